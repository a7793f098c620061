"""Run records and the store that keeps them.

The values here import no torch. The names are imported on first use (PEP 562): a leaf module such as
``dnnperf.results.watch`` imports without the record and its other sections.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "Point": "dnnperf.results.record",
    "RunRecord": "dnnperf.results.record",
    "RunStore": "dnnperf.results.store",
    "read_record": "dnnperf.results.store",
}

__all__ = ["Point", "RunRecord", "RunStore", "read_record"]

if TYPE_CHECKING:
    from dnnperf.results.record import Point, RunRecord
    from dnnperf.results.store import RunStore, read_record


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dnnperf.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
