"""Seed 001, "Analyzing performance of neural networks in training phase" (Li, Zhang, Cao, 2018): the
stage breakdown of a CNN training step along the flow of data; per-layer compute efficiency,
convolution against fully-connected layers; the convolution library against im2col + GEMM (cuDNN
against cuBLAS there; oneDNN against MKL here on a CPU); memory used as a share of the device's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pandas as pd

from dnnperf.report.terminal import human_count
from dnnperf.reproduce.base import Claim, Reproduction, Session, finish, percent, started, verdict

KEY, SEED = "training-phase", "001"
TITLE = "Analyzing performance of neural networks in training phase (Li, Zhang, Cao, 2018)"

#: size -> (workload, preset, batch, measured steps, libcompare repeats)
SIZES = {
    "smoke": ("basic_cnn", "tiny", 8, 2, 2),
    "default": ("vgg16", "small", 32, 10, 10),
}


def planned(size: str) -> int:
    """How many commands ``run`` makes (for progress)."""
    return 2


def run(session: Session, size: str, progress: Callable[[str], None] | None = None) -> Reproduction:
    from dnnperf.analysis.layers import category_table

    start = started()
    workload, preset, batch, steps, repeats = SIZES[size]
    hw_command, hw_path = session.hardware(quick=size == "smoke")
    command, record, _ = session.profile(
        workload, "--preset", preset, "-b", str(batch), "--steps", str(steps), "--warmup", "2",
        "--data", "disk", "--layers", "--memory", "--hw", hw_path,
    )  # fmt: skip
    if progress is not None:
        progress(command)
    point = record.points[0]
    summary = point.stages.summary()
    stages = pd.DataFrame(
        [
            {"stage": name, "median_ms": 1e3 * s["median"], "share": s["share"]}
            for name, s in summary["stages"].items()
        ]
    )
    hardware = point.layers.hardware_profile()
    categories = category_table(point.layers, hardware)
    lib_command, document = session.run(
        "libcompare",
        workload,
        "--preset",
        preset,
        "-b",
        str(batch),
        "--repeats",
        str(repeats),
        "--hw",
        hw_path,
    )
    if progress is not None:
        progress(lib_command)
    reproduction = Reproduction(KEY, SEED, TITLE, size)
    library = _library_frame(document)
    reproduction.tables = [
        (f"{workload} ({preset}, batch {batch}, data on disk): stages of a step", stages),
        ("per layer type and phase: time, FLOPs, efficiency against the calibrated peak", categories),
        ("each convolution: the default library against im2col + GEMM (medians)", library),
    ]
    reproduction.claims = [
        _stages_claim(stages, summary, command),
        _conv_vs_fc_claim(categories, [hw_command, command]),
        _library_claim(library, document, [hw_command, lib_command]),
        _memory_claim(point.memory, record, command),
    ]
    return finish(reproduction, start)


def _stages_claim(stages: pd.DataFrame, summary: dict, command: str) -> Claim:
    text = ", ".join(f"{r.stage} {percent(r.share)}" for r in stages.itertuples())
    workers = summary.get("worker", {})
    if workers:  # read and preprocess ran in DataLoader workers, beside the step
        text += "; in the DataLoader workers, per batch: " + ", ".join(
            f"{name} {1e3 * w['median']:.1f} ms" for name, w in workers.items()
        )
    closure = summary["max_closure_error"]
    data = {"read", "preprocess"} <= (set(workers) | set(stages["stage"]))
    compute = {"forward", "backward", "update"} <= set(stages["stage"])
    return Claim(
        claim="A training step divides along the flow of data into stages (read, preprocess, copy to the "
        "device, forward, backward, update), each with its own latency.",
        measured=f"shares of the step: {text}; the stages add up to each step within {percent(closure)}",
        verdict=verdict(closure <= 0.05 and data and compute),
        why="every stage is timed and the stages account for each step's time"
        + (" (no host-to-device copy on a CPU)" if "copy" not in set(stages["stage"]) else ""),
        commands=[command],
    )


def _efficiency(categories: pd.DataFrame, category: str) -> float | None:
    rows = categories[categories["category"] == category]
    # The same seconds the layer table's efficiency uses: the category's own operators' time.
    seconds = rows["op_time_s"] if "op_time_s" in rows else rows.get("time_s")
    if rows.empty or seconds is None or seconds.sum() <= 0 or "peak_flops" not in rows:
        return None
    achieved = rows["flops"].sum() / seconds.sum()
    peak = rows["peak_flops"].dropna()
    return achieved / float(peak.iloc[0]) if len(peak) else None


def _conv_vs_fc_claim(categories: pd.DataFrame, commands: list[str]) -> Claim:
    conv, fc = _efficiency(categories, "convolution"), _efficiency(categories, "linear")
    claim = "Convolution layers use the compute resources about 50% better than fully-connected layers."
    if conv is None or fc is None or fc <= 0:
        return Claim(claim, "no convolution or no linear layer was timed", "differs", "nothing to compare",
                     commands)  # fmt: skip
    ratio = conv / fc
    return Claim(
        claim=claim,
        measured=(
            f"forward + backward efficiency against the calibrated peak: convolution {percent(conv)}, "
            f"fully-connected {percent(fc)} (ratio {ratio:.2f})"
        ),
        verdict=verdict(ratio >= 1.25),
        why=(
            "convolutions reuse each weight across positions, reaching a higher share of the peak"
            if ratio >= 1.25
            else "here the fully-connected layers' matrix products run as close to the peak as convolutions"
        ),
        commands=commands,
    )


def _library_frame(document: dict) -> pd.DataFrame:
    rows = []
    for layer in document["layers"]:
        if layer.get("skipped"):
            continue
        samples = layer["samples_s"]
        row = {"layer": layer["name"]}
        for phase in ("forward", "backward"):
            flops = layer[f"flops_{phase}"]
            for method, short in (("default", "default"), ("im2col+gemm", "im2col")):
                seconds = statistics.median(samples[method][phase])
                row[f"{short}_{phase}_ms"] = 1e3 * seconds
                row[f"{short}_{phase}_flops_per_s"] = flops / seconds
        rows.append(row)
    return pd.DataFrame(rows)


def _library_claim(library: pd.DataFrame, document: dict, commands: list[str]) -> Claim:
    claim = "The convolution library (cuDNN) computes convolutions about 2x as efficiently as im2col + GEMM."
    if library.empty:
        return Claim(claim, "no convolution was compared", "differs", "nothing to compare", commands)
    default = sum(library[f"default_{p}_ms"].sum() for p in ("forward", "backward"))
    im2col = sum(library[f"im2col_{p}_ms"].sum() for p in ("forward", "backward"))
    ratio = im2col / default
    device = document.get("device", "cpu")
    library_name = "cuDNN" if str(device).startswith("cuda") else "oneDNN"
    return Claim(
        claim=claim,
        measured=(
            f"all {len(library)} convolutions, forward + backward: {library_name} {default:.1f} ms, "
            f"im2col + GEMM {im2col:.1f} ms: the library is {ratio:.2f}x as efficient (same FLOPs)"
        ),
        verdict=verdict(ratio >= 1.5),
        why=f"{library_name} against explicit im2col + matrix products on {device}",
        commands=commands,
    )


def _memory_claim(memory, record, command: str) -> Claim:  # type: ignore[no-untyped-def]
    claim = "Training uses little of the device's memory: at most 20% of it."
    capacity = memory.subsystem.get("device_capacity_bytes") or record.environment["machine"]["memory_bytes"]
    share = memory.measured_peak / capacity
    where = "the GPU's" if "device_capacity_bytes" in memory.subsystem else "the machine's RAM"
    return Claim(
        claim=claim,
        measured=f"the step's peak {human_count(memory.measured_peak, 'B')}: {percent(share)} of {where}",
        verdict=verdict(share <= 0.20),
        why="the model and batch are far smaller than the memory" if share <= 0.2 else "the step fills it",
        commands=[command],
    )
