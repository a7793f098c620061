"""Where along each axis of a what-if sweep the best strategy changes.

``dnnperf predict --sweep`` keeps its table in a record of kind ``predict`` (the ``prediction``
section, ``dnnperf.results.prediction.SweepResult``) so that it can be shown again, and so that the
HTML report can draw throughput along each axis with the crossovers of data and model parallelism
marked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd


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
