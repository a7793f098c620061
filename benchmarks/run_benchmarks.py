"""Benchmarks of dnnperf itself (`make bench`); writes the whole of docs/benchmarks.md.

1. Tiny-preset step time of every workload (target: under 0.5 s on 2 cores, so tests stay fast).
2. The runner's overhead: dnnperf's measured loop against a bare training loop on the same task,
   paired and interleaved (A, B, A, B, ...) so drift in the machine hits both alike.
3. Memory vs on-disk data for an image workload at `small`: what real reading and decoding cost.
4. The stage profiler's overhead: the same runner with and without stage profiling, paired and
   interleaved, on several workloads (target: at most 2% slower).

``--json PATH`` keeps the results; ``--from-json PATH`` writes the page from them without running.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from dnnperf import environment
from dnnperf.data.sources import MemorySource
from dnnperf.devices import synchronize, to_device
from dnnperf.jsonio import write_json_atomic, write_text_atomic
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
        size = workload.batch_size("tiny")
        batches = [workload.data("tiny").synthesize(size, seed=s) for s in range(2)]
        bare_loop_time(task, batches, 5, device)  # warm-up
        for _ in range(rounds):
            bare.append(bare_loop_time(task, batches, steps, device))
            record = bench(BenchSettings(name, steps=steps, warmup=0, device="cpu"), store)
            # wall time of the measured steps, including the runner's saving and callbacks
            measured.append(sum(record.points[0].step_s) / steps)
    return Samples.of(bare), Samples.of(measured)


STAGE_OVERHEAD_WORKLOADS = ("resnet18", "transformer", "gpt2", "vgg16")
STAGE_PAIRS = 150


def stage_overhead(name: str, pairs: int) -> tuple[Samples, Samples]:
    """Step times of one task alternating, step by step, between the plain clock (A) and the stage
    clock (B), in ABBA order so neither always goes first. Same process, model and batches."""
    device = torch.device("cpu")
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("tiny", device)
    source = MemorySource(workload.data("tiny"), workload.batch_size("tiny"))
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


#: The other pages of benchmark figures, each regenerated by its own command.
OTHER_PAGES = (
    (
        "benchmarks-layers.md",
        "layer profiler overhead and closure, `dnnperf hw` repeatability, "
        "efficiency against the calibrated peak",
        "`python benchmarks/layer_benchmarks.py`",
    ),
    (
        "benchmarks-memory.md",
        "memory profiler against the allocator and the process, its overhead",
        "`python benchmarks/memory_benchmarks.py`",
    ),
    (
        "benchmarks-memsave.md",
        "memory saver: planner against no saving, offload-everything and sqrt(n)",
        "`python benchmarks/memsave_benchmarks.py --out memsave-benchmarks.json`",
    ),
    (
        "benchmarks-distributed.md",
        "DDP buckets: each bucket's allreduce against a stand-alone one",
        "`python benchmarks/distributed_benchmarks.py`",
    ),
    (
        "validation.md",
        "performance model: step time, memory, collectives, 2 ranks, against real runs",
        "`python benchmarks/model_validation.py`, `dnnperf validate`",
    ),
    (
        "benchmarks-predict.md",
        "`dnnperf predict`: a sweep from an empty cache, a new workload and a warm cache",
        "`python benchmarks/predict_speed.py --profile PROFILE`",
    ),
    (
        "benchmarks-gpu.md",
        "the CUDA paths on a GPU: tests, memsave, profiles",
        "`benchmarks/gpu_check.sh OUTDIR`",
    ),
)


def spread(samples: Samples) -> dict[str, float]:
    """Median, p10 and p90 of step seconds, in milliseconds."""
    return {"median": samples.median * 1e3, "p10": samples.p10 * 1e3, "p90": samples.p90 * 1e3}


def measure(steps: int) -> dict:
    """Every benchmark of this page, as plain numbers (milliseconds, fractions) for `render`."""
    print("1/4 tiny step times", file=sys.stderr)
    tiny = tiny_step_times(steps, warmup=3)
    print("2/4 runner overhead (paired, interleaved)", file=sys.stderr)
    bare, measured = runner_overhead("basic_cnn", rounds=7, steps=steps)
    print("3/4 memory vs disk data", file=sys.stderr)
    kinds = data_kinds("resnet18", "small", 16, steps)
    print("4/4 stage profiler overhead (paired, interleaved)", file=sys.stderr)
    overheads = {name: stage_overhead(name, pairs=STAGE_PAIRS) for name in STAGE_OVERHEAD_WORKLOADS}
    machine = environment.machine()
    software = environment.software()
    difference = Samples.of([m - b for m, b in zip(measured.values, bare.values, strict=True)])
    stages = []
    for name, (plain, profiled) in overheads.items():  # pairs are adjacent steps
        pairs = Samples.of([(b - a) / a for a, b in zip(plain.values, profiled.values, strict=True)])
        stages.append(
            {
                "workload": name,
                "plain_ms": plain.median * 1e3,
                "profiled_ms": profiled.median * 1e3,
                "overhead": {"median": pairs.median, "p10": pairs.p10, "p90": pairs.p90},
            }
        )
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": environment.source_commit(),
        "machine": (
            f"{machine['cpu_model']}, {machine['cores_usable']} usable cores, "
            f"{machine['memory_bytes'] / 2**30:.0f} GiB, "
            f"{', '.join(g['name'] for g in machine['gpus']) or 'no GPU'}; torch {software['torch']} "
            f"({software['torch_threads']} threads), Python {software['python']}"
        ),
        "steps": steps,
        "tiny": [{"workload": n, "batch": b, **spread(s)} for n, b, s in tiny],
        "runner": {
            "rounds": len(bare.values),
            "bare": spread(bare),
            "runner": spread(measured),
            "difference": spread(difference),
        },
        "data": {kind: spread(samples) for kind, samples in kinds.items()},
        "stages": stages,
    }


def ms_range(row: dict[str, float], digits: int) -> str:
    return f"{row['p10']:.{digits}f} to {row['p90']:.{digits}f}"


def render(results: dict) -> str:
    """The whole of docs/benchmarks.md from `measure`'s results: nothing on the page is kept by hand."""
    steps = results["steps"]
    lines = [
        "# Benchmarks of dnnperf",
        "",
        f"Generated by `make bench` (`python benchmarks/run_benchmarks.py`) on {results['date']} at commit "
        f"`{results['commit']}`. Machine: {results['machine']}. Every figure on this page is from that run;",
        "rerunning the command rewrites the whole page.",
        "",
        "## Other benchmark pages",
        "",
        "Each page gives its own date, machine, commit and the command that regenerates it.",
        "",
        "| page | what | regenerated by |",
        "|---|---|---|",
    ]
    lines += [f"| [{page}]({page}) | {what} | {command} |" for page, what, command in OTHER_PAGES]
    lines += [
        "",
        f"## Tiny presets: step time (target: under {TINY_TARGET_S} s)",
        "",
        f"Median and p10-p90 over {steps} measured steps after 3 warm-up steps, default batch size, data in "
        "memory. The target keeps the test suite fast.",
        "",
        "| workload | batch | median ms | p10 to p90 ms | under target |",
        "|---|---:|---:|---:|---|",
    ]
    for row in results["tiny"]:
        ok = "yes" if row["median"] < TINY_TARGET_S * 1e3 else "**no**"
        lines.append(
            f"| {row['workload']} | {row['batch']} | {row['median']:.1f} | {ms_range(row, 1)} | {ok} |"
        )
    runner = results["runner"]
    lines += [
        "",
        "## Runner overhead",
        "",
        "`basic_cnn` tiny: per-step time of a bare loop (`task.step` on pre-made batches) and of",
        f"`dnnperf.bench`, alternated over {runner['rounds']} rounds of {steps} steps so that drift in the "
        "machine hits both alike.",
        "",
        "| loop | median ms/step | p10 to p90 |",
        "|---|---:|---:|",
        f"| bare | {runner['bare']['median']:.2f} | {ms_range(runner['bare'], 2)} |",
        f"| dnnperf runner | {runner['runner']['median']:.2f} | {ms_range(runner['runner'], 2)} |",
        f"| paired difference | {runner['difference']['median']:.2f} | {ms_range(runner['difference'], 2)} |",
        "",
        "## Data in memory vs on disk",
        "",
        "`resnet18` small, batch 16: the on-disk dataset is JPEG files read, decoded, cropped, flipped and",
        "normalised by DataLoader workers.",
        "",
        "| data | median ms/step | p10 to p90 |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {kind} | {row['median']:.1f} | {ms_range(row, 1)} |" for kind, row in results["data"].items()
    ]
    lines += [
        "",
        "## Stage profiler overhead (target: at most 2%)",
        "",
        "Tiny presets, data in memory, CPU. One task alternates, step by step in ABBA order, between",
        f"the plain step clock and the stage clock ({STAGE_PAIRS} pairs after 5 warm-up steps); the overhead",
        "is the median of the pairs' relative differences of step time.",
        "",
        "| workload | plain ms | profiled ms | overhead (median of pairs) | p10 to p90 of pairs "
        "| within 2% |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in results["stages"]:
        pairs = row["overhead"]
        ok = "yes" if pairs["median"] <= 0.02 else "**no**"
        lines.append(
            f"| {row['workload']} | {row['plain_ms']:.2f} | {row['profiled_ms']:.2f} | "
            f"{100 * pairs['median']:+.2f}% | "
            f"{100 * pairs['p10']:+.2f}% to {100 * pairs['p90']:+.2f}% | {ok} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--from-json", type=Path, help="write the page from such a JSON, running nothing")
    args = parser.parse_args()

    results = json.loads(args.from_json.read_text()) if args.from_json else measure(args.steps)
    if args.json:
        write_json_atomic(args.json, results)
    write_text_atomic(args.output, render(results))
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
