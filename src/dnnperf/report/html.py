"""The HTML report of a run: one self-contained file (inline CSS, inline SVG charts, a few lines of
vanilla JavaScript for sortable tables), no URL anywhere, so it opens offline and fetches nothing.

The page is a list of section renderers (``SECTIONS``). Each takes a :class:`Report` (the record and
the tables sections share) and returns a
:class:`Section`, or None when the record has no data for it, so sections for later capabilities
(predictions, the memory saver's plan, per-rank views) plug in by appending a renderer. Every string
from the record (layer names, the command, the machine) is escaped; charts are matplotlib SVG, whose
text matplotlib escapes.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dnnperf.analysis import layers as layer_analysis
from dnnperf.analysis.memory import peak_table, predict_max_batch, scaling_fit
from dnnperf.errors import UsageError
from dnnperf.jsonio import write_text_atomic
from dnnperf.report import charts
from dnnperf.report.terminal import how_it_ended, human_count, sampling_cost, strategy_settings
from dnnperf.results.memory import CATEGORIES
from dnnperf.results.record import RunRecord

#: Layer phases drawn as bars per batch size (the rest are in the table).
TOP_LAYERS = 20
#: Points per memory timeline chart: the timeline is binned, keeping each bin's highest total.
TIMELINE_POINTS = 400


@dataclass
class Section:
    """One part of the page: an anchor, a heading and its HTML body."""

    id: str
    title: str
    body: str


@dataclass
class Report:
    """What the sections draw from: the record, and tables several sections share (computed once)."""

    record: RunRecord

    @functools.cached_property
    def layer_tables(self) -> list[tuple[Any, pd.DataFrame]]:
        """(point, its per-layer table) for every point with layer-timed steps."""
        return [
            (p, layer_analysis.layer_table(p.layers, p.layers.hardware_profile()))
            for p in self.record.points
            if p.layers is not None and p.layers.steps
        ]


Renderer = Callable[[Report], "Section | None"]


# --------------------------------------------------------------------------------------------------
# Small HTML pieces
# --------------------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def ms(value: Any) -> str:
    """Milliseconds to 3 significant digits, without an exponent: 0.0123, 12.3, 1,110."""
    if _missing(value):
        return ""
    milli = float(value) * 1e3
    return f"{milli:,.0f}" if abs(milli) >= 1000 else f"{milli:.3g}"


def pct(value: Any) -> str:
    return "" if _missing(value) else f"{100 * float(value):.1f}%"


def count(value: Any, unit: str = "") -> str:
    return "" if _missing(value) else human_count(float(value), unit)


def chart(svg: str, caption: str) -> str:
    return f'<figure class="chart">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


@dataclass(frozen=True)
class Column:
    """A table column: heading, the row key, how to show it, and whether it sorts as a number."""

    heading: str
    key: str
    show: Callable[[Any], str] = str
    numeric: bool = False


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], sortable: bool = True) -> str:
    """A table of rows; numeric cells carry their raw value (``data-v``) for sorting."""
    head = "".join(
        f'<th class="{"num" if c.numeric else ""}" title="sort">{esc(c.heading)}</th>' for c in columns
    )
    body = []
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c.key)
            text = "" if _missing(value) else esc(c.show(value))
            if c.numeric:
                raw = "" if _missing(value) else repr(float(value))
                cells.append(f'<td class="num" data-v="{raw}">{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def definitions(items: Sequence[tuple[str, Any]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items) + "</dl>"


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


def summary_section(report: Report) -> Section:
    record = report.record
    workload, settings = record.workload, record.settings
    machine = record.environment.get("machine", {})
    software = record.environment.get("software", {})
    gpus = ", ".join(str(g.get("name")) for g in machine.get("gpus", [])) or "none"
    about = definitions(
        [
            ("workload", f"{workload.get('name')} ({workload.get('preset')}), {workload.get('domain', '')}"),
            ("parameters", count(workload.get("parameters"))),
            ("status", record.effective_status() + (f": {record.error}" if record.error else "")),
            ("device", settings.get("device")),
            *(
                []
                if record.kind in ("predict", "validate", "watch")  # no steps of dnnperf's own
                else [
                    ("data", f"{settings.get('data')}, {settings.get('workers')} workers"),
                    ("steps", f"{settings.get('steps')} measured after {settings.get('warmup')} warm-up"),
                ]
            ),
            ("created", f"{record.created} (finished {record.finished})"),
            ("command", " ".join(record.command) or "(from Python)"),
            (
                "machine",
                f"{machine.get('cpu_model')}, {machine.get('cores_usable')} usable cores, "
                f"{count(machine.get('memory_bytes'), 'B')} memory, GPUs: {gpus}",
            ),
            (
                "software",
                ", ".join(f"{k} {software.get(k)}" for k in ("dnnperf", "torch", "cuda", "python")),
            ),
        ]
    )
    unit = workload.get("sample_unit", "sample")
    rows = []
    for point in record.points:
        summary = point.summary()
        step, rate = summary["step_time_s"], summary["throughput"] or {}
        rows.append(
            {
                "batch": point.batch_size,
                "status": point.status + (f": {point.error}" if point.error else ""),
                "steps": step["n"],
                "median": step["median"],
                "p10": step["p10"],
                "p90": step["p90"],
                "rate": rate.get("median"),
            }
        )
    columns = [
        Column("batch", "batch", numeric=True),
        Column("status", "status"),
        Column("steps", "steps", numeric=True),
        Column("step ms (median)", "median", ms, numeric=True),
        Column("p10 ms", "p10", ms, numeric=True),
        Column("p90 ms", "p90", ms, numeric=True),
        Column(f"{unit}s/s", "rate", lambda v: f"{v:.1f}", numeric=True),
    ]
    return Section("summary", "Summary", about + (table(rows, columns) if rows else ""))


def stages_section(report: Report) -> Section | None:
    record = report.record
    points = [p for p in record.points if p.stages is not None and p.stages.wall_s]
    if not points:
        return None
    summaries = [p.stages.summary()["stages"] for p in points]
    names = list(dict.fromkeys(n for s in summaries for n in s))
    series = {n: [s.get(n, {}).get("median", 0.0) for s in summaries] for n in names}
    svg = charts.stacked_bars(
        [f"batch {p.batch_size}" for p in points], series, "median ms per step", seconds=True
    )
    rows = [
        {"batch": p.batch_size, "stage": n, **s[n]} for p, s in zip(points, summaries, strict=True) for n in s
    ]
    columns = [
        Column("batch", "batch", numeric=True),
        Column("stage", "stage"),
        Column("median ms", "median", ms, numeric=True),
        Column("p10 ms", "p10", ms, numeric=True),
        Column("p90 ms", "p90", ms, numeric=True),
        Column("share", "share", pct, numeric=True),
    ]
    caption = (
        "Where each step's time went: the median of each stage over the measured steps, per batch size "
        f"({points[0].stages.timing}). Per step the stages add up to the step."
    )
    return Section("stages", "Stage breakdown", chart(svg, caption) + table(rows, columns))


LAYER_COLUMNS = (
    Column("layer", "module"),
    Column("type", "type"),
    Column("phase", "phase"),
    Column("ms", "time_s", ms, numeric=True),
    Column("p10 ms", "time_p10_s", ms, numeric=True),
    Column("p90 ms", "time_p90_s", ms, numeric=True),
    Column("share", "share", pct, numeric=True),
    Column("FLOPs", "flops", count, numeric=True),
    Column("FLOP/s", "achieved_flops", count, numeric=True),
    Column("efficiency", "efficiency", pct, numeric=True),
    Column("FLOP/B", "intensity", lambda v: f"{v:.3g}", numeric=True),
    Column("bound", "bound"),
    Column("library", "library"),
)
TYPE_COLUMNS = (
    Column("layer type", "category"),
    *(
        c
        for c in LAYER_COLUMNS
        if c.key in ("phase", "time_s", "share", "achieved_flops", "efficiency", "library")
    ),
)


def layers_section(report: Report) -> Section | None:
    points = report.layer_tables
    if not points:
        return None
    parts = [
        "<p>Each layer's own time (not its children's) per step, median over the layer-timed steps; "
        "FLOPs from the operators it ran; efficiency against the calibrated peak. Click a heading to "
        "sort.</p>"
    ]
    for point, frame in points:
        top = frame.head(TOP_LAYERS)
        svg = charts.horizontal_bars(
            [f"{m} ({p})" for m, p in zip(top["module"], top["phase"], strict=True)],
            top["time_s"].to_list(),
            top["phase"].to_list(),
            "median ms per step",
            seconds=True,
        )
        caption = f"batch {point.batch_size}: the {len(top)} slowest of {len(frame)} layer phases"
        parts.append(f"<h3>batch {point.batch_size}</h3>" + chart(svg, caption))
        parts.append(f"<details><summary>all {len(frame)} layer phases</summary>")
        parts.append(table(frame.to_dict("records"), LAYER_COLUMNS) + "</details>")
        types = layer_analysis.category_table(point.layers, point.layers.hardware_profile())
        parts.append("<h4>by layer type</h4>" + table(types.to_dict("records"), TYPE_COLUMNS))
    return Section("layers", "Layers: time, FLOPs, efficiency", "".join(parts))


def roofline_section(report: Report) -> Section | None:
    points = [(p, f) for p, f in report.layer_tables if p.layers.hardware is not None]
    if not points:
        return None
    parts = []
    for point, frame in points:
        hardware = point.layers.hardware_profile()
        peak, bandwidth = hardware.peak_flops(), hardware.memory_bandwidth
        known = frame[(frame["intensity"] > 0) & (frame["achieved_flops"] > 0)]
        groups = {
            phase: (rows["intensity"].to_list(), rows["achieved_flops"].to_list())
            for phase, rows in known.groupby("phase", sort=False)
        }
        title = (
            f"{hardware.device_name}: peak {human_count(peak, 'FLOP/s')}, "
            f"DRAM {human_count(bandwidth, 'B/s')}"
        )
        svg = charts.roofline(peak, bandwidth, groups, title)
        caption = (
            f"batch {point.batch_size}: {len(known)} layer phases with FLOPs on the roofline of the "
            f"calibrated machine (float32 peak; the dotted line is the ridge point)"
        )
        parts.append(chart(svg, caption))
    return Section("roofline", "Roofline", "".join(parts))


def _timeline(memory: Any) -> tuple[list[float], dict[str, list[float]]]:
    """The memory timeline, binned to at most TIMELINE_POINTS samples (each bin's highest total, so
    the peak survives)."""
    times = np.asarray([t for t, _ in memory.timeline], dtype=float)
    values = np.asarray(
        [[bytes_.get(c, 0) for c in CATEGORIES] for _, bytes_ in memory.timeline], dtype=float
    )
    if len(times) > TIMELINE_POINTS:
        bins = np.array_split(np.arange(len(times)), TIMELINE_POINTS)
        keep = [b[np.argmax(values[b].sum(axis=1))] for b in bins]
        times, values = times[keep], values[keep]
    # Categories never alive in this step (e.g. no optimizer state) would be empty areas in the legend.
    return times.tolist(), {c: values[:, i].tolist() for i, c in enumerate(CATEGORIES) if values[:, i].any()}


def memory_section(report: Report) -> Section | None:
    record = report.record
    points = [p for p in record.points if p.memory is not None]
    if not points:
        return None
    colors = charts.color_map(CATEGORIES)
    peaks = peak_table([(p.batch_size, p.memory) for p in points])
    svg = charts.stacked_bars(
        [f"batch {b}" for b in peaks["batch_size"]],
        {c: peaks[c].to_list() for c in CATEGORIES},
        "bytes at the peak",
        colors,
        bytes_=True,
    )
    parts = [chart(svg, "Memory at the step's peak by data structure, per batch size")]
    parts.append(
        table(
            peaks.to_dict("records"),
            [
                Column("batch", "batch_size", numeric=True),
                *(Column(c.replace("_", " "), c, lambda v: count(v, "B"), numeric=True) for c in CATEGORIES),
                Column("measured peak", "measured_peak", lambda v: count(v, "B"), numeric=True),
                Column("peak in", "peak_phase"),
                Column("at layer", "peak_module"),
            ],
        )
    )
    for point in points:
        if not point.memory.timeline:
            continue
        times, series = _timeline(point.memory)
        svg = charts.memory_timeline(times, series, point.memory.stages, colors)
        caption = (
            f"batch {point.batch_size}: bytes alive by data structure through one step, with the stage "
            f"boundaries; peak {count(point.memory.tracked_peak, 'B')} at "
            f"{point.memory.peak_at_s * 1e3:.1f} ms ({point.memory.peak_phase}, {point.memory.peak_module})"
        )
        parts.append(chart(svg, caption))
    return Section("memory", "Memory", "".join(parts))


def device_capacity(record: RunRecord) -> int | None:
    """The memory of the device the run used, as the record describes the machine."""
    device = str(record.settings.get("device", "cpu"))
    machine = record.environment.get("machine", {})
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        gpus = machine.get("gpus", [])
        return gpus[index].get("memory_bytes") or None if index < len(gpus) else None
    return machine.get("memory_bytes")


def memory_scaling_section(report: Report) -> Section | None:
    record = report.record
    points = [(p.batch_size, p.memory) for p in record.points if p.memory is not None]
    if len({b for b, _ in points}) < 2:
        return None
    fit = scaling_fit(points)
    peak = fit.set_index("category").loc["peak"]
    capacity = device_capacity(record)
    try:
        predicted = predict_max_batch(points, capacity) if capacity else None
    except UsageError:  # the peak does not grow with the batch: no largest batch
        predicted = None
    table_ = peak_table(points)
    svg = charts.memory_scaling(
        table_["batch_size"].to_list(),
        table_["peak"].to_list(),
        float(peak["fixed"]),
        float(peak["per_sample"]),
        capacity,
        predicted,
    )
    caption = f"Peak memory = {count(peak['fixed'], 'B')} + {count(peak['per_sample'], 'B')} per sample; " + (
        f"the largest batch within the device's {count(capacity, 'B')}: {predicted}"
        if predicted
        else "no largest batch predicted"
    )
    columns = [
        Column("data structure", "category"),
        Column("fixed", "fixed", lambda v: count(v, "B"), numeric=True),
        Column("per sample", "per_sample", lambda v: count(v, "B"), numeric=True),
        Column("fit error", "max_rel_error", pct, numeric=True),
    ]
    body = chart(svg, caption) + table(fit.to_dict("records"), columns)
    return Section("memory-scaling", "Memory against batch size", body)


def ranks_section(report: Report) -> Section | None:
    """A distributed point: every rank's stages side by side (stacked bars), busy time and imbalance,
    and (``--memory``) every rank's peak by category."""
    from dnnperf.distributed.ranks import rank_balance, rank_medians, rank_memory
    from dnnperf.results.stages import STAGE_ORDER

    points = [p for p in report.record.points if p.ranks is not None and p.ranks.steps]
    if not points:
        return None
    parts = []
    for point in points:
        medians, balance = rank_medians(point.ranks), rank_balance(point.ranks)
        stages = [n for n in medians.index if n in STAGE_ORDER]
        svg = charts.stacked_bars(
            [f"rank {r}" for r in medians.columns],
            {n: medians.loc[n].to_list() for n in stages},
            "median ms per step",
            seconds=True,
        )
        own = strategy_settings(report.record.settings.get("distributed"))
        caption = (
            f"batch {point.batch_size}: {point.ranks.strategy} over {point.ranks.world_size} ranks "
            f"({point.ranks.backend}{'; ' + own if own else ''}); imbalance "
            f"{pct(balance['excess'].max())} (slowest busy / mean busy - 1)"
        )
        rows = [{"what": n, **{f"rank {r}": v for r, v in row.items()}} for n, row in medians.iterrows()]
        columns = [
            Column("", "what"),
            *(Column(f"rank {r}", f"rank {r}", ms, numeric=True) for r in medians.columns),
        ]
        parts.append(chart(svg, caption) + table(rows, columns))
        memory = rank_memory(point.ranks)
        if len(memory):
            categories = [c for c in memory.columns if c != "peak_bytes" and memory[c].abs().sum() > 0]
            svg = charts.stacked_bars(
                [f"rank {r}" for r in memory.index],
                {c: memory[c].clip(lower=0).to_list() for c in categories},
                "bytes at the rank's peak",
                bytes_=True,
            )
            caption = (
                f"batch {point.batch_size}: each rank's tracked step at its peak, by category; measured "
                f"peaks {', '.join(count(v, 'B') for v in memory['peak_bytes'])}"
            )
            parts.append(chart(svg, caption))
    return Section("ranks", "Ranks", "".join(parts))


def memsave_section(report: Report) -> Section | None:
    """``dnnperf memsave``: every variant's tracked step as bytes against time (one line each, the
    budget dashed), their measured peaks and overheads, and the plan's non-kept units."""
    result = report.record.memsave
    if result is None:
        return None
    lines = {v.name: ([t for t, _ in v.timeline], [b for _, b in v.timeline]) for v in result.variants}
    svg = charts.memory_lines({k: v for k, v in lines.items() if v[0]}, budget=result.budget)
    verdict = "the planner called it feasible" if result.feasible else f"no plan run: {result.reason}"
    caption = (
        f"Bytes allocated through one tracked step of each variant; budget {result.budget_text} = "
        f"{count(result.budget, 'B')} of an unoptimised peak of {count(result.baseline_peak, 'B')}; {verdict}"
    )
    rows = [
        {
            "variant": v.name,
            "peak": v.peak,
            "share": v.peak / result.baseline_peak,
            "step": float(np.median(v.step_s)),
            "plain": float(np.median(v.plain_s)),
            "overhead": v.overhead,
            "predicted_peak": v.predicted_peak,
            "predicted_overhead": v.predicted_overhead,
            "written": v.bytes_written,
        }
        for v in result.variants
    ]
    columns = [
        Column("variant", "variant"),
        Column("measured peak", "peak", lambda v: count(v, "B"), numeric=True),
        Column("vs none", "share", pct, numeric=True),
        Column("step ms (median)", "step", ms, numeric=True),
        Column("plain ms (median)", "plain", ms, numeric=True),
        Column("overhead", "overhead", pct, numeric=True),
        Column("predicted peak", "predicted_peak", lambda v: count(v, "B"), numeric=True),
        Column("predicted overhead", "predicted_overhead", pct, numeric=True),
        Column("written to disk", "written", lambda v: count(v, "B"), numeric=True),
    ]
    changed = [r for r in result.plan_table if r.get("policy") != "keep"]
    plan = (
        f"<h3>the plan: {len(changed)} of {len(result.plan_table)} units changed</h3>"
        + table(
            changed,
            [
                Column("unit", "unit"),
                Column("policy", "policy"),
                Column("saved for backward", "saved_bytes", lambda v: count(v, "B"), numeric=True),
                Column("forward ms", "forward_s", ms, numeric=True),
                Column("predicted cost ms", "predicted_cost_s", ms, numeric=True),
            ],
        )
        if changed
        else ""
    )
    return Section("memsave", "Memory saving", chart(svg, caption) + table(rows, columns) + plan)


#: Charts per sweep axis: one per combination of the other axes' values, the first few (the table has all).
MAX_HELD_CHARTS = 4


def prediction_section(report: Report) -> Section | None:
    """``dnnperf predict --sweep``: predicted throughput along each axis per strategy, where the best
    strategy changes (data vs model parallelism), and every predicted row."""
    from dnnperf.perfmodel.whatif import crossovers

    result = report.record.prediction
    if result is None:
        return None
    frame, axes = result.frame(), list(result.axes)
    crossings = crossovers(frame, axes)
    parts = [
        f"<p>{esc(result.workload)} ({esc(result.preset)}), global batch {result.batch_size} unless swept, "
        f"from the machine {esc(result.machine)}; predicted by the performance model, not measured.</p>"
    ]
    applies = frame[frame["reason"].isna()] if "reason" in frame else frame
    for strategy in result.strategies:
        refused = (
            frame[(frame["strategy"] == strategy) & frame["reason"].notna()] if "reason" in frame else []
        )
        if len(refused):
            parts.append(
                f"<p>{esc(strategy)} cannot apply to {len(refused)} of "
                f"{int((frame['strategy'] == strategy).sum())} configurations, e.g. "
                f"{esc(refused['reason'].iloc[0])}.</p>"
            )
    for axis in (a for a in axes if len(result.axes[a]) > 1):
        others = [a for a in axes if a != axis]
        held_groups = list(applies.groupby(others, sort=True)) if others else [((), applies)]
        for held, group in held_groups[:MAX_HELD_CHARTS]:
            held = held if isinstance(held, tuple) else (held,)
            label = ", ".join(f"{a}={v:g}" for a, v in zip(others, held, strict=True))
            series = {}
            for strategy, rows in group.groupby("strategy", sort=False):
                rows = rows.sort_values(axis)
                series[strategy] = (
                    rows[axis].tolist(),
                    rows["throughput"].tolist(),
                    rows["fits"].eq(True).tolist(),
                )
            spans = crossings[(crossings["axis"] == axis) & (crossings["held"] == label)]
            svg = charts.strategy_lines(axis, series, list(zip(spans["below"], spans["above"], strict=True)))
            changes = "; ".join(
                f"{r.before or 'none fits'} -> {r.after or 'none fits'} between {r.below:g} and {r.above:g}"
                for r in spans.itertuples()
            )
            caption = (
                f"along {axis}"
                + (f" ({label})" if label else "")
                + ": "
                + (f"the best strategy changes: {changes} (shaded)" if changes else "no crossover")
                + "; hollow markers do not fit in memory"
            )
            parts.append(chart(svg, caption))
        if len(held_groups) > MAX_HELD_CHARTS:
            parts.append(
                f"<p>{len(held_groups) - MAX_HELD_CHARTS} more combinations along {esc(axis)}: "
                "see the table.</p>"
            )
    if len(crossings):
        parts.append(
            "<h3>crossovers</h3>"
            + table(
                crossings.to_dict("records"),
                [
                    Column("axis", "axis"),
                    Column("held", "held"),
                    Column("below", "below", lambda v: f"{v:g}", numeric=True),
                    Column("above", "above", lambda v: f"{v:g}", numeric=True),
                    Column("best below", "before"),
                    Column("best above", "after"),
                ],
            )
        )
    columns = [
        *(Column(a, a, lambda v: f"{v:g}", numeric=True) for a in axes),
        Column("strategy", "strategy"),
        Column("step ms", "step_s", ms, numeric=True),
        Column("compute ms", "compute_s", ms, numeric=True),
        Column("exposed comm ms", "communication_s", ms, numeric=True),
        Column("bubble ms", "bubble_s", ms, numeric=True),
        Column("other ms", "other_s", ms, numeric=True),
        Column("samples/s", "throughput", lambda v: count(v), numeric=True),
        Column("memory/device", "memory_bytes", lambda v: count(v, "B"), numeric=True),
        Column("fits", "fits", lambda v: "yes" if v else "no"),
        Column("cannot apply", "reason"),
    ]
    parts.append("<h3>every configuration</h3>" + table(frame.to_dict("records"), columns))
    return Section("prediction", "Predicted what-if", "".join(parts))


def validation_section(report: Report) -> Section | None:
    """``dnnperf validate``: predicted against measured step times (one colour per strategy) and, with
    ``--collectives``, collective times (one colour per operation), with the targets' bands."""
    result = report.record.validation
    if result is None or not (result.runs or result.collectives or result.memory):
        return None
    parts = []
    if result.memory:
        parts.append(_memory_validation(pd.DataFrame(result.memory)))
    for rows, key, band, what, items in (
        (result.runs, "strategy", 0.15, "step", "runs"),
        (result.collectives, "op", 0.10, "collective", "collectives"),
    ):
        if not rows:
            continue
        frame = pd.DataFrame(rows)
        frame["error"] = frame["predicted_s"] / frame["measured_s"] - 1
        series = {
            name: (group["measured_s"].tolist(), group["predicted_s"].tolist())
            for name, group in frame.groupby(key, sort=False)
        }
        errors = frame["error"].abs()
        caption = (
            f"predicted against measured {what} time, {len(frame)} {items}: median |error| "
            f"{pct(errors.median())}, max {pct(errors.max())}, {int((errors <= band).sum())} within "
            f"{band:.0%} (dashed)"
        )
        parts.append(chart(charts.predicted_vs_measured(series, band), caption))
        columns = [
            *(
                [Column("workload", "workload"), Column("batch", "batch", numeric=True)]
                if key == "strategy"
                else [Column("bytes", "bytes", lambda v: count(v, "B"), numeric=True)]
            ),
            Column(key, key),
            Column("measured ms", "measured_s", ms, numeric=True),
            Column("predicted ms", "predicted_s", ms, numeric=True),
            Column("error", "error", pct, numeric=True),
            *([Column("fit on", "fit")] if key == "op" else []),
        ]
        if key == "op":
            frame["fit"] = frame["held_out"].map({True: "held out", False: "fit"})
        parts.append(table(frame.to_dict("records"), columns))
    return Section("validation", "Predicted against measured", "".join(parts))


def _memory_validation(frame: pd.DataFrame, band: float = 0.10) -> str:
    """``validate --memory``: predicted against the memory profiler's peak, one colour per workload."""
    frame = frame.assign(error=frame["predicted_bytes"] / frame["measured_bytes"] - 1)
    series = {
        name: ((group["measured_bytes"] / 1e6).tolist(), (group["predicted_bytes"] / 1e6).tolist())
        for name, group in frame.groupby("workload", sort=False)
    }
    errors = frame["error"].abs()
    caption = (
        f"predicted against measured peak memory of one device, {len(frame)} runs: median |error| "
        f"{pct(errors.median())}, max {pct(errors.max())}, {int((errors <= band).sum())} within "
        f"{band:.0%} (dashed)"
    )
    columns = [
        Column("workload", "workload"),
        Column("batch", "batch", numeric=True),
        Column("measured", "measured_bytes", lambda v: count(v, "B"), numeric=True),
        Column("predicted", "predicted_bytes", lambda v: count(v, "B"), numeric=True),
        Column("error", "error", pct, numeric=True),
        Column("measured at", "measured_phase"),
        Column("predicted at", "predicted_phase"),
    ]
    return chart(charts.predicted_vs_measured(series, band, unit="MB"), caption) + table(
        frame.to_dict("records"), columns
    )


#: The page, in order. Later capabilities append theirs (each returns None without its data).
def watch_section(report: Report) -> Section | None:
    """A watch: how the command ended and what sampling cost, then a timeline per metric (the tree's
    total; per process for RSS and cores), per GPU, the step marks as vertical lines, and the
    step-time histogram."""
    result = report.record.watch
    if result is None:
        return None
    summary, total, t = result.summary(), result.total, result.t
    marks = list(result.marks.t)
    about = definitions(
        [
            ("command", " ".join(result.config.argv)),
            ("ended", how_it_ended(result)),
            ("wall time", f"{result.wall_s:.2f} s"),
            ("samples", f"{summary['samples']}, every {result.config.interval_s:g} s"),
            ("sampling cost", sampling_cost(result)),
            ("GPUs", ", ".join(g.name for g in result.gpus) or result.gpu_note or "none"),
        ]
    )
    biggest = sorted(result.processes, key=lambda p: max(p.rss_bytes, default=0), reverse=True)
    shown = biggest[: charts.TIMELINE_PROCESSES]

    def own(process: Any, values: list[Any]) -> tuple[list[float], list[Any]]:
        return t[process.first : process.first + len(values)], values

    def label(process: Any) -> str:
        return f"{process.pid} {process.name}"

    figures = [
        chart(
            charts.timeline(
                {"total": (t, total.rss_bytes)} | {label(p): own(p, p.rss_bytes) for p in shown},
                "resident size",
                marks,
                in_bytes=True,
            ),
            "Resident size (RSS): the tree's total and its largest processes.",
        ),
        chart(
            charts.timeline(
                {"total": (t, result.cpu_cores())} | {label(p): own(p, result.cpu_cores(p)) for p in shown},
                "busy cores",
                marks,
            ),
            "Busy cores over the last interval: the tree's total and its largest processes.",
        ),
        chart(
            charts.timeline({"PSS": (t, total.pss_bytes), "USS": (t, total.uss_bytes)}, "bytes", marks, True),
            "Proportional and unique set size of the tree (each holds its last value between reads).",
        ),
        chart(
            charts.timeline(
                {"minor": (t, total.minor_faults), "major": (t, total.major_faults)}, "page faults", marks
            ),
            "Page faults, cumulative (ended descendants included).",
        ),
        chart(
            charts.timeline(
                {"read": (t, total.read_bytes), "written": (t, total.write_bytes)}, "disk bytes", marks, True
            ),
            "Bytes read from and written to storage, cumulative (ended descendants included).",
        ),
        chart(
            charts.timeline(
                {
                    "voluntary": (t, total.voluntary_switches),
                    "involuntary": (t, total.involuntary_switches),
                },
                "context switches",
                marks,
            ),
            "Context switches of the processes alive at each sample, cumulative.",
        ),
        chart(
            charts.timeline(
                {"threads": (t, total.threads), "processes": (t, total.processes)}, "count", marks
            ),
            "Threads and processes in the tree.",
        ),
    ]
    for gpu in result.gpus:
        name = f"GPU {gpu.index} ({gpu.name})"
        figures += [
            chart(
                charts.timeline({"used": (t, gpu.memory_used_bytes)}, "GPU memory", marks, True),
                f"{name}: memory used (all processes on the device).",
            ),
            chart(
                charts.timeline({"utilisation": (t, gpu.utilization_pct)}, "%", marks),
                f"{name}: utilisation (share of time a kernel ran).",
            ),
            chart(
                charts.timeline(
                    {"rx": (t, gpu.pcie_rx_bytes_per_s), "tx": (t, gpu.pcie_tx_bytes_per_s)},
                    "PCIe bytes/s",
                    marks,
                    True,
                ),
                f"{name}: PCIe traffic (rx: host to device).",
            ),
            chart(charts.timeline({"power": (t, gpu.power_w)}, "W", marks), f"{name}: power."),
        ]
    steps = result.step_s()
    if steps:
        figures.append(
            chart(
                charts.histogram(steps, "step time (ms), between consecutive mark_step calls"),
                f"{len(steps)} steps, median {ms(sorted(steps)[len(steps) // 2])} ms.",
            )
        )
    rows = [
        {
            "pid": p.pid,
            "name": p.name,
            "cmdline": " ".join(p.cmdline),
            "cpu": next((v for v in reversed(p.cpu_s) if v is not None), None),
            "peak": max(p.rss_bytes, default=None),
        }
        for p in result.processes
    ]
    columns = [
        Column("pid", "pid", numeric=True),
        Column("name", "name"),
        Column("command line", "cmdline"),
        Column("CPU s", "cpu", lambda v: f"{v:.2f}", numeric=True),
        Column("peak RSS", "peak", lambda v: human_count(v, "B"), numeric=True),
    ]
    return Section("watch", "Process tree", about + "".join(figures) + table(rows, columns))


SECTIONS: list[Renderer] = [
    summary_section,
    stages_section,
    layers_section,
    roofline_section,
    memory_section,
    memory_scaling_section,
    ranks_section,
    memsave_section,
    prediction_section,
    validation_section,
    watch_section,
]


# --------------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------------

# Nothing may load from anywhere: a violation is blocked and recorded by the page itself.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 1em 2em;
       color: #222; }
nav a { margin-right: 1em; }
h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
dl { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dt { font-weight: 600; } dd { margin: 0; overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; }
th, td { padding: .2em .6em; border-bottom: 1px solid #eee; text-align: left; }
th { cursor: pointer; background: #f6f6f6; position: sticky; top: 0; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure.chart { margin: 1em 0; } figure.chart svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 13px; }
"""

# Errors are collected before anything else runs (window errors, console.error, blocked loads), and
# once loaded the page marks on <body> how many charts it has and how many drew (an <svg> with
# visible graphics): a headless browser's dump of the DOM then says whether the page worked.
_HEAD_JS = """
window.dnnperfErrors = [];
window.addEventListener('error', e => window.dnnperfErrors.push(String(e.message)));
document.addEventListener('securitypolicyviolation', e =>
  window.dnnperfErrors.push('blocked ' + e.blockedURI));
const consoleError = console.error.bind(console);
console.error = (...args) => { window.dnnperfErrors.push(args.join(' ')); consoleError(...args); };
"""

_BODY_JS = """
for (const t of document.querySelectorAll('table.sortable')) {
  t.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
    const numeric = th.classList.contains('num'), up = th.dataset.dir !== 'up';
    th.dataset.dir = up ? 'up' : 'down';
    const key = r => { const c = r.cells[i];
      if (!numeric) return c.textContent;
      const v = parseFloat(c.dataset.v); return isNaN(v) ? -Infinity : v; };
    const rows = Array.from(t.tBodies[0].rows);
    const order = (x, y) => (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
    rows.sort((a, b) => order(key(a), key(b)));
    t.tBodies[0].append(...rows);
  }));
}
window.addEventListener('load', () => {
  const figures = document.querySelectorAll('figure.chart');
  let drawn = 0;
  for (const f of figures) {
    const svg = f.querySelector('svg');
    if (!svg) continue;
    const box = svg.getBBox();
    if (box.width > 0 && box.height > 0 && svg.querySelectorAll('path, use, rect').length > 0) drawn++;
  }
  document.body.dataset.charts = figures.length;
  document.body.dataset.chartsDrawn = drawn;
  document.body.dataset.errors = window.dnnperfErrors.length;
  document.body.dataset.errorText = window.dnnperfErrors.join(' | ');
});
"""


def render(
    record: RunRecord, sections: Sequence[Renderer] = SECTIONS, advance: Callable[[], None] | None = None
) -> str:
    """The whole page as a string (``advance`` is called after each section, for a progress bar)."""
    drawn, data = [], Report(record)
    for renderer in sections:
        section = renderer(data)
        if section is not None:
            drawn.append(section)
        if advance is not None:
            advance()
    title = f"dnnperf: {record.workload.get('name')} ({record.workload.get('preset')}) {record.id}"
    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in drawn)
    body = "".join(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{s.body}</section>' for s in drawn)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{esc(title)}</title><script>{_HEAD_JS}</script><style>{_CSS}</style></head>"
        f"<body><h1>{esc(title)}</h1><nav>{nav}</nav>{body}<script>{_BODY_JS}</script></body></html>\n"
    )


def write_report(record: RunRecord, path: Path, advance: Callable[[], None] | None = None) -> Path:
    """Render the record's report to ``path`` (atomically)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UsageError(f"cannot write the report to {path}: {path.parent} is not a directory")
    write_text_atomic(path, render(record, advance=advance))
    return path


def default_path(record_path: Path) -> Path:
    """The report beside its record: ``<id>.html``."""
    return Path(record_path).with_suffix(".html")
