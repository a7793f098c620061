"""The training loop that measures: warm-up, then timed steps, one batch size after another.

A step's time runs from asking the data source for a batch to the end of the optimizer update, with
the device synchronised at the end so the host clock covers the queued GPU work. The record is saved
atomically when the run starts, at most every ``checkpoint_s`` seconds while it runs, and when it
ends, so an interrupted run keeps the steps it measured (marked partial).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from dnnperf.data.integrity import CorruptDataset
from dnnperf.data.sources import BatchSource, dataset_size, ensure_dataset, open_source, pop_data_times
from dnnperf.devices import current, is_out_of_memory, resolve_device, synchronize, to_device
from dnnperf.errors import UsageError
from dnnperf.interrupts import stop_if_requested
from dnnperf.probes.clock import StageClock, StepTiming, WallClock
from dnnperf.probes.layers import CountingStages, LayerTimer, build_profile, with_outside_the_model
from dnnperf.probes.memory import MemoryTracker, ResidentGrowth
from dnnperf.probes.opcount import OpCounter, OpRecord
from dnnperf.probes.stages import CpuMeter
from dnnperf.results.record import Point, RunRecord, utc_now
from dnnperf.results.settings import BenchRunSettings
from dnnperf.results.stages import StageBreakdown
from dnnperf.results.store import RunStore
from dnnperf.stats import Samples
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import Task, Workload, count_parameters

#: Called after every step: (batch size, steps done at this batch size, steps in total at it).
StepCallback = Callable[[int, int, int], None]


class RunHooks(Protocol):
    """How a distributed rank changes the loop (``distributed/worker.py``): it names the record, wraps
    the task for its strategy, takes its share of the batches, and gathers every step on rank 0."""

    def on_record(self, record: RunRecord) -> None: ...
    def on_task(self, task: Task, workload: Workload) -> Task: ...
    def on_source(self, source: BatchSource, batch_size: int) -> BatchSource: ...
    def after_step(self, point: Point, loss: torch.Tensor | None, measured: bool) -> None: ...
    def after_memory(self, point: Point) -> None: ...


MAX_WORKERS = 64

# On-disk dataset size (samples) per preset, before the "at least two batches" rule.
DISK_SAMPLES = {"tiny": 64, "small": 256, "full": 512}


class RunFailed(RuntimeError):
    """A run stopped by an error in the workload (its model, data or step); carries the record,
    already saved as failed with every step measured before the error."""

    def __init__(self, record: RunRecord, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.record = record


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM through the CLI) during a run; carries the partial record, already saved."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__(f"interrupted; partial record {record.id}")
        self.record = record


@dataclass(frozen=True)
class BenchSettings:
    """What to measure. ``batch_sizes`` None means the workload's default for the preset."""

    workload: str
    preset: str = "tiny"
    batch_sizes: tuple[int, ...] | None = None
    steps: int = 20
    warmup: int = 5
    device: str = "auto"
    data: str = "memory"
    workers: int | None = None
    seed: int = 0
    data_dir: Path | None = None
    #: Profile where each step's time goes (the stage breakdown), not only its wall time.
    stages: bool = False
    #: Then time every layer in as many more steps (after two operator-timed steps, the first counted);
    #: implies stages, whose forward and backward times the layer times are checked against.
    layers: bool = False
    #: The calibrated hardware profile (``HardwareProfile.to_dict()``) that layer efficiencies use.
    hardware: dict[str, Any] | None = None
    #: Then track one more step's memory by data structure (see probes/memory.py).
    memory: bool = False

    @property
    def steps_per_point(self) -> int:
        """Steps run at each batch size: warm-up, measured, with layers the instrumented ones, with memory
        the tracked step and the resident cross-check's."""
        return self.warmup + self.steps + (self.steps + 3 if self.layers else 0) + (2 if self.memory else 0)

    def record_settings(
        self, batch_sizes: Sequence[int], device: str, torch_threads: int | None
    ) -> BenchRunSettings:
        """The record's settings: these, with the batch sizes and the device resolved (the hardware
        profile is kept with the layers it describes)."""
        return BenchRunSettings(
            workload=self.workload,
            preset=self.preset,
            batch_sizes=list(batch_sizes),
            steps=self.steps,
            warmup=self.warmup,
            device=device,
            data=self.data,
            workers=self.workers,
            seed=self.seed,
            data_dir=str(self.data_dir) if self.data_dir is not None else None,
            stages=self.stages,
            layers=self.layers,
            memory=self.memory,
            requested_device=self.device,
            torch_threads=torch_threads,
        )

    def validate(self) -> None:
        if self.steps <= 0:
            raise UsageError(f"--steps must be a positive integer, got {self.steps}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be zero or more, got {self.warmup}")
        for b in self.batch_sizes or ():
            if b <= 0:
                raise UsageError(f"batch size must be a positive integer, got {b}")
        if self.workers is not None and not 0 <= self.workers <= MAX_WORKERS:
            raise UsageError(f"--workers must be between 0 and {MAX_WORKERS}, got {self.workers}")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be between 0 and 2**32 - 1, got {self.seed}")
        data_dir = Path(self.data_dir) if self.data_dir is not None else None
        if self.data == "disk" and data_dir is not None and data_dir.exists() and not data_dir.is_dir():
            raise UsageError(f"--data-dir {self.data_dir} is not a directory")


def bench(
    settings: BenchSettings,
    store: RunStore | None = None,
    *,
    command: Sequence[str] = (),
    on_step: StepCallback | None = None,
    checkpoint_s: float = 1.0,
    hooks: RunHooks | None = None,
) -> RunRecord:
    """Train and time ``settings.steps`` steps at each batch size; return (and store) the record.

    A batch size that runs out of memory is recorded as ``oom`` and the sweep goes on. Ctrl-C saves
    the record as ``partial`` and re-raises KeyboardInterrupt; any other error saves it as ``failed``.
    """
    settings.validate()
    workload = get_workload(settings.workload)
    device = resolve_device(settings.device)
    fmt = workload.data(settings.preset)
    if settings.data == "disk" and not fmt.storable:
        raise UsageError(f"{workload.name}: {fmt.why_not_storable}; --data disk does not apply")
    batch_sizes = settings.batch_sizes or (workload.batch_size(settings.preset),)
    if settings.data == "disk":  # written, checked, rebuilt or refused before there is a record
        for batch_size in batch_sizes:
            samples = dataset_size(batch_size, DISK_SAMPLES.get(settings.preset, 64))
            ensure_dataset(fmt, samples, settings.seed, settings.data_dir)
    record = RunRecord.start(
        "profile" if settings.stages or settings.layers or settings.memory else "bench",
        workload_section(workload, settings.preset),
        settings.record_settings(batch_sizes, str(device), torch.get_num_threads()),
        command=command,
    )
    if hooks is not None:
        hooks.on_record(record)
    saver = _Saver(store, record, checkpoint_s)
    saver.save()
    keep = True
    try:
        for batch_size in batch_sizes:
            point = Point(batch_size=batch_size)
            record.points.append(point)
            _measure_point(workload, settings, device, point, saver, on_step, hooks)
        record.status = "complete"
    except KeyboardInterrupt as interrupt:
        record.status = "partial"
        raise Interrupted(record) from interrupt
    except CorruptDataset as corrupt:
        # A dataset damaged during the run: a record with no measured step would only be a failed run
        # that measured nothing, so it is removed; one with measured steps keeps them.
        record.status = "failed"
        record.error = str(corrupt)
        measured = sum(len(p.step_s) for p in record.points)
        keep = measured > 0
        if keep:
            raise CorruptDataset(
                f"{corrupt} ({measured} measured steps kept in failed record {record.id})"
            ) from None
        raise
    except UsageError:
        record.status = "failed"
        raise
    except Exception as error:
        record.status = "failed"
        record.error = f"{type(error).__name__}: {error}"
        raise RunFailed(record, error) from error
    except BaseException as error:
        record.status = "failed"
        record.error = f"{type(error).__name__}: {error}"
        raise
    finally:
        record.finished = utc_now()
        if keep:
            saver.save()
        else:
            saver.discard()
    return record


def _measure_point(
    workload: Workload,
    settings: BenchSettings,
    device: torch.device,
    point: Point,
    saver: _Saver,
    on_step: StepCallback | None,
    hooks: RunHooks | None = None,
) -> None:
    task = source = None
    try:
        with current(device):
            torch.manual_seed(settings.seed)
            task = workload.build(settings.preset, device)
            if hooks is not None:
                task = hooks.on_task(task, workload)
            source = open_source(
                workload.data(settings.preset),
                settings.data,
                point.batch_size,
                seed=settings.seed,
                workers=settings.workers,
                data_dir=settings.data_dir,
                min_samples=DISK_SAMPLES.get(settings.preset, 64),
                pin=device.type == "cuda",
            )
            if hooks is not None:
                source = hooks.on_source(source, point.batch_size)
            synchronize(device)  # model initialisation runs asynchronously on a GPU: keep it out of step 1
            _train_steps(task, source, device, settings, point, saver, on_step, hooks)
        point.status = "complete"
    except KeyboardInterrupt:
        point.status = "partial"
        if point.stages is not None:
            point.stages.status = "partial"
        raise
    except Exception as error:
        if point.stages is not None:
            point.stages.status = "partial"
        if not is_out_of_memory(error):
            point.status = "failed"
            point.error = f"{type(error).__name__}: {error}"
            raise
        point.status = "oom"
        point.error = (str(error).splitlines() or [type(error).__name__])[0][:300]
    finally:
        if source is not None:
            source.close()
        if task is not None:
            task.close()
        del task, source
        _release_memory(device)


def _train_steps(
    task: Task,
    source: BatchSource,
    device: torch.device,
    settings: BenchSettings,
    point: Point,
    saver: _Saver,
    on_step: StepCallback | None,
    hooks: RunHooks | None = None,
) -> None:
    """The timed loop. Its own function so that the last batch and loss are freed when it returns."""
    profile_stages = settings.stages or settings.layers
    clock = StageClock(device) if profile_stages else WallClock(device)
    if profile_stages:
        point.stages = StageBreakdown(
            timing="cuda-events" if device.type == "cuda" else "host-clock", data_workers=source.workers
        )
    cpu = CpuMeter()
    total = settings.warmup + settings.steps
    try:
        for index in range(total):
            measured = index >= settings.warmup
            if measured and not cpu.started:
                cpu.start()
            timing, data_times, loss = timed_step(task, source, device, clock)
            (point.step_s if measured else point.warmup_s).append(timing.wall_s)
            point.loss.append(_as_float(loss))
            if measured and point.stages is not None:
                point.stages.add(timing.wall_s, timing.stages, point.batch_size, data_times)
                point.stages.cpu = cpu.read()
            if hooks is not None:
                hooks.after_step(point, loss, measured)
            if on_step is not None:
                on_step(point.batch_size, index + 1, settings.steps_per_point)
            saver.maybe_save()
    finally:
        clock.close()  # the stage clock's garbage-collector callback, also when a step raised
    if settings.layers:
        _layer_steps(task, source, device, settings, point, saver, on_step)
    if settings.memory:
        _memory_steps(task, source, device, settings, point, saver, on_step, hooks)


def _memory_steps(
    task: Task,
    source: BatchSource,
    device: torch.device,
    settings: BenchSettings,
    point: Point,
    saver: _Saver,
    on_step: StepCallback | None,
    hooks: RunHooks | None = None,
) -> None:
    """One more step with its memory tracked (hooks and profiler gone after), then one plain step for
    the resident-memory cross-check: its heap trim makes the step it measures fault every page in
    again (+15% to +30% on the small presets), so it is not paid by the tracked step
    (docs/memory.md). Its resident figures and page faults replace the tracked step's. A distributed
    rank then hands its memory to the hooks (every rank's is gathered on rank 0)."""
    batch = _next_batch(source, device)
    tracker = MemoryTracker(task.model, task.optimizers(), batch, device=device, resident=False)
    with tracker:
        task.step(batch, tracker)
        synchronize(device)
    point.memory = tracker.result()
    batch = _next_batch(source, device)
    with ResidentGrowth(trim=True) as resident:
        task.step(batch)
        synchronize(device)
    point.memory.subsystem.update(resident.result())
    if hooks is not None:
        hooks.after_memory(point)
    if on_step is not None:
        on_step(point.batch_size, settings.steps_per_point, settings.steps_per_point)
    saver.maybe_save()


def _next_batch(source: BatchSource, device: torch.device) -> Any:
    host_batch = next(source)
    pop_data_times(host_batch)
    batch = to_device(host_batch, device)
    synchronize(device)
    return batch


def _layer_steps(
    task: Task,
    source: BatchSource,
    device: torch.device,
    settings: BenchSettings,
    point: Point,
    saver: _Saver,
    on_step: StepCallback | None,
) -> None:
    """Two operator-timed steps (the first also counted: FLOPs, bytes, libraries), one layer-timed
    warm-up step, then ``settings.steps`` layer-timed steps. Every hook and the dispatch mode are
    gone when this returns, also on error."""
    timing = "cuda-kernels" if device.type == "cuda" else "host-clock"
    done = settings.warmup + settings.steps
    total = settings.steps_per_point

    def progress(index: int) -> None:
        if on_step is not None:
            on_step(point.batch_size, done + index + 1, total)
        saver.maybe_save()

    counter = OpCounter(task.model, count=True, timed=True, device=device)
    op_tables: list[list[OpRecord]] = []
    with counter:
        timed_step(task, source, device, CountingStages(WallClock(device), counter))
        module_calls, counted = dict(counter.module_calls), counter.take_step()
        op_tables.append(counted)
        progress(0)
        counter.count = False
        timed_step(task, source, device, CountingStages(WallClock(device), counter))
        op_tables.append(counter.take_step())
        progress(1)
    layer_tables: list[dict[str, dict[str, float]]] = []
    step_s: list[float] = []
    clock = StageClock(device)
    # On CUDA the layers are their kernels' device time, and work outside them is measured against the
    # measured steps' stages: the instrumented step's own are stretched by the tracing of it.
    measured: dict[str, float] | None = None
    if device.type == "cuda" and point.stages is not None and point.stages.wall_s:
        measured = {n: Samples.of(v).median for n, v in point.stages.steps.items()}
    try:
        with LayerTimer(task.model, device) as timer:
            for index in range(settings.steps + 1):
                step_timing, _, _ = timed_step(task, source, device, clock)
                table = with_outside_the_model(timer.take_step(), measured or step_timing.stages)
                if index > 0:  # the first warms up the hooks' own paths
                    layer_tables.append(table)
                    step_s.append(step_timing.wall_s)
                    point.layers = build_profile(
                        task.model,
                        counted,
                        module_calls,
                        op_tables,
                        step_s,
                        timing,
                        counter.formula_errors,
                        layer_tables,
                    )
                    point.layers.hardware = settings.hardware
                progress(2 + index)
    finally:
        clock.close()


def timed_step(
    task: Task, source: BatchSource, device: torch.device, clock: WallClock
) -> tuple[StepTiming, dict[str, float] | None, torch.Tensor]:
    """One training step as the runner measures it: fetch the batch, copy it to the device, step,
    synchronise. Returns the clock's timing, the data-making times the batch carried, and the loss."""
    stop_if_requested()
    clock.begin_step()
    with clock("data_wait"):
        host_batch = next(source)
    data_times = pop_data_times(host_batch)
    with clock("copy"):
        batch = to_device(host_batch, device)
    loss = task.step(batch, clock)
    synchronize(device)
    return clock.end_step(), data_times, loss


def _as_float(loss: torch.Tensor | None) -> float | None:
    if loss is None:
        return None
    value = float(loss)
    return value if math.isfinite(value) else None


def _release_memory(device: torch.device) -> None:
    """Free what the last batch size held so the next one starts clean (and an OOM can recover)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def workload_section(workload: Workload, preset: str) -> dict:
    """The record's workload section: name, domain, preset, parameters (counted on the meta device)."""
    config = workload.config(preset)
    with torch.device("meta"):  # count parameters without allocating them
        parameters = count_parameters(workload.build(preset, "meta").model)
    return {
        "name": workload.name,
        "domain": workload.domain,
        "preset": preset,
        "parameters": parameters,
        "sample_unit": workload.sample_unit,
        "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config),
    }


class _Saver:
    """Saves the record now, or when ``interval`` seconds have passed since the last save."""

    def __init__(self, store: RunStore | None, record: RunRecord, interval: float) -> None:
        self.store, self.record, self.interval = store, record, interval
        self.last = -math.inf

    def save(self) -> None:
        if self.store is not None:
            self.store.save(self.record)
        self.last = time.monotonic()

    def discard(self) -> None:
        """Remove the record saved so far."""
        if self.store is not None:
            self.store.path(self.record.id).unlink(missing_ok=True)

    def maybe_save(self) -> None:
        if time.monotonic() - self.last >= self.interval:
            self.save()
