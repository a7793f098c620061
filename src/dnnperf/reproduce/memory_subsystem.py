"""Seed 000, "Computational resource consumption in CNN training: a focus on memory" (Torres, Barrios,
Denneulin, 2021): a basic CNN and AlexNet across batch sizes on two synthetic datasets (small and
large images): resident memory, page faults, memory traffic and bandwidth, and how they scale.

The two datasets are each model's ``tiny`` and ``small`` presets (basic_cnn: 16 and 32 px images;
alexnet: 64 and 128 px), read from disk through the DataLoader as in training.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from dnnperf.reproduce.base import Claim, Reproduction, Session, commands_of, finish, started, verdict

KEY, SEED, TITLE = (
    "memory-subsystem",
    "000",
    "Computational resource consumption in CNN training: a focus on memory (Torres et al., 2021)",
)

#: size -> (presets as the two datasets, batch sizes, measured steps)
SIZES = {
    "smoke": (("tiny",), (2, 4), 1),
    "default": (("tiny", "small"), (4, 8, 16, 32), 3),
}
MODELS = ("basic_cnn", "alexnet")


def planned(size: str) -> int:
    """How many commands ``run`` makes (for progress)."""
    return len(MODELS) * len(SIZES[size][0])


def run(session: Session, size: str, progress: Callable[[str], None] | None = None) -> Reproduction:
    start = started()
    presets, sweep, steps = SIZES[size]
    rows, commands = [], []
    for model in MODELS:
        for preset in presets:
            command, record, _ = session.profile(
                model, "--preset", preset, "--sweep", ",".join(map(str, sweep)), "--steps", str(steps),
                "--warmup", "1", "--data", "disk", "--layers", "--memory",
            )  # fmt: skip
            commands.append(command)
            for point in record.points:
                if point.status != "complete" or point.memory is None or point.layers is None:
                    continue
                rows.append(_row(model, preset, point))
            if progress is not None:
                progress(command)
    table = pd.DataFrame(rows)
    reproduction = Reproduction(KEY, SEED, TITLE, size)
    reproduction.tables = [("memory subsystem against batch size, per model and dataset", table)]
    reproduction.claims = [
        _grows_claim(table, commands),
        _similar_claim(table, commands),
        _bandwidth_claim(table, commands),
    ]
    return finish(reproduction, start)


def _row(model: str, preset: str, point) -> dict:  # type: ignore[no-untyped-def]
    from dnnperf.analysis.layers import op_frame

    memory, layers = point.memory, point.layers
    ops = op_frame(layers)
    compute = ops[ops["phase"].isin(("forward", "backward", "update"))]
    moved = float(compute["bytes"].sum())
    seconds = float(compute["time_s"].sum())
    sub = memory.subsystem
    hardware = layers.hardware_profile()
    dram = hardware.memory_bandwidth if hardware is not None else float("nan")
    return {
        "model": model,
        "dataset": preset,
        "batch": point.batch_size,
        "allocator_peak_MiB": memory.measured_peak / 2**20,
        "resident_MiB": (sub.get("rss_bytes") or 0) / 2**20,
        "peak_resident_growth_MiB": (sub.get("peak_rss_growth_bytes") or 0) / 2**20,
        "minor_faults": sub.get("minor_faults"),
        "major_faults": sub.get("major_faults"),
        "operator_traffic_MiB": moved / 2**20,
        "operator_bandwidth_GBps": moved / seconds / 1e9 if seconds > 0 else float("nan"),
        "dram_bandwidth_GBps": dram / 1e9,
        "cache_counters": counters if isinstance(counters := sub.get("cache_counters"), str) else "measured",
    }


def _slope(rows: pd.DataFrame, column: str) -> tuple[float, float]:
    """Least-squares bytes per sample and the fit's largest relative error."""
    x, y = rows["batch"].to_numpy(float), rows[column].to_numpy(float)
    slope, intercept = np.polyfit(x, y, 1)
    fit = slope * x + intercept
    return float(slope), float(np.max(np.abs(fit - y) / np.maximum(np.abs(y), 1e-12)))


def _grows_claim(table: pd.DataFrame, commands: list[str]) -> Claim:
    parts, linear = [], 0
    groups = list(table.groupby(["model", "dataset"]))
    for (model, dataset), rows in groups:
        slope, error = _slope(rows, "allocator_peak_MiB")
        faults = rows.sort_values("batch")["minor_faults"].to_numpy(float)
        linear += slope > 0 and error < 0.10
        parts.append(
            f"{model}/{dataset}: +{slope:.2f} MiB per sample (linear within {100 * error:.0f}%), "
            f"minor faults {int(faults[0])} -> {int(faults[-1])}"
        )
    return Claim(
        claim="The memory a CNN's training uses grows with the batch size, pressing on the memory subsystem.",
        measured="; ".join(parts),
        verdict=verdict(bool(groups) and linear == len(groups)),
        why=f"the allocator's peak rises linearly with the batch in {linear} of {len(groups)} model/datasets",
        commands=commands_of(commands),
    )


def _similar_claim(table: pd.DataFrame, commands: list[str]) -> Claim:
    claim = "AlexNet and the basic CNN behave alike in the memory subsystem as the batch size varies."
    correlations = []
    for dataset, rows in table.groupby("dataset"):
        a = rows[rows["model"] == "basic_cnn"].sort_values("batch")["allocator_peak_MiB"].to_numpy()
        b = rows[rows["model"] == "alexnet"].sort_values("batch")["allocator_peak_MiB"].to_numpy()
        if len(a) == len(b) and len(a) > 1:
            correlations.append((dataset, float(np.corrcoef(a, b)[0, 1])))
    if not correlations:
        return Claim(claim, "too few batch sizes to compare", "differs", "nothing to compare", commands)
    text = ", ".join(f"{d}: r = {r:.3f}" for d, r in correlations)
    alike = all(r > 0.95 for _, r in correlations)
    return Claim(
        claim=claim,
        measured=f"correlation of the two models' peak memory across batch sizes: {text}",
        verdict=verdict(alike),
        why="both grow in proportion to the batch (feature maps dominate)" if alike else "the curves differ",
        commands=commands_of(commands),
    )


def _bandwidth_claim(table: pd.DataFrame, commands: list[str]) -> Claim:
    largest = table.sort_values("batch").groupby(["model", "dataset"]).tail(1)
    parts = [
        f"{r.model}/{r.dataset} batch {r.batch}: {r.operator_bandwidth_GBps:.1f} GB/s of operator traffic "
        f"against {r.dram_bandwidth_GBps:.1f} GB/s calibrated DRAM bandwidth"
        for r in largest.itertuples()
    ]
    heavy = [r for r in largest.itertuples() if r.operator_bandwidth_GBps >= 0.25 * r.dram_bandwidth_GBps]
    return Claim(
        claim="Training moves enough data to make memory bandwidth one of the biggest bottlenecks.",
        measured="; ".join(parts) + " (operator traffic: a lower bound from tensor sizes)",
        verdict=verdict(len(heavy) == len(largest) and len(largest) > 0),
        why=f"{len(heavy)} of {len(largest)} runs move at least a quarter of the DRAM bandwidth",
        commands=commands_of(commands),
    )
