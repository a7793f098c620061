"""The per-layer tables, each a function over one :class:`~dnnperf.probes.layers.LayerProfile`.

Times are per step: for every timed step the seconds of a group's operators are summed, and the table
gives the median (p10, p90) of those sums. FLOPs and bytes are per step too. With a hardware profile
(``dnnperf hw``) a table adds the achieved FLOP/s against the calibrated peak (efficiency) and the
roofline: arithmetic intensity against the ridge point says whether a layer is compute- or
memory-bound, and ``attainable`` is the roofline's ceiling at that intensity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from dnnperf.hardware import HardwareProfile, NotMeasuredError
from dnnperf.probes.layers import CATEGORIES, PROFILER
from dnnperf.probes.opcount import FREE_FAMILIES, NO_MODULE
from dnnperf.results.layers import LayerProfile

LAYER_PHASES = ("forward", "backward")
#: Families whose operators do a layer's heavy arithmetic: the library that ran them is the layer's.
HEAVY_FAMILIES = ("matmul", "convolution", "attention", "rnn")


def op_frame(profile: LayerProfile) -> pd.DataFrame:
    """One row per (module, phase, operator): type and category of the module, library, calls, FLOPs,
    bytes per step, and the per-step seconds (a list) with their median."""
    rows = []
    for op in profile.ops:
        info = profile.modules.get(op.module)
        rows.append(
            {
                "module": op.module,
                "type": info.type if info else "?",
                "category": info.category if info else "other",
                "phase": op.phase,
                "op": op.op,
                "family": op.family,
                "library": op.library or "unknown",
                "dtype": op.dtype,
                "calls": op.calls,
                "flops": np.nan if op.flops is None else float(op.flops),
                "covered": op.flops is not None or op.family in FREE_FAMILIES,
                "bytes": float(op.bytes_read + op.bytes_written),
                "seconds": op.seconds,
                "time_s": float(np.median(op.seconds)) if op.seconds else 0.0,
            }
        )
    columns = ["module", "type", "category", "phase", "op", "family", "library", "dtype", "calls"]
    columns += ["flops", "covered", "bytes", "seconds", "time_s"]
    return pd.DataFrame(rows, columns=columns)


def _per_step(seconds: Iterable[list[float]], steps: int) -> np.ndarray:
    total = np.zeros(steps)
    for values in seconds:
        total += np.asarray(values, dtype=float)
    return total


def _roofline(frame: pd.DataFrame, hardware: HardwareProfile | None) -> pd.DataFrame:
    """Add intensity, achieved FLOP/s, and (with hardware) peak, efficiency, attainable and bound."""
    frame["intensity"] = frame["flops"] / frame["bytes"].where(frame["bytes"] > 0)
    # FLOP/s from the same operators the FLOPs were counted on: their own time in the operator-timed
    # steps. A layer's hook time also holds its Python and autograd bookkeeping, and a container's
    # nodes are attributed by a different walk than its operators: dividing one by the other mixes.
    seconds = frame["op_time_s"] if "op_time_s" in frame else frame["time_s"]
    frame["achieved_flops"] = frame["flops"] / seconds.where(seconds > 0)
    peaks, ridges = [], []
    for dtype in frame["dtype"]:
        try:
            peak = hardware.peak_flops(dtype or "float32") if hardware is not None else np.nan
            ridge = hardware.ridge_point(dtype or "float32") if hardware is not None else np.nan
        except (NotMeasuredError, ValueError, KeyError):
            peak = ridge = np.nan
        peaks.append(peak)
        ridges.append(ridge)
    frame["peak_flops"] = peaks
    frame["efficiency"] = frame["achieved_flops"] / frame["peak_flops"]
    bandwidth = hardware.memory_bandwidth if hardware is not None else np.nan
    frame["attainable_flops"] = np.minimum(frame["peak_flops"], frame["intensity"] * bandwidth)
    bound = np.where(frame["intensity"] >= np.asarray(ridges, dtype=float), "compute", "memory")
    known = frame["intensity"].notna() & (frame["flops"] > 0) & pd.Series(ridges, index=frame.index).notna()
    frame["bound"] = np.where(known, bound, None)
    return frame


def _main_dtype(group: pd.DataFrame) -> str | None:
    dtypes = group.dropna(subset=["dtype"])
    if dtypes.empty:
        return None
    return str(dtypes.groupby("dtype")["time_s"].sum().idxmax())


def _library(group: pd.DataFrame) -> str:
    heavy = group[group["family"].isin(HEAVY_FAMILIES)]
    chosen = heavy if not heavy.empty else group
    return (
        str(chosen.sort_values("time_s", ascending=False)["library"].iloc[0])
        if not chosen.empty
        else "native"
    )


def _aggregate(ops: pd.DataFrame, keys: Sequence[str], steps: int) -> list[dict]:
    rows = []
    for key, group in ops.groupby(list(keys), sort=False):
        per_step = _per_step(group["seconds"], steps)
        covered = group["flops"].notna()
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "time_s": float(np.median(per_step)),
                "time_p10_s": float(np.percentile(per_step, 10)),
                "time_p90_s": float(np.percentile(per_step, 90)),
                "calls": int(group["calls"].sum()),
                # FLOPs of the operators with a formula; NaN when none has one and some do arithmetic.
                "flops": float(group.loc[covered, "flops"].sum())
                if covered.any() or group["covered"].all()
                else np.nan,
                "bytes": float(group["bytes"].sum()),
                "library": _library(group),
                "dtype": _main_dtype(group),
                "uncovered_s": float(group.loc[~group["covered"], "time_s"].sum()),
            }
        )
    return rows


def layer_times(
    profile: LayerProfile, phases: Sequence[str] = LAYER_PHASES
) -> dict[tuple[str, str], np.ndarray]:
    """(module, phase) -> its own seconds in each layer-timed step (hooks; see LayerTimer)."""
    return {
        (module, phase): np.asarray(values, dtype=float)
        for module, by_phase in profile.layer_seconds.items()
        for phase, values in by_phase.items()
        if phase in phases
    }


def _with_layer_times(frame: pd.DataFrame, profile: LayerProfile, phases: Sequence[str]) -> pd.DataFrame:
    """Replace operator-summed times by the layer-timed steps' times (which include the Python of a
    layer's forward and its autograd nodes' overhead); layers with no operators get a row too. The
    operator-summed time stays as ``op_time_s``."""
    if not profile.steps:
        return frame.assign(op_time_s=frame.get("time_s"))
    times = layer_times(profile, phases)
    frame = frame.rename(columns={"time_s": "op_time_s"}) if not frame.empty else frame
    known = (
        set(zip(frame.get("module", []), frame.get("phase", []), strict=True)) if not frame.empty else set()
    )
    extra = [
        {"module": m, "phase": p, "calls": 0, "flops": 0.0, "bytes": 0.0, "library": "native", "dtype": None,
         "uncovered_s": 0.0, "op_time_s": 0.0}
        for (m, p) in times
        if (m, p) not in known
    ]  # fmt: skip
    frame = pd.concat([frame, pd.DataFrame(extra)], ignore_index=True) if extra else frame
    zeros = np.zeros(profile.steps)
    per_step = [times.get((m, p), zeros) for m, p in zip(frame["module"], frame["phase"], strict=True)]
    frame["time_s"] = [float(np.median(v)) for v in per_step]
    frame["time_p10_s"] = [float(np.percentile(v, 10)) for v in per_step]
    frame["time_p90_s"] = [float(np.percentile(v, 90)) for v in per_step]
    return frame


def layer_table(
    profile: LayerProfile, hardware: HardwareProfile | None = None, phases: Sequence[str] = LAYER_PHASES
) -> pd.DataFrame:
    """One row per (module, phase), the module's own operators only (not its children's): time,
    FLOPs, bytes, intensity, achieved FLOP/s, efficiency, roofline bound, library. Sorted by time."""
    ops = op_frame(profile)
    ops = ops[ops["phase"].isin(phases)]
    rows = _aggregate(ops, ["module", "phase"], profile.op_steps)
    frame = _with_layer_times(pd.DataFrame(rows), profile, phases)
    if frame.empty:
        return frame
    frame.insert(
        1, "type", [profile.modules[m].type if m in profile.modules else "?" for m in frame["module"]]
    )
    frame.insert(
        2,
        "category",
        [profile.modules[m].category if m in profile.modules else "other" for m in frame["module"]],
    )
    total = frame["time_s"].sum()
    frame["share"] = frame["time_s"] / total if total > 0 else np.nan
    return _roofline(frame, hardware).sort_values("time_s", ascending=False, ignore_index=True)


def category_table(
    profile: LayerProfile, hardware: HardwareProfile | None = None, phases: Sequence[str] = LAYER_PHASES
) -> pd.DataFrame:
    """One row per (layer type, phase): the convolution vs fully-connected comparison of seed 001."""
    ops = op_frame(profile)
    ops = ops[ops["phase"].isin(phases)]
    frame = pd.DataFrame(_aggregate(ops, ["category", "phase"], profile.op_steps))
    if frame.empty:
        return frame
    if profile.steps:  # times from the layer-timed steps, summed per step over the category's layers
        totals: dict[tuple[str, str], np.ndarray] = {}
        for (module, phase), values in layer_times(profile, phases).items():
            category = profile.modules[module].category if module in profile.modules else "other"
            totals[(category, phase)] = totals.get((category, phase), np.zeros(profile.steps)) + values
        zeros = np.zeros(profile.steps)
        per_step = [totals.get(key, zeros) for key in zip(frame["category"], frame["phase"], strict=True)]
        frame["op_time_s"] = frame["time_s"]
        frame["time_s"] = [float(np.median(v)) for v in per_step]
        frame["time_p10_s"] = [float(np.percentile(v, 10)) for v in per_step]
        frame["time_p90_s"] = [float(np.percentile(v, 90)) for v in per_step]
    total = frame["time_s"].sum()
    frame["share"] = frame["time_s"] / total if total > 0 else np.nan
    order = {c: i for i, c in enumerate(CATEGORIES)}
    frame = frame.sort_values(
        ["category", "phase"], key=lambda s: s.map(order) if s.name == "category" else s.map({"forward": 0})
    )
    return _roofline(frame.reset_index(drop=True), hardware)


def library_table(profile: LayerProfile, phases: Sequence[str] = LAYER_PHASES) -> pd.DataFrame:
    """Time per library and phase, with FLOPs and share of the phases' operator time."""
    ops = op_frame(profile)
    ops = ops[ops["phase"].isin(phases)]
    frame = pd.DataFrame(_aggregate(ops, ["library", "phase"], profile.op_steps))
    if frame.empty:
        return frame
    frame["share"] = frame["time_s"] / frame["time_s"].sum()
    return frame.sort_values("time_s", ascending=False, ignore_index=True)[
        ["library", "phase", "time_s", "share", "calls", "flops"]
    ]


def coverage(profile: LayerProfile, phases: Sequence[str] = (*LAYER_PHASES, "update")) -> dict:
    """How much of the measured operator time has a FLOP formula, and every operator without one with
    its share of that time (seed-001 style efficiencies are only as good as this coverage)."""
    ops = op_frame(profile)
    ops = ops[ops["phase"].isin(phases)]
    total = float(ops["time_s"].sum())
    uncovered = (
        ops[~ops["covered"]]
        .groupby("op", as_index=False)
        .agg(time_s=("time_s", "sum"), calls=("calls", "sum"))
        .sort_values("time_s", ascending=False, ignore_index=True)
    )
    uncovered["share"] = uncovered["time_s"] / total if total > 0 else np.nan
    return {
        "time_s": total,
        "covered_share": 1.0 - float(uncovered["time_s"].sum()) / total if total > 0 else 1.0,
        "uncovered": uncovered,
    }


def closure(profile: LayerProfile, stage_s: Mapping[str, float]) -> pd.DataFrame:
    """Per phase: the stage's measured median time (from uninstrumented steps), the sum of its layers'
    times (median over the layer-timed steps; for the update, its operators'), and the remainder no
    layer accounts for: the loss and other work outside the model, autograd's engine between nodes
    (on CUDA also the device's idle time: there a layer's time is its kernels'). The ``(none)`` row is
    that remainder as the instrumented steps saw it, and the layer timer's own work (``(profiler)``)
    a plain step does not have: both are left out of the layers' sum."""
    ops = op_frame(profile)
    times = layer_times(profile, (*LAYER_PHASES, "update"))
    rows = []
    for phase in (*LAYER_PHASES, "update"):
        if phase not in stage_s:
            continue
        if profile.steps and phase in LAYER_PHASES:
            per_step = sum(
                (v for (m, p), v in times.items() if p == phase and m not in (PROFILER, NO_MODULE)),
                np.zeros(profile.steps),
            )
        else:  # the update is no layer's: its operators
            per_step = _per_step(ops.loc[ops["phase"] == phase, "seconds"], profile.op_steps)
        layers = float(np.median(per_step))
        stage = float(stage_s[phase])
        rows.append(
            {
                "phase": phase,
                "stage_s": stage,
                "layers_s": layers,
                "remainder_s": stage - layers,
                "remainder_share": (stage - layers) / stage if stage > 0 else np.nan,
            }
        )
    return pd.DataFrame(rows, columns=["phase", "stage_s", "layers_s", "remainder_s", "remainder_share"])
