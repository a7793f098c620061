"""What-if sweeps as a record section, and where along each axis the best strategy changes.

``dnnperf predict --sweep`` keeps its table in a record of kind ``predict`` (the ``prediction``
section, docs/run-record.md) so that it can be shown again, and so that the HTML report can draw
throughput along each axis with the crossovers of data and model parallelism marked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


def best_per_configuration(frame: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """One row per combination of the axes: the strategy with the highest throughput among those that
    apply and fit (``best`` None where none does) and that throughput."""
    rows = []
    for values, group in frame.groupby(list(axes), sort=True):
        values = values if isinstance(values, tuple) else (values,)
        applies = group["reason"].isna() if "reason" in group else pd.Series(True, index=group.index)
        fits = group["fits"].eq(True) if "fits" in group else pd.Series(False, index=group.index)
        usable = group[applies & fits]
        best = usable.loc[usable["throughput"].idxmax()] if len(usable) else None
        rows.append(
            {
                **dict(zip(axes, values, strict=True)),
                "best": None if best is None else best["strategy"],
                "throughput": math.nan if best is None else float(best["throughput"]),
            }
        )
    return pd.DataFrame(rows)


def _strategy(best: Any) -> str | None:
    """A configuration's best strategy, None where none fits (pandas reads a missing one as NaN, and
    NaN != NaN would report a change from nothing to nothing)."""
    return best if isinstance(best, str) else None


def crossovers(frame: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """Where the best strategy changes between two neighbouring values of one axis, the other axes
    held at each of their combinations: columns axis, held (text), below, above, before, after."""
    best = best_per_configuration(frame, axes)
    rows = []
    for axis in axes:
        others = [a for a in axes if a != axis]
        groups = best.groupby(others, sort=True) if others else [((), best)]
        for held, group in groups:
            held = held if isinstance(held, tuple) else (held,)
            ordered = group.sort_values(axis)
            pairs = zip(ordered.iloc[:-1].itertuples(), ordered.iloc[1:].itertuples(), strict=True)
            for low, high in pairs:
                if _strategy(low.best) != _strategy(high.best):
                    rows.append(
                        {
                            "axis": axis,
                            "held": ", ".join(f"{a}={v:g}" for a, v in zip(others, held, strict=True)),
                            "below": getattr(low, axis),
                            "above": getattr(high, axis),
                            "before": _strategy(low.best),
                            "after": _strategy(high.best),
                        }
                    )
    return pd.DataFrame(rows, columns=["axis", "held", "below", "above", "before", "after"])
