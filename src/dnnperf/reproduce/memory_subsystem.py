"""Seed 000, "Computational resource consumption in CNN training: a focus on memory" (Torres, Barrios,
Denneulin, 2021): a basic CNN and AlexNet across batch sizes on two synthetic datasets (small and
large images): resident memory, page faults, memory traffic and bandwidth, and how they scale.

The two datasets are each model's ``tiny`` and ``small`` presets (basic_cnn: 16 and 32 px images;
alexnet: 64 and 128 px), read from disk through the DataLoader as in training.

The study's framework comparison: the same basic CNN trained in TensorFlow (Keras 3) and PyTorch,
each in its own process under ``watch`` (``dnnperf bench --framework``), across a batch sweep:
resident memory, page faults and throughput side by side. It needs the ``frameworks`` extra; without
it the reproduction says so in a note.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from dnnperf.errors import DnnperfError
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

#: The framework comparison, size -> (preset, batch sizes, measured steps, warm-up steps).
FRAMEWORK_SWEEPS = {
    "smoke": ("tiny", (4, 8, 16), 3, 1),
    "default": ("small", (8, 16, 32, 64), 10, 3),
}
FRAMEWORKS = ("torch", "tensorflow")
#: Two curves "alike": peak resident memory against batch size correlated at least this much.
ALIKE_CORRELATION = 0.9


def planned(size: str) -> int:
    """How many commands ``run`` makes (for progress)."""
    return len(MODELS) * len(SIZES[size][0]) + (len(FRAMEWORKS) if _frameworks_installed() else 0)


def _frameworks_installed() -> bool:
    from dnnperf.frameworks import missing_packages

    return not missing_packages("tensorflow")


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
    if not _frameworks_installed():
        reproduction.notes.append(
            "TensorFlow beside PyTorch: not measured, the frameworks extra is not installed "
            "(pip install 'dnnperf[frameworks]')"
        )
        return finish(reproduction, start)
    try:
        frameworks, framework_commands = _framework_sweep(session, size, progress)
    except DnnperfError as error:
        reproduction.notes.append(f"TensorFlow beside PyTorch: not measured: {error}")
        return finish(reproduction, start)
    preset = FRAMEWORK_SWEEPS[size][0]
    reproduction.tables.append(
        (f"basic_cnn ({preset}) in TensorFlow and PyTorch against batch size, each under watch", frameworks)
    )
    reproduction.claims += framework_claims(frameworks, framework_commands)
    return finish(reproduction, start)


def _framework_sweep(
    session: Session, size: str, progress: Callable[[str], None] | None
) -> tuple[pd.DataFrame, list[str]]:
    """``dnnperf bench basic_cnn --framework F`` for each framework: one row per batch size."""
    preset, sweep, steps, warmup = FRAMEWORK_SWEEPS[size]
    rows, commands = [], []
    for framework in FRAMEWORKS:
        command, document = session.run(
            "bench", "basic_cnn", "--framework", framework, "--preset", preset,
            "--sweep", ",".join(map(str, sweep)), "--steps", str(steps), "--warmup", str(warmup),
        )  # fmt: skip
        commands.append(command)
        figures = {row["batch_size"]: row for row in document["system"]}
        for point in document["record"]["points"]:
            system = figures.get(point["batch_size"], {})
            throughput = (point["summary"].get("throughput") or {}).get("median")
            if point["status"] != "complete" or throughput is None:
                continue
            rows.append(
                {
                    "framework": framework,
                    "batch": point["batch_size"],
                    "throughput_per_s": throughput,
                    "peak_rss_MiB": _mib(system.get("peak_rss_bytes")),
                    "minor_faults": system.get("minor_faults"),
                    "major_faults": system.get("major_faults"),
                    "cpu_cores": system.get("cpu_cores"),
                }
            )
        if progress is not None:
            progress(command)
    return pd.DataFrame(rows), commands


def _mib(value: float | None) -> float:
    return float("nan") if value is None else value / 2**20


def framework_claims(table: pd.DataFrame, commands: list[str]) -> list[Claim]:
    """The study's claims on its two frameworks, judged from a table with one row per framework and
    batch size (``framework``, ``batch``, ``throughput_per_s``, ``peak_rss_MiB``, ``minor_faults``)."""
    return [_framework_growth_claim(table, commands), _framework_alike_claim(table, commands)]


def _by_framework(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    if table.empty:
        return {}
    return {name: rows.sort_values("batch") for name, rows in table.groupby("framework")}


def _framework_growth_claim(table: pd.DataFrame, commands: list[str]) -> Claim:
    claim = "In TensorFlow as in PyTorch, the memory CNN training holds grows with the batch size."
    groups = _by_framework(table)
    parts, growing = [], 0
    for name, rows in groups.items():
        rss = rows["peak_rss_MiB"].to_numpy(float)
        if len(rows) < 2 or not np.isfinite(rss).all():
            parts.append(f"{name}: too few batch sizes with a resident-memory sample")
            continue
        slope = float(np.polyfit(rows["batch"].to_numpy(float), rss, 1)[0])
        growing += slope > 0
        faults = rows["minor_faults"].to_numpy(float)
        parts.append(
            f"{name}: peak RSS {rss[0]:.0f} -> {rss[-1]:.0f} MiB from batch {rows['batch'].iloc[0]} to "
            f"{rows['batch'].iloc[-1]} ({slope:+.2f} MiB per sample), minor faults per batch size "
            f"{_count(faults[0])} (with the framework's import) -> {_count(faults[-1])}"
        )
    both = len(groups) == len(FRAMEWORKS) and growing == len(groups)
    return Claim(
        claim=claim,
        measured="; ".join(parts) or "nothing measured",
        verdict=verdict(both),
        why=f"peak resident memory rises with the batch in {growing} of {len(FRAMEWORKS)} frameworks",
        commands=commands_of(commands),
    )


def _count(value: float) -> str:
    return "-" if not np.isfinite(value) else f"{int(value)}"


def _framework_alike_claim(table: pd.DataFrame, commands: list[str]) -> Claim:
    claim = (
        "The same CNN loads the memory subsystem alike in TensorFlow and PyTorch as the batch size "
        "varies (the study draws its conclusions for both)."
    )
    groups = _by_framework(table)
    if len(groups) < 2:
        return Claim(
            claim, "fewer than two frameworks measured", verdict(False), "nothing to compare", commands
        )
    (a_name, a), (b_name, b) = list(groups.items())[:2]
    shared = sorted(set(a["batch"]) & set(b["batch"]))
    a, b = a[a["batch"].isin(shared)], b[b["batch"].isin(shared)]
    rss_a, rss_b = a["peak_rss_MiB"].to_numpy(float), b["peak_rss_MiB"].to_numpy(float)
    usable = len(shared) > 2 and np.isfinite(rss_a).all() and np.isfinite(rss_b).all()
    r = (
        float(np.corrcoef(rss_a, rss_b)[0, 1])
        if usable and rss_a.std() > 0 and rss_b.std() > 0
        else float("nan")
    )
    speed = (b["throughput_per_s"].to_numpy(float) / a["throughput_per_s"].to_numpy(float)).tolist()
    alike = bool(np.isfinite(r) and r >= ALIKE_CORRELATION)
    measured = (
        f"over batch sizes {', '.join(map(str, shared))}: peak RSS "
        f"{a_name} {rss_a.min():.0f}-{rss_a.max():.0f} MiB, "
        f"{b_name} {rss_b.min():.0f}-{rss_b.max():.0f} MiB, correlation r = {r:.3f}; throughput "
        f"{b_name}/{a_name} {min(speed):.2f}x to {max(speed):.2f}x"
        if shared
        else "no batch size measured in both"
    )
    why = (
        f"both curves rise together (r >= {ALIKE_CORRELATION}); the frameworks' own footprints differ"
        if alike
        else f"the resident-memory curves do not follow each other (r < {ALIKE_CORRELATION}, or too few)"
    )
    return Claim(claim, measured, verdict(alike), why, commands_of(commands))


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
            f"{model}/{dataset}: {slope:+.2f} MiB per sample (linear within {100 * error:.0f}%), "
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
