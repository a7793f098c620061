"""Page faults of a training step: the model charges each one the machine's ``page_fault_s``.

A minor page fault is the first touch of a page the allocator took fresh from the OS. On the CPU,
glibc hands large freed blocks back to the OS and trims its heap, so an eager step maps and touches
part of its memory anew every time; on this project's machine that was 9,000-37,000 faults a step at
about 1.4 us each (alexnet, vgg16 `small`), up to a quarter of a small batch's step. The operator
rows carry no such cost. Faults are counted, like FLOPs, not timed.

How many a step takes depends on what the process allocated before (glibc raises its mmap threshold
as large blocks are freed): a process that trained other models first takes fewer, and two fresh
processes of the same job can differ. A user's job is a process of its own, so a suite workload's
count is the median of three fresh interpreters (:func:`counting_workload_faults`); a user's model is counted
in the calling process (``describe_model``).
``DNNPERF_COUNT_FAULTS=0`` turns the fresh-process count off (the test suite does, for speed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dnnperf.errors import DnnperfError
from dnnperf.interrupts import children_beside
from dnnperf.probes.opcount import minor_faults

if TYPE_CHECKING:
    from dnnperf.workloads.base import Task, Workload


def steady_page_faults(
    step: Callable[[], Any],
    warm: int = 2,
    counted: int = 10,
    budget_s: float | None = None,
    least: int = 3,
) -> float:
    """Minor page faults of one step in steady state: the median over ``counted`` plain steps after
    ``warm`` more (the first steps create optimizer state and grow the heap). The count varies from
    step to step as glibc's thresholds move (inception_v3 `small` batch 4: 1,652 to 6,809 a step;
    basic_cnn batch 4: 992 with an occasional 0), so it is the median of as many steps as a
    validation run times, after as many as it warms up (with the described step). ``budget_s``: stop
    counting once ``least`` steps are counted and they took that much CPU time (a large model's steps
    are few: its faults are a small part of a long step; a small model's, where they weigh most, are
    cheap to count ten times). 0 where the OS does not count faults."""
    for _ in range(warm):
        step()
    counts = []
    spent = 0.0
    while len(counts) < counted and not (budget_s is not None and len(counts) >= least and spent > budget_s):
        cpu = time.process_time()
        before = minor_faults()
        step()
        counts.append(minor_faults() - before)
        spent += time.process_time() - cpu
    return float(np.median(counts))


def enabled() -> bool:
    return os.environ.get("DNNPERF_COUNT_FAULTS", "1") != "0"


#: CPU seconds a counting process spends on counted steps before it may stop (steady_page_faults).
CHILD_BUDGET_S = 2.0


@contextmanager
def counting_workload_faults(
    workload: str,
    preset: str,
    batch_sizes: Sequence[int],
    timeout_s: float = 600.0,
    processes: int = 3,
) -> Iterator[Callable[[], dict[int, float]]]:
    """Steady-state page faults of one CPU step of a suite workload at each of ``batch_sizes``, at this
    process's thread count (0 when counting is off), counted while the caller does other work (a count
    is not a time): yields the function that waits for them. Each is the median over ``processes``
    fresh interpreters of each one's median step. Two processes of the same job can differ (basic_cnn
    `small` batch 4: 0 in one, 992 a step in the next: where glibc's heap and mapping thresholds
    settle depends on the process), so one is not enough. One process cannot count two batch sizes
    either (alexnet `small` at batch 4 after batch 2: 120 to 10,066 a step, against 9,185 in a fresh
    one), so each fresh interpreter builds the workload once and forks a process per batch size, which
    starts from the heap a fresh process has after the same build (alexnet `small`: 9,186 a step in
    each, vgg16 `small`: 25,092 and 27,236). The interpreters run at once, whatever the cores: a count
    is not a time, and three jobs on two cores in two rounds would leave one idle for the second; the
    counting then holds ``processes`` training steps' memory at once."""
    sizes = list(dict.fromkeys(batch_sizes))
    if not enabled() or not sizes:
        yield lambda: {size: 0.0 for size in sizes}
        return
    threads = torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", __name__, workload, preset, ",".join(map(str, sizes))]

    with children_beside([command] * processes, env, processes, timeout_s) as wait_for_children:

        def wait() -> dict[int, float]:
            try:
                done = wait_for_children()
            except subprocess.TimeoutExpired:
                raise DnnperfError(f"counting {workload}'s page faults took over {timeout_s:g} s") from None
            counts: dict[int, list[float]] = {size: [] for size in sizes}
            for child in done:
                if child.returncode != 0:
                    last = (child.stderr.strip().splitlines() or ["no message"])[-1]
                    raise DnnperfError(f"counting {workload}'s page faults failed: {last}")
                for size, count in json.loads(child.stdout)["page_faults"].items():
                    counts[int(size)].append(float(count))
            return {size: float(np.median(found)) for size, found in counts.items()}

        yield wait


def _main(workload: str, preset: str, batch_sizes: list[int]) -> None:
    """A fresh interpreter's counts: the workload built once, then per batch size a forked process
    that counts (:func:`_count_forked`)."""
    from dnnperf.interrupts import die_with_this_process
    from dnnperf.workloads import get_workload

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no thread team before the forks: a forked process could not use it
    spec = get_workload(workload)
    torch.manual_seed(0)
    task = spec.build(preset, "cpu")
    arm = die_with_this_process()
    counts = {}
    for batch_size in batch_sizes:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the counting process: it reports through the pipe and leaves at once
            code = 1
            try:
                os.close(read)
                arm()
                torch.set_num_threads(threads)
                report = json.dumps(_count_forked(spec, task, preset, batch_size))
                code = 0
            except BaseException as error:
                report = json.dumps(f"{type(error).__name__}: {error}".splitlines()[0])
            finally:
                os.write(write, report.encode())
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            reported = json.loads(pipe.read() or '"no report"')
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"at batch {batch_size}: {reported}")
        counts[batch_size] = float(reported)
    print(json.dumps({"page_faults": counts}))


def _count_forked(spec: Workload, task: Task, preset: str, batch_size: int) -> float:
    """Steady-state faults of ``task`` (``spec`` built) at ``batch_size``, trained as the
    runner does, on the in-memory pool's alternating batches."""
    from dnnperf.data import open_source
    from dnnperf.workloads.base import no_stages

    source = open_source(spec.data(preset), "memory", batch_size, seed=0)

    def step() -> None:
        task.step(next(source), no_stages)

    try:
        step()  # the first step: it creates the optimizer state
        # One more settles the heap (alexnet `small`: 18,636 faults, 10,241, then 9,184 a step).
        return steady_page_faults(step, warm=1, budget_s=CHILD_BUDGET_S)
    finally:
        source.close()


if __name__ == "__main__":  # python -m dnnperf.perfmodel.faults WORKLOAD PRESET BATCH[,BATCH...]
    from dnnperf.interrupts import exit_now

    _main(sys.argv[1], sys.argv[2], [int(size) for size in sys.argv[3].split(",")])
    exit_now()
