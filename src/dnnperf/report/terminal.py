"""Rich tables of the suite, of a run's results and of the run store. Rendering only: no measuring."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable
from rich.text import Text

from dnnperf.errors import printable
from dnnperf.hardware import HardwareProfile
from dnnperf.results.layers import LayerProfile
from dnnperf.results.memory import StepMemory
from dnnperf.results.record import RunRecord
from dnnperf.results.stages import StageBreakdown

#: The most characters of one string a cell shows, and a title or caption.
CELL_LIMIT, TITLE_LIMIT = 120, 2000


def plain(value: Any, limit: int = CELL_LIMIT) -> Any:
    """A string as rich Text (never read as markup or emoji codes: a stored name such as "[/bold]"
    would stop rich), control characters made visible, cut to ``limit``; anything else as it is."""
    return Text(printable(value, limit, newlines=True)) if isinstance(value, str) else value


class Table(RichTable):
    """A rich table that shows every string it is given as it is (see ``plain``): names from a record
    or a command line reach these tables. Styled cells are passed as rich Text."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("title", "caption"):
            value = plain(value, TITLE_LIMIT)
        super().__setattr__(name, value)

    def add_column(self, header: Any = "", *args: Any, **kwargs: Any) -> None:
        super().add_column(plain(header), *args, **kwargs)

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(plain(cell) for cell in cells), **kwargs)


def human_count(value: float | None, unit: str = "") -> str:
    """1234567 -> '1.23 M'; None -> 'n/a'."""
    if value is None:
        return "n/a"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def milliseconds(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f}"


def measured_ms(row: dict[str, Any]) -> str:
    """A validation row's measured step, with the range over its runs where there were several."""
    low, high = row.get("measured_min_s"), row.get("measured_max_s")
    text = milliseconds(row["measured_s"])
    if low is None or high is None or low != low or high == low:  # one run (or NaN: none recorded)
        return text
    return f"{text} ({low * 1e3:.1f}-{high * 1e3:.1f})"


def suite_table(rows: list[dict[str, Any]], presets: tuple[str, ...]) -> Table:
    table = Table(title="dnnperf workload suite", title_justify="left")
    table.add_column("workload", style="bold")
    table.add_column("domain")
    for preset in presets:
        table.add_column(f"{preset} params", justify="right")
        table.add_column(f"{preset} FLOPs/sample", justify="right")
    for row in rows:
        cells = [row["name"], row["domain"]]
        for preset in presets:
            info = row["presets"][preset]
            cells += [human_count(info["parameters"]), human_count(info["train_flops_per_sample"])]
        table.add_row(*cells)
    table.caption = (
        "FLOPs: forward + backward of one training step, counted per operator as it ran (products, "
        "RNN kernels, normalisation, element-wise, losses), divided by the batch size."
    )
    return table


def points_table(record: RunRecord) -> Table:
    unit = record.workload.get("sample_unit", "sample")
    title = (
        f"{record.workload['name']} ({record.workload['preset']}) on {record.settings['device']}, "
        f"data {record.settings['data']}: {record.effective_status()}"
    )
    table = Table(title=title, title_justify="left")
    for name in (
        "batch",
        "status",
        "steps",
        "step ms median",
        "p10-p90 ms",
        f"{unit}s/s median",
        "p10-p90",
        "loss first->last",
    ):
        table.add_column(name, justify="right")
    for point in record.points:
        summary = point.summary()
        step, rate = summary["step_time_s"], summary["throughput"]
        losses = [v for v in point.loss if v is not None]
        loss = f"{losses[0]:.3g} -> {losses[-1]:.3g}" if losses else "n/a"
        if rate is None:
            table.add_row(str(point.batch_size), point.status, "0", "n/a", "n/a", "n/a", "n/a", loss)
            continue
        table.add_row(
            str(point.batch_size),
            point.status,
            str(step["n"]),
            milliseconds(step["median"]),
            f"{milliseconds(step['p10'])}-{milliseconds(step['p90'])}",
            f"{rate['median']:.1f}",
            f"{rate['p10']:.1f}-{rate['p90']:.1f}",
            loss,
        )
    return table


def runs_table(records: list[RunRecord]) -> Table:
    table = Table(title="runs", title_justify="left")
    for name in ("id", "workload", "preset", "device", "data", "status", "batch sizes", "best samples/s"):
        table.add_column(name)
    for record in records:
        rates = [p.summary()["throughput"] for p in record.points if p.status == "complete"]
        best = max((r["median"] for r in rates if r), default=None)
        table.add_row(
            record.id,
            record.workload.get("name", "?"),
            record.workload.get("preset", "?"),
            str(record.settings.get("device", "?")),
            str(record.settings.get("data", "?")),
            record.effective_status(),
            ",".join(str(p.batch_size) for p in record.points),
            "n/a" if best is None else f"{best:.1f}",
        )
    return table


def stages_table(batch_size: int, breakdown: StageBreakdown) -> Table:
    """Where the step's time went, stage by stage, adding up to the step."""
    summary = breakdown.summary()
    step = summary["step_time_s"]
    title = (
        f"batch {batch_size}: step {milliseconds(step['median'])} ms median over {step['n']} steps, "
        f"{summary['samples_per_s']:.1f} samples/s over them all ({breakdown.timing})"
        + ("" if breakdown.status == "complete" else f" [{breakdown.status}]")
    )
    table = Table(title=title, title_justify="left")
    table.add_column("stage")
    for name in ("median ms", "p10-p90 ms", "share"):
        table.add_column(name, justify="right")
    table.add_column("")
    for name, stats in summary["stages"].items():
        share = stats["share"]
        table.add_row(
            name,
            milliseconds(stats["median"]),
            f"{milliseconds(stats['p10'])}-{milliseconds(stats['p90'])}",
            f"{100 * share:.1f}%",
            "#" * round(40 * share),
        )
    for name, stats in summary["worker"].items():
        table.add_row(
            f"{name} (in workers)",
            milliseconds(stats["median"]),
            f"{milliseconds(stats['p10'])}-{milliseconds(stats['p90'])}",
            "",
            "",
        )
    cpu = summary["cpu"] if {"process_cores", "workers_cores", "usable_cores"} <= set(summary["cpu"]) else {}
    caption = (
        f"Shares add up to 100%; the worst step closes within {100 * summary['max_closure_error']:.2g}%."
    )
    if cpu:
        caption = (
            f"CPU: training process {cpu['process_cores']:.2f} cores, {breakdown.data_workers} data workers "
            f"{cpu['workers_cores']:.2f} cores, of {cpu['usable_cores']:.0f} usable. " + caption
        )
    table.caption = caption
    return table


def hardware_table(profile: HardwareProfile) -> Table:
    """The calibrated machine: compute peaks, memory bandwidth, transfers, dispatch overhead."""
    summary = profile.summary()
    title = (
        f"{profile.device_name} ({profile.device_key}), {profile.threads} threads, "
        f"calibrated in {profile.duration_s:.0f} s{' (quick)' if profile.quick else ''}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("measurement")
    table.add_column("value", justify="right")
    for op, peaks in summary["peak_flops"].items():
        for precision, rate in peaks.items():
            table.add_row(f"peak {op} {precision}", human_count(rate, "FLOP/s"))
    table.add_row("memory bandwidth (DRAM, roofline)", human_count(summary["memory_bandwidth"], "B/s"))
    for kernel, plateaus in summary["bandwidth_plateaus"].items():
        for level, rate in plateaus.items():
            table.add_row(f"{kernel} bandwidth, {level}", human_count(rate, "B/s"))
    if summary["host_transfer"]:
        for name, rate in summary["host_transfer"].items():
            table.add_row(f"host transfer {name}", human_count(rate, "B/s"))
    else:
        table.add_row("host transfer", profile.host_transfer_reason or "n/a")
    table.add_row("dispatch overhead per operator", f"{summary['dispatch_overhead_us']:.2f} µs")
    if profile.background_cores is not None:
        table.add_row("other processes during the calibration", f"{profile.background_cores:.2f} cores")
    return table


def cell_text(value: Any) -> str:
    """A table cell from a DataFrame value: missing (None, NaN) as empty, anything else as text."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def _percent(value: Any) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.1f}%"


def _rate(value: Any, unit: str) -> str:
    return "n/a" if value is None or value != value else human_count(float(value), unit)


def layers_tables(
    batch_size: int, profile: LayerProfile, stage_s: dict[str, float] | None = None, top: int = 15
) -> list[Table]:
    """The per-layer analysis of one batch size: the slowest layers, layer types, libraries, coverage."""
    from dnnperf.analysis import layers
    from dnnperf.probes.layers import PROFILER

    hardware = profile.hardware_profile()
    layer_rows = layers.layer_table(profile, hardware)
    hooks = layer_rows[layer_rows["module"] == PROFILER] if "module" in layer_rows else layer_rows.iloc[:0]
    layer_rows = layer_rows.drop(hooks.index).reset_index(drop=True)  # the timer's own work: no layer
    if not hooks.empty and layer_rows["time_s"].sum() > 0:  # shares of the layers' time alone
        layer_rows["share"] = layer_rows["time_s"] / layer_rows["time_s"].sum()
    peak = "no hardware profile: run `dnnperf hw` for efficiency and roofline"
    if hardware is not None:
        peak = (
            f"efficiency against {hardware.device_name}'s calibrated peak "
            f"{human_count(hardware.peak_flops(), 'FLOP/s')} (float32), roofline ridge at "
            f"{hardware.ridge_point():.1f} FLOP/B"
        )
    title = (
        f"batch {batch_size}: the {min(top, len(layer_rows))} slowest of {len(layer_rows)} layer phases "
        f"({profile.timing}, median of {profile.steps} steps)"
    )
    above = layer_rows[layer_rows["efficiency"] > 1.0] if "efficiency" in layer_rows else layer_rows.iloc[:0]
    if not above.empty:  # shown, not clipped: the profile underestimates this machine
        worst = above.loc[above["efficiency"].idxmax()]
        peak += (
            f"\n{len(above)} layer phase(s) ran above the calibrated peak (highest: {worst['module']} "
            f"{worst['phase']}, {_percent(worst['efficiency'])}): recalibrate with `dnnperf hw`"
        )
    if not hooks.empty:
        peak += (
            f"\ndnnperf's layer hooks took {milliseconds(float(hooks['time_s'].sum()))} ms of each "
            "instrumented step (a plain step has none): no layer's, left out of these tables"
        )
    table = Table(title=title, title_justify="left", caption=peak)
    for name, justify in (
        ("layer", "left"),
        ("type", "left"),
        ("phase", "left"),
        ("ms", "right"),
        ("share", "right"),
        ("FLOPs", "right"),
        ("FLOP/s", "right"),
        ("efficiency", "right"),
        ("FLOP/B", "right"),
        ("bound", "left"),
        ("library", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in layer_rows.head(top).to_dict("records"):
        table.add_row(
            cell_text(row["module"]),
            cell_text(row["type"]),
            cell_text(row["phase"]),
            milliseconds(row["time_s"]),
            _percent(row["share"]),
            _rate(row["flops"], ""),
            _rate(row["achieved_flops"], ""),
            _percent(row["efficiency"]),
            "n/a"
            if not isinstance(row["intensity"], float) or row["intensity"] != row["intensity"]
            else f"{row['intensity']:.1f}",
            cell_text(row["bound"]),
            cell_text(row["library"]),
        )

    categories = layers.category_table(profile, hardware)
    by_type = Table(title=f"batch {batch_size}: by layer type", title_justify="left")
    for name in ("layer type", "phase", "ms", "share", "FLOP/s", "efficiency", "library"):
        by_type.add_column(name, justify="left" if name in ("layer type", "phase", "library") else "right")
    for row in categories.to_dict("records"):
        by_type.add_row(
            cell_text(row["category"]),
            cell_text(row["phase"]),
            milliseconds(row["time_s"]),
            _percent(row["share"]),
            _rate(row["achieved_flops"], ""),
            _percent(row["efficiency"]),
            cell_text(row["library"]),
        )
    notes = []
    cover = layers.coverage(profile)
    uncovered = ", ".join(
        f"{r['op']} {_percent(r['share'])}" for r in cover["uncovered"].head(5).to_dict("records")
    )
    notes.append(
        f"FLOP formulas cover {_percent(cover['covered_share'])} of operator time"
        + (f" (without one: {uncovered})" if uncovered else "")
    )
    libraries = layers.library_table(profile)
    if not libraries.empty:
        per_library = libraries.groupby("library", sort=False)["share"].sum()
        notes.append("libraries: " + ", ".join(f"{name} {_percent(v)}" for name, v in per_library.items()))
    if stage_s:
        rows = layers.closure(profile, stage_s).to_dict("records")
        notes.append(
            "layers (instrumented steps) vs stages (plain steps): "
            + "; ".join(
                f"{r['phase']} {milliseconds(r['layers_s'])} of {milliseconds(r['stage_s'])} ms "
                + (
                    f"(remainder {_percent(r['remainder_share'])})"
                    if r["remainder_s"] >= 0
                    else f"(layers over by {_percent(-r['remainder_share'])}: the instrumentation's own cost)"
                )
                for r in rows
            )
        )
    by_type.caption = "\n".join(notes)
    return [table, by_type]


def libcompare_table(workload: str, batch_size: int, rows: list[dict[str, Any]], peak: float | None) -> Table:
    """Each convolution layer through the default library and through explicit im2col + GEMM."""
    table = Table(
        title=f"{workload}, batch {batch_size}: convolutions, default library vs im2col + GEMM",
        title_justify="left",
        caption=(
            f"efficiency against the calibrated peak {human_count(peak, 'FLOP/s')}"
            if peak
            else "no hardware profile: run `dnnperf hw` for efficiencies"
        )
        + "; ratio = im2col time / default time",
    )
    table.add_column("layer")
    table.add_column("input")
    table.add_column("kernel")
    for name in ("FLOPs fwd", "default fwd ms", "eff", "im2col fwd ms", "eff", "ratio fwd"):
        table.add_column(name, justify="right")
    for name in ("default bwd ms", "eff", "im2col bwd ms", "eff", "ratio bwd"):
        table.add_column(name, justify="right")

    def ms(value: Any) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    def ratio(value: Any) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    for row in rows:
        if row["skipped"]:
            table.add_row(row["layer"], row["input_shape"], row["kernel"], f"skipped: {row['skipped']}")
            continue
        table.add_row(
            row["layer"],
            row["input_shape"],
            row["kernel"],
            human_count(row["flops_forward"]),
            ms(row["default_fwd_ms"]),
            _percent(row["default_fwd_efficiency"]),
            ms(row["im2col_fwd_ms"]),
            _percent(row["im2col_fwd_efficiency"]),
            ratio(row["ratio_fwd"]),
            ms(row["default_bwd_ms"]),
            _percent(row["default_bwd_efficiency"]),
            ms(row["im2col_bwd_ms"]),
            _percent(row["im2col_bwd_efficiency"]),
            ratio(row["ratio_bwd"]),
        )
    return table


def memory_tables(batch_size: int, memory: StepMemory, top: int = 8) -> list[Table]:
    """The step's peak by data structure, where it fell, the busiest layers and the subsystem."""
    from dnnperf.results.memory import CATEGORIES, EXTRA

    total = memory.measured_peak or memory.tracked_peak
    title = (
        f"batch {batch_size}: peak memory {human_count(total, 'B')} at {memory.peak_at_s * 1e3:.1f} ms "
        f"({memory.peak_phase}, {memory.peak_module})"
    )
    table = Table(title=title, title_justify="left")
    for name, justify in (("data structure", "left"), ("bytes", "right"), ("share", "right"), ("", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for name in (*CATEGORIES, *EXTRA):
        value = memory.peak.get(name, 0)
        share = value / total if total else 0.0
        table.add_row(name, human_count(value, "B"), _percent(share), "#" * max(0, round(40 * share)))
    sub = memory.subsystem
    notes = [
        f"measured peak {human_count(memory.measured_peak, 'B')} ({memory.measured_by}); "
        f"tracked {human_count(memory.tracked_peak, 'B')}"
    ]
    if sub.get("peak_rss_growth_bytes") is not None:
        notes.append(
            f"process: resident {human_count(sub.get('rss_bytes'), 'B')}, peak resident grew "
            f"{human_count(sub['peak_rss_growth_bytes'], 'B')} during the step; page faults "
            f"{sub.get('minor_faults')} minor, {sub.get('major_faults')} major"
        )
    if "device_utilisation" in sub:
        notes.append(f"device memory used: {_percent(sub['device_utilisation'])} of capacity")
    for label, key in (("host to device", "host_to_device"), ("device to host", "device_to_host")):
        if sub.get(f"{key}_bytes"):
            notes.append(
                f"{label}: {human_count(sub[f'{key}_bytes'], 'B')} in {sub[f'{key}_s'] * 1e3:.2f} ms "
                f"({human_count(sub[f'{key}_bytes_per_s'], 'B/s')})"
            )
    counters = sub.get("cache_counters")
    if isinstance(counters, str):
        notes.append(f"hardware cache counters: {counters}")
    table.caption = "\n".join(notes)
    layers = Table(title=f"batch {batch_size}: layers by bytes saved for backward", title_justify="left")
    for name in ("layer", "parameters", "gradients", "outputs", "saved for backward"):
        layers.add_column(name, justify="left" if name == "layer" else "right")
    busiest = sorted(memory.layers.items(), key=lambda item: -item[1]["saved"])[:top]
    for name, entry in busiest:
        layers.add_row(
            name,
            human_count(entry["parameters"], "B"),
            human_count(entry["gradients"], "B"),
            human_count(entry["outputs"], "B"),
            human_count(entry["saved"], "B"),
        )
    return [table, layers]


def memory_scaling_table(
    fit: Any, limit: int | None, predicted: int | None, checked: Any = None, asked: bool = False
) -> Table:
    """Each category as fixed + per-sample bytes over the sweep, and the largest batch that fits within
    ``limit`` (``asked``: the user's --memory-limit, else the device's capacity)."""
    table = Table(title="memory against batch size: bytes = fixed + per sample x batch", title_justify="left")
    for name in ("data structure", "fixed", "per sample", "fit error"):
        table.add_column(name, justify="left" if name == "data structure" else "right")
    for row in fit.to_dict("records"):
        table.add_row(
            row["category"],
            human_count(row["fixed"], "B"),
            human_count(row["per_sample"], "B"),
            _percent(row["max_rel_error"]),
        )
    if limit is not None:
        caption = f"largest batch within {human_count(limit, 'B')}: {predicted if predicted else 'none'}"
        if checked is not None:
            verdict = "within" if checked <= limit else "ABOVE"
            caption += f"; ran it: peak {human_count(checked, 'B')} ({verdict} the limit)"
        elif asked:  # no batch to run: not even one sample fits by the fit
            caption += " (predicted from the fit: even one sample's memory is above the limit)"
        else:
            caption += " (predicted, not run: pass --memory-limit to check a limit by running it)"
        table.caption = caption
    return table


def strategy_settings(distributed: Any) -> str:
    """The strategy's own settings of a record's ``settings.distributed`` as one phrase ("" when it
    has none, or the block is absent): fsdp's resharding and mixed precision, dp's and zero1's bucket
    cap, pp's schedule and micro-batches."""
    if not isinstance(distributed, dict):
        return ""
    strategy = distributed.get("strategy")
    if strategy == "fsdp":
        parts = []
        if "reshard_after_forward" in distributed:
            reshard = distributed["reshard_after_forward"]
            parts.append("resharded after forward" if reshard else "kept gathered after forward")
        if "mixed_precision" in distributed:
            parts.append(f"mixed precision {distributed['mixed_precision'] or 'none'}")
        return ", ".join(parts)
    if strategy in ("dp", "zero1") and "bucket_cap_mb" in distributed:
        cap = distributed["bucket_cap_mb"]
        return f"bucket cap {'DDP default' if cap is None else f'{cap:g} MiB'}"
    if strategy == "pp" and "schedule" in distributed:
        return f"{distributed['schedule']} schedule, {distributed.get('microbatches')} micro-batches"
    return ""


def ranks_tables(batch_size: int, ranks: Any, distributed: Any = None) -> list[Table]:
    """A distributed point: every rank's stages side by side (its exposed ``exchange`` beside its
    compute) with the slowest rank and the imbalance, then (dp) each gradient bucket's allreduce, then
    (``--memory``) each rank's peak by category. ``distributed``: the record's
    ``settings.distributed``, whose strategy settings the title names."""
    from dnnperf.distributed.ranks import bucket_table, rank_balance, rank_medians, rank_memory

    medians, balance = rank_medians(ranks), rank_balance(ranks)
    slowest = int(balance.index[balance["slowest"]][0])
    imbalance = float(balance["excess"].max())
    own = strategy_settings(distributed)
    table = Table(
        title=(
            f"batch {batch_size}: {ranks.strategy} over {ranks.world_size} ranks ({ranks.backend}, "
            f"{ranks.timing}{'; ' + own if own else ''}), median ms per step; slowest rank {slowest}, "
            f"imbalance {100 * imbalance:.1f}%"
        ),
        title_justify="left",
    )
    table.add_column("")
    for rank in medians.columns:
        table.add_column(f"rank {rank}" + (" (slowest)" if rank == slowest else ""), justify="right")
    table.add_column("max - min", justify="right")
    for name, row in medians.iterrows():
        table.add_row(str(name), *(milliseconds(v) for v in row), milliseconds(row.max() - row.min()))
    table.caption = (
        "busy: time the rank worked rather than waited for others (the task's compute, else the step less "
        "the exposed exchange); imbalance: slowest busy / mean busy - 1."
    )
    tables = [table]
    buckets = bucket_table(ranks)
    if len(buckets):
        bucket = Table(
            title=f"batch {batch_size}: gradient buckets: wait (launch to completion), skew, own time",
            title_justify="left",
        )
        for name in buckets.columns:
            bucket.add_column(name, justify="right")
        for _, row in buckets.iterrows():
            bucket.add_row(
                *(
                    milliseconds(v) + " ms"
                    if str(k).endswith(" s")
                    else human_count(v, "B" if k == "bytes" else "")
                    for k, v in row.items()
                )
            )
        tables.append(bucket)
    memory = rank_memory(ranks)
    if len(memory):
        by_rank = Table(
            title=f"batch {batch_size}: each rank's tracked step, bytes at its peak", title_justify="left"
        )
        by_rank.add_column("")
        for rank in memory.index:
            by_rank.add_column(f"rank {rank}", justify="right")
        for name in memory.columns:
            if name == "peak_bytes" or memory[name].abs().sum() > 0:
                label = "measured peak" if name == "peak_bytes" else str(name)
                by_rank.add_row(label, *(human_count(v, "B") for v in memory[name]))
        tables.append(by_rank)
    return tables


def _ms3(seconds: Any) -> str:
    """Milliseconds to three significant digits (a layer can take microseconds)."""
    return "" if seconds is None or seconds != seconds else f"{seconds * 1e3:.3g}"


def compare_table(frame: Any, a: str, b: str, top: int = 10) -> Table:
    """``analysis.compare.compare_runs``: the step and stages of each batch size, then the layer phases
    that were flagged or moved most beyond the common factor."""
    table = Table(title=f"A = {a}\nB = {b}", title_justify="left")
    for name, justify in (
        ("batch", "right"), ("", "left"), ("phase", "left"), ("A ms", "right"), ("B ms", "right"),
        ("change", "right"), ("beyond common", "right"), ("p", "right"), ("flag", "left"),
    ):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    layers = frame[frame["kind"] == "layer"]
    moved = layers.assign(size=layers["excess_rel"].abs()).sort_values(["flagged", "size"], ascending=False)
    keep = list(frame.index[frame["kind"] != "layer"])
    for _, group in moved.groupby(["batch_a", "batch_b"], sort=False):
        keep += list((group[group["flagged"]] if group["flagged"].sum() > top else group.head(top)).index)
    shown = frame.loc[sorted(keep)]
    for row in shown.to_dict("records"):
        a_b = (row["batch_a"], row["batch_b"])
        batch = str(a_b[0]) if a_b[0] == a_b[1] else f"{a_b[0]}->{a_b[1]}"
        flag = row["change"].upper() if row["flagged"] else row["change"]
        table.add_row(
            batch,
            cell_text(row["name"]),
            cell_text(row["phase"]),
            _ms3(row["a_median_s"]),
            _ms3(row["b_median_s"]),
            _percent(row["delta_rel"]),
            "" if row["kind"] == "step" else _percent(row["excess_rel"]),
            "" if row["p_value"] != row["p_value"] else f"{row['p_value']:.2g}",
            Text(flag, style="bold red") if row["flagged"] else flag,
        )
    table.caption = (
        "change: B's median against A's; beyond common: against A x the common factor (what the whole "
        "run changed by). Flagged: beyond both runs' noise (see docs/reports.md). Layers: the "
        f"{top} that moved most per batch size, or every flagged one."
    )
    return table


def reproduction_table(reproduction: Any) -> Table:
    """A reproduced paper: each claim, what was measured here, the verdict."""
    table = Table(
        title=f"seed {reproduction.seed}: {reproduction.title}", title_justify="left", show_lines=True
    )
    for name in ("the paper's claim", "measured here", "verdict"):
        table.add_column(name, overflow="fold")
    for claim in reproduction.claims:
        style = "green" if claim.verdict == "holds" else "yellow"
        # Sentences, not names: shown whole (as Text, so never read as markup), folded by the columns.
        verdict = Text(claim.verdict, style=style) + Text(printable(f": {claim.why}"))
        table.add_row(Text(printable(claim.claim)), Text(printable(claim.measured)), verdict)
    return table


def _spread(values: list[float]) -> str:
    """p10-p90 of per-pair overheads, in percent."""
    from dnnperf.stats import Samples

    samples = Samples.of(values)
    return f"{100 * samples.p10:+.0f}..{100 * samples.p90:+.0f}%"


def memsave_plan_table(
    rows: list[dict[str, Any]],
    budget: int,
    budget_text: str,
    baseline_peak: int,
    feasible: bool,
    predicted_peak: int | None,
    reason: str = "",
) -> Table:
    """``dnnperf memsave``'s plan: per unit its policy, saved bytes and predicted cost."""
    verdict = (
        Text(f"predicted peak {human_count(predicted_peak, 'B')}")
        if feasible
        else Text("infeasible", style="bold red")
    )
    heading = (
        f"memsave plan for a budget of {budget_text} = {human_count(budget, 'B')} "
        f"(unoptimised peak {human_count(baseline_peak, 'B')}): "
    )
    table = Table(title=Text.assemble(plain(heading, TITLE_LIMIT), verdict), title_justify="left")
    for name in ("unit", "policy", "saved for backward", "forward ms", "predicted cost ms"):
        table.add_column(name, justify="left" if name in ("unit", "policy") else "right")
    for row in rows:
        policy = str(row.get("policy", ""))
        table.add_row(
            cell_text(row.get("unit")),
            policy if policy == "keep" else Text(policy, style="bold"),
            human_count(row.get("saved_bytes"), "B"),
            _ms3(row.get("forward_s")),
            _ms3(row.get("predicted_cost_s")),
        )
    cost = sum(float(r.get("predicted_cost_s") or 0.0) for r in rows)
    notes = [
        f"predicted added time per step: {cost * 1e3:.3g} ms (recompute: forward time; offload: "
        "exposed seconds per byte from the offload-everything run)"
    ]
    if not feasible:
        notes.append(reason)
    table.caption = "\n".join(notes)
    return table


def memsave_variants_table(result: Any) -> Table:
    """``dnnperf memsave``: every variant's measured peak and overhead, beside the planner's prediction."""
    from dnnperf.stats import Samples

    table = Table(
        title="memsave: measured peak and step time of each variant "
        f"(budget {human_count(result.budget, 'B')})",
        title_justify="left",
    )
    for name in (
        "variant", "peak", "vs none", "in budget", "step ms", "plain ms", "overhead", "p10..p90",
        "pred. peak", "pred. overhead", "to disk",
    ):  # fmt: skip
        table.add_column(name, justify="left" if name == "variant" else "right")
    for v in result.variants:
        pairs = [s / p - 1 for s, p in zip(v.step_s, v.plain_s, strict=False)]
        within = "yes" if v.peak <= result.budget else Text("no", style="red")
        table.add_row(
            v.name,
            human_count(v.peak, "B"),
            _percent(v.peak / result.baseline_peak),
            within,
            milliseconds(Samples.of(v.step_s).median),
            milliseconds(Samples.of(v.plain_s).median),
            f"{100 * v.overhead:+.1f}%",
            _spread(pairs) if pairs else "n/a",
            human_count(v.predicted_peak, "B") if v.predicted_peak is not None else "",
            f"{100 * v.predicted_overhead:+.1f}%" if v.predicted_overhead is not None else "",
            human_count(v.bytes_written, "B") if v.bytes_written else "",
        )
    notes = [
        "peak: the allocator's peak of one tracked step; overhead: median variant step / median of the "
        f"plain steps interleaved with it - 1 ({len(result.variants[0].step_s)} pairs); p10..p90 of the "
        "per-pair ratios"
    ]
    notes.append(
        "the planner called the budget feasible" if result.feasible else f"no planner run: {result.reason}"
    )
    table.caption = "\n".join(notes)
    return table


def memsave_tables(result: Any) -> list[Table]:
    """A ``memsave`` record section: the plan, then the variants."""
    planned = next((v for v in result.variants if v.name == "planner"), None)
    plan = memsave_plan_table(
        result.plan_table,
        result.budget,
        result.budget_text,
        result.baseline_peak,
        result.feasible,
        planned.predicted_peak if planned is not None else None,
        result.reason,
    )
    return [plan, memsave_variants_table(result)]


def prediction_table(predictions: list[Any], refused: dict[str, str], best: Any = None) -> Table:
    """Predicted steps (dnnperf.perfmodel.predict.Prediction), one row per strategy; refused ones say why."""
    first = predictions[0] if predictions else None
    title = "predicted step" + (
        f": {first.workload}, batch {first.batch_size}, on {first.machine}" if first else ""
    )
    table = Table(title=title)
    for column in (
        "strategy",
        "devices",
        "step ms",
        "compute",
        "exposed comm",
        "bubble",
        "other",
        "samples/s",
        "memory/device",
        "fits",
    ):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for p in predictions:
        mark = " (best)" if best is not None and p is best else ""
        kept = " kept after forward" if p.detail.get("reshard_after_forward") is False else ""
        table.add_row(
            f"{p.strategy}{kept}{mark}",
            str(p.devices),
            f"{p.step_s * 1e3:.3g}",
            milliseconds(p.compute_s),
            milliseconds(p.communication_s),
            milliseconds(p.bubble_s),
            milliseconds(p.other_s),
            human_count(p.throughput),
            human_count(p.memory_bytes, "B"),
            "yes" if p.fits else "NO",
        )
    for strategy, reason in refused.items():
        table.add_row(strategy, "", "", "", "", "", "", "", "", reason)
    return table


def sweep_table(frame: Any, axes: list[str], title: str) -> Table:
    """A what-if sweep: one row per combination of the axes, samples/s per strategy and the best one."""
    strategies = list(dict.fromkeys(frame["strategy"]))
    table = Table(title=f"what-if: {title} (samples/s per strategy; - cannot apply, * does not fit)")
    for column in (*axes, *strategies, "best"):
        table.add_column(column, justify="right")
    reasons: dict[str, list[str]] = {}
    for values, group in frame.groupby(axes, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        cells, best, best_rate = [], "-", 0.0
        for strategy in strategies:
            row = group[group["strategy"] == strategy].iloc[0]
            if isinstance(row.get("reason"), str):
                cells.append("-")
                found = reasons.setdefault(strategy, [])
                if row["reason"] not in found:
                    found.append(row["reason"])
                continue
            cells.append(human_count(row["throughput"]) + ("" if row["fits"] else "*"))
            if row["fits"] and row["throughput"] > best_rate:
                best, best_rate = strategy, row["throughput"]
        table.add_row(*(f"{v:g}" for v in values), *cells, best)
    if reasons:  # why each "-": a strategy's first reason, and how many others it gave
        table.caption = "; ".join(
            f"{strategy} -: {found[0]}" + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
            for strategy, found in reasons.items()
        )
    return table


def validation_tables(frame: Any, ablation: Any) -> list[Table]:
    """dnnperf validate: measured against predicted per configuration, and the ablation's errors."""
    runs = Table(title="measured vs predicted step (single process)")
    for column in ("workload", "batch", "measured ms (range)", "predicted ms", "error"):
        runs.add_column(column, justify="left" if column == "workload" else "right")
    for row in frame.to_dict(orient="records"):
        runs.add_row(
            row["workload"],
            str(row["batch"]),
            measured_ms(row),
            milliseconds(row["pred[model]"]),
            _percent(row["err[model]"]),
        )
    variants = Table(title="ablation: absolute error over these runs")
    for column in ("variant", "median", "max"):
        variants.add_column(column, justify="left" if column == "variant" else "right")
    for row in ablation.to_dict(orient="records"):
        variants.add_row(row["variant"], _percent(row["median_abs_error"]), _percent(row["max_abs_error"]))
    return [runs, variants]


def validation_record_tables(result: Any) -> list[Table]:
    """A ``validate`` record's rows, measured beside predicted with the error: step times (per strategy),
    collectives (per operation and size) and peak memory, each a table when the record has them."""

    def size(value: Any) -> str:
        return human_count(value, "B")

    parts = (  # rows, title, key columns, field suffix, unit, format
        (result.runs, "step time", ["workload", "batch", "strategy"], "_s", "ms", milliseconds),
        (result.collectives, "collectives", ["op", "bytes"], "_s", "ms", milliseconds),
        (result.memory, "peak memory", ["workload", "batch"], "_bytes", "", size),
    )
    tables = []
    for rows, title, keys, suffix, unit, shown in parts:
        if not rows:
            continue
        table = Table(title=f"{title}, measured vs predicted ({len(rows)} rows)")
        for column in [*keys, f"measured {unit}".strip(), f"predicted {unit}".strip(), "error"]:
            table.add_column(column, justify="left" if column in ("workload", "strategy", "op") else "right")
        for row in rows:
            measured, predicted = row.get(f"measured{suffix}"), row.get(f"predicted{suffix}")
            error = predicted / measured - 1 if measured and predicted is not None else None
            cells = [cell_text(row.get(k)) for k in keys]
            table.add_row(*cells, shown(measured), shown(predicted), _percent(error))
        tables.append(table)
    return tables


def crossover_table(crossings: Any) -> Table | str:
    """Where the best predicted strategy changes along an axis (model.whatif.crossovers); a line saying
    there is none where it never does."""
    if len(crossings) == 0:
        return "crossovers: the best strategy does not change along the sweep"
    table = Table(title="crossovers: where the best strategy changes")
    for column in ("axis", "held", "between", "best below", "best above"):
        table.add_column(column)
    for r in crossings.itertuples():
        table.add_row(
            r.axis,
            r.held or "-",
            f"{r.below:g} and {r.above:g}",
            r.before if isinstance(r.before, str) else "none fits",  # None, or NaN once in a frame
            r.after if isinstance(r.after, str) else "none fits",
        )
    return table


def collectives_table(table: Any, summary: dict[str, float]) -> Table:
    """dnnperf validate --collectives: each operation and size, measured against the fitted model."""
    out = Table(
        title=(
            f"gloo collectives, 2 ranks: measured vs predicted (>= 64 KiB: median |error| "
            f"{summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}; sizes the fit never "
            f"saw: median {summary['held_out_median_abs_error']:.1%}, "
            f"max {summary['held_out_max_abs_error']:.1%})"
        )
    )
    for column in ("operation", "bytes", "measured ms (p10-p90)", "predicted ms", "error", "fit on"):
        out.add_column(column, justify="left" if column in ("operation", "fit on") else "right")
    for r in table.itertuples():
        out.add_row(
            r.op,
            human_count(r.bytes, "B"),
            f"{r.median_s * 1e3:.3g} ({r.p10_s * 1e3:.3g}-{r.p90_s * 1e3:.3g})",
            f"{r.predicted_s * 1e3:.3g}",
            _percent(r.error),
            "held out" if r.held_out else "fit",
        )
    return out


def distributed_memory_table(frame: Any, summary: dict[str, float]) -> Table:
    """dnnperf validate --memory --distributed: the heaviest rank's measured peak against the predicted
    peak of one device, per workload, global batch and strategy, every rank's peak beside it."""
    table = Table(
        title=(
            f"peak memory per device on 2 ranks, measured (memory profiler, heaviest rank) vs predicted: "
            f"median |error| {summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}, "
            f"{summary['within_10_percent']} of {summary['runs']} within 10%"
        ),
    )
    for column in ("workload", "batch", "strategy", "measured", "predicted", "error", "ranks"):
        table.add_column(column, justify="left" if column in ("workload", "strategy", "ranks") else "right")
    for row in frame.to_dict(orient="records"):
        reason = row.get("reason")
        ranks = row.get("measured_ranks")
        table.add_row(
            row["workload"],
            str(row["batch"]),
            row["strategy"],
            "" if isinstance(reason, str) else human_count(row["measured_bytes"], "B"),
            ""
            if row["predicted_bytes"] != row["predicted_bytes"]
            else human_count(row["predicted_bytes"], "B"),
            reason[:60] if isinstance(reason, str) else f"{100 * row['error']:+.1f}%",
            ", ".join(human_count(v, "B") for v in ranks) if isinstance(ranks, list) else "",
        )
    return table


def memory_validation_table(frame: Any, summary: dict[str, float]) -> Table:
    """dnnperf validate --memory: measured against predicted peak per configuration, with the bytes
    of each category at both sides' peaks (predicted / measured) to say where a miss comes from."""
    table = Table(
        title=(
            f"peak memory of one step, measured (memory profiler) vs predicted: median |error| "
            f"{summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}, "
            f"{summary['within_10_percent']} of {summary['runs']} within 10%"
        ),
        caption="per category: bytes at the predicted / the measured peak (bwd: backward, upd: update)",
    )
    parts = {
        "parameters": "params",
        "gradients": "grads",
        "optimizer_state": "opt state",
        "activations": "activations",
        "temporaries": "temporaries",
    }
    for column in ("workload", "batch", "measured", "predicted", "error", "peak in", *parts.values()):
        table.add_column(column, justify="left" if column in ("workload", "peak in") else "right")
    short = {"backward": "bwd", "update": "upd", "forward": "fwd"}
    for row in frame.to_dict(orient="records"):
        if isinstance(row.get("reason"), str):
            table.add_row(
                row["workload"],
                str(row["batch"]),
                "",
                human_count(row["predicted_bytes"], "B"),
                "",
                row["reason"][:60],
                *([""] * len(parts)),
            )
            continue
        phases = [short.get(row[k], row[k]) for k in ("predicted_phase", "measured_phase")]
        table.add_row(
            row["workload"],
            str(row["batch"]),
            human_count(row["measured_bytes"], "B"),
            human_count(row["predicted_bytes"], "B"),
            "n/a" if row["error"] != row["error"] else f"{100 * row['error']:+.1f}%",
            " / ".join(phases),
            *(f"{human_count(row[f'predicted[{p}]'])} / {human_count(row[f'measured[{p}]'])}" for p in parts),
        )
    return table


def distributed_validation_table(frame: Any, ranking: Any) -> Table:
    """dnnperf validate --distributed: 2-rank runs against the model, and the strategies' ranking."""
    ran = frame[frame["reason"].isna()] if "reason" in frame else frame
    errors = ran["error"].abs()
    agree = int(ranking["agrees"].sum()) if len(ranking) else 0
    beyond = int(ranking["agrees_where_separated"].sum()) if len(ranking) else 0
    table = Table(
        title=(
            f"2 ranks, measured vs predicted step: median |error| {errors.median():.1%}, "
            f"max {errors.max():.1%}; "
            f"ranking of the strategies agrees in {agree} of {len(ranking)} "
            f"({beyond} of {len(ranking)} on the pairs the launches' ranges separate)"
        )
    )
    links = "link" in frame and set(frame["link"].dropna()) != {"loopback"}
    for column in (
        "workload",
        "batch",
        *(["link"] if links else []),
        "strategy",
        "measured ms (range)",
        "predicted ms",
        "error",
        "comm ms",
        "bubble ms",
    ):
        table.add_column(column, justify="left" if column in ("workload", "strategy", "link") else "right")
    for row in frame.to_dict(orient="records"):
        first = [row["workload"], str(row["batch"]), *([str(row["link"])] if links else [])]
        if isinstance(row.get("reason"), str):
            table.add_row(*first, row["strategy"], "", "", "", "", row["reason"])
            continue
        table.add_row(
            *first,
            row["strategy"],
            measured_ms(row),
            milliseconds(row["predicted_s"]),
            _percent(row["error"]),
            milliseconds(row["communication_s"]),
            milliseconds(row["bubble_s"]),
        )
    return table


def mebibytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


def last_known(values: list[Any]) -> Any:
    """The last value that is not None (a counter some samples could not read), None if none is."""
    return next((v for v in reversed(values) if v is not None), None)


def signal_name(number: int | None) -> str:
    import signal

    try:
        return signal.Signals(number).name if number is not None else "none"
    except ValueError:
        return f"signal {number}"


def how_it_ended(result: Any) -> str:
    """ "exited with code 0", "killed by SIGKILL", "interrupted (SIGINT), exited with code 130"."""
    ending = (
        f"exited with code {result.exit_code}"
        if result.exit_code is not None
        else f"killed by {signal_name(result.signal)}"
    )
    if result.end == "interrupted":
        return f"interrupted ({signal_name(result.stop_signal)} to the watcher), then {ending}"
    return ending


def sampling_cost(result: Any) -> str:
    """What the watcher's sampling cost: CPU milliseconds per sample and the share of one core."""
    share = result.sampling_share
    per_sample = milliseconds(result.cost.per_sample_s)
    shown = "n/a" if share is None else f"{share * 100:.1f}% of a core"
    return f"{per_sample} ms of CPU per sample, {shown}"


def watch_tables(record: RunRecord) -> list[Table]:
    """A watch record: the summary, its processes, its GPUs (or why none), its steps, what outlived it."""
    result = record.watch
    if result is None:
        return []
    tables = [watch_summary_table(record), watch_processes_table(result), watch_gpus_table(result)]
    steps = watch_steps_table(result)
    if steps is not None:
        tables.append(steps)
    if result.outlived:
        outlived = Table(title="processes that outlived the command", title_justify="left")
        for name in ("pid", "name", "command line", "fate"):
            outlived.add_column(name)
        for process in result.outlived:
            outlived.add_row(str(process.pid), process.name, " ".join(process.cmdline), process.fate)
        tables.append(outlived)
    return tables


def watch_summary_table(record: RunRecord) -> Table:
    result = record.watch
    assert result is not None
    summary, total = result.summary(), result.total
    table = Table(
        title=f"watch {record.id}: {record.effective_status()}", title_justify="left", show_header=False
    )
    table.add_column("")
    table.add_column("")
    # Switches are those of the processes alive at each sample: the most the tree held at once.
    pairs = zip(total.voluntary_switches, total.involuntary_switches, strict=True)
    switches = max((a + b for a, b in pairs), default=None)
    rows = [
        ("program", str(record.workload.get("name", "?"))),
        ("command", printable(" ".join(result.config.argv), CELL_LIMIT)),
        ("ended", how_it_ended(result)),
        ("wall time", f"{result.wall_s:.2f} s"),
        ("samples", f"{summary['samples']} every {result.config.interval_s:g} s"),
        ("sampling cost", sampling_cost(result)),
        ("peak RSS (sampled)", mebibytes(summary["peak_rss_bytes"])),
        ("peak RSS (kernel: the largest process)", mebibytes(result.kernel_peak_rss_bytes)),
        ("peak PSS", mebibytes(max((v for v in total.pss_bytes if v is not None), default=None))),
        (
            "busy cores (mean / peak)",
            " / ".join(_cores(summary[k]) for k in ("mean_cpu_cores", "peak_cpu_cores")),
        ),
        (
            "CPU time (kernel: the command and what it reaped)",
            "n/a" if result.kernel_cpu_s is None else f"{result.kernel_cpu_s:.2f} s",
        ),
        (
            "page faults (minor / major)",
            " / ".join(human_count(last_known(s)) for s in (total.minor_faults, total.major_faults)),
        ),
        (
            "disk read / written",
            " / ".join(human_count(last_known(s), "B") for s in (total.read_bytes, total.write_bytes)),
        ),
        ("context switches (most at once)", human_count(switches)),
        ("threads (max)", str(max(total.threads, default=0))),
        ("processes (max)", str(max(total.processes, default=0))),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _cores(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def watch_processes_table(result: Any) -> Table:
    table = Table(title="processes", title_justify="left")
    for name, justify in (
        ("pid", "right"),
        ("name", "left"),
        ("CPU s", "right"),
        ("mean cores", "right"),
        ("peak RSS", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for process in result.processes:
        cores = [c for c in result.cpu_cores(process) if c is not None]
        table.add_row(
            str(process.pid),
            process.name,
            f"{last_known(process.cpu_s) or 0.0:.2f}",
            _cores(sum(cores) / len(cores) if cores else None),
            mebibytes(max(process.rss_bytes, default=None)),
        )
    return table


def watch_gpus_table(result: Any) -> Table:
    """Per GPU: peak memory, mean utilisation, peak PCIe traffic, mean power; or why there is none."""
    table = Table(title="GPUs", title_justify="left", show_header=bool(result.gpus))
    if not result.gpus:
        table.add_column("")
        table.add_row(result.gpu_note or "no GPU series")
        return table
    for name in ("GPU", "name", "peak memory", "mean util", "peak PCIe rx", "peak PCIe tx", "mean power"):
        table.add_column(name)
    for gpu in result.gpus:
        util = [v for v in gpu.utilization_pct if v is not None]
        power = [v for v in gpu.power_w if v is not None]
        table.add_row(
            str(gpu.index),
            gpu.name,
            mebibytes(max((v for v in gpu.memory_used_bytes if v is not None), default=None)),
            "n/a" if not util else f"{sum(util) / len(util):.0f}%",
            *(
                human_count(max((v for v in series if v is not None), default=None), "B/s")
                for series in (gpu.pcie_rx_bytes_per_s, gpu.pcie_tx_bytes_per_s)
            ),
            "n/a" if not power else f"{sum(power) / len(power):.0f} W",
        )
    return table


def watch_steps_table(result: Any) -> Table | None:
    """Count, median and p90 step time and the median RSS growth per step; None without two marks."""
    from dnnperf.stats import Samples

    steps = result.step_s()
    if not steps:
        return None
    times = Samples.of(steps)
    growth = Samples.of([float(g) for g in result.step_rss_growth_bytes()])
    table = Table(title="steps (mark_step)", title_justify="left")
    for name in ("steps", "median step", "p90 step", "median RSS growth per step"):
        table.add_column(name, justify="right")
    table.add_row(
        str(len(steps)),
        f"{milliseconds(times.median)} ms",
        f"{milliseconds(times.p90)} ms",
        mebibytes(growth.median),
    )
    return table


def watch_compare_table(frame: Any, a: str, b: str) -> Table:
    """``analysis.compare.compare_watches``: the step time (flagged beyond the runs' noise), then
    peak RSS, mean cores and GPU peak memory side by side."""
    table = Table(title=f"A = {a}\nB = {b}", title_justify="left")
    for name, justify in (("", "left"), ("A", "right"), ("B", "right"), ("change", "right"), ("p", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("flag")
    for row in frame.to_dict("records"):

        def shown(value: Any, kind: str = row["kind"]) -> str:
            if value is None or value != value:
                return "n/a"
            if kind == "step":
                return f"{milliseconds(value)} ms"
            return _cores(value) if kind == "cpu" else mebibytes(value)

        flag = row["change"].upper() if row["flagged"] else row["change"]
        table.add_row(
            row["name"],
            shown(row["a"]),
            shown(row["b"]),
            _percent(row["delta_rel"]),
            "" if row["p_value"] != row["p_value"] else f"{row['p_value']:.2g}",
            Text(flag, style="bold red") if row["flagged"] else flag,
        )
    table.caption = (
        "The step time is flagged only beyond both runs' noise (docs/reports.md); one value per run "
        "for memory, cores and GPU memory: stated, not judged."
    )
    return table
