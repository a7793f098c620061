"""Benchmarks of dnnperf itself (`make bench`); results go to docs/benchmarks.md.

1. Tiny-preset step time of every workload (target: under 0.5 s on 2 cores, so tests stay fast).
2. The runner's overhead: dnnperf's measured loop against a bare training loop on the same task,
   paired and interleaved (A, B, A, B, ...) so drift in the machine hits both alike.
3. Memory vs on-disk data for an image workload at `small`: what real reading and decoding cost.
4. The stage profiler's overhead: the same runner with and without stage profiling, paired and
   interleaved, on several workloads (target: at most 2% slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from dnnperf import environment
from dnnperf.data.sources import MemorySource
from dnnperf.devices import synchronize, to_device
from dnnperf.probes.clock import StageClock, WallClock
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench, timed_step
from dnnperf.stats import Samples
from dnnperf.workloads import all_workloads, get_workload

TINY_TARGET_S = 0.5


def tiny_step_times(steps: int, warmup: int) -> list[tuple[str, int, Samples]]:
    rows = []
    with tempfile.TemporaryDirectory() as runs:
        for workload in all_workloads():
            record = bench(BenchSettings(workload.name, steps=steps, warmup=warmup), RunStore(runs))
            point = record.points[0]
            rows.append((workload.name, point.batch_size, point.step_time))
            print(f"  {workload.name:14s} median {point.step_time.median * 1e3:7.1f} ms", file=sys.stderr)
    return rows


def bare_loop_time(task, batches, steps: int, device) -> float:
    """The same steps as the runner, without its bookkeeping: the reference for overhead."""
    start = time.perf_counter()
    for index in range(steps):
        task.step(to_device(batches[index % len(batches)], device))
    synchronize(device)
    return (time.perf_counter() - start) / steps


def runner_overhead(name: str, rounds: int, steps: int) -> tuple[Samples, Samples]:
    """Per-step time of dnnperf's runner (B) and of a bare loop (A), interleaved over rounds."""
    device = torch.device("cpu")
    workload = get_workload(name)
    bare, measured = [], []
    with tempfile.TemporaryDirectory() as runs:
        store = RunStore(runs)
        torch.manual_seed(0)
        task = workload.build("tiny", device)
        size = workload.default_batch_size["tiny"]
        batches = [workload.data("tiny").synthesize(size, seed=s) for s in range(2)]
        bare_loop_time(task, batches, 5, device)  # warm-up
        for _ in range(rounds):
            bare.append(bare_loop_time(task, batches, steps, device))
            record = bench(BenchSettings(name, steps=steps, warmup=0, device="cpu"), store)
            # wall time of the measured steps, including the runner's saving and callbacks
            measured.append(sum(record.points[0].step_s) / steps)
    return Samples.of(bare), Samples.of(measured)


STAGE_OVERHEAD_WORKLOADS = ("resnet18", "transformer", "gpt2", "vgg16")


def stage_overhead(name: str, pairs: int) -> tuple[Samples, Samples]:
    """Step times of one task alternating, step by step, between the plain clock (A) and the stage
    clock (B), in ABBA order so neither always goes first. Same process, model and batches."""
    device = torch.device("cpu")
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("tiny", device)
    source = MemorySource(workload.data("tiny"), workload.default_batch_size["tiny"])
    clocks = {"plain": WallClock(device), "stages": StageClock(device)}
    for _ in range(5):  # warm-up
        timed_step(task, source, device, clocks["stages"])
    times: dict[str, list[float]] = {"plain": [], "stages": []}
    for index in range(pairs):
        order = ("plain", "stages") if index % 2 == 0 else ("stages", "plain")
        for kind in order:
            times[kind].append(timed_step(task, source, device, clocks[kind])[0].wall_s)
    return Samples.of(times["plain"]), Samples.of(times["stages"])


def data_kinds(name: str, preset: str, batch_size: int, steps: int) -> dict[str, Samples]:
    results = {}
    with tempfile.TemporaryDirectory() as runs, tempfile.TemporaryDirectory() as data:
        for kind in ("memory", "disk"):
            settings = BenchSettings(
                name,
                preset=preset,
                batch_sizes=(batch_size,),
                steps=steps,
                warmup=3,
                data=kind,
                data_dir=Path(data),
            )
            results[kind] = bench(settings, RunStore(runs)).points[0].step_time
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    machine = environment.machine()
    software = environment.software()
    print("1/4 tiny step times", file=sys.stderr)
    tiny = tiny_step_times(args.steps, warmup=3)
    print("2/4 runner overhead (paired, interleaved)", file=sys.stderr)
    bare, measured = runner_overhead("basic_cnn", rounds=7, steps=args.steps)
    print("3/4 memory vs disk data", file=sys.stderr)
    kinds = data_kinds("resnet18", "small", 16, args.steps)
    print("4/4 stage profiler overhead (paired, interleaved)", file=sys.stderr)
    overheads = {name: stage_overhead(name, pairs=150) for name in STAGE_OVERHEAD_WORKLOADS}

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    gpus = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
    lines = [
        "# Benchmarks of dnnperf",
        "",
        f"Generated by `make bench` on {date}. Machine: {machine['cpu_model']}, "
        f"{machine['cores_usable']} usable cores, {machine['memory_bytes'] / 2**30:.0f} GiB, {gpus}; "
        f"torch {software['torch']} ({software['torch_threads']} threads), Python {software['python']}.",
        "",
        "The layer profiler and calibration: [benchmarks-layers.md](benchmarks-layers.md); the memory",
        "profiler: [benchmarks-memory.md](benchmarks-memory.md).",
        "",
        f"## Tiny presets: step time (target under {TINY_TARGET_S} s)",
        "",
        f"Median and p10-p90 over {args.steps} measured steps after 3 warm-up steps, default batch size, "
        "data in memory.",
        "",
        "| workload | batch | median ms | p10-p90 ms | under target |",
        "|---|---:|---:|---:|---|",
    ]
    for name, batch, samples in tiny:
        ok = "yes" if samples.median < TINY_TARGET_S else "**no**"
        lines.append(
            f"| {name} | {batch} | {samples.median * 1e3:.1f} | {samples.p10 * 1e3:.1f}-"
            f"{samples.p90 * 1e3:.1f} | {ok} |"
        )
    overhead = [m - b for m, b in zip(measured.values, bare.values, strict=True)]
    lines += [
        "",
        "## Runner overhead",
        "",
        "`basic_cnn` tiny, per-step time of a bare loop (`task.step` on pre-made batches) and of",
        f"`dnnperf.bench`, alternated over {len(bare)} rounds of {args.steps} steps.",
        "",
        "| loop | median ms/step | p10-p90 |",
        "|---|---:|---:|",
        f"| bare | {bare.median * 1e3:.2f} | {bare.p10 * 1e3:.2f}-{bare.p90 * 1e3:.2f} |",
        f"| dnnperf runner | {measured.median * 1e3:.2f} | "
        f"{measured.p10 * 1e3:.2f}-{measured.p90 * 1e3:.2f} |",
        f"| paired difference | {statistics.median(overhead) * 1e3:.2f} | "
        f"{Samples.of(overhead).p10 * 1e3:.2f}-{Samples.of(overhead).p90 * 1e3:.2f} |",
        "",
        "## Data in memory vs on disk",
        "",
        "`resnet18` small, batch 16: the on-disk dataset is JPEG files read, decoded, cropped, flipped and",
        "normalised by DataLoader workers.",
        "",
        "| data | median ms/step | p10-p90 |",
        "|---|---:|---:|",
    ]
    for kind, samples in kinds.items():
        lines.append(
            f"| {kind} | {samples.median * 1e3:.1f} | {samples.p10 * 1e3:.1f}-{samples.p90 * 1e3:.1f} |"
        )
    lines += [
        "",
        "## Stage profiler overhead (target: at most 2%)",
        "",
        "Tiny presets, data in memory, CPU. One task alternates, step by step in ABBA order, between the",
        "plain step clock and the stage clock (150 pairs after 5 warm-up steps); the overhead is the",
        "median of the pairs' relative differences of step time.",
        "",
        "| workload | plain ms | profiled ms | overhead (median of pairs) | p10-p90 of pairs | within 2% |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, (plain, profiled) in overheads.items():  # pairs are adjacent steps
        pairs = Samples.of([(b - a) / a for a, b in zip(plain.values, profiled.values, strict=True)])
        ok = "yes" if pairs.median <= 0.02 else "**no**"
        lines.append(
            f"| {name} | {plain.median * 1e3:.2f} | {profiled.median * 1e3:.2f} | "
            f"{100 * pairs.median:+.2f}% | {100 * pairs.p10:+.2f}% to {100 * pairs.p90:+.2f}% | {ok} |"
        )
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
