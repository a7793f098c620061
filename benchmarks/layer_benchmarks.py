"""Benchmarks of the per-layer analysis and the hardware calibration (`make bench`); results go to
docs/benchmarks-layers.md.

1. `dnnperf hw` twice in a row: do peak FLOP/s and memory bandwidth agree within 10%? (part `hw`;
   the second profile is saved where `dnnperf hw` saves it)
2. The layer profiler's overhead: plain steps against operator-timed steps of one task, paired and
   interleaved (ABBA), at `small` (target: at most 10% slower). (part `overhead`)
3. Closure: per phase, the operator times of the timed steps against the stage times of plain steps.
4. The suite at `tiny` and `small`: the highest layer efficiency against the calibrated peak (must not
   pass 100%) and the share of operator time covered by FLOP formulas (target: at least 95% at
   `small`). (part `suite`, against the profile part `hw` saved)

`--parts` runs some of them (each under ten minutes on 2 cores, so each can run while the machine is
otherwise idle); the sections of the parts not run are kept from the output file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from dnnperf import calibration, environment, hardware
from dnnperf.analysis import layers
from dnnperf.calibration.plans import PLANS
from dnnperf.calibration.timing import bytes_text
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
    first = calibration.calibrate("cpu")
    second = calibration.calibrate("cpu")
    return first, second


def layer_overhead(name: str, pairs: int) -> dict:
    """Plain (stage clock) steps and layer-timed steps of one task, adjacent in ABBA order."""
    device = torch.device("cpu")
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("small", device)
    source = MemorySource(workload.data("small"), workload.batch_size("small"))
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


def suite_efficiency(profile: hardware.HardwareProfile, presets: tuple[str, ...]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as runs:
        for preset, workload in ((p, w) for p in presets for w in all_workloads()):
            settings = BenchSettings(
                workload.name, preset=preset, steps=3, warmup=1, layers=True, hardware=profile.to_dict()
            )
            try:
                point = bench(settings, RunStore(runs)).points[0]
            except Exception as error:  # report, go on with the others
                rows.append(
                    {"name": workload.name, "preset": preset, "error": f"{type(error).__name__}: {error}"}
                )
                continue
            table = layers.layer_table(point.layers, profile)
            cover = layers.coverage(point.layers)
            best = table.loc[table["efficiency"].idxmax()] if table["efficiency"].notna().any() else None
            rows.append(
                {
                    "name": workload.name,
                    "preset": preset,
                    "batch": point.batch_size,
                    "max_efficiency": None if best is None else float(best["efficiency"]),
                    "best_layer": None
                    if best is None
                    else f"{best['module']} ({best['type']}, {best['phase']})",
                    "covered": float(cover["covered_share"]),
                    "uncovered": ", ".join(
                        f"{r['op']} {100 * r['share']:.2f}%"
                        for r in cover["uncovered"].head(3).to_dict("records")
                    ),
                }
            )
            print(f"  {workload.name:14s} {preset:6s} done", file=sys.stderr)
    return rows


PARTS = ("hw", "overhead", "suite")


def hw_section(first: hardware.HardwareProfile, second: hardware.HardwareProfile) -> list[str]:
    plan = PLANS[("cpu", False)]
    lines = [
        f"## `dnnperf hw` twice in a row (target: within {100 * REPEAT_TARGET:.0f}%)",
        "",
        f"Measured {_today()}, one calibration right after the other. Each peak is the best sustained rate:",
        f"the fastest sample (back-to-back calls, at least {plan.min_sample_s * 1e3:.0f} ms) of the fastest",
        "configuration over interleaved repeats; the DRAM bandwidth is the fastest triad sample among the",
        f"sizes whose working set is at least {hardware.DRAM_FACTOR}x the last-level cache "
        f"({_dram_sizes(second)}), every size swept {plan.memory_sweeps} times.",
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
    pairs.append(("calibration time (s)", first.duration_s, second.duration_s))
    for label, a, b in pairs:
        difference = abs(b - a) / a
        ok = "" if label.startswith("calibration") else ("yes" if difference <= REPEAT_TARGET else "**no**")
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {100 * difference:.1f}% | {ok} |")
    return lines


def _today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def _dram_sizes(profile: hardware.HardwareProfile) -> str:
    points, beyond = profile.dram_points()
    sizes = ", ".join(bytes_text(int(p.params["nbytes"])) for p in points)
    return f"{sizes} per tensor" if beyond else f"{sizes} per tensor, not confirmed beyond the caches"


def overhead_section(overheads: dict[str, dict], pairs: int) -> list[str]:
    lines = [
        f"## Layer profiler overhead (target: at most {100 * OVERHEAD_TARGET:.0f}%) and closure",
        "",
        f"Measured {_today()}. `small` presets, data in memory. One task alternates, step by step in ABBA",
        "order, between a plain step (stage clock only) and a layer-timed step (module and autograd-node",
        f"hooks; {pairs} pairs after warm-up). Overhead: the median of the pairs' relative step-time",
        "differences. Closure: per phase, the median sum of the layers' times, `(none)` included (the same",
        "step's stage time no layer took: the loss, autograd's engine between nodes), against the plain",
        "steps' median stage time; in brackets the difference, which is what instrumenting changed.",
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
    return lines


def suite_section(
    profile: hardware.HardwareProfile, suite: list[dict], presets: tuple[str, ...]
) -> list[str]:
    over = [r for r in suite if (r.get("max_efficiency") or 0.0) > 1.0]
    failed = [r for r in suite if "error" in r]
    verdict = (
        "no layer above 100% of the peak"
        if not over and not failed
        else f"{len(over)} workload(s) with a layer above 100%, {len(failed)} failed"
    )
    lines = [
        f"## The suite at {' and '.join(f'`{p}`' for p in presets)}: efficiency against the calibrated "
        "peak and FLOP coverage",
        "",
        f"Measured {_today()} against the profile {profile.created} ({profile.device_name}): peak "
        f"{profile.peak_flops() / 1e9:.0f} GFLOP/s float32 "
        f"({profile.curves(_peak_op(profile), 'float32')[0].best.label}). Efficiency of each layer phase =",
        "its FLOPs / its operators' median time / peak; coverage = share of operator time whose operators",
        f"have a FLOP formula (target at least 95% at `small`). Result: {verdict}.",
        "",
        "| workload | preset | batch | highest layer efficiency | that layer | coverage "
        "| without a formula |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for row in suite:
        if "error" in row:
            lines.append(f"| {row['name']} | {row['preset']} | | failed: {row['error']} | | | |")
            continue
        eff = "n/a" if row["max_efficiency"] is None else f"{100 * row['max_efficiency']:.1f}%"
        if row["max_efficiency"] is not None and row["max_efficiency"] > 1.0:
            eff = f"**{eff}**"
        lines.append(
            f"| {row['name']} | {row['preset']} | {row['batch']} | {eff} | {row['best_layer']} | "
            f"{100 * row['covered']:.2f}% | {row['uncovered'] or '-'} |"
        )
    return lines


def _peak_op(profile: hardware.HardwareProfile) -> str:
    return max(hardware.OPS, key=lambda op: profile.peak_flops("float32", op=op))


def _kept_sections(path: Path) -> dict[str, list[str]]:
    """The output file's sections by part, from their headings (to keep those of parts not run);
    sections written by hand (any other heading) are kept under their heading, after the parts."""
    if not path.exists():
        return {}
    headings = {"## `dnnperf hw`": "hw", "## Layer profiler overhead": "overhead", "## The suite": "suite"}
    sections: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            current = next((part for prefix, part in headings.items() if line.startswith(prefix)), line)
        if current is not None:
            sections.setdefault(current, []).append(line)
    return {part: lines[:-1] if lines and not lines[-1] else lines for part, lines in sections.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-layers.md"))
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--presets", default="tiny,small", help="presets of the suite part")
    parser.add_argument(
        "--rows",
        type=Path,
        help="JSON file of the suite part's rows: rows of presets not run this time are taken from it "
        "(so the presets can run at separate times), and it is rewritten",
    )
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts takes some of {', '.join(PARTS)}")
    presets = tuple(p.strip() for p in args.presets.split(",") if p.strip())
    machine, software = environment.machine(), environment.software()
    sections = _kept_sections(args.output)

    profile = None
    if "hw" in parts:
        print("dnnperf hw, twice", file=sys.stderr)
        first, second = calibrate_twice()
        hardware.save_profile(second)
        profile = second
        sections["hw"] = hw_section(first, second)
    if "overhead" in parts:
        print("layer profiler overhead and closure (paired, interleaved)", file=sys.stderr)
        overheads = {name: layer_overhead(name, args.pairs) for name in OVERHEAD_WORKLOADS}
        sections["overhead"] = overhead_section(overheads, args.pairs)
    if "suite" in parts:
        profile = profile or hardware.load_profile("cpu")
        if profile is None:
            parser.error("the suite part needs a hardware profile: run part hw (or `dnnperf hw`) first")
        for reason in hardware.stale_reasons(profile):
            print(f"warning: the hardware profile was {reason}", file=sys.stderr)
        print(f"the suite at {', '.join(presets)}: efficiency and coverage", file=sys.stderr)
        rows = suite_efficiency(profile, presets)
        if args.rows is not None:
            kept = json.loads(args.rows.read_text()) if args.rows.exists() else []
            # Only rows measured against this same profile.
            same = [r for r in kept if r.get("profile") == profile.created and r["preset"] not in presets]
            rows = same + [{**r, "profile": profile.created} for r in rows]
            args.rows.write_text(json.dumps(rows, indent=1))
            order = {name: i for i, name in enumerate(w.name for w in all_workloads())}
            rows.sort(key=lambda r: (r["preset"] != "tiny", r["preset"], order.get(r["name"], len(order))))
            presets = tuple(dict.fromkeys(r["preset"] for r in rows))
        sections["suite"] = suite_section(profile, rows, presets)

    gpus = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
    lines = [
        "# Benchmarks of the per-layer analysis and the calibration",
        "",
        f"Generated by `make bench` (`benchmarks/layer_benchmarks.py`), last on {_today()} at commit "
        f"`{environment.source_commit()}` (parts: "
        f"{', '.join(parts)}; each section says when it was measured). Machine: {machine['cpu_model']}, "
        f"{machine['cores_usable']} usable cores, {machine['memory_bytes'] / 2**30:.0f} GiB, {gpus}; "
        f"torch {software['torch']} ({torch.get_num_threads()} threads), Python {software['python']}.",
    ]
    for part in [*PARTS, *(name for name in sections if name not in PARTS)]:
        if part in sections:
            lines += ["", *sections[part]]
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
