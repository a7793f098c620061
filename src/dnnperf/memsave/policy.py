"""What to do with each layer's saved activations: keep, offload or recompute.

A *unit* is a layer the policies apply to: the model is walked from its root, to any depth, and
opened are the root, containers (``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``) and any module
that holds a stack of blocks somewhere below it (a container with two or more children of one class
that have children of their own: HF's ``transformer.h`` and ``encoder.layer``, timm's ``stages`` and
``blocks``), so a unit is a leaf layer or a block (a ResNet bottleneck, a transformer layer), never a
whole backbone. A module reached twice (shared weights) is a unit once, under its first name, as
``named_modules`` names it. Recomputed units are grouped into *segments*: consecutive units of one
``nn.Sequential`` can be checkpointed together (only the segment's input is kept), any other unit is a
segment of its own. The plan itself, a value kept in the run record, is
``dnnperf.results.memsave.Plan``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from dnnperf.results.memsave import KEEP, RECOMPUTE, Plan

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
    """The model's units: its layers and blocks, in registration order (see the module doc)."""
    units: list[Unit] = []
    seen: set[int] = set()

    def walk(module: nn.Module, name: str) -> None:
        for index, (child_name, child) in enumerate(module.named_children()):
            if id(child) in seen:
                continue
            seen.add(id(child))
            full = f"{name}.{child_name}" if name else child_name
            if opens(child):
                walk(child, full)
            else:
                units.append(Unit(full, name if isinstance(module, nn.Sequential) else None, index))

    walk(model, "")
    if not units:  # a model without children: the whole model is the one unit
        units.append(Unit("", None, 0))
    return units


def opens(module: nn.Module) -> bool:
    """Whether the walk goes inside a module below the root: a container with children, or a module
    holding a stack of blocks somewhere below it."""
    if isinstance(module, _CONTAINERS):
        return any(True for _ in module.children())
    return holds_blocks(module)


def holds_blocks(module: nn.Module) -> bool:
    """Whether a container below ``module`` holds repeated blocks: two or more children of one class
    that have children of their own (transformer layers, residual blocks, a network's stages)."""
    for inner in module.modules():
        if isinstance(inner, _CONTAINERS):
            classes = Counter(type(c) for c in inner.children() if any(True for _ in c.children()))
            if any(count > 1 for count in classes.values()):
                return True
    return False


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
