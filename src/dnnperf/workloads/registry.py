"""The suite's registry: workloads by name, with suggestions for misspelt names."""

from __future__ import annotations

import difflib

from dnnperf.errors import UsageError
from dnnperf.workloads.base import Workload

REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.name in REGISTRY:
        raise ValueError(f"workload {workload.name!r} registered twice")
    REGISTRY[workload.name] = workload
    return workload


def get_workload(name: str) -> Workload:
    """The workload called ``name`` (a suite workload, or a third-party model: ``timm:NAME``,
    ``hf:MODEL_TYPE``); a UsageError naming the closest matches otherwise."""
    if ":" in name:  # the zoo imports its library only now, when such a name is asked for
        from dnnperf.workloads.zoo import third_party_workload

        return third_party_workload(name)
    try:
        return REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, REGISTRY, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(REGISTRY)}"
        hint += " (or a third-party model: timm:NAME, hf:MODEL_TYPE)"
        raise UsageError(f"unknown workload {name!r}{hint}") from None


# The order `dnnperf list` shows: the TBD suite's applications, then the additions.
DOMAIN_ORDER = (
    "image classification",
    "machine translation",
    "language modelling",
    "speech recognition",
    "object detection",
    "adversarial",
    "reinforcement learning",
    "recommendation",
)


def all_workloads() -> list[Workload]:
    """Every registered workload, grouped by domain (registration order within a domain)."""
    rank = {domain: i for i, domain in enumerate(DOMAIN_ORDER)}
    return sorted(REGISTRY.values(), key=lambda w: rank.get(w.domain, len(rank)))
