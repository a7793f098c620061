"""The ``ranks`` section of a distributed point, as a value: every rank's own measured steps, side by
side, gathered on rank 0 (the analyses over it are in :mod:`dnnperf.distributed.ranks`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dnnperf.results.memory import StepMemory, step_memory_from_document

#: Per-step seconds a model-parallel task reports through ``last_step_detail()`` (pipeline: send,
#: recv, bubble; tensor parallel: collective; both: compute).
DETAIL_NAMES = ("compute", "send", "recv", "bubble", "collective")
#: Stages that are waiting for other ranks rather than working.
WAIT_STAGES = ("exchange",)
#: Optional parts of a dp bucket's ``seconds`` (launch to completion), which they add up to: waiting
#: for the last rank to launch it, for a free lane of the process group, other buckets' collectives
#: sharing the link meanwhile (``ddp.split_wait``; absent from older records) and its own share.
BUCKET_PARTS = ("skew_s", "queued_s", "shared_s", "allreduce_s")


@dataclass
class RankSteps:
    """One rank's measured steps (every list has one value per measured step)."""

    rank: int
    host: str = ""
    pid: int = 0
    device: str = "cpu"
    wall_s: list[float] = field(default_factory=list)
    #: Stage name -> seconds per step, as the rank's stage clock cut them.
    stages: dict[str, list[float]] = field(default_factory=dict)
    #: A model-parallel task's ``last_step_detail()`` per step (send, recv, bubble, collective, compute).
    detail: dict[str, list[float]] = field(default_factory=dict)
    #: Data parallelism: per step, each gradient bucket's allreduce {index, bytes, seconds} (launch to
    #: completion on this rank) and its parts ``BUCKET_PARTS`` where recorded.
    buckets: list[list[dict[str, float]]] = field(default_factory=list)
    #: The rank's tracked step's memory by data structure (``--memory``), gathered after its steps.
    memory: StepMemory | None = None

    def add(self, step: dict[str, Any]) -> None:
        """Append one step as a rank reported it (see ``worker.step_payload``)."""
        index = len(self.wall_s)
        for target, values in ((self.stages, step.get("stages", {})), (self.detail, step.get("detail", {}))):
            for name in set(values) | set(target):
                target.setdefault(name, [0.0] * index).append(float(values.get(name, 0.0)))
        self.buckets.append(list(step.get("buckets", [])))
        self.wall_s.append(float(step["wall_s"]))

    def busy_s(self) -> list[float]:
        """Seconds per step this rank worked rather than waited for others: the task's own ``compute``
        when it reports one (model parallelism), else the wall time less the exposed exchange."""
        if "compute" in self.detail:
            return list(self.detail["compute"])
        waits = [self.stages.get(name, [0.0] * len(self.wall_s)) for name in WAIT_STAGES]
        return [wall - sum(w[i] for w in waits) for i, wall in enumerate(self.wall_s)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "device": self.device,
            "wall_s": self.wall_s,
            "stages": self.stages,
            "detail": self.detail,
            "buckets": self.buckets,
            **({"memory": self.memory.to_dict()} if self.memory is not None else {}),
        }


@dataclass
class RankBreakdown:
    """Every rank's measured steps at one batch size, gathered on rank 0."""

    strategy: str
    world_size: int
    backend: str
    timing: str = "host-clock"
    ranks: list[RankSteps] = field(default_factory=list)

    def add_memory(self, memories: list[dict[str, Any]]) -> None:
        """Every rank's tracked step (``StepMemory.to_dict()``, rank r's at r), after the timed steps."""
        if len(memories) != self.world_size or len(self.ranks) != self.world_size:
            raise ValueError(f"expected memory from {self.world_size} ranks, got {len(memories)}")
        for rank, memory in zip(self.ranks, memories, strict=True):
            rank.memory = StepMemory.from_dict(memory)

    def add_step(self, steps: list[dict[str, Any]]) -> None:
        """Append one measured step: ``steps[r]`` is rank r's report."""
        if len(steps) != self.world_size:
            raise ValueError(f"expected reports from {self.world_size} ranks, got {len(steps)}")
        if not self.ranks:
            self.ranks = [
                RankSteps(
                    rank=r, host=s.get("host", ""), pid=int(s.get("pid", 0)), device=s.get("device", "")
                )
                for r, s in enumerate(steps)
            ]
        for rank, step in zip(self.ranks, steps, strict=True):
            rank.add(step)

    @property
    def steps(self) -> int:
        return len(self.ranks[0].wall_s) if self.ranks else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "world_size": self.world_size,
            "backend": self.backend,
            "timing": self.timing,
            "per_rank": [rank.to_dict() for rank in self.ranks],
        }

    @classmethod
    def from_dict(cls, data: Any, steps: int) -> RankBreakdown:
        """Validate and build; ValueError says what is wrong. ``steps``: the point's measured steps
        (every rank has the same number of gathered steps, at most that many)."""
        if not isinstance(data, dict) or not isinstance(data.get("per_rank"), list):
            raise ValueError("not an object with a 'per_rank' list")
        world = data.get("world_size")
        if not isinstance(world, int) or isinstance(world, bool) or world <= 0:
            raise ValueError(f"world_size is {world!r}, not a positive integer")
        if data["per_rank"] and len(data["per_rank"]) != world:
            raise ValueError(f"per_rank holds {len(data['per_rank'])} ranks, world_size is {world}")
        breakdown = cls(
            strategy=str(data.get("strategy", "")),
            world_size=world,
            backend=str(data.get("backend", "")),
            timing=str(data.get("timing", "host-clock")),
        )
        # A step whose gathering failed (a rank died during it) is in the point's step_s but not here.
        gathered = len(data["per_rank"][0].get("wall_s") or []) if data["per_rank"] else 0
        if gathered > steps:
            raise ValueError(f"per_rank holds {gathered} steps, more than the point's {steps} measured steps")
        for index, item in enumerate(data["per_rank"]):
            breakdown.ranks.append(_rank_from_dict(item, index, gathered))
        return breakdown


def _seconds(values: Any, where: str, steps: int) -> list[float]:
    if not isinstance(values, list) or len(values) != steps:
        raise ValueError(f"{where} needs {steps} values, one per measured step")
    for value in values:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where} holds {value!r}, not a non-negative number of seconds")
    return [float(v) for v in values]


def _rank_from_dict(item: Any, index: int, steps: int) -> RankSteps:
    where = f"per_rank[{index}]"
    if not isinstance(item, dict) or item.get("rank") != index:
        raise ValueError(f"{where} is not rank {index}'s object")
    for key in ("stages", "detail"):
        if not isinstance(item.get(key, {}), dict):
            raise ValueError(f"{where}.{key} is not an object")
    buckets = item.get("buckets", [])
    if not isinstance(buckets, list) or len(buckets) != steps:
        raise ValueError(f"{where}.buckets needs {steps} lists, one per measured step")
    for step in buckets:
        for bucket in step if isinstance(step, list) else [None]:
            if not isinstance(bucket, dict) or not {"index", "bytes", "seconds"} <= bucket.keys():
                raise ValueError(f"{where}.buckets holds {bucket!r}, not an {{index, bytes, seconds}} object")
            parts = [bucket[k] for k in ("seconds", "bytes", *BUCKET_PARTS) if k in bucket]
            _seconds(parts, f"{where}.buckets", len(parts))
    return RankSteps(
        rank=index,
        host=str(item.get("host", "")),
        pid=int(item.get("pid", 0)),
        device=str(item.get("device", "")),
        wall_s=_seconds(item.get("wall_s"), f"{where}.wall_s", steps),
        stages={k: _seconds(v, f"{where}.stages.{k}", steps) for k, v in item.get("stages", {}).items()},
        detail={k: _seconds(v, f"{where}.detail.{k}", steps) for k, v in item.get("detail", {}).items()},
        buckets=buckets,
        memory=step_memory_from_document(item.get("memory"), where),
    )
