"""The suite's registry: workloads by name, with suggestions for misspelt names."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from dnnperf.errors import UsageError
from dnnperf.workloads.base import Workload

REGISTRY: dict[str, Workload] = {}
#: Where names with a ``:`` go: the resolver of third-party models (``workloads.zoo``), registered on import.
_third_party: list[Callable[[str], Workload]] = []


def register(workload: Workload) -> Workload:
    if workload.name in REGISTRY:
        raise ValueError(f"workload {workload.name!r} registered twice")
    REGISTRY[workload.name] = workload
    return workload


def register_third_party(resolve: Callable[[str], Workload]) -> None:
    """Send every name with a ``:`` (``timm:NAME``, ``hf:MODEL_TYPE``) to ``resolve``."""
    _third_party[:] = [resolve]


def get_workload(name: str) -> Workload:
    """The workload called ``name`` (a suite workload, or a third-party model: ``timm:NAME``,
    ``hf:MODEL_TYPE``); a UsageError naming the closest matches otherwise."""
    if ":" in name and _third_party:  # the zoo imports its library only now, when such a name is asked for
        return _third_party[0](name)
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
