"""Benchmarks of the memory profiler (`make bench`); results go to docs/benchmarks-memory.md.

1. The suite at `small`: the unattributed residual (target: at most 5% of the measured peak), the
   largest category, and the cross-check of the allocator's growth against the growth of the
   process's peak resident memory (target: within 10%, or the difference explained).
2. Overhead: plain steps against memory-tracked steps of one task, interleaved (the order reversed
   every other round), with and without the resident-memory cross-check (target: at most 15%).
   ``--overhead-only --workloads resnet18 --overhead-json F`` runs one workload's part, adding it to F,
   and rewrites only the overhead section of the output from everything F holds (so a busy machine
   can run the workloads one at a time, each when it is otherwise idle).
   ``--suite-only`` measures only the suite and rewrites only its section (and the header's date line),
   leaving the overhead section as it is (the suite's figures are memory, not time: they can be taken
   niced beside other work, the overhead cannot).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from dnnperf import environment
from dnnperf.data.sources import MemorySource
from dnnperf.devices import synchronize, to_device
from dnnperf.probes.clock import WallClock
from dnnperf.probes.memory import MemoryTracker
from dnnperf.results.memory import CATEGORIES
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench, timed_step
from dnnperf.stats import Samples
from dnnperf.workloads import all_workloads, get_workload

OVERHEAD_WORKLOADS = ("resnet18", "vgg16", "transformer", "gpt2")
RESIDUAL_TARGET = 0.05
OVERHEAD_TARGET = 0.15


#: glibc's malloc with a fixed mmap threshold (which also turns off its dynamic adjustment): every
#: block of 64 KiB or more is mapped on allocation and unmapped on release, so the resident memory
#: follows the allocator instead of the C heap's retained free space.
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def one_workload(name: str) -> dict:
    """One tracked step of a workload at `small` (after a warm-up step), in this process."""
    with tempfile.TemporaryDirectory() as runs:
        settings = BenchSettings(name, preset="small", steps=1, warmup=1, memory=True)
        memory = bench(settings, RunStore(runs)).points[0].memory
    at_start = sum(memory.timeline[0][1].values())
    return {
        "name": name,
        "measured": memory.measured_peak,
        "residual": memory.peak["unattributed"] / memory.measured_peak if memory.measured_peak else None,
        "largest": max(CATEGORIES, key=lambda c: memory.category_max.get(c, 0)),
        "allocator_growth": memory.measured_peak - at_start,
        "rss_growth": memory.subsystem.get("peak_rss_growth_bytes"),
        "phase": memory.peak_phase,
    }


def suite_memory(store: Path | None = None) -> list[dict]:
    """Each workload in a fresh process, three times: glibc's defaults, FIXED_MMAP, and FIXED_MMAP
    with oneDNN off. The rows so far are saved to ``store`` after each workload when given."""
    rows = []
    for workload in all_workloads():
        row: dict = {"name": workload.name}
        for label, extra, flags in (
            ("default", {}, []),
            ("fixed_mmap", FIXED_MMAP, []),
            ("fixed_mmap_no_onednn", FIXED_MMAP, ["--no-onednn"]),
        ):
            done = subprocess.run(
                [sys.executable, __file__, "--one", workload.name, *flags],
                capture_output=True,
                text=True,
                env={**os.environ, **extra},
                timeout=900,
            )
            if done.returncode != 0:
                row["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1]
                break
            result = json.loads(done.stdout)
            if label == "default":
                row.update(result)
            else:
                row[f"rss_growth_{label}"] = result["rss_growth"]
                row[f"allocator_growth_{label}"] = result["allocator_growth"]
        rows.append(row)
        if store:
            store.write_text(json.dumps(rows))
        print(f"  {workload.name:14s} done", file=sys.stderr)
    return rows


#: The kinds of step the overhead compares: plain, tracked, tracked without the resident cross-check.
KINDS = ("plain", "tracked", "tracked_no_resident")


def memory_overhead(name: str, rounds: int) -> dict[str, Samples]:
    """Per tracked kind, each round's relative step-time difference from that round's plain step.
    The kinds run in order, then reversed, round by round (ABC CBA ...), on the same task."""
    device = torch.device("cpu")
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("small", device)
    source = MemorySource(workload.data("small"), workload.batch_size("small"))
    clock = WallClock(device)
    for _ in range(3):
        timed_step(task, source, device, clock)
    for resident in (True, False):  # the profiler's one-off start-up, outside the measured rounds
        batch = to_device(next(source), device)
        with MemoryTracker(task.model, task.optimizers(), batch, device=device, resident=resident) as t:
            task.step(batch, t)
    relative: dict[str, list[float]] = {kind: [] for kind in KINDS[1:]}
    plain_s: list[float] = []
    for index in range(rounds):
        times = {}
        for kind in KINDS if index % 2 == 0 else KINDS[::-1]:
            batch = to_device(next(source), device)
            synchronize(device)
            if kind == "plain":  # the same span as the tracked step's wall_s: the step and a sync
                start = time.perf_counter()
                task.step(batch)
                synchronize(device)
                times[kind] = time.perf_counter() - start
                continue
            tracker = MemoryTracker(
                task.model, task.optimizers(), batch, device=device, resident=kind == "tracked"
            )
            with tracker:
                task.step(batch, tracker)
                synchronize(device)
            times[kind] = tracker.result().wall_s
        for kind in KINDS[1:]:
            relative[kind].append((times[kind] - times["plain"]) / times["plain"])
        plain_s.append(times["plain"])
    return {"plain_s": Samples.of(plain_s)} | {kind: Samples.of(v) for kind, v in relative.items()}


def overhead_section(results: dict[str, dict]) -> list[str]:
    """The overhead section of the document, from {workload: {kind: [values], "machine": ...}}."""
    rounds = "/".join(str(r) for r in sorted({row["rounds"] for row in results.values()}))
    lines = [
        f"## Overhead (target: at most {100 * OVERHEAD_TARGET:.0f}%)",
        "",
        "`small` presets, CPU. Plain steps, memory-tracked steps, and memory-tracked steps without the",
        "resident-memory cross-check (`MemoryTracker(..., resident=False)`) of one task run in turn,",
        f"the order reversed every other round ({rounds} rounds); a tracked step's overhead is the",
        "median over the rounds of its time relative to the same round's plain step (p10 to p90 beside",
        "it). The tracked step's time is its `wall_s`: from just before the profiler starts to the end",
        "of the step; the profiler's one-off start-up is taken before the rounds. The difference",
        "between the two tracked columns is the resident cross-check's heap trim (`malloc_trim` before",
        "the step, whose returned pages the step faults in again; docs/memory.md, Overhead). `dnnperf",
        "profile --memory` tracks its step without the cross-check (the third column is its cost) and",
        "takes the resident growth in one further plain step of its own.",
        "",
        "| workload | plain step ms | tracked | p10 to p90 | within target | without the resident check | "
        "p10 to p90 | within target | measured on |",
        "|---|---:|---:|---:|---|---:|---:|---|---|",
    ]
    ordered = [n for n in OVERHEAD_WORKLOADS if n in results] + sorted(set(results) - set(OVERHEAD_WORKLOADS))
    for name in ordered:
        row = results[name]
        cells = [name, f"{1e3 * Samples.of(row['plain_s']).median:.0f}"]
        for kind in KINDS[1:]:
            samples = Samples.of(row[kind])
            ok = "yes" if samples.median <= OVERHEAD_TARGET else "**no**"
            cells += [
                f"{100 * samples.median:+.1f}%",
                f"{100 * samples.p10:+.1f}% to {100 * samples.p90:+.1f}%",
                ok,
            ]
        cells.append(row["machine"])
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for kind, label in (("tracked", "With the resident cross-check in the step"), (KINDS[2], "Without it")):
        medians = {name: Samples.of(results[name][kind]).median for name in ordered}
        misses = {name: m - OVERHEAD_TARGET for name, m in medians.items() if m > OVERHEAD_TARGET}
        text = f"{label}: {len(medians) - len(misses)} of {len(medians)} workloads within the target"
        if misses:
            worst = max(misses, key=misses.get)
            text += f"; the largest miss is {worst}, {100 * misses[worst]:.1f} points over"
        lines.append(text + ".")
    return lines


def _machine_line() -> str:
    machine, software = environment.machine(), environment.software()
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return (
        f"{date}, {machine['cpu_model']} ({machine['cores_usable']} usable cores), torch {software['torch']} "
        f"({torch.get_num_threads()} threads)"
    )


def run_overhead(names: list[str], rounds: int, store: Path | None) -> dict[str, dict]:
    """Measure ``names``; merged into (and saved back to) ``store`` when given."""
    results: dict[str, dict] = json.loads(store.read_text()) if store and store.exists() else {}
    for name in names:
        samples = memory_overhead(name, rounds)
        results[name] = {kind: list(s.values) for kind, s in samples.items()} | {"machine": _machine_line()}
        results[name]["rounds"] = rounds
        print(f"  {name:14s} done", file=sys.stderr)
        if store:
            store.write_text(json.dumps(results, indent=1))
    return results


def _suite(args: argparse.Namespace) -> list[dict]:
    """The suite's rows: from --suite-from, or measured (saved to --suite-to as they come)."""
    if args.suite_from:
        return json.loads(args.suite_from.read_text())
    return suite_memory(args.suite_to)


def suite_document(suite: list[dict], note: str = "") -> list[str]:
    """The document's header and the suite section, from the suite's rows."""
    machine, software = environment.machine(), environment.software()
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    gpus = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
    mib = 2**20
    lines = [
        "# Benchmarks of the memory profiler",
        "",
        f"Generated by `make bench` on {date} at commit `{environment.source_commit()}`{note}. "
        f"Machine: {machine['cpu_model']}, "
        f"{machine['cores_usable']} usable cores, {machine['memory_bytes'] / 2**30:.0f} GiB, {gpus}; "
        f"torch {software['torch']} ({torch.get_num_threads()} threads), Python {software['python']}.",
        "",
        "## The suite at `small` (CPU)",
        "",
        "Measured peak: torch's CPU allocator in the tracked step itself (the profiler's memory events)",
        "above its level at the start, plus the bytes alive at the start. Residual: allocations live at",
        "that peak that are still held after the step and are none of the categories (target at most",
        f"{100 * RESIDUAL_TARGET:.0f}%).",
        "Cross-check: the allocator's growth over the step (its peak above its level at the start)",
        "against the growth of the process's peak resident memory (VmHWM reset after returning free",
        "heap pages) in one further plain step of the same process, as `dnnperf profile --memory` takes",
        "it (the tracked step holds the profiler's event buffers), in a fresh process per workload,",
        "twice: with glibc's default malloc, whose",
        "dynamic mmap threshold serves large blocks from the heap and keeps their pages after release",
        "(so the resident peak also counts freed-but-retained heap), and with a fixed 64 KiB mmap",
        "threshold (`MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0`), where a block of 64 KiB or",
        "more is mapped (and unmapped when freed) whenever no free heap chunk fits it (docs/memory.md).",
        "Target: within 10% (second setting). The last column",
        "repeats the second setting with oneDNN turned off (`torch.backends.mkldnn.enabled = False`): oneDNN",
        "keeps some buffers outside torch's allocator (resident, not counted) and has torch allocate",
        "others it never fully touches (counted, not resident).",
        "",
        "| workload | measured peak MiB | residual | within target | largest category | peak in | "
        "allocator growth MiB | resident growth MiB (default malloc) | resident / allocator | "
        "resident / allocator (fixed mmap threshold) | within 10% | same, oneDNN off |",
        "|---|---:|---:|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for row in suite:
        if "error" in row:
            lines.append(f"| {row['name']} | failed: {row['error']} | | | | | | | | | | |")
            continue
        residual = row["residual"]
        ok = "yes" if residual is not None and abs(residual) <= RESIDUAL_TARGET else "**no**"
        growth, rss = row["allocator_growth"], row["rss_growth"]
        ratio = f"{rss / growth:.2f}" if rss and growth > 0 else "n/a"
        fixed, fixed_growth = row.get("rss_growth_fixed_mmap"), row.get("allocator_growth_fixed_mmap")
        fixed_ratio = fixed / fixed_growth if fixed and fixed_growth else None
        off, off_growth = (
            row.get("rss_growth_fixed_mmap_no_onednn"),
            row.get("allocator_growth_fixed_mmap_no_onednn"),
        )
        off_ratio = f"{off / off_growth:.2f}" if off and off_growth else "n/a"
        agree = "n/a" if fixed_ratio is None else ("yes" if abs(fixed_ratio - 1) <= 0.10 else "**no**")
        lines.append(
            f"| {row['name']} | {row['measured'] / mib:.1f} | {100 * residual:+.1f}% | {ok} | "
            f"{row['largest']} | {row['phase']} | {growth / mib:.1f} | {(rss or 0) / mib:.1f} | {ratio} | "
            f"{'n/a' if fixed_ratio is None else f'{fixed_ratio:.2f}'} | {agree} | {off_ratio} |"
        )
    return lines


#: The sections this script writes; any other "## " section of the output is hand-written and kept.
GENERATED = ("## The suite at", "## Overhead")


def hand_written(text: str) -> str:
    """The output file's hand-written sections: from the first "## " heading after the generated
    ones that is not generated itself, to the end (they follow the generated sections)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("## ") and not line.startswith(GENERATED):
            return "\n" + "".join(lines[i:])
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-memory.md"))
    parser.add_argument("--rounds", type=int, default=20, help="overhead rounds per workload")
    parser.add_argument(
        "--workloads", default=",".join(OVERHEAD_WORKLOADS), help="overhead workloads (comma-separated)"
    )
    parser.add_argument(
        "--overhead-only",
        action="store_true",
        help="measure only the overhead and rewrite only that section of --output",
    )
    parser.add_argument("--overhead-json", type=Path, help="overhead results to add to and draw from (JSON)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the per-workload child process
    parser.add_argument("--no-onednn", action="store_true", help=argparse.SUPPRESS)  # the child, oneDNN off
    parser.add_argument(
        "--suite-from", type=Path, help="reuse the suite rows saved by an earlier --suite-to (JSON)"
    )
    parser.add_argument("--suite-to", type=Path, help="save the suite rows (JSON) for --suite-from")
    parser.add_argument(
        "--suite-only",
        action="store_true",
        help="measure only the suite and rewrite only that section (and the header) of --output",
    )
    args = parser.parse_args()
    if args.one:
        if args.no_onednn:  # which of the resident excess is oneDNN's own memory, outside torch's allocator
            torch.backends.mkldnn.enabled = False
        print(json.dumps(one_workload(args.one)))
        return
    names = [n for n in args.workloads.split(",") if n]
    previous = args.output.read_text() if args.output.exists() else ""
    kept = hand_written(previous)
    if args.overhead_only:
        overheads = run_overhead(names, args.rounds, args.overhead_json)
        text = previous[: previous.index(kept)] if kept else previous
        head = text[: text.index("## Overhead")] if "## Overhead" in text else text + "\n"
        args.output.write_text(head + "\n".join(overhead_section(overheads)) + "\n" + kept)
        print(f"wrote {args.output}", file=sys.stderr)
        return
    print("1/2 the suite at small", file=sys.stderr)
    suite = _suite(args)
    if args.suite_only:
        text = previous[: previous.index(kept)] if kept else previous
        tail = text[text.index("## Overhead") :] if "## Overhead" in text else ""
        note = " with `--suite-only` (the overhead section from its own run, dated per row)" if tail else ""
        document = "\n".join(suite_document(suite, note)) + "\n" + ("\n" + tail if tail else "")
        args.output.write_text(document + kept)
        print(f"wrote {args.output}", file=sys.stderr)
        return
    print("2/2 overhead (paired, interleaved)", file=sys.stderr)
    overheads = run_overhead(names, args.rounds, args.overhead_json)
    lines = suite_document(suite)
    lines += ["", *overhead_section(overheads)]
    args.output.write_text("\n".join(lines) + "\n" + kept)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
