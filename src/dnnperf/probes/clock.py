"""Step clocks: the wall time of each training step and, for the stage clock, where it went.

A step is cut into consecutive segments by *marks*: ``mark("forward")`` means "from now on, time
belongs to forward". Stage blocks (``with clock("backward"): ...``) mark their name on entry and,
on exit, the enclosing stage (or ``other`` at the top level). Because segments tile the step, the
stages plus ``other`` add up to the step's wall time by construction; what the measurement has to
get right is where each boundary falls, which the tests check against injected delays.

On CPU a boundary is a host monotonic-clock reading. On CUDA it is an event recorded on the current
stream, resolved after the step's final synchronisation: no synchronisation is added inside a step.
The GPU timeline between the first and last events can be shorter than the host's wall time (launch
latency before the first event, the synchronisation call after the last); that remainder is counted
in ``other``. Pauses of Python's garbage collector inside a step are their own stage, ``python_gc``.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from dnnperf.results.stages import GC, OTHER


@dataclass
class StepTiming:
    """One step: its wall time and the seconds each stage took (``other`` included)."""

    wall_s: float
    stages: dict[str, float] = field(default_factory=dict)


class WallClock:
    """Times whole steps on the host; stage blocks cost nothing. Used when stages are not profiled."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self._start: float | None = None

    def begin_step(self) -> None:
        self._start = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        yield

    def mark(self, name: str) -> None:
        """No-op: a wall clock records no stage boundaries."""

    def close(self) -> None:
        """Nothing to release."""

    def end_step(self) -> StepTiming:
        """Call after the device is synchronised."""
        if self._start is None:
            raise RuntimeError("end_step() without begin_step()")
        wall = time.perf_counter() - self._start
        self._start = None
        return StepTiming(wall_s=wall, stages={})

    @property
    def in_step(self) -> bool:
        return self._start is not None


class StageClock(WallClock):
    """Times whole steps on the host and every stage boundary on the device's own timeline."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__(device)
        self.cuda = self.device.type == "cuda"
        self._marks: list[tuple[str, float | torch.cuda.Event]] = []
        self._stack: list[str] = []
        self._pool: list[torch.cuda.Event] = []
        self._before_gc = OTHER
        self._marking = False
        self._owner: int | None = None  # the thread that runs the step
        self._pid = os.getpid()  # a forked child (a DataLoader worker) inherits the callback, not the step

    def _stamp(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))  # the profiled device, whatever is current
        return event

    def begin_step(self) -> None:
        super().begin_step()
        self._owner = threading.get_ident()
        self._pid = os.getpid()
        self._stack.clear()
        self._marks = [(OTHER, self._stamp())]
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        """Python's garbage collector pausing the step is its own stage, not an unexplained "other".
        Only collections on the step's own thread count, and none that start inside a mark (between
        reading the clock and storing the reading), which would put marks out of order. A process forked
        during a step (a DataLoader worker) has the callback and the step's thread id but not its device:
        its collections are not the step's."""
        if self._start is None or self._marking or threading.get_ident() != self._owner:
            return
        if os.getpid() != self._pid:
            return
        if phase == "start":
            self._before_gc = self._marks[-1][0]
            self.mark(GC)
        elif self._marks[-1][0] == GC:
            self.mark(self._before_gc)

    def close(self) -> None:
        """Remove the garbage-collector callback (also done when a step ends); safe to call twice."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def mark(self, name: str) -> None:
        if self._start is not None:
            self._marking = True
            try:
                self._marks.append((name, self._stamp()))
            finally:
                self._marking = False

    @property
    def current(self) -> str:
        """The stage time belongs to now (``other`` outside a step)."""
        return self._marks[-1][0] if self._start is not None and self._marks else OTHER

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._stack.append(name)
        self.mark(name)
        try:
            yield
        finally:
            self._stack.pop()
            self.mark(self._stack[-1] if self._stack else OTHER)

    def end_step(self) -> StepTiming:
        """Close the step; call after the device is synchronised (events are then complete)."""
        if self._start is None:
            raise RuntimeError("end_step() without begin_step()")
        self.close()
        self.mark(OTHER)
        end = self._marks[-1][1]
        if self.cuda:
            end.synchronize()  # type: ignore[union-attr]  # after the step's own sync: adds nothing inside
        timing = super().end_step()
        totals: dict[str, float] = defaultdict(float)
        for (name, start), (_, stop) in zip(self._marks, self._marks[1:], strict=False):
            totals[name] += self._elapsed(start, stop)
        covered = self._elapsed(self._marks[0][1], end)
        # On CUDA the event timeline can be shorter than the host's wall time; the rest is "other".
        totals[OTHER] += max(timing.wall_s - covered, 0.0)
        if self.cuda:
            self._pool.extend(stamp for _, stamp in self._marks)  # type: ignore[misc]
        self._marks = []
        timing.stages = dict(totals)
        return timing

    def _elapsed(self, start: float | torch.cuda.Event, stop: float | torch.cuda.Event) -> float:
        if self.cuda:
            return start.elapsed_time(stop) / 1e3  # type: ignore[union-attr]  # ms -> s
        return stop - start  # type: ignore[operator]
