"""The memory profiler for your own training loop: one step of it tracked as ``dnnperf profile --memory``
tracks a suite workload's step (docs/memory.md, "Your own loop")::

    profiler = dnnperf.MemoryProfiler(model, optimizer)        # added
    with profiler:                                             # added
        for inputs, targets in profiler.batches(loader):       # was: for inputs, targets in loader:
            ...forward, backward, optimizer.step()...
    memory = profiler.result()                                 # added: a StepMemory

The loop's steps are cut and its stages found by :class:`~dnnperf.probes.stages.StageProfiler`'s
hooks; the step after ``warmup`` runs under a :class:`~dnnperf.probes.memory.MemoryTracker`, which the
stage boundaries are marked in as they happen.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from dnnperf.probes.clock import StageClock
from dnnperf.probes.memory import MemoryTracker
from dnnperf.probes.stages import StageProfiler
from dnnperf.results.memory import StepMemory


class _MarkingClock(StageClock):
    """A stage clock that also marks each stage boundary in the memory tracker of the step, if any."""

    tracker: MemoryTracker | None = None

    def mark(self, name: str) -> None:
        super().mark(name)
        if self.tracker is not None:
            self.tracker.mark(name)


class MemoryProfiler(StageProfiler):
    """Peak memory by data structure, per layer and over the step, of one step of a user's loop (the
    module doc). The tracked step is the one after ``warmup`` (1: the optimizer's state then exists).
    Every hook and the profiler are removed when the ``with`` block ends, also on error; a loop that
    ends before the tracked step does gives an error from :meth:`result`, not an empty report."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
        warmup: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(model, optimizer, warmup=warmup, device=device)
        self.clock = _MarkingClock(self.device)
        self._tracker: MemoryTracker | None = None
        self._tracked: StepMemory | None = None  # the tracked step's, kept with the step (_finish_step)
        self._memory: StepMemory | None = None

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        for batch in super().batches(loader):
            if self.steps_seen == self.warmup and self._memory is None and self._tracker is None:
                tracker = MemoryTracker(self.model, self.optimizers, batch, device=self.device)
                tracker.__enter__()
                self._tracker = self.clock.tracker = tracker
                tracker.mark("other")  # the batch is in hand: what follows is the step's own
            yield batch

    def _end_step_now(self) -> None:
        self._stop_tracking(None)
        super()._end_step_now()

    def _finish_step(self) -> None:
        super()._finish_step()
        if self._tracked is not None:
            self._memory, self._tracked = self._tracked, None

    def _stop_tracking(self, exc_type: Any) -> None:
        tracker, self._tracker = self._tracker, None
        self.clock.tracker = None
        if tracker is None:
            return
        tracker.__exit__(exc_type, None, None)
        if exc_type is None:
            self._tracked = tracker.result()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is not None:  # the step failed: its tracker goes, with no result
                self._stop_tracking(exc_type)
                self._tracked = None
        finally:
            super().__exit__(exc_type, *exc)

    def result(self) -> StepMemory:  # type: ignore[override]
        """The tracked step's memory. Raises if the loop ended before it."""
        if self._memory is None:
            raise RuntimeError(
                f"no tracked step: the loop ended after {self.steps_seen} step(s), and the step after the "
                f"first {self.warmup} is the one tracked"
            )
        return self._memory
