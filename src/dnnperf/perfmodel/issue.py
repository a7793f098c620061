"""The host's side of a training step, measured on the step itself: how long it takes to issue the
step to a GPU, and on a CPU the seconds between the step's operator calls.

On a GPU the host queues kernels and goes on; a small network's step is the host's time, and most of
that is not in the operators' own calls: the model's Python (module calls, reshapes, the glue of a
transformers block), the autograd engine's walk, the optimizer's loops. The calibrated per-call costs
(calibrate.fit_host_costs) price a zoo layer's calls; a user's model runs code between them that no
zoo has. So a description made on a GPU also times the host's side of the step: each phase from its
start to the return of its last call, nothing synchronised inside, the device idle at the start of
each step. The host's work does not grow with the batch (the kernels it queues do), so the seconds
measured at the description's batch hold at any other (perfmodel/compute.py's queued step scales
the calls' host costs to them). Where the device falls a full queue behind, the host waits and the
time measured is an upper bound: of two descriptions the smaller is kept (StepGraph.at_batch).

A CPU runs the operators itself, so its host time is the step's; what it spends *between* the
operators can still be told apart (:func:`gap_seconds`, probes.opcount.GapClock): a model may run
Python between its calls that the calibration's network does not, and
``ComputeOptions(host_gaps=True)`` charges the excess (compute.host_gap_seconds).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from dnnperf.devices import synchronize
from dnnperf.probes.opcount import GapClock
from dnnperf.workloads.base import Stages, no_stages


class PhaseClock:
    """A ``stages`` callable that adds up the host seconds spent inside each named phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started


def issue_seconds(
    step: Callable[[Stages], Any], device: torch.device, warm: int = 3, counted: int = 7
) -> dict[str, float]:
    """Host seconds per phase ("forward", "backward", "update") of one step as ``step(stages)`` runs
    it on ``device``: the median over ``counted`` steps after ``warm`` more, each started on an idle
    device (synchronised before, not inside)."""
    for _ in range(warm):
        step(no_stages)
        synchronize(device)
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(counted):
        clock = PhaseClock()
        synchronize(device)
        step(clock)
        synchronize(device)
        for phase, seconds in clock.seconds.items():
            samples[phase].append(seconds)
    return {phase: statistics.median(values) for phase, values in samples.items()}


def gap_seconds(step: Callable[[Stages], Any], warm: int = 2, counted: int = 5) -> dict[str, list[float]]:
    """Per phase of ``step(stages)`` on a CPU: [host seconds between its operator calls, its calls],
    the median over ``counted`` steps after ``warm`` more (GapClock)."""
    for _ in range(warm):
        step(no_stages)
    seconds: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, list[int]] = defaultdict(list)
    for _ in range(counted):
        clock = GapClock()
        with clock:
            step(clock)
        for phase, value in clock.seconds.items():
            seconds[phase].append(value)
            calls[phase].append(clock.calls[phase])
    return {
        phase: [statistics.median(values), float(statistics.median(calls[phase]))]
        for phase, values in seconds.items()
    }
