"""The ``memsave`` section of a run record (docs/run-record.md): the budget, the plan (a policy per
layer) and every variant of the step measured, baselines and plan."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dnnperf.errors import UsageError
from dnnperf.stats import Samples

KEEP, OFFLOAD, RECOMPUTE = "keep", "offload", "recompute"
POLICIES = (KEEP, OFFLOAD, RECOMPUTE)


@dataclass
class Plan:
    """A policy per unit (absent: keep) and the recompute segments (lists of unit names).

    ``min_bytes``: saved tensors smaller than this are kept whatever the policy (a copy of a few
    bytes costs more than it saves). ``prefetch_bytes``: how much backward reads ahead of use.
    ``training_state``: keep, or offload (each parameter's update fused into backward, its optimizer
    state off the device between updates: ``memsave.state.StateSaver``)."""

    policies: dict[str, str] = field(default_factory=dict)
    segments: list[list[str]] = field(default_factory=list)
    min_bytes: int = 64 * 1024
    prefetch_bytes: int = 64 * 2**20
    training_state: str = KEEP

    def policy(self, unit: str) -> str:
        return self.policies.get(unit, KEEP)

    def validate(self, units: Iterable[Any]) -> None:
        """A one-line error for unknown units (``memsave.policy.Unit``: name, sequential, index),
        policies, or segments that cannot be checkpointed."""
        if self.training_state not in (KEEP, OFFLOAD):
            raise UsageError(f"unknown training-state policy {self.training_state!r}: choose keep or offload")
        by_name = {u.name: u for u in units}
        for name, policy in self.policies.items():
            if name not in by_name:
                raise UsageError(f"plan names unknown layer {name!r}")
            if policy not in POLICIES:
                raise UsageError(f"unknown policy {policy!r} for {name!r}: choose {', '.join(POLICIES)}")
        seen: set[str] = set()
        for segment in self.segments:
            if not segment:
                raise UsageError("plan has an empty recompute segment")
            for name in segment:
                if self.policy(name) != RECOMPUTE:
                    raise UsageError(f"segment member {name!r} is not marked recompute")
                if name in seen:
                    raise UsageError(f"layer {name!r} is in two recompute segments")
                seen.add(name)
            if len(segment) > 1:
                members = [by_name[n] for n in segment]
                parents = {m.sequential for m in members}
                indices = [m.index for m in members]
                if None in parents or len(parents) > 1 or indices != list(range(indices[0], indices[-1] + 1)):
                    raise UsageError(
                        f"segment {segment[0]}..{segment[-1]} is not a run of one nn.Sequential's children"
                    )
        missing = [n for n, p in self.policies.items() if p == RECOMPUTE and n not in seen]
        if missing:
            raise UsageError(f"recompute layer {missing[0]!r} is in no segment")

    def to_dict(self) -> dict[str, Any]:
        return {
            "policies": dict(self.policies),
            "segments": [list(s) for s in self.segments],
            "min_bytes": self.min_bytes,
            "prefetch_bytes": self.prefetch_bytes,
            "training_state": self.training_state,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            policies={str(k): str(v) for k, v in data["policies"].items()},
            segments=[[str(n) for n in s] for s in data["segments"]],
            min_bytes=int(data.get("min_bytes", 0)),
            prefetch_bytes=int(data.get("prefetch_bytes", 0)),
            training_state=str(data.get("training_state", KEEP)),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


@dataclass
class Variant:
    """One way of running the step, measured: peak, paired step times, bytes to the offload tier."""

    name: str
    peak: int
    step_s: list[float]
    plain_s: list[float]
    bytes_written: int = 0
    predicted_peak: int | None = None
    predicted_overhead: float | None = None
    #: [seconds from the step's start, bytes allocated] of the tracked step.
    timeline: list[list[float]] = field(default_factory=list, repr=False)  # hundreds of points
    #: Bytes the tracked step's forward left allocated for backward (at backward's start, less the
    #: step's start): the saved activations, and what else forward holds (the loss, writes in flight).
    forward_held: int | None = None

    @property
    def overhead(self) -> float:
        """Step-time overhead over the paired plain steps (ratio of medians - 1)."""
        return Samples.of(self.step_s).median / Samples.of(self.plain_s).median - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak": self.peak,
            "step_s": self.step_s,
            "plain_s": self.plain_s,
            "overhead": self.overhead,
            "bytes_written": self.bytes_written,
            "predicted_peak": self.predicted_peak,
            "predicted_overhead": self.predicted_overhead,
            "timeline": self.timeline,
            "forward_held": self.forward_held,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variant:
        return cls(
            name=str(data["name"]),
            peak=int(data["peak"]),
            step_s=[float(v) for v in data["step_s"]],
            plain_s=[float(v) for v in data["plain_s"]],
            bytes_written=int(data.get("bytes_written", 0)),
            predicted_peak=None if data.get("predicted_peak") is None else int(data["predicted_peak"]),
            predicted_overhead=(
                None if data.get("predicted_overhead") is None else float(data["predicted_overhead"])
            ),
            timeline=[[float(t), float(b)] for t, b in data.get("timeline", [])],
            forward_held=None if data.get("forward_held") is None else int(data["forward_held"]),
        )


@dataclass
class MemsaveResult:
    """The ``memsave`` section of a run record (docs/run-record.md)."""

    budget: int
    budget_text: str
    baseline_peak: int
    feasible: bool
    reason: str
    plan: Plan
    plan_table: list[dict[str, Any]]
    variants: list[Variant]
    offload_s_per_byte: float
    bandwidth: dict[str, float]
    #: Measured / predicted recomputation seconds of the sqrt(n) baseline (planner's recompute cost
    #: scale; 1.0 in records from before it was measured).
    recompute_factor: float = 1.0
    #: The exposed seconds per offloaded byte with the training state off the device (offload-all+state
    #: over offload-state); None where the state was not measured.
    state_offload_s_per_byte: float | None = None

    def variant(self, name: str) -> Variant:
        """The measured variant ``name``; a KeyError naming those there are (an infeasible budget has
        no ``planner`` variant: ``reason`` says why)."""
        for variant in self.variants:
            if variant.name == name:
                return variant
        there = ", ".join(v.name for v in self.variants)
        why = f"; the budget is infeasible: {self.reason}" if name == "planner" and not self.feasible else ""
        raise KeyError(f"no variant {name!r} (measured: {there}){why}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "budget_text": self.budget_text,
            "baseline_peak": self.baseline_peak,
            "feasible": self.feasible,
            "reason": self.reason,
            "plan": self.plan.to_dict(),
            "plan_table": self.plan_table,
            "variants": [v.to_dict() for v in self.variants],
            "offload_s_per_byte": self.offload_s_per_byte,
            "recompute_factor": self.recompute_factor,
            "state_offload_s_per_byte": self.state_offload_s_per_byte,
            "bandwidth": self.bandwidth,
        }

    @classmethod
    def from_dict(cls, data: Any) -> MemsaveResult:
        """Validated: a ValueError (or KeyError/TypeError) says what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("memsave is not an object")
        for key in ("budget", "baseline_peak"):
            if not isinstance(data.get(key), int) or isinstance(data.get(key), bool) or data[key] <= 0:
                raise ValueError(f"memsave.{key} must be a positive byte count")
        if not isinstance(data.get("feasible"), bool):
            raise ValueError("memsave.feasible must be true or false")
        variants = data.get("variants")
        if not isinstance(variants, list) or not variants:
            raise ValueError("memsave.variants must be a non-empty list")
        parsed = [Variant.from_dict(v) for v in variants]
        for v in parsed:
            if v.peak <= 0 or not v.step_s or not v.plain_s or min(v.step_s + v.plain_s) <= 0:
                raise ValueError(f"memsave variant {v.name!r} needs a positive peak and step times")
        return cls(
            budget=data["budget"],
            budget_text=str(data.get("budget_text", data["budget"])),
            baseline_peak=data["baseline_peak"],
            feasible=data["feasible"],
            reason=str(data.get("reason", "")),
            plan=Plan.from_dict(data["plan"]),
            plan_table=list(data.get("plan_table", [])),
            variants=parsed,
            offload_s_per_byte=float(data.get("offload_s_per_byte", 0.0)),
            bandwidth={str(k): float(v) for k, v in data.get("bandwidth", {}).items()},
            recompute_factor=float(data.get("recompute_factor", 1.0)),
            state_offload_s_per_byte=(
                None
                if data.get("state_offload_s_per_byte") is None
                else float(data["state_offload_s_per_byte"])
            ),
        )
