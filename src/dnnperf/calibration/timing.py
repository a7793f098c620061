"""Timing a kernel: warm-up, samples of back-to-back calls, blocks of several kernels alternated, and
the progress of a calibration."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from dnnperf.calibration.plans import Plan
from dnnperf.devices import synchronize
from dnnperf.hardware import GiB, KernelTiming, KiB, MiB

Progress = Callable[[str, float], None]


def time_samples(
    fn: Callable[[], object], device: torch.device, calls: int, repeats: int, host_only: bool = False
) -> list[float]:
    """Mean seconds per call of ``repeats`` samples of ``calls`` back-to-back calls, the device
    synchronised before and after each sample. ``host_only``: stop the clock before the final
    synchronisation, to time what the host spends issuing the calls (CUDA launch cost)."""
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if not host_only:
            synchronize(device)
        seconds.append((time.perf_counter() - start) / calls)
        if host_only:
            synchronize(device)
    return seconds


def warm_up(fn: Callable[[], object], device: torch.device, warmup_s: float) -> float:
    """Call ``fn`` until ``warmup_s`` has passed (twice at least); the faster of its last two calls
    estimates the seconds per call."""
    start = time.perf_counter()
    recent: list[float] = []
    while len(recent) < 2 or time.perf_counter() - start < warmup_s:
        synchronize(device)
        call_start = time.perf_counter()
        fn()
        synchronize(device)
        recent = [*recent[-1:], time.perf_counter() - call_start]
    return max(min(recent), 1e-9)


def calls_per_sample(per_call: float, plan: Plan) -> int:
    return max(1, math.ceil(plan.min_sample_s / per_call))


def measure(
    fn: Callable[[], object],
    device: torch.device,
    plan: Plan,
    budget_s: float,
    warmup_s: float,
    host_only: bool = False,
    calls: int | None = None,
    min_repeats: int | None = None,
) -> tuple[int, list[float]]:
    """Warm up, then time as many samples as fit in ``budget_s`` (within the plan's bounds), each of
    ``calls`` calls (by default enough calls for the plan's shortest sample)."""
    per_call = warm_up(fn, device, warmup_s)
    calls = calls or calls_per_sample(per_call, plan)
    least = plan.min_repeats if min_repeats is None else min_repeats
    repeats = min(plan.max_repeats, max(least, int(budget_s / (calls * per_call))))
    return calls, time_samples(fn, device, calls, repeats, host_only)


@dataclass(frozen=True)
class Kernel:
    """A kernel configuration ready to time: inputs allocated, ``fn`` runs it once."""

    fn: Callable[[], object]
    label: str
    work: float
    unit: str
    params: dict[str, Any]


def schedule(per_call: Sequence[float], plan: Plan, budget_s: float) -> tuple[list[int], list[int], int]:
    """Calls per sample, samples per block and rounds for kernels timed in alternating blocks of about
    ``plan.block_s`` until ``budget_s`` is spent."""
    calls = [calls_per_sample(t, plan) for t in per_call]
    sample_s = [c * t for c, t in zip(calls, per_call, strict=True)]
    blocks = [max(1, round(plan.block_s / s)) for s in sample_s]
    round_s = sum(b * s + t for b, s, t in zip(blocks, sample_s, per_call, strict=True))
    rounds = max(math.ceil(plan.min_repeats / min(blocks)), round(budget_s / round_s))
    rounds = max(1, min(rounds, plan.max_repeats // max(blocks)))
    return calls, blocks, rounds


def measure_interleaved(
    kernels: Sequence[Kernel],
    per_call: Sequence[float],
    device: torch.device,
    plan: Plan,
    budget_s: float,
    step: Callable[[int, int], AbstractContextManager[None]],
) -> list[KernelTiming]:
    """Time warmed-up kernels in alternating blocks of samples (about ``plan.block_s`` each) until
    ``budget_s`` is spent. The machine's speed drifts (clock changes, other tenants of a virtual
    machine): alternating spreads a drift over every kernel instead of the one running at that
    moment, so the sizes compare fairly and the best of them is not just the luckiest. Each block
    starts with an untimed call that brings the kernel's data back into cache after the others ran."""
    calls, blocks, rounds = schedule(per_call, plan, budget_s)
    seconds: list[list[float]] = [[] for _ in kernels]
    for index in range(rounds):
        with step(index, rounds):
            one_round(kernels, seconds, calls, blocks, device)
    return [
        KernelTiming(k.label, k.work, k.unit, n, tuple(samples), k.params)
        for k, n, samples in zip(kernels, calls, seconds, strict=True)
    ]


def one_round(
    kernels: Sequence[Kernel],
    seconds: list[list[float]],
    calls: Sequence[int],
    blocks: Sequence[int],
    device: torch.device,
) -> None:
    """One block of samples of each kernel, each block after an untimed call."""
    for kernel, samples, n, block in zip(kernels, seconds, calls, blocks, strict=True):
        kernel.fn()
        samples += time_samples(kernel.fn, device, n, block)


class Tracker:
    """Reports (description, fraction done) to a progress callback; weights are estimated seconds."""

    def __init__(self, progress: Progress | None, total: float) -> None:
        self.progress = progress
        self.total = max(total, 1e-9)
        self.done = 0.0

    @contextmanager
    def step(self, description: str, weight: float) -> Iterator[None]:
        if self.progress is not None:
            self.progress(description, min(self.done / self.total, 1.0))
        try:
            yield
        finally:
            self.done += weight

    def skip(self, weight: float) -> None:
        """Count a planned step that will not run (a dropped precision, a size that does not fit)."""
        self.done += weight

    def finish(self) -> None:
        if self.progress is not None:
            self.progress("calibration done", 1.0)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bytes_text(nbytes: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


class BackgroundLoad:
    """Other processes' CPU use from now on: the machine's busy CPU time (steal included: a
    hypervisor's other guests) less this process's and its children's, in cores over the wall time."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.busy = machine_busy_s()
        self.own = own_cpu_s()

    def cores(self) -> float:
        wall = time.perf_counter() - self.started
        others = (machine_busy_s() - self.busy) - (own_cpu_s() - self.own)
        return max(0.0, others / wall) if wall > 0 else 0.0


def machine_busy_s() -> float:
    """Seconds every CPU of the machine has spent not idle (Linux: user, nice, system, irq, softirq,
    steal; elsewhere what psutil reports)."""
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system
