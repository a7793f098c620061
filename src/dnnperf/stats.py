"""Measurements as values: raw samples plus the statistics computed from them.

Like ``torch.utils.benchmark.Measurement``, a :class:`Samples` keeps every raw sample so that any
statistic (or a comparison between runs) can be recomputed later; rendering lives elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Samples:
    """Repeated measurements of one quantity (e.g. step time in seconds)."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Samples:
        return cls(tuple(float(v) for v in values))

    def __len__(self) -> int:
        return len(self.values)

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile (numpy's default); NaN when there are no samples."""
        if not self.values:
            return float("nan")
        with np.errstate(all="ignore"):  # values near a float's limit interpolate to inf, silently
            return float(np.quantile(np.asarray(self.values), q))

    @property
    def median(self) -> float:
        return self.quantile(0.5)

    @property
    def p10(self) -> float:
        return self.quantile(0.1)

    @property
    def p90(self) -> float:
        return self.quantile(0.9)

    @property
    def mean(self) -> float:
        if not self.values:
            return float("nan")
        with np.errstate(all="ignore"):  # a sum past a float's limit is inf, not a warning
            return float(np.mean(self.values))

    @property
    def std(self) -> float:
        """Sample standard deviation (ddof=1); NaN for fewer than two samples."""
        if len(self.values) < 2:
            return float("nan")
        with np.errstate(all="ignore"):
            return float(np.std(self.values, ddof=1))

    @property
    def iqr(self) -> float:
        return self.quantile(0.75) - self.quantile(0.25)

    def summary(self) -> dict[str, float | int]:
        """The statistics stored beside the raw samples in a run record."""
        return {
            "n": len(self.values),
            "median": self.median,
            "p10": self.p10,
            "p90": self.p90,
            "mean": self.mean,
            "std": self.std,
            "min": min(self.values) if self.values else float("nan"),
            "max": max(self.values) if self.values else float("nan"),
        }
