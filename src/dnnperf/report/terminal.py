"""Rich tables of the suite, of a run's results and of the run store. Rendering only: no measuring."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dnnperf.hardware import HardwareProfile
from dnnperf.probes.stages import StageBreakdown
from dnnperf.results.record import RunRecord


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
        f"{summary['samples_per_s']:.1f} samples/s ({breakdown.timing})"
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
    return table
