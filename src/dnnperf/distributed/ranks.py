"""Analyses of a distributed point's ``ranks`` section, every rank's own step side by side.

Each rank measures its steps with its own stage clock; after every step the measurements travel to
rank 0 (:mod:`dnnperf.distributed.gather`), which appends them to a
:class:`~dnnperf.results.ranks.RankBreakdown`. The analyses are functions over one breakdown
returning DataFrames (rendering lives in ``report/terminal.py``).
"""

from __future__ import annotations

import pandas as pd

from dnnperf.results.ranks import RankBreakdown
from dnnperf.results.stages import STAGE_ORDER
from dnnperf.stats import Samples


def rank_medians(breakdown: RankBreakdown) -> pd.DataFrame:
    """Median seconds per step of every stage and detail (rows) on every rank (columns), with the
    step's wall time and the busy time (working, not waiting for other ranks) first."""
    rows: dict[str, dict[int, float]] = {}
    for rank in breakdown.ranks:
        rows.setdefault("step", {})[rank.rank] = Samples.of(rank.wall_s).median
        rows.setdefault("busy", {})[rank.rank] = Samples.of(rank.busy_s()).median
        for name, values in rank.stages.items():
            rows.setdefault(name, {})[rank.rank] = Samples.of(values).median
        for name, values in rank.detail.items():
            rows.setdefault(f"{name} (detail)", {})[rank.rank] = Samples.of(values).median
    known = ("step", "busy", *STAGE_ORDER)
    stages = [n for n in known if n in rows] + sorted(n for n in rows if n not in known)
    frame = pd.DataFrame.from_dict(rows, orient="index").reindex(stages)
    frame.columns.name = "rank"
    return frame.fillna(0.0)


def rank_balance(breakdown: RankBreakdown) -> pd.DataFrame:
    """Per rank: median busy seconds per step, its excess over the mean busy time, and whether it is
    the slowest. The run's imbalance is the slowest rank's excess: max(busy) / mean(busy) - 1."""
    busy = pd.Series({rank.rank: Samples.of(rank.busy_s()).median for rank in breakdown.ranks}, name="busy_s")
    frame = busy.to_frame()
    mean = float(busy.mean()) if len(busy) else float("nan")
    frame["excess"] = busy / mean - 1 if mean > 0 else float("nan")
    frame["slowest"] = frame.index == busy.idxmax() if len(busy) else []
    frame.index.name = "rank"
    return frame


def rank_memory(breakdown: RankBreakdown) -> pd.DataFrame:
    """Per rank with a tracked step: its measured peak and each category's bytes at that peak (the
    allocator's view, as ``dnnperf profile --memory`` gives one device's); empty without ``--memory``."""
    rows = [
        {"rank": rank.rank, "peak_bytes": rank.memory.measured_peak, **rank.memory.peak}
        for rank in breakdown.ranks
        if rank.memory is not None
    ]
    return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()


def bucket_table(breakdown: RankBreakdown) -> pd.DataFrame:
    """Data parallelism: per gradient bucket, its size and, on every rank, the median seconds over the
    measured steps of what the rank waited for its allreduce (launch to completion), of the part spent
    waiting for the last rank to launch it (skew) and of the collective's own time, where recorded."""
    rows: dict[tuple[int, int], dict[str, float]] = {}
    parts = (("skew_s", "skew s"), ("allreduce_s", "allreduce s"))
    for rank in breakdown.ranks:
        seconds: dict[tuple[int, int], list[float]] = {}
        split: dict[str, dict[tuple[int, int], list[float]]] = {name: {} for name, _ in parts}
        for step in rank.buckets:
            for bucket in step:
                key = (int(bucket["index"]), int(bucket["bytes"]))
                seconds.setdefault(key, []).append(float(bucket["seconds"]))
                for name, _ in parts:
                    if name in bucket:
                        split[name].setdefault(key, []).append(float(bucket[name]))
        for key, values in seconds.items():
            row = rows.setdefault(key, {"steps": 0})
            row["steps"] = max(row["steps"], len(values))
            row[f"rank {rank.rank} s"] = Samples.of(values).median
            for name, label in parts:
                if split[name].get(key):
                    row[f"rank {rank.rank} {label}"] = Samples.of(split[name][key]).median
    return pd.DataFrame(
        [{"bucket": index, "bytes": size, **values} for (index, size), values in sorted(rows.items())]
    )
