"""Benchmark of dp's bucket timing (`make bench`); results go to docs/benchmarks-distributed.md.

Each DDP gradient bucket's allreduce as dnnperf measures it (comm hook, launch to completion) against a
stand-alone allreduce of the same size on the same two ranks, timed the same way. Paired and
interleaved: every training step is followed by one stand-alone allreduce per bucket size, so both see
the same machine state; medians over the steps. Target: every bucket within 20%.

Runs itself under torchrun (``--rank``) once per workload; rank 0 writes a JSON summary the parent reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from dnnperf import environment
from dnnperf.data.sources import MemorySource
from dnnperf.distributed.ddp import DataParallelTask
from dnnperf.distributed.gather import gather_json
from dnnperf.distributed.worker import ShardSource
from dnnperf.probes.clock import StageClock
from dnnperf.stats import Samples
from dnnperf.workloads import get_workload

CASES = (("resnet18", "small", 8, 1.0), ("vgg16", "tiny", 8, 1.0), ("gpt2", "small", 8, 1.0))
TARGET = 0.20


def standalone_allreduce(numel: int) -> float:
    """One allreduce of ``numel`` float32 elements, launch to completion, timed as the hook times it."""
    tensor = torch.ones(numel)
    done = threading.Event()
    stamps: list[float] = []
    start = time.perf_counter()
    future = dist.all_reduce(tensor, async_op=True).get_future()
    future.then(lambda f: (stamps.append(time.perf_counter()), done.set()))
    done.wait()
    future.wait()
    return stamps[0] - start


def rank_main(workload: str, preset: str, batch: int, bucket_mb: float, steps: int, output: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    w = get_workload(workload)
    torch.manual_seed(0)
    task = DataParallelTask(w.build(preset, "cpu"), workload, torch.device("cpu"), bucket_mb)
    source = ShardSource(MemorySource(w.data(preset), batch, seed=0), rank, world)
    clock = StageClock(torch.device("cpu"))
    hook: dict[tuple[int, int], list[float]] = {}
    alone: dict[tuple[int, int], list[float]] = {}
    try:
        for step in range(steps + 2):  # two warm-up steps (DDP rebuilds its buckets after the first)
            clock.begin_step()
            task.step(next(source), clock)
            clock.end_step()
            buckets = task.timer.take_step()
            for bucket in buckets:
                key = (bucket["index"], bucket["bytes"])
                seconds = standalone_allreduce(bucket["bytes"] // 4)
                if step >= 2:
                    hook.setdefault(key, []).append(bucket["allreduce_s"])
                    alone.setdefault(key, []).append(seconds)
    finally:
        clock.close()
    rows = [
        {
            "bucket": index,
            "bytes": size,
            "hook_s": Samples.of(hook[(index, size)]).median,
            "alone_s": Samples.of(alone[(index, size)]).median,
            "steps": len(hook[(index, size)]),
        }
        for index, size in sorted(hook)
    ]
    reports = gather_json(rows, torch.device("cpu"))
    if reports is not None:
        output.write_text(json.dumps(reports))
    dist.destroy_process_group()


def run_case(workload: str, preset: str, batch: int, bucket_mb: float, steps: int) -> list[list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "result.json"
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
            __file__, "--rank", workload, preset, str(batch), str(bucket_mb), str(steps), str(output),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run(argv, env=env, capture_output=True, text=True)
        if result.returncode:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise RuntimeError(f"{workload} ({preset}) failed:\n{tail}")
        return json.loads(output.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-distributed.md"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rank", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        workload, preset, batch, bucket_mb, steps, output = args.rank
        rank_main(workload, preset, int(batch), float(bucket_mb), int(steps), Path(output))
        return

    machine = environment.describe()["machine"]
    lines = [
        "# Distributed benchmarks",
        "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {machine['cpu_model']} "
        f"({machine['cores_usable']} usable cores), torch {torch.__version__}, 2 ranks, gloo, "
        f"1 thread per rank, {args.steps} measured steps (`python benchmarks/distributed_benchmarks.py`).",
        "",
        "Each DDP gradient bucket's own allreduce as the dp comm hook measures it (completion minus the",
        "later of its launch and the previous bucket's completion: the process group runs collectives in",
        "order, so launch to completion also counts waiting behind earlier buckets)",
        "against a stand-alone allreduce of the same size on the same ranks, paired and interleaved (one",
        f"stand-alone allreduce per bucket after every step); medians. Target: within {TARGET:.0%}.",
        "",
        "| workload | preset | bucket | bytes | rank | hook ms | stand-alone ms | ratio | within 20% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    misses = 0
    for workload, preset, batch, bucket_mb in CASES:
        print(f"{workload} ({preset}) ...", file=sys.stderr)
        for rank, rows in enumerate(run_case(workload, preset, batch, bucket_mb, args.steps)):
            for row in rows:
                ratio = row["hook_s"] / row["alone_s"]
                ok = abs(ratio - 1) <= TARGET
                misses += not ok
                cells = [workload, preset, row["bucket"], row["bytes"], rank]
                cells += [f"{row['hook_s'] * 1e3:.2f}", f"{row['alone_s'] * 1e3:.2f}", f"{ratio:.2f}"]
                lines.append("| " + " | ".join(map(str, [*cells, "yes" if ok else "no"])) + " |")
    lines += ["", f"Buckets outside the target: {misses}."]
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
