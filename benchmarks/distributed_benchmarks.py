"""Benchmark of dp's bucket timing (`make bench`); results go to docs/benchmarks-distributed.md.

Each DDP gradient bucket's own allreduce time as dnnperf measures it (comm hook; launch to completion
less the skew and queueing, see ``ddp.split_wait``) against a stand-alone allreduce of the same size on
the same two ranks, timed the same way. Paired and interleaved: every training step is followed by
stand-alone allreduces per bucket size (idle, under load, after skew), so both see the same machine
state; medians over the steps. Target: every bucket within 20%.

Runs itself under torchrun (``--rank``) once per workload; rank 0 writes a JSON summary the parent reads.
The script writes one section of the page (``GENERATED``); the page's other sections (another host's
run, the analysis of dated runs) are written by hand and kept. ``--from-json`` re-renders the
section from a saved ``--json`` run.
"""

from __future__ import annotations

import argparse
import contextlib
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
from dnnperf.distributed.ddp import DataParallelTask, PeerClock
from dnnperf.distributed.gather import gather_json
from dnnperf.distributed.worker import ShardSource
from dnnperf.probes.clock import StageClock
from dnnperf.stats import Samples
from dnnperf.workloads import get_workload

CASES = (("resnet18", "small", 8, 1.0), ("vgg16", "tiny", 8, 1.0), ("gpt2", "small", 8, 1.0))
TARGET = 0.20
#: How late one rank launches the skewed stand-alone allreduce (the ranks take turns).
LATE_S = 0.01
#: Medians per bucket and rank in the table.
MEDIANS = (
    "seconds",
    "skew_s",
    "queued_s",
    "shared_s",
    "allreduce_s",
    "every_computing",
    "alone_s",
    "loaded_s",
    "skewed_s",
)
#: Classes of bucket allreduces by the ranks computing their backward pass during its own time.
CLASSES = (
    "no rank computing",
    "one rank computing",
    "every rank computing for under half of it",
    "every rank computing for half of it or more",
)


def contention(record: dict) -> str:
    """The class of one bucket allreduce (see :func:`computing_shares`)."""
    every, some = record["every_computing"], record["some_computing"]
    return (
        CLASSES[0] if some <= 0 else CLASSES[1] if every <= 0 else CLASSES[2] if every < 0.5 else CLASSES[3]
    )


class Load:
    """A thread multiplying matrices until stopped: the backward pass's compute, competing for the cores
    while a stand-alone allreduce runs (one intra-op thread, as the ranks use)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._work, daemon=True)

    def _work(self) -> None:
        x = torch.randn(192, 192)
        self._running.set()
        while not self._stop.is_set():
            torch.mm(x, x)

    def __enter__(self) -> Load:
        self._thread.start()
        self._running.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def standalone_allreduce(
    tensor: torch.Tensor, peers: PeerClock, loaded: bool = False, late: int | None = None
) -> tuple[float, float]:
    """One allreduce of ``tensor`` after a barrier, timed as the hook times a bucket: (launch to
    completion on this rank, the collective's own time from the latest launch over the ranks to
    completion). ``loaded``: with a :class:`Load` thread running on every rank meanwhile; ``late``:
    that rank sleeps :data:`LATE_S` before it launches, so its peers wait idle, as in a skewed step."""
    done = threading.Event()
    stamps: list[float] = []
    with Load() if loaded else contextlib.nullcontext():
        dist.barrier()
        if dist.get_rank() == late:
            time.sleep(LATE_S)
        start = time.perf_counter()
        future = dist.all_reduce(tensor, async_op=True).get_future()
        future.then(lambda f: (stamps.append(time.perf_counter()), done.set()))
        done.wait()
        future.wait()
    latest = peers.latest({0: [start]}, 1)[0][0]
    return stamps[0] - start, stamps[0] - max(latest, start)


def computing_shares(
    raw: list[tuple[int, int, float, float]], buckets: list[dict], peers: PeerClock
) -> dict[int, tuple[float, float, float]]:
    """Per bucket index, the shares of its collective's running time (``shared_s + allreduce_s``)
    that ran while every rank, and while at least one rank, was still computing its backward pass, and
    the share that overlapped another bucket's own allreduce on this rank (gloo runs two at once). A
    rank has computed every gradient when it launches its last bucket; a bucket's own time begins
    after every rank launched it, so every rank is in its backward pass by then."""
    last = [launch[0][0] for launch in peers.gather({0: [max(start for _, _, start, _ in raw)]}, 1)]
    stops = {index: stop for index, _, _, stop in raw}
    # Its collective ran from the end of its queue to completion (own share plus the others' shares).
    own = {
        b["index"]: (stops[b["index"]] - b["allreduce_s"] - b.get("shared_s", 0.0), stops[b["index"]])
        for b in buckets
    }
    shares = {}
    for index, (begin, end) in own.items():
        length = max(end - begin, 1e-12)
        every, some = (min(max(t - begin, 0.0), end - begin) / length for t in (min(last), max(last)))
        others = sorted((max(a, begin), min(b, end)) for i, (a, b) in own.items() if i != index)
        covered, reach = 0.0, begin  # the union of the other buckets' own intervals within this one
        for a, b in others:
            if b > max(a, reach):
                covered, reach = covered + b - max(a, reach), b
        shares[index] = (every, some, covered / length)
    return shares


def rank_main(
    workload: str, preset: str, batch: int, bucket_mb: float, steps: int, output: Path, compute_cpu: int
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if compute_cpu >= 0:
        # This thread only (Linux: pid 0 is the calling thread): gloo's worker threads, made by
        # init_process_group, keep every core; the training step, and the load thread it starts, run
        # on ``compute_cpu``, so the collectives have the other cores to themselves.
        os.sched_setaffinity(0, {compute_cpu})
    rank, world = dist.get_rank(), dist.get_world_size()
    w = get_workload(workload)
    torch.manual_seed(0)
    task = DataParallelTask(w.build(preset, "cpu"), workload, torch.device("cpu"), bucket_mb)
    assert task.timer.peers is not None
    peers = task.timer.peers
    source = ShardSource(MemorySource(w.data(preset), batch, seed=0), rank, world)
    clock = StageClock(torch.device("cpu"))
    records: list[dict] = []
    buffers: dict[tuple[int, int], torch.Tensor] = {}
    try:
        for step in range(steps + 2):  # two warm-up steps (DDP rebuilds its buckets after the first)
            clock.begin_step()
            task.step(next(source), clock)
            clock.end_step()
            with task.timer._lock:
                raw = list(task.timer._pending)  # this rank's (index, bytes, launch, completion)
            buckets = task.timer.take_step()
            shares = computing_shares(raw, buckets, peers)
            for bucket in buckets:
                key = (bucket["index"], bucket["bytes"])
                # one buffer per bucket, reused every step, as DDP reuses its bucket buffers
                tensor = buffers.setdefault(key, torch.ones(bucket["bytes"] // 4))
                alone_wait, alone = standalone_allreduce(tensor, peers, loaded=False)
                _, loaded = standalone_allreduce(tensor, peers, loaded=True)
                _, skewed = standalone_allreduce(tensor, peers, late=step % world)
                if step >= 2:
                    every, some, concurrent = shares[bucket["index"]]
                    records.append(
                        {**bucket, "bucket": bucket["index"], "step": step - 2}
                        | {"every_computing": every, "some_computing": some, "concurrent": concurrent}
                        | {
                            "alone_s": alone,
                            "alone_wait_s": alone_wait,
                            "loaded_s": loaded,
                            "skewed_s": skewed,
                        }
                    )
    finally:
        clock.close()
    reports = gather_json({"records": records, "shared_clock": peers.shared}, torch.device("cpu"))
    if reports is not None:
        output.write_text(json.dumps(reports))
    dist.destroy_process_group()


def run_case(
    workload: str,
    preset: str,
    batch: int,
    bucket_mb: float,
    steps: int,
    link_mbit: float | None = None,
    compute_cpu: int = -1,
) -> list[list[dict]]:
    """Both ranks under torchrun on loopback; with ``link_mbit``, each in its own network namespace,
    joined by a veth pair shaped to that rate (root; ``dnnperf.distributed.netns``). ``compute_cpu``
    >= 0: both ranks' training threads on that core, their gloo threads free."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "result.json"
        rank_argv = [__file__, "--rank", workload, preset, str(batch), str(bucket_mb), str(steps)]
        rank_argv += [str(output), str(compute_cpu)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if link_mbit is None:
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                    "--nproc-per-node=2", *rank_argv]  # fmt: skip
            result = subprocess.run(argv, env=env, capture_output=True, text=True)
            failed, log = result.returncode, result.stdout + result.stderr
        else:
            from dnnperf.distributed.netns import LinkShape, NetnsPair

            with NetnsPair(LinkShape(link_mbit)) as pair:
                ranks = [
                    subprocess.Popen(
                        pair.rank_command(rank, [sys.executable, *rank_argv]),
                        env={**env, **pair.rank_environment(rank)},
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                    for rank in range(2)
                ]
                logs = [rank.communicate()[0] for rank in ranks]
            failed, log = max(rank.returncode for rank in ranks), "\n".join(logs)
        if failed:
            tail = "\n".join(log.splitlines()[-15:])
            raise RuntimeError(f"{workload} ({preset}) failed:\n{tail}")
        return json.loads(output.read_text())


#: The heading of the section this script writes; the page's other "## " sections are written by hand
#: from dated runs (another host, the analysis of a run) and kept as they are.
GENERATED = "## On 2 cores (`make bench`)"


def hand_written(text: str) -> str:
    """The page's sections other than the generated one, each from its "## " heading to the next."""
    kept: list[str] = []
    keep = False
    for line in text.splitlines():
        if line.startswith("## "):
            keep = line != GENERATED
        if keep:
            kept.append(line)
    return "\n" + "\n".join(kept).rstrip() + "\n" if kept else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/benchmarks-distributed.md"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workloads", nargs="+", help="only these of the cases")
    parser.add_argument("--json", type=Path, help="also write every rank's bucket allreduces as JSON here")
    parser.add_argument("--from-json", type=Path, help="write the tables from such a JSON, running nothing")
    parser.add_argument(
        "--link-mbit",
        type=float,
        help="each rank in its own network namespace, the link between them shaped to this rate (root)",
    )
    parser.add_argument(
        "--compute-cpu",
        type=int,
        default=-1,
        help="both ranks' training threads on this core only, leaving the others to gloo's threads",
    )
    parser.add_argument("--rank", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        workload, preset, batch, bucket_mb, steps, output, cpu = args.rank
        rank_main(workload, preset, int(batch), float(bucket_mb), int(steps), Path(output), int(cpu))
        return

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        run, results = saved["run"], {tuple(key.split()): value for key, value in saved["cases"].items()}
    else:
        machine = environment.describe()["machine"]
        run = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "steps": args.steps}
        run |= {"cpu": machine["cpu_model"], "cores": machine["cores_usable"], "torch": torch.__version__}
        run["commit"] = environment.source_commit()
        run["load_before"] = os.getloadavg()[0]
        run["link_mbit"] = args.link_mbit
        run["compute_cpu"] = args.compute_cpu
        results = {}
        for workload, preset, batch, bucket_mb in CASES:
            if args.workloads and workload not in args.workloads:
                continue
            print(f"{workload} ({preset}) ...", file=sys.stderr)
            case = (workload, preset, batch, bucket_mb, args.steps, args.link_mbit, args.compute_cpu)
            results[(workload, preset)] = run_case(*case)
        run["load_after"] = os.getloadavg()[0]
    if args.json:
        cases = {f"{w} {p}": r for (w, p), r in results.items()}
        args.json.write_text(json.dumps({"run": run, "cases": cases}))
    ms = "{:.2f}".format
    bucket_rows = [
        "| workload | preset | bucket | bytes | rank | waited ms | skew ms | queued ms | shared ms | own ms "
        "| every rank computing | stand-alone ms | own / stand-alone | within 20% "
        "| stand-alone under load ms | stand-alone after skew ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    misses = total = like_skewed = 0
    instances: dict[str, list[dict]] = {name: [] for name in CLASSES}
    for (workload, preset), reports in results.items():
        for rank, report in enumerate(reports):
            by_bucket: dict[tuple[int, int], list[dict]] = {}
            for record in report["records"]:
                by_bucket.setdefault((record["bucket"], record["bytes"]), []).append(record)
                instances[contention(record)].append(record)
            for (index, size), records in sorted(by_bucket.items()):
                med = {k: Samples.of([r[k] for r in records]).median for k in MEDIANS}
                ratio = med["allreduce_s"] / med["alone_s"]
                ok = abs(ratio - 1) <= TARGET
                misses, total = misses + (not ok), total + 1
                like_skewed += abs(med["allreduce_s"] / med["skewed_s"] - 1) <= TARGET
                cells = [workload, preset, index, size, rank]
                parts = ("seconds", "skew_s", "queued_s", "shared_s", "allreduce_s")
                cells += [ms(med[k] * 1e3) for k in parts]
                cells += [f"{med['every_computing']:.0%}", ms(med["alone_s"] * 1e3), f"{ratio:.2f}"]
                cells += ["yes" if ok else "no", ms(med["loaded_s"] * 1e3), ms(med["skewed_s"] * 1e3)]
                bucket_rows.append("| " + " | ".join(map(str, cells)) + " |")
    class_rows = [
        "| own allreduce ran while | bucket allreduces | median own / stand-alone | share within 20% "
        "| median own / stand-alone under load | median own / stand-alone after skew "
        "| of these, no other bucket in flight | their median own / stand-alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, records in instances.items():
        if not records:
            continue
        ratios = [r["allreduce_s"] / r["alone_s"] for r in records]
        within = sum(abs(x - 1) <= TARGET for x in ratios) / len(ratios)
        loaded = Samples.of([r["allreduce_s"] / r["loaded_s"] for r in records]).median
        skewed = Samples.of([r["allreduce_s"] / r["skewed_s"] for r in records]).median
        single = [r["allreduce_s"] / r["alone_s"] for r in records if r["concurrent"] <= 0]
        single_median = f"{Samples.of(single).median:.2f}" if single else "-"
        class_rows.append(
            f"| {name} | {len(records)} | {Samples.of(ratios).median:.2f} | {within:.0%} | {loaded:.2f} "
            f"| {skewed:.2f} | {len(single)} | {single_median} |"
        )
    shared = all(report["shared_clock"] for reports in results.values() for report in reports)
    every = [r for reports in results.values() for report in reports for r in report["records"]]
    waited = sum(r["seconds"] for r in every)
    part = {k: sum(r[k] for r in every) / waited for k in ("skew_s", "queued_s", "shared_s", "allreduce_s")}
    old = Samples.of([r["seconds"] / r["alone_s"] for r in every]).median
    under_load = Samples.of([r["loaded_s"] / r["alone_s"] for r in every]).median
    after_skew = Samples.of([r["skewed_s"] / r["alone_s"] for r in every]).median
    lines = [
        "# Distributed benchmarks",
        "",
        GENERATED,
        "",
        f"Run {run['date']} at commit `{run.get('commit', 'unknown')}` on {run['cpu']} "
        f"({run['cores']} usable cores), torch {run['torch']}, 2 ranks, "
        "gloo, 1 thread per rank, "
        + (
            f"each rank in its own network namespace, the veth link between them shaped to "
            f"{run['link_mbit']:g} Mbit/s, "
            if run.get("link_mbit")
            else "loopback, "
        )
        + (
            f"both ranks' training threads pinned to core {run['compute_cpu']} (gloo's threads free), "
            if run.get("compute_cpu", -1) >= 0
            else ""
        )
        + f"{run['steps']} measured steps after 2 warm-up steps "
        "(`python benchmarks/distributed_benchmarks.py`); "
        f"ranks' clocks {'shared (one machine)' if shared else 'offset-estimated'}; "
        f"1-minute load average {run['load_before']:.1f} before and {run['load_after']:.1f} after the run "
        "(the machine is shared: other users' processes ran too).",
        "",
        "### What is compared",
        "",
        "Each DDP gradient bucket's allreduce as the dp comm hook measures it (see",
        "[distributed.md](distributed.md#what-is-measured)): what the rank **waited** (launch to",
        "completion), split into **skew** (until the last rank launched the bucket), **queued** (every",
        "lane of the process group busy with earlier buckets), and from then to completion, time divided",
        "evenly among the collectives running at each moment (gloo runs two at once, sharing the link and",
        "the cores): **shared** (the other buckets' shares) and the collective's **own** share. The",
        "target compares the own share with a **stand-alone** allreduce of the",
        "same size on the same ranks, timed the same way (after a barrier; completion minus the later",
        "rank's launch), one per bucket after every training step (paired, interleaved), reusing one",
        "buffer per bucket as DDP does. A second stand-alone allreduce per bucket runs **under load**: a",
        "thread on every rank multiplies 192x192 matrices (one intra-op thread) meanwhile, as a backward",
        "pass would compete for the cores. A third one runs **after skew**: one rank (the ranks take",
        f"turns) sleeps {LATE_S * 1e3:.0f} ms after the barrier before it launches, so its peer waits idle",
        "for it, as the early rank does in a skewed step; its own time is counted from the late launch.",
        "",
        "Each bucket allreduce of each step is also classed by how many ranks were still computing their",
        "backward pass during its own time: a rank has computed every gradient when it launches its last",
        "bucket (the ranks' launches on one clock).",
        f"Target: own time within {TARGET:.0%} of the stand-alone.",
        "",
        "### Result",
        "",
        f"Buckets (per rank, median over the steps) within the target: {total - misses} of {total}: "
        + ("**met**." if misses == 0 else "**not met**."),
        f"Within {TARGET:.0%} of the stand-alone allreduce after skew (launched as a bucket is, one rank "
        f"late): {like_skewed} of {total}.",
        "",
        f"Of all the time the ranks waited for buckets, {part['skew_s']:.0%} was skew, "
        f"{part['queued_s']:.0%} queued, {part['shared_s']:.0%} other buckets' collectives running beside "
        f"it (their shares) and {part['allreduce_s']:.0%} the collectives' own shares. The whole wait "
        f"(launch to completion, not split) is {old:.1f} times the stand-alone allreduce "
        "(median over every bucket allreduce). The stand-alone allreduce under load takes a median "
        f"{under_load:.2f} times as long as the one on idle ranks, the one after skew "
        f"{after_skew:.2f} times.",
        "",
        "Every bucket allreduce of every step, by the ranks computing during its own time (ratios paired "
        "with the stand-alone allreduces after the same step):",
        "",
        *class_rows,
        "",
        "Per bucket and rank, medians over the steps (every rank computing: the median share of the own",
        "time during which every rank was still in its backward pass):",
        "",
        *bucket_rows,
    ]
    previous = args.output.read_text() if args.output.exists() else ""
    args.output.write_text("\n".join(lines) + "\n" + hand_written(previous))
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
