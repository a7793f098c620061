"""The ``prediction`` section of a run record (docs/run-record.md): one ``dnnperf predict --sweep``,
every predicted row of the what-if table, kept so that it can be shown again and drawn in the report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

#: Numbers every predicted row carries (rows a strategy cannot apply to carry a ``reason`` instead).
PREDICTED = ("step_s", "compute_s", "communication_s", "bubble_s", "other_s", "throughput", "memory_bytes")


@dataclass
class SweepResult:
    """One ``predict --sweep``: the machine it started from, the axes and every predicted row."""

    workload: str
    preset: str
    machine: str
    batch_size: int
    axes: dict[str, list[float]]
    strategies: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "preset": self.preset,
            "machine": self.machine,
            "batch_size": self.batch_size,
            "axes": self.axes,
            "strategies": self.strategies,
            "rows": self.rows,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepResult:
        """Validate and build; ValueError or TypeError says what is wrong."""
        axes = data["axes"]
        if not isinstance(axes, dict) or not axes:
            raise ValueError("axes must be a non-empty object of axis -> values")
        for axis, values in axes.items():
            if not isinstance(values, list) or not values or not all(_finite(v) for v in values):
                raise ValueError(f"axes.{axis} must be a non-empty list of numbers")
        strategies = data["strategies"]
        if not isinstance(strategies, list) or not all(isinstance(s, str) for s in strategies):
            raise ValueError("strategies must be a list of names")
        rows = data["rows"]
        if not isinstance(rows, list):
            raise ValueError("rows must be a list")
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or row.get("strategy") not in strategies:
                raise ValueError(f"rows[{i}] is not an object with one of the strategies")
            if any(not _finite(row.get(axis)) for axis in axes):
                raise ValueError(f"rows[{i}] lacks a value of every axis")
            if row.get("reason") is None and any(not _finite(row.get(k)) for k in PREDICTED):
                raise ValueError(f"rows[{i}] has neither a reason nor every predicted figure")
        if not isinstance(data["batch_size"], int):
            raise TypeError("batch_size must be an integer")
        return cls(
            workload=str(data["workload"]),
            preset=str(data["preset"]),
            machine=str(data["machine"]),
            batch_size=data["batch_size"],
            axes={str(k): list(v) for k, v in axes.items()},
            strategies=list(strategies),
            rows=[dict(r) for r in rows],
        )


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
