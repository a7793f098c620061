"""The suite's registry: workloads by name, with suggestions for misspelt names."""

from __future__ import annotations

import difflib

from dnnperf.errors import UsageError
from dnnperf.workloads.base import Workload

_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.name in _REGISTRY:
        raise ValueError(f"workload {workload.name!r} registered twice")
    _REGISTRY[workload.name] = workload
    return workload


def get_workload(name: str) -> Workload:
    """The workload called ``name``; a UsageError naming the closest matches otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, _REGISTRY, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(_REGISTRY)}"
        raise UsageError(f"unknown workload {name!r}{hint}") from None


def all_workloads() -> list[Workload]:
    return list(_REGISTRY.values())
