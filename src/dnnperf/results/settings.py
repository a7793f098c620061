"""The ``settings`` section a run record starts with: what the run was asked to do, one typed value per
kind of run (the fields and their meaning are in docs/run-record.md; results/fields.py checks them on
load). ``to_dict`` gives the section as stored, fields in the order declared."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class RunSettings:
    """What every record's settings say: the device it ran on and where its data came from."""

    device: str
    data: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass
class TrainingSettings(RunSettings):
    """What every run that trains a suite workload says first."""

    workload: str
    preset: str
    batch_sizes: list[int]
    steps: int
    warmup: int
    #: The resolved device; ``requested_device`` keeps what was asked ("auto").
    device: str


@dataclass
class BenchRunSettings(TrainingSettings):
    """``dnnperf bench`` and ``dnnperf profile``: the suite's training loop at each batch size."""

    #: memory | disk
    data: str
    #: DataLoader workers asked for (None: the default).
    workers: int | None
    seed: int
    data_dir: str | None
    stages: bool
    layers: bool
    memory: bool
    requested_device: str
    #: torch's intra-op threads (None where torch does not train: the other frameworks).
    torch_threads: int | None


@dataclass
class FrameworkBenchSettings(BenchRunSettings):
    """``dnnperf bench --framework F``: the workload trained by another framework in a watched child."""

    framework: str
    #: What dnnperf cannot see in the framework.
    limitations: str
    watch_interval_s: float


@dataclass
class WatchSettings(RunSettings):
    """``dnnperf watch``: a command's process tree, sampled."""

    #: "cuda" with GPU series, else "cpu".
    device: str
    #: Always "external": the command's data is its own.
    data: str
    interval_s: float


@dataclass
class MemsaveSettings(TrainingSettings):
    """``dnnperf memsave``: a plan under a memory budget, run beside the plain steps (``steps``: paired
    steps per variant)."""

    requested_device: str
    data: str
    #: The budget as typed.
    budget: str
    #: ``--state``.
    training_state: str
    offload_dir: str | None
    torch_threads: int


@dataclass
class PredictSettings(RunSettings):
    """``dnnperf predict --sweep``: the performance model's what-if table."""

    workload: str
    preset: str
    batch_sizes: list[int]
    #: "predicted: <machine>".
    device: str
    #: Always "none": nothing ran.
    data: str
    #: The machine as typed.
    machine: str
    strategies: list[str]
    sweep: list[str]


@dataclass
class ValidateSettings(RunSettings):
    """``dnnperf validate``: runs and collectives, measured beside predicted."""

    device: str
    data: str
    batch_sizes: list[int]
    steps: int
    #: ``--distributed``'s strategies as typed (None: single-process runs).
    distributed: str | None
    memory: bool
    collectives: bool
    hw: str | None
