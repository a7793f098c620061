"""The stage profiler: where each training step's time goes, adding up to the step. The stages and the
:class:`~dnnperf.results.stages.StageBreakdown` they fill are described in :mod:`dnnperf.results.stages`.

Two ways in: the suite's runner passes a :class:`~dnnperf.probes.clock.StageClock` to each
``Task.step``; a user's own loop uses :class:`StageProfiler`, which finds the same boundaries with
hooks on the model and optimizer and removes them when it ends.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import psutil
import torch
from torch import nn

from dnnperf.data.sources import pop_data_times
from dnnperf.devices import synchronize, to_device
from dnnperf.probes.clock import StageClock, StepTiming
from dnnperf.results.stages import OTHER, StageBreakdown


class CpuMeter:
    """CPU seconds used by this process and by its child processes (DataLoader workers) since
    ``start()``, as cores kept busy on average."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self._start: tuple[float, float, dict[int, float]] | None = None

    def _children(self) -> dict[int, float]:
        seconds = {}
        for child in self.process.children(recursive=True):
            try:
                times = child.cpu_times()
                seconds[child.pid] = times.user + times.system
            except psutil.Error:  # a worker that just exited
                continue
        return seconds

    def _reaped(self) -> float:
        """CPU seconds of child processes that have already exited and been waited for."""
        times = self.process.cpu_times()
        return times.children_user + times.children_system

    def start(self) -> None:
        times = self.process.cpu_times()
        self._start = (time.perf_counter(), times.user + times.system, self._children())
        self._reaped_start = self._reaped()
        self._last_seen = dict(self._start[2])

    @property
    def started(self) -> bool:
        return self._start is not None

    def read(self) -> dict[str, float]:
        if self._start is None:
            raise RuntimeError("read() before start()")
        wall0, own0, children0 = self._start
        times = self.process.cpu_times()
        wall = time.perf_counter() - wall0
        own = times.user + times.system - own0
        alive = self._children()
        # Workers alive now: their time since start. Workers that exited since: the time they had when
        # last seen, plus what the OS reports for reaped children (their full lifetime since start).
        self._last_seen.update(alive)
        children = sum(t - children0.get(pid, 0.0) for pid, t in alive.items())
        gone = [pid for pid in self._last_seen if pid not in alive]
        reaped = self._reaped() - self._reaped_start
        before = sum(children0.get(pid, 0.0) for pid in gone)  # their time before start() is not ours
        children += max(reaped - before, sum(self._last_seen[pid] for pid in gone) - before)
        cores = (
            len(self.process.cpu_affinity()) if hasattr(self.process, "cpu_affinity") else psutil.cpu_count()
        )
        return {
            "wall_s": wall,
            "process_cores": own / wall if wall > 0 else 0.0,
            "workers_cores": children / wall if wall > 0 else 0.0,
            "usable_cores": float(cores or 1),
        }


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (0 if it has none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    )
    for value in values:
        size = batch_size_of(value)
        if size:
            return size
    return 0


class StageProfiler:
    """Stage breakdown of a user's own training loop, in a few added lines::

        profiler = dnnperf.StageProfiler(model, optimizer)
        with profiler:
            for batch in profiler.batches(loader):   # was: for batch in loader:
                ...                                    # the loop body, unchanged
        print(profiler.result().summary()["stages"])

    A step runs from asking the loader for a batch to asking for the next one. Boundaries come from
    hooks: the model's first forward call in a step starts ``forward``; autograd reaching the model's
    output starts ``backward`` (so the loss's own small backward counts as forward); the optimizer's
    ``step`` is ``update``. Code between getting the batch and calling the model counts as ``other``
    unless the batch is moved with :meth:`to_device`, which is timed as ``copy``. The device is
    synchronised once per step, at its end. The first ``warmup`` steps are not recorded. Every hook is
    removed when the ``with`` block ends, also on error. A step ends when the loop stops asking for
    batches (a ``break``), not when the block does; if the block then fails, that step is dropped. One
    profiler used for several ``with`` blocks adds up their steps, and a block that failed leaves the
    result ``partial``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
        warmup: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.model = model
        self.optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        self.warmup = warmup
        if device is None:
            parameter = next(model.parameters(), None)
            device = parameter.device if parameter is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.clock = StageClock(self.device)
        self.breakdown = StageBreakdown(timing="cuda-events" if self.clock.cuda else "host-clock")
        self.steps_seen = 0
        self._handles: list[Any] = []
        self._node_hooks: list[Any] = []  # autograd-node hooks of the current step
        self._cpu = CpuMeter()
        self._depth = 0  # nesting of model calls: only the outermost marks forward
        self._synchronized = False
        self._pending: tuple[int, dict[str, float] | None] | None = None
        # A step ended by the loop leaving (a break), kept once the ``with`` block ends without error.
        self._ended: tuple[StepTiming, int, dict[str, float] | None] | None = None
        self._deferred: Exception | None = None  # an error ending the step at the loop's close
        self._loop: object | None = None  # the batches() loop whose step is in flight
        self._active = False

    # -- hooks ----------------------------------------------------------------------------------
    def __enter__(self) -> StageProfiler:
        if self._active:
            raise RuntimeError("this StageProfiler is already active")
        self._active = True
        self._handles.append(self.model.register_forward_pre_hook(self._on_forward))
        self._handles.append(self.model.register_forward_hook(self._on_output, always_call=True))
        for optimizer in self.optimizers:
            self._handles.append(optimizer.register_step_pre_hook(lambda *_: self.clock.mark("update")))
            self._handles.append(optimizer.register_step_post_hook(lambda *_: self.clock.mark(OTHER)))
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is None:
                self._finish_step()
            else:  # the loop failed: keep the steps measured before it, marked partial
                self.breakdown.status = "partial"
                self.clock._start = None
                self._pending = self._ended = self._deferred = None  # the block's own error is the one
        finally:
            self.clock.close()
            self._remove_node_hooks()
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self._active = False

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        # Every outermost model call starts (or continues) forward: micro-batches, several models'
        # worth of calls in one step, and closures re-evaluated by the optimizer are all forward.
        self._depth += 1
        if self._depth == 1 and self.clock.in_step and self.clock.current != "forward":
            self.clock.mark("forward")

    def _on_output(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth or not self.clock.in_step:
            return
        # Autograd reaching any of the model's outputs means backward has begun for the model's part.
        for node in _grad_fns(output):
            self._node_hooks.append(node.register_prehook(self._on_backward))

    def _on_backward(self, grad_outputs: Any) -> None:
        if self.clock.current != "backward":
            self.clock.mark("backward")

    def _remove_node_hooks(self) -> None:
        for handle in self._node_hooks:
            handle.remove()
        self._node_hooks.clear()

    # -- the loop -------------------------------------------------------------------------------
    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``loader`` as the training loop would, cutting steps at each request for a batch."""
        if not self._active:
            raise RuntimeError("use batches() inside `with profiler:`")
        self.breakdown.data_workers = int(getattr(loader, "num_workers", 0) or 0)
        if not self._synchronized:  # work queued before the loop must not land in its first step
            synchronize(self.device)
            self._synchronized = True
        iterator = iter(loader)
        this_loop = object()  # whose step is in flight: a loop closed late must not end another's
        while True:
            self._finish_step()
            if self.steps_seen == self.warmup and not self._cpu.started:
                self._cpu.start()  # from the first measured step on
            self.clock.begin_step()
            self._loop = this_loop
            self._depth = 0
            try:
                with self.clock("data_wait"):
                    batch = next(iterator)
            except StopIteration:
                self.clock._start = None  # the request that found no batch is not a step
                return
            data_times = pop_data_times(batch) if isinstance(batch, dict) else None
            self._pending = (batch_size_of(batch), data_times)
            try:
                yield batch
            except GeneratorExit:
                # The loop stopped asking for batches (a break, a return, an error unwinding it): its
                # last step ends here, not with the ``with`` block, whose exit keeps it unless it failed.
                if self._loop is this_loop:
                    try:
                        self._end_step_now()
                    except Exception as error:  # raised here it would only be printed: __exit__ raises it
                        self._deferred = error
                raise

    def to_device(self, batch: Any, device: torch.device | str | None = None) -> Any:
        """Move a batch (tensor, dict, list or tuple of tensors) to the device, timed as ``copy``."""
        target = torch.device(device) if device is not None else self.device
        with self.clock("copy"):
            if isinstance(batch, torch.Tensor):
                return batch.to(target, non_blocking=batch.is_pinned())
            if isinstance(batch, Mapping):
                return to_device(batch, target)
            if isinstance(batch, (list, tuple)):
                moved = [self.to_device(item, target) for item in batch]
                return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
            return batch

    def _end_step_now(self) -> None:
        """Stop the current step's clock; ``_finish_step`` records it."""
        if not self.clock.in_step or self._pending is None:
            return
        synchronize(self.device)
        timing = self.clock.end_step()
        self._remove_node_hooks()
        self._ended = (timing, *self._pending)
        self._pending = None

    def _finish_step(self) -> None:
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        self._end_step_now()
        if self._ended is None:
            return
        timing, samples, data_times = self._ended
        self._ended = None
        self.steps_seen += 1
        if self.steps_seen > self.warmup:
            self.breakdown.add(timing.wall_s, timing.stages, samples, data_times)
            self.breakdown.cpu = self._cpu.read()

    def result(self) -> StageBreakdown:
        """The breakdown of the measured steps. Raises if no step was measured."""
        if not self.breakdown.wall_s:
            ended = "failed" if self.breakdown.status == "partial" else "ended"
            raise RuntimeError(
                f"no measured step: the loop {ended} after {self.steps_seen} step(s), "
                f"and the first {self.warmup} are warm-up"
            )
        return self.breakdown


def _grad_fns(output: Any) -> list[Any]:
    """The autograd nodes of every tensor in a model's output (tensors, mappings, sequences,
    dataclasses), each once."""
    found: dict[int, Any] = {}

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None:
                found.setdefault(id(value.grad_fn), value.grad_fn)
        elif isinstance(value, Mapping):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for item in dataclasses.fields(value):
                visit(getattr(value, item.name))

    visit(output)
    return list(found.values())
