"""Where each training step's time went, stage by stage, as a value (measured by
``dnnperf.probes.stages``: the stage profiler and the suite's stage clock).

Stages, in data-flow order (``STAGE_ORDER``): ``read`` and ``preprocess`` (when the training process
makes its own batches), ``data_wait`` (the rest of the time spent getting the batch: with DataLoader
workers, the time the loop was exposed to them), ``copy`` (host to device), ``environment``
(reinforcement learning's play), ``forward`` (with the loss), ``backward``, ``update``, ``exchange``
(gradient exchange under data parallelism), ``python_gc`` (the garbage collector's pauses) and
``other``, everything in the step no stage claims. Work done inside DataLoader workers is reported
beside the step (``worker``), since it overlaps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dnnperf.stats import Samples

#: The time of a step no stage claims.
OTHER = "other"
#: Pauses of Python's garbage collector inside a step.
GC = "python_gc"
STAGE_ORDER = (
    "read",
    "preprocess",
    "data_wait",
    "copy",
    "environment",
    "forward",
    "backward",
    "update",
    "exchange",
    GC,
    OTHER,
)


@dataclass
class StageBreakdown:
    """Per-step seconds of every stage over the measured steps, with what surrounds them."""

    #: Stage name -> seconds in each measured step (every list as long as ``wall_s``).
    steps: dict[str, list[float]] = field(default_factory=dict)
    #: Wall time of each measured step.
    wall_s: list[float] = field(default_factory=list)
    #: Work done inside DataLoader workers for each step's batch (read, preprocess), if any.
    worker: dict[str, list[float]] = field(default_factory=dict)
    data_workers: int = 0
    samples_per_step: list[int] = field(default_factory=list)
    #: "cuda-events" or "host-clock".
    timing: str = "host-clock"
    cpu: dict[str, float] = field(default_factory=dict)
    #: "complete", or "partial" when the loop ended with an error (the steps before it are kept).
    status: str = "complete"

    def add(
        self,
        wall_s: float,
        stages: Mapping[str, float],
        samples: int,
        data_times: Mapping[str, float] | None,
    ) -> None:
        """Append one step: its wall time and the seconds of each stage the clock cut. Batches made in
        the training process split ``data_wait`` into read, preprocess (with collation) and the
        remaining loader overhead; batches made by workers keep ``data_wait`` whole (the exposed wait)
        and their work goes to ``worker``."""
        stages = dict(stages)
        if data_times is not None:
            read, preprocess = data_times["read"], data_times["preprocess"] + data_times["collate"]
            if self.data_workers == 0:
                wait = stages.get("data_wait", 0.0)
                if read + preprocess > wait > 0:  # clocks disagree by a hair: the wait is the bound
                    read, preprocess = (
                        read * wait / (read + preprocess),
                        preprocess * wait / (read + preprocess),
                    )
                stages["read"], stages["preprocess"] = read, preprocess
                stages["data_wait"] = max(wait - read - preprocess, 0.0)
            else:
                self.worker.setdefault("read", []).append(read)
                self.worker.setdefault("preprocess", []).append(preprocess)
        index = len(self.wall_s)
        for name in set(stages) | set(self.steps):
            self.steps.setdefault(name, [0.0] * index).append(stages.get(name, 0.0))
        self.wall_s.append(wall_s)
        self.samples_per_step.append(samples)

    def names(self) -> list[str]:
        """Stages that took any time, in data-flow order (``other`` always shown, last)."""
        known = [n for n in STAGE_ORDER if n in self.steps and (n == OTHER or any(self.steps[n]))]
        extra = sorted(n for n in self.steps if n not in STAGE_ORDER)
        return [n for n in known if n != OTHER] + extra + [OTHER]

    def summary(self) -> dict[str, Any]:
        """Median, p10, p90 per stage, each stage's share of the total step time (shares of summed
        times, so they add up to 1), throughput, and the closure error of the worst step."""
        total_wall = sum(self.wall_s)
        stages = {}
        for name in self.names():
            values = self.steps.get(name, [0.0] * len(self.wall_s))
            samples = Samples.of(values)
            stages[name] = {
                "median": samples.median,
                "p10": samples.p10,
                "p90": samples.p90,
                "share": sum(values) / total_wall if total_wall > 0 else float("nan"),
            }
        worker = {
            name: {**Samples.of(values).summary(), "total_s": sum(values)}
            for name, values in self.worker.items()
        }
        closure = [
            abs(sum(self.steps[n][i] for n in self.steps) - wall) / wall for i, wall in enumerate(self.wall_s)
        ]
        return {
            "stages": stages,
            "worker": worker,
            "step_time_s": Samples.of(self.wall_s).summary(),
            "samples_per_s": sum(self.samples_per_step) / total_wall if total_wall > 0 else None,
            "max_closure_error": max(closure, default=0.0),
            "cpu": self.cpu,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "timing": self.timing,
            "data_workers": self.data_workers,
            "wall_s": self.wall_s,
            "samples_per_step": self.samples_per_step,
            "steps": {n: self.steps[n] for n in self.names() if n in self.steps},
            "worker": self.worker,
            "cpu": self.cpu,
            "summary": self.summary(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageBreakdown:
        return cls(
            steps={k: list(v) for k, v in data["steps"].items()},
            wall_s=list(data["wall_s"]),
            worker={k: list(v) for k, v in data.get("worker", {}).items()},
            data_workers=int(data.get("data_workers", 0)),
            samples_per_step=list(data.get("samples_per_step", [])),
            timing=str(data.get("timing", "host-clock")),
            cpu=dict(data.get("cpu", {})),
            status=str(data.get("status", "complete")),
        )
