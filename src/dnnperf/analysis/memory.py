"""Memory tables over run records: the peak by category per batch size, its fit against batch size,
and the largest batch that fits a memory limit. Each a function over plain data, returning a table."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dnnperf.errors import UsageError
from dnnperf.results.memory import CATEGORIES, EXTRA, StepMemory

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9}
_UNITS |= {"t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'8GiB' -> 8589934592, '512MB' -> 512000000, '1000' -> 1000; a UsageError for anything else."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match[2].lower() not in _UNITS:
        raise UsageError(f"not a size in bytes: {text!r} (e.g. 8GiB, 512MB, 1000000)")
    value = float(match[1]) * _UNITS[match[2].lower()]
    if value <= 0 or not math.isfinite(value):
        raise UsageError(f"a memory size must be positive, got {text!r}")
    if value < 1 or (not match[2] and value != int(value)):  # "1.5": bytes come whole
        raise UsageError(f"not a whole number of bytes: {text!r} (e.g. 8GiB, 512MB, 1000000)")
    return int(value)


def peak_table(points: Sequence[tuple[int, StepMemory]]) -> pd.DataFrame:
    """One row per batch size: bytes per category at the peak, the tracked and measured peaks."""
    rows = []
    for batch_size, memory in points:
        rows.append(
            {
                "batch_size": batch_size,
                **{c: memory.peak.get(c, 0) for c in (*CATEGORIES, *EXTRA)},
                **{f"max_{c}": memory.category_max.get(c, memory.peak.get(c, 0)) for c in CATEGORIES},
                "tracked_peak": memory.tracked_peak,
                "measured_peak": memory.measured_peak,
                # What a limit must hold: the allocator's peak where it was measured, else the tracked one.
                "peak": memory.measured_peak or memory.tracked_peak,
                "peak_phase": memory.peak_phase,
                "peak_module": memory.peak_module,
            }
        )
    return pd.DataFrame(rows).sort_values("batch_size", ignore_index=True)


def scaling_fit(points: Sequence[tuple[int, StepMemory]]) -> pd.DataFrame:
    """Per category (its largest value over the step) and for the peak: bytes = fixed + per_sample x
    batch size, least squares over the sweep, with the fit's largest relative error at the sweep's sizes."""
    table = peak_table(points)
    if len(table) < 2:
        raise UsageError("fitting memory against batch size needs at least two batch sizes (--sweep)")
    x = table["batch_size"].to_numpy(dtype=float)
    rows = []
    for column in (*CATEGORIES, "peak"):
        # A category by its own largest value over the step; the peak as it is.
        y = table[column if column == "peak" else f"max_{column}"].to_numpy(dtype=float)
        per_sample, fixed = np.polyfit(x, y, 1)
        fitted = fixed + per_sample * x
        error = float(np.max(np.abs(fitted - y) / np.maximum(y, 1.0)))
        # Whole bytes: a least-squares fit of an exact constant leaves residues like 1e-10 B.
        rows.append(
            {
                "category": column,
                "fixed": round(fixed),
                "per_sample": round(per_sample, 1),
                "max_rel_error": error,
            }
        )
    return pd.DataFrame(rows)


def predict_max_batch(points: Sequence[tuple[int, StepMemory]], limit: int) -> int | None:
    """The largest batch size whose fitted peak stays within ``limit`` bytes; None if not even one."""
    fit = scaling_fit(points).set_index("category").loc["peak"]
    if fit["per_sample"] <= 0:
        raise UsageError("the peak does not grow with batch size here: no largest batch to predict")
    batch = math.floor((limit - fit["fixed"]) / fit["per_sample"])
    return batch if batch >= 1 else None
