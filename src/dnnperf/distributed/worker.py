"""One rank of a distributed run, under torchrun (ours or the user's) or the network-namespace launcher.

The rank initialises the default process group (gloo on CPU, NCCL on CUDA with device
cuda:LOCAL_RANK), then runs the ordinary measuring loop (``runner.bench``) with :class:`RankHooks`:
the task is wrapped for the strategy, dp ranks take their shard of the global batch, and after every
step each rank's measurements are gathered on rank 0, which alone writes the run record.

Batch semantics: ``--batch-size`` is the global batch, the batch single-process training would take.
dp, fsdp and zero1: every rank makes the same global batch (same seed) and trains on its contiguous
1/N slice; the averaged gradients then equal the single-process gradient of the global batch's mean
loss. pp and tp: every rank gets the whole global batch (the model is split, not the data).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import socket
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dnnperf.data.sources import BatchSource
from dnnperf.devices import resolve_device
from dnnperf.distributed import DATA_PARALLEL, DistributedSettings
from dnnperf.distributed.ddp import DataParallelTask, check_divisible
from dnnperf.distributed.gather import gather_json
from dnnperf.distributed.heartbeat import Heartbeat
from dnnperf.distributed.lifeline import ENV_RANK_DIR
from dnnperf.errors import UsageError
from dnnperf.results.ranks import RankBreakdown
from dnnperf.results.record import Point, RunRecord, json_safe
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, RunFailed, StepCallback, bench
from dnnperf.workloads.base import Batch, Stages, Task, Workload, no_stages

ENV_RUN_ID = "DNNPERF_RUN_ID"
ENV_LAUNCHED = "DNNPERF_LAUNCHED"

# Model-parallel strategies live in their own modules: strategy -> (module, function).
_MODEL_PARALLEL = {
    "pp": ("dnnperf.distributed.pipeline", "pipeline_task"),
    "tp": ("dnnperf.distributed.tensor_parallel", "tensor_parallel_task"),
}


def in_torchrun() -> bool:
    """True in a process started by torchrun (or our launcher) as one rank of a job."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched() -> bool:
    """True when dnnperf's own launcher started this rank (it then prints the results itself)."""
    return os.environ.get(ENV_LAUNCHED) == "1"


def model_parallel_available(strategy: str) -> bool:
    module, _ = _MODEL_PARALLEL[strategy]
    return importlib.util.find_spec(module) is not None


def strategy_task(task: Task, workload: Workload, config: DistributedSettings, device: torch.device) -> Task:
    """The task as this rank runs it under the strategy."""
    if config.strategy == "dp":
        return DataParallelTask(task, workload.name, device, config.bucket_cap_mb)
    if config.strategy == "fsdp":
        from dnnperf.distributed.sharded import FullyShardedTask, check_mixed_precision

        check_mixed_precision(config.mixed_precision, device)
        return FullyShardedTask(task, workload.name, config.reshard_after_forward, config.mixed_precision)
    if config.strategy == "zero1":
        from dnnperf.distributed.sharded import ZeroOneTask

        return ZeroOneTask(task, workload.name, device, config.bucket_cap_mb)
    module_name, function = _MODEL_PARALLEL[config.strategy]
    if not model_parallel_available(config.strategy):
        raise UsageError(f"--strategy {config.strategy} is not available ({module_name} is missing)")
    module = importlib.import_module(module_name)
    if config.strategy == "pp":
        return module.pipeline_task(
            task, workload.name, schedule=config.schedule, microbatches=config.microbatches
        )
    return getattr(module, function)(task, workload.name)


class ShardSource(BatchSource):
    """dp, fsdp, zero1: this rank's contiguous slice of every global batch (dim 0 of each tensor)."""

    def __init__(self, source: BatchSource, rank: int, world: int) -> None:
        self.source, self.rank, self.world = source, rank, world
        self.workers = source.workers

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = next(self.source)
        return {key: _shard(value, self.rank, self.world) for key, value in batch.items()}

    def close(self) -> None:
        self.source.close()


def _shard(value: Any, rank: int, world: int) -> Any:
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.dtype == torch.float64:
        return value  # the data times a disk batch carries (float64) describe the whole global batch
    size = value.shape[0] // world
    return value[rank * size : (rank + 1) * size]


class _TrackedTask(Task):
    """The strategy's task, noting the step's clock so the heartbeat can say where the rank is."""

    def __init__(self, inner: Task) -> None:
        self.inner = inner
        self.model = inner.model
        self.clock: Any = None

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        self.clock = stages
        return self.inner.step(batch, stages)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self.inner.optimizers()

    def close(self) -> None:
        self.inner.close()

    def where(self) -> tuple[str, int]:
        timer = getattr(self.inner, "timer", None)
        return str(getattr(self.clock, "current", "step")), getattr(timer, "launches", 0)


class RankHooks:
    """What the runner calls on every rank (see ``runner.RunHooks``)."""

    def __init__(
        self,
        config: DistributedSettings,
        settings: BenchSettings,
        device: torch.device,
        heartbeat: Heartbeat | None,
    ) -> None:
        self.config, self.settings, self.device, self.heartbeat = config, settings, device, heartbeat
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())
        self.task: _TrackedTask | None = None

    def on_record(self, record: RunRecord) -> None:
        if os.environ.get(ENV_RUN_ID):
            record.id = os.environ[ENV_RUN_ID]
        record.settings["distributed"] = {
            "strategy": self.config.strategy,
            "world_size": self.world,
            "backend": self.backend,
            "batch": "global",  # batch_sizes are global batches; see docs/distributed.md
            "rank_threads": torch.get_num_threads(),
            "timeout_s": self.config.timeout_s,
            **(
                {"bucket_cap_mb": self.config.bucket_cap_mb}
                if self.config.strategy in ("dp", "zero1")
                else {}
            ),
            **(
                {
                    "reshard_after_forward": self.config.reshard_after_forward,
                    "mixed_precision": self.config.mixed_precision,
                }
                if self.config.strategy == "fsdp"
                else {}
            ),
            **(
                {"schedule": self.config.schedule, "microbatches": self.config.microbatches}
                if self.config.strategy == "pp"
                else {}
            ),
            "netns": (
                {"link_mbit": self.config.link_mbit, "link_delay_ms": self.config.link_delay_ms}
                if self.config.netns
                else None
            ),
        }

    def on_task(self, task: Task, workload: Workload) -> Task:
        self.task = _TrackedTask(strategy_task(task, workload, self.config, self.device))
        if self.heartbeat is not None:
            self.heartbeat.where = self.task.where
        return self.task

    def on_source(self, source: BatchSource, batch_size: int) -> BatchSource:
        if self.config.strategy not in DATA_PARALLEL:
            return source
        try:
            check_divisible(batch_size, self.world, self.config.strategy)
        except UsageError:
            source.close()
            raise
        return ShardSource(source, self.rank, self.world)

    def after_step(self, point: Point, loss: torch.Tensor | None, measured: bool) -> None:
        """Gather this step's measurements from every rank on rank 0 (a collective: every rank calls
        it after every step, outside the timed step)."""
        inner = self.task.inner if self.task is not None else None
        timer = getattr(inner, "timer", None)
        value = float(loss) if loss is not None else math.nan
        report: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": str(self.device),
            "loss": value if math.isfinite(value) else None,
            "buckets": timer.take_step() if timer is not None else [],
            "detail": dict(inner.last_step_detail()) if hasattr(inner, "last_step_detail") else {},
        }
        if measured and point.stages is not None:
            report["wall_s"] = point.stages.wall_s[-1]
            report["stages"] = {name: values[-1] for name, values in point.stages.steps.items()}
        reports = gather_json(report, self.device)
        if self.heartbeat is not None:
            self.heartbeat.step_done()
        if reports is not None:
            losses = [r["loss"] for r in reports]
            if self.config.strategy in DATA_PARALLEL:  # each rank's loss is its shard's mean: average them
                point.loss[-1] = None if None in losses else sum(losses) / len(losses)
            if measured:
                if point.ranks is None:
                    timing = "cuda-events" if self.device.type == "cuda" else "host-clock"
                    point.ranks = RankBreakdown(self.config.strategy, self.world, self.backend, timing)
                point.ranks.add_step(reports)
        done = len(point.step_s) == self.settings.steps
        if measured and done and self.config.save_params is not None and self.rank == 0 and self.task:
            save_parameters(self.task.inner, self.config.save_params)

    def after_memory(self, point: Point) -> None:
        """Gather every rank's tracked step on rank 0 (a collective, after the timed steps)."""
        memory = json_safe(point.memory.to_dict()) if point.memory is not None else None
        reports = gather_json(memory, self.device)
        if reports is not None and point.ranks is not None and None not in reports:
            point.ranks.add_memory(reports)


def save_parameters(task: Task, path: Path) -> None:
    """The replica's parameters as a NumPy .npz (no pickle), written atomically."""
    module = getattr(task, "module", task.model)
    arrays = {name: p.detach().cpu().numpy() for name, p in module.named_parameters()}
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rank_device(settings: BenchSettings) -> torch.device:
    """cuda:LOCAL_RANK when the run is on CUDA, else the CPU."""
    device = resolve_device(settings.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def run_rank(
    settings: BenchSettings,
    config: DistributedSettings,
    store: RunStore | None,
    *,
    command: list[str],
    on_step: StepCallback | None = None,
) -> RunRecord | None:
    """Run this rank's share of the run; rank 0 returns (and stores) the record, the others None."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    threads = config.rank_threads or (1 if local_world > 1 else None)
    if threads:
        torch.set_num_threads(threads)
    device = rank_device(settings)
    settings = dataclasses.replace(settings, device=str(device))
    directory = os.environ.get(ENV_RANK_DIR)
    heartbeat = Heartbeat(Path(directory), int(os.environ["RANK"])).start() if directory else None
    state, error = "failed", None
    try:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            # Launched by us, the launcher's watchdog names a hung rank after timeout_s; the collectives'
            # own timeout is the backstop. Under the user's torchrun it is the only guard.
            timeout=timedelta(seconds=config.timeout_s * (2 if heartbeat is not None else 1)),
            device_id=device if device.type == "cuda" else None,
        )
        rank = dist.get_rank()
        hooks = RankHooks(config, settings, device, heartbeat)
        record = bench(
            settings,
            store if rank == 0 else None,
            command=command,
            on_step=on_step if rank == 0 else None,
            hooks=hooks,
        )
        state = "done"
        return record if rank == 0 else None
    except KeyboardInterrupt:
        state = "interrupted"
        raise
    except UsageError as usage:
        state, error = "usage", str(usage)
        raise
    except BaseException as failure:
        error = str(failure) if isinstance(failure, RunFailed) else f"{type(failure).__name__}: {failure}"
        raise
    finally:
        if heartbeat is not None:
            heartbeat.finish(state, error)
        if dist.is_initialized():
            dist.destroy_process_group()
