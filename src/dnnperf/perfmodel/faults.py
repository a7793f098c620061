"""Page faults of a training step: the model charges each one the machine's ``page_fault_s``.

A minor page fault is the first touch of a page the allocator took fresh from the OS. On the CPU,
glibc hands large freed blocks back to the OS and trims its heap, so an eager step maps and touches
part of its memory anew every time; on this project's machine that was 9,000-37,000 faults a step at
about 1.4 us each (alexnet, vgg16 `small`), up to a quarter of a small batch's step. The operator
rows carry no such cost. Faults are counted, like FLOPs, not timed.

How many a step takes depends on what the process allocated before (glibc raises its mmap threshold
as large blocks are freed): a process that trained other models first takes fewer, and two fresh
processes of the same job can differ. A user's job is a process of its own, so a suite workload's
count is the median of three fresh interpreters (:func:`workload_faults`); a user's model is counted
in the calling process (``describe_model``).
``DNNPERF_COUNT_FAULTS=0`` turns the fresh-process count off (the test suite does, for speed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dnnperf.errors import DnnperfError
from dnnperf.interrupts import run_child


def steady_page_faults(step: Callable[[], Any], warm: int = 2, counted: int = 10) -> float:
    """Minor page faults of one step in steady state: the median over ``counted`` plain steps after
    ``warm`` more (the first steps create optimizer state and grow the heap). The count varies from
    step to step as glibc's thresholds move (inception_v3 `small` batch 4: 1,652 to 6,809 a step;
    basic_cnn batch 4: 992 with an occasional 0), so it is the median of as many steps as a
    validation run times, after as many as it warms up (with the described step). 0 where the OS
    does not count faults."""
    try:
        import resource
    except ImportError:  # not a Unix
        return 0.0
    for _ in range(warm):
        step()
    counts = []
    for _ in range(counted):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return float(np.median(counts))


def enabled() -> bool:
    return os.environ.get("DNNPERF_COUNT_FAULTS", "1") != "0"


def workload_faults(
    workload: str, preset: str, batch_size: int, timeout_s: float = 600.0, processes: int = 3
) -> float:
    """Steady-state page faults of one CPU step of a suite workload at this process's thread count (0
    when counting is off): the median over ``processes`` fresh interpreters of each one's median step.
    Two processes of the same job can differ (basic_cnn `small` batch 4: 0 in one, 992 a step in the
    next: where glibc's heap and mapping thresholds settle depends on the process), so one is not
    enough; each trains as the runner does, on the in-memory pool's alternating batches."""
    if not enabled():
        return 0.0
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    argv = [sys.executable, "-m", __name__, workload, preset, str(batch_size)]
    counts = []
    for _ in range(processes):
        try:
            done = run_child(argv, env, timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            raise DnnperfError(f"counting {workload}'s page faults took over {timeout_s:g} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise DnnperfError(f"counting {workload}'s page faults failed: {last}")
        counts.append(float(json.loads(done.stdout)["page_faults"]))
    return float(np.median(counts))


def _main(workload: str, preset: str, batch_size: int) -> None:
    from dnnperf.data import open_source
    from dnnperf.workloads import get_workload
    from dnnperf.workloads.base import no_stages

    spec = get_workload(workload)
    torch.manual_seed(0)
    task = spec.build(preset, "cpu")
    source = open_source(spec.data(preset), "memory", batch_size, seed=0)  # as `dnnperf bench` feeds it
    try:
        task.step(next(source), no_stages)  # the first step: it creates the optimizer state
        faults = steady_page_faults(lambda: task.step(next(source), no_stages))
    finally:
        source.close()
    print(json.dumps({"page_faults": faults}))


if __name__ == "__main__":  # python -m dnnperf.perfmodel.faults WORKLOAD PRESET BATCH
    _main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
