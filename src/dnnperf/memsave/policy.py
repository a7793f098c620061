"""What to do with each layer's saved activations: keep, offload or recompute.

A *unit* is a layer the policies apply to: the model is walked from its root and containers
(``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``, the root itself) are opened, so a unit is a
leaf layer or a block (a ResNet bottleneck, a transformer layer). Recomputed units are grouped into
*segments*: consecutive units of one ``nn.Sequential`` can be checkpointed together (only the
segment's input is kept), any other unit is a segment of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from dnnperf.errors import UsageError

KEEP, OFFLOAD, RECOMPUTE = "keep", "offload", "recompute"
POLICIES = (KEEP, OFFLOAD, RECOMPUTE)
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


@dataclass(frozen=True)
class Unit:
    """One layer or block a policy applies to, in forward (registration) order."""

    name: str
    #: The ``nn.Sequential`` this unit is a direct child of ("" when none): segments stay inside one.
    sequential: str | None
    #: Position among that Sequential's children.
    index: int


def find_units(model: nn.Module) -> list[Unit]:
    """The model's units: its layers and blocks, containers opened, in registration order."""
    units: list[Unit] = []

    def walk(module: nn.Module, name: str, is_root: bool) -> None:
        children = list(module.named_children())
        if children and (is_root or isinstance(module, _CONTAINERS)):
            for index, (child_name, child) in enumerate(children):
                full = f"{name}.{child_name}" if name else child_name
                if not children_or_container(child):
                    units.append(Unit(full, name if isinstance(module, nn.Sequential) else None, index))
                else:
                    walk(child, full, False)
            return
        if not is_root:
            units.append(Unit(name, None, 0))

    def children_or_container(module: nn.Module) -> bool:
        return isinstance(module, _CONTAINERS) and any(True for _ in module.children())

    walk(model, "", True)
    if not units:  # a model without children: the whole model is the one unit
        units.append(Unit("", None, 0))
    return units


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

    def validate(self, units: Iterable[Unit]) -> None:
        """A one-line error for unknown units, policies, or segments that cannot be checkpointed."""
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


def segments_of(
    units: list[Unit],
    policies: Mapping[str, str],
    max_bytes: float = float("inf"),
    saved: Mapping[str, int] | None = None,
) -> list[list[str]]:
    """Maximal runs of recomputed units of one Sequential (cut when a run's saved bytes would pass
    ``max_bytes``: one large recomputed segment recreates the peak in backward)."""
    segments: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    previous: Unit | None = None
    for unit in units:
        if policies.get(unit.name, KEEP) != RECOMPUTE:
            previous = None
            if current:
                segments.append(current)
            current, current_bytes = [], 0
            continue
        size = (saved or {}).get(unit.name, 0)
        joins = (
            current
            and previous is not None
            and unit.sequential is not None
            and unit.sequential == previous.sequential
            and unit.index == previous.index + 1
            and current_bytes + size <= max_bytes
        )
        if not joins and current:
            segments.append(current)
            current, current_bytes = [], 0
        current.append(unit.name)
        current_bytes += size
        previous = unit
    if current:
        segments.append(current)
    return segments


def plan_of(units: list[Unit], policies: Mapping[str, str], **settings: Any) -> Plan:
    """A plan from per-unit policies, recompute segments as long as they can be."""
    policies = {k: v for k, v in policies.items() if v != KEEP}
    return Plan(policies=policies, segments=segments_of(units, policies), **settings)
