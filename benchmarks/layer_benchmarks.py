"""Benchmarks of the per-layer analysis and the hardware calibration (`make bench`); results go to
docs/benchmarks-layers.md.

1. `dnnperf hw` twice in a row: do peak FLOP/s and memory bandwidth agree within 10%?
2. The layer profiler's overhead: plain steps against operator-timed steps of one task, paired and
   interleaved (ABBA), at `small` (target: at most 10% slower).
3. Closure: per phase, the operator times of the timed steps against the stage times of plain steps.
4. The suite at `small`: the highest layer efficiency against the calibrated peak (must not pass
   100%) and the share of operator time covered by FLOP formulas (target: at least 95%).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from dnnperf import environment, hardware
from dnnperf.analysis import layers
from dnnperf.data.sources import MemorySource
from dnnperf.probes.clock import StageClock
from dnnperf.probes.layers import PROFILER, LayerTimer, with_outside_the_model
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench, timed_step
from dnnperf.stats import Samples
from dnnperf.workloads import all_workloads, get_workload

OVERHEAD_WORKLOADS = ("resnet18", "vgg16", "transformer", "gpt2")
OVERHEAD_TARGET = 0.10
REPEAT_TARGET = 0.10


def calibrate_twice() -> tuple[hardware.HardwareProfile, hardware.HardwareProfile]:
    first = hardware.calibrate("cpu")
    second = hardware.calibrate("cpu")
    return first, second


def layer_overhead(name: str, pairs: int) -> dict:
    """Plain (stage clock) steps and layer-timed steps of one task, adjacent in ABBA order."""
    device = torch.device("cpu")
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("small", device)
    source = MemorySource(workload.data("small"), workload.default_batch_size["small"])
    plain_clock, timed_clock = StageClock(device), StageClock(device)
    timer = LayerTimer(task.model, device)
    plain: list = []
    timed: list[float] = []
    layer_sums: dict[str, list[float]] = {"forward": [], "backward": []}
    try:
        for _ in range(3):  # warm-up, both ways
            timed_step(task, source, device, plain_clock)
            with timer:
                timed_step(task, source, device, timed_clock)
        for index in range(pairs):
            order = ("plain", "timed") if index % 2 == 0 else ("timed", "plain")
            for kind in order:
                if kind == "plain":
                    plain.append(timed_step(task, source, device, plain_clock)[0])
                    continue
                with timer:  # hooks installed and removed outside the timed step
                    timing = timed_step(task, source, device, timed_clock)[0]
                    table = with_outside_the_model(timer.take_step(), timing.stages)
                timed.append(timing.wall_s)
                for phase, sums in layer_sums.items():
                    sums.append(sum(t.get(phase, 0.0) for name, t in table.items() if name != PROFILER))
    finally:
        plain_clock.close()
        timed_clock.close()
    relative = [(t - p.wall_s) / p.wall_s for p, t in zip(plain, timed, strict=True)]
    return {
        "plain": Samples.of([p.wall_s for p in plain]),
        "timed": Samples.of(timed),
        "overhead": Samples.of(relative),
        "stages": {k: statistics.median(p.stages.get(k, 0.0) for p in plain) for k in layer_sums},
        "layers": {k: statistics.median(v) for k, v in layer_sums.items()},
    }


def suite_efficiency(profile: hardware.HardwareProfile) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as runs:
        for workload in all_workloads():
            settings = BenchSettings(
                workload.name, preset="small", steps=3, warmup=1, layers=True, hardware=profile.to_dict()
            )
            try:
                point = bench(settings, RunStore(runs)).points[0]
            except Exception as error:  # report, go on with the others
                rows.append({"name": workload.name, "error": f"{type(error).__name__}: {error}"})
                continue
            table = layers.layer_table(point.layers, profile)
            cover = layers.coverage(point.layers)
            best = table.loc[table["efficiency"].idxmax()] if table["efficiency"].notna().any() else None
            rows.append(
                {
                    "name": workload.name,
                    "batch": point.batch_size,
                    "max_efficiency": None if best is None else float(best["efficiency"]),
                    "best_layer": None
                    if best is None
                    else f"{best['module']} ({best['type']}, {best['phase']})",
                    "covered": cover["covered_share"],
                    "uncovered": ", ".join(
                        f"{r['op']} {100 * r['share']:.2f}%"
                        for r in cover["uncovered"].head(3).to_dict("records")
                    ),
                }
            )
            print(f"  {workload.name:14s} done", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-layers.md"))
    parser.add_argument("--pairs", type=int, default=20)
    args = parser.parse_args()
    machine, software = environment.machine(), environment.software()

    print("1/3 dnnperf hw, twice", file=sys.stderr)
    first, second = calibrate_twice()
    print("2/3 layer profiler overhead and closure (paired, interleaved)", file=sys.stderr)
    overheads = {name: layer_overhead(name, args.pairs) for name in OVERHEAD_WORKLOADS}
    print("3/3 the suite at small: efficiency and coverage", file=sys.stderr)
    suite = suite_efficiency(second)

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    gpus = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
    lines = [
        "# Benchmarks of the per-layer analysis and the calibration",
        "",
        f"Generated by `make bench` on {date}. Machine: {machine['cpu_model']}, "
        f"{machine['cores_usable']} usable cores, {machine['memory_bytes'] / 2**30:.0f} GiB, {gpus}; "
        f"torch {software['torch']} ({torch.get_num_threads()} threads), Python {software['python']}.",
        "",
        f"## `dnnperf hw` twice in a row (target: within {100 * REPEAT_TARGET:.0f}%)",
        "",
        "| measurement | first | second | difference | within target |",
        "|---|---:|---:|---:|---|",
    ]
    pairs = [
        (f"peak {c.op} {c.precision} (GFLOP/s)", c.peak / 1e9, d.peak / 1e9)
        for c, d in zip(first.compute, second.compute, strict=True)
        if c.usable and d.usable
    ]
    pairs.append(
        ("DRAM bandwidth, triad (GB/s)", first.memory_bandwidth / 1e9, second.memory_bandwidth / 1e9)
    )
    pairs.append(
        ("calibration time (s)", first.duration_s, second.duration_s),
    )
    for label, a, b in pairs:
        difference = abs(b - a) / a
        ok = "" if label.startswith("calibration") else ("yes" if difference <= REPEAT_TARGET else "**no**")
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {100 * difference:.1f}% | {ok} |")
    lines += [
        "",
        f"## Layer profiler overhead (target: at most {100 * OVERHEAD_TARGET:.0f}%) and closure",
        "",
        "`small` presets, data in memory. One task alternates, step by step in ABBA order, between a plain",
        f"step (stage clock only) and a layer-timed step (module and autograd-node hooks; {args.pairs} pairs",
        "after warm-up). Overhead: the median of the pairs' relative step-time differences. Closure: per",
        "phase, the median sum of the layers' times, `(none)` included (the same step's stage time no layer",
        "took: the loss, autograd's engine between nodes), against the plain steps' median stage time; in",
        "brackets the difference, which is what instrumenting changed.",
        "",
        "| workload | plain ms | layer-timed ms | overhead (p10 to p90) | within target | "
        "forward layers / stage ms | backward layers / stage ms |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for name, result in overheads.items():
        o = result["overhead"]
        ok = "yes" if o.median <= OVERHEAD_TARGET else "**no**"
        closure = [
            f"{result['layers'][k] * 1e3:.1f} / {result['stages'][k] * 1e3:.1f} "
            f"({100 * (result['stages'][k] - result['layers'][k]) / result['stages'][k]:+.1f}%)"
            for k in ("forward", "backward")
        ]
        lines.append(
            f"| {name} | {result['plain'].median * 1e3:.1f} | {result['timed'].median * 1e3:.1f} | "
            f"{100 * o.median:+.1f}% ({100 * o.p10:+.1f}% to {100 * o.p90:+.1f}%) | {ok} | "
            + " | ".join(closure)
            + " |"
        )
    lines += [
        "",
        "## The suite at `small`: efficiency against the calibrated peak and FLOP coverage",
        "",
        f"Peak: {second.peak_flops() / 1e9:.0f} GFLOP/s (float32, the second calibration above). Efficiency",
        "of each layer phase = its FLOPs / its median time / peak; coverage = share of operator time whose",
        "operators have a FLOP formula (target at least 95%).",
        "",
        "| workload | batch | highest layer efficiency | that layer | coverage | without a formula |",
        "|---|---:|---:|---|---:|---|",
    ]
    for row in suite:
        if "error" in row:
            lines.append(f"| {row['name']} | | failed: {row['error']} | | | |")
            continue
        eff = "n/a" if row["max_efficiency"] is None else f"{100 * row['max_efficiency']:.1f}%"
        lines.append(
            f"| {row['name']} | {row['batch']} | {eff} | {row['best_layer']} | {100 * row['covered']:.2f}% | "
            f"{row['uncovered'] or '-'} |"
        )
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
