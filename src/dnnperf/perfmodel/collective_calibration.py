"""Alpha, beta and gamma of the real backend, from microbenchmarks of its collectives.

:func:`measure` starts ``world`` processes on this host (gloo over loopback, one intra-op thread each,
rendezvous through a file store in a temporary directory removed at the end) and times allreduce,
allgather, reduce-scatter (``reduce_scatter_tensor``, as FSDP reduces its gradients), broadcast and a
send/receive over message sizes from 1 KiB to 64 MiB. Sizes and
operations are interleaved round by round; each sample starts after a barrier and is the slowest
rank's time (a collective is done when its last rank is).

Gloo implements each collective its own way (allgather through a flat buffer and copies, broadcast
and send/receive as point-to-point pipes; its reduce-scatter of a tensor costs more than an allreduce
of the same tensor, not the half a ring would take), so :func:`fit_op` fits alpha (latency per message, with
gloo's 1 MiB segments) and beta (seconds per byte sent) per operation, by least squares on relative
error, from every other message size; gamma (seconds per byte reduced) comes from a local one-thread
reduction (:func:`reduce_seconds_per_byte`), since with 2 ranks allreduce's beta and gamma terms both
grow with the message and cannot be separated. Each sample also counts the rank's minor page faults:
the fit takes them off at the host's page-fault cost (``calibrate.page_fault_cost``), and the
prediction adds those gloo's allocations take (``collectives.gather_buffer_faults``: allgather's
result above glibc's mmap threshold), so a 64 MiB allgather's 16 thousand faults do not bend the line.
:func:`compare` predicts every measured row, the sizes the fit never saw flagged, so the model is
judged on messages it did not see.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dnnperf.distributed.lifeline import ENV_RANK_DIR, Lifeline, run_ranks, scratch_directory
from dnnperf.distributed.netns import LinkShape, NetnsPair, burst_bytes
from dnnperf.errors import DnnperfError
from dnnperf.perfmodel import collectives
from dnnperf.perfmodel.calibrate import page_fault_cost
from dnnperf.perfmodel.machine import GLOO_SEGMENT
from dnnperf.probes.opcount import minor_faults

#: 1 KiB to 64 MiB in powers of 4.
SIZES = tuple(1024 * 4**i for i in range(9))
OPS = collectives.OPERATIONS
#: Samples per operation and size. On the 2-core machine 7 gave a median error of 11.8% over the
#: messages of 64 KiB or more (11 of 24 within 10%), 25 gave 6.9% (15 of 24) and 60 gave 4.9%
#: (16 of 24; 2026-11-24, one calibration each): the medians were noise. 25 costs ~10 s, 60 ~21 s.
ROUNDS = 25
#: What a step's collectives are fitted on: their mean. A call's time here is skewed (2 gloo ranks on
#: 2 cores, 2026-11-25: 20-40% of the calls of 128 KiB-1 MiB take 2-8 ms where the median is 0.3-1.5
#: ms), and a step that makes tens of calls (resnet18 tp: 41) sums to about their count times the
#: mean, not the median; fitted on medians, its collectives come out at about half what they take.
#: The microbenchmark's own table (calibrate) compares a fit on medians with the medians: the
#: typical call.
STEP_STATISTIC = "mean_s"
#: Messages at least this large are the model's target (within 10%: docs/validation-distributed.md).
TARGET_MIN_BYTES = 64 * 1024


def _rank_main(
    rank: int,
    world: int,
    store_path: str,
    out_path: str,
    sizes: Sequence[int],
    rounds: int,
    ops: Sequence[str],
) -> None:
    """One rank: time every (operation in ``ops``, size) ``rounds`` times, interleaved; rank 0 writes
    the samples."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        buffers = {n: torch.ones(n // 4) for n in sizes}
        pieces = {n: [torch.empty(n // 4 // world) for _ in range(world)] for n in sizes}
        shards = {n: torch.empty(n // 4 // world) for n in sizes}
        samples: dict[str, list[float]] = {}
        faults: dict[str, list[int]] = {}
        order = [(op, n) for op in ops for n in sizes]
        for round_ in range(rounds + 1):  # the first round warms every buffer and connection up
            random.Random(round_).shuffle(order)
            for op, n in order:
                dist.barrier()
                faults_before = minor_faults()
                started = time.perf_counter()
                if op == "allreduce":
                    dist.all_reduce(buffers[n])
                elif op == "allgather":
                    dist.all_gather(pieces[n], buffers[n][: n // 4 // world])
                elif op == "reduce_scatter":  # as FSDP reduces its gradients
                    dist.reduce_scatter_tensor(shards[n], buffers[n])
                elif op == "broadcast":
                    dist.broadcast(buffers[n], src=0)
                elif rank == 0:
                    dist.send(buffers[n], dst=1)
                elif rank == 1:
                    dist.recv(buffers[n], src=0)
                if round_ > 0:
                    samples.setdefault(f"{op}/{n}", []).append(time.perf_counter() - started)
                    faulted = minor_faults() - faults_before
                    faults.setdefault(f"{op}/{n}", []).append(faulted)
        gathered: list[Any] = [None] * world
        dist.gather_object({"seconds": samples, "faults": faults}, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            Path(out_path).write_text(json.dumps(gathered), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def measure(
    world: int = 2,
    sizes: Sequence[int] = SIZES,
    rounds: int = ROUNDS,
    timeout_s: float = 300.0,
    shape: LinkShape | None = None,
    ops: Sequence[str] = OPS,
) -> pd.DataFrame:
    """Median (and p10, p90) seconds per operation of ``ops`` and size: one row each, the slowest rank
    per sample; ``faults``: the median over samples of the most minor page faults a rank took in it.

    The ranks are plain subprocesses (no multiprocessing helper outlives the call); a rank that fails
    or overruns ``timeout_s`` stops all of them, and the error names it. ``shape``: the 2 ranks in
    their own network namespaces on a veth pair shaped so (root only; distributed/netns.py), gloo on
    the veth."""
    if world < 2:
        raise DnnperfError("collectives need at least 2 ranks")
    if shape is not None and world != 2:
        raise DnnperfError("a shaped link joins exactly 2 ranks")
    ops = collectives.operations(ops)
    if not ops:
        raise DnnperfError(f"no collective asked: choose among {', '.join(OPS)}")
    with NetnsPair(shape) if shape is not None else nullcontext() as pair:
        return _measure(world, sizes, rounds, timeout_s, pair, ops)


def _measure(
    world: int,
    sizes: Sequence[int],
    rounds: int,
    timeout_s: float,
    pair: NetnsPair | None,
    ops: Sequence[str],
) -> pd.DataFrame:
    """The ranks' samples. Nothing outlives this process, even a SIGKILL of it: the ranks get the
    parent-death signal, and a lifeline kills what is left (by the scratch directory in their
    environment) and removes the scratch directory and the namespaces."""
    with Lifeline() as lifeline:
        for namespace in pair.namespaces if pair is not None else ():
            lifeline.announce("netns", namespace)
        return _measure_ranks(world, sizes, rounds, timeout_s, pair, lifeline, ops)


def _measure_ranks(
    world: int,
    sizes: Sequence[int],
    rounds: int,
    timeout_s: float,
    pair: NetnsPair | None,
    lifeline: Lifeline,
    ops: Sequence[str],
) -> pd.DataFrame:
    with scratch_directory(lifeline, "dnnperf-collectives-") as scratch:
        out = scratch / "samples.json"
        settings = json.dumps([world, str(scratch / "store"), str(out), list(sizes), rounds, list(ops)])
        env = {**os.environ, "OMP_NUM_THREADS": "1", ENV_RANK_DIR: str(scratch)}
        commands = []
        for rank in range(world):
            argv = [sys.executable, "-m", __name__, str(rank), settings]
            if pair is None:
                commands.append((argv, env))
            else:
                commands.append(
                    (pair.rank_command(rank, argv), {**env, "GLOO_SOCKET_IFNAME": pair.interfaces[rank]})
                )
        run_ranks(commands, timeout_s, "collective microbenchmark")
        per_rank = json.loads(out.read_text(encoding="utf-8"))
    rows = []
    for key in per_rank[0]["seconds"]:
        op, n = key.split("/")
        slowest = np.max([rank["seconds"][key] for rank in per_rank], axis=0)
        faults = np.max([rank["faults"][key] for rank in per_rank], axis=0)
        rows.append(
            {
                "op": op,
                "bytes": int(n),
                "median_s": float(np.median(slowest)),
                "mean_s": float(np.mean(slowest)),
                "p10_s": float(np.percentile(slowest, 10)),
                "p90_s": float(np.percentile(slowest, 90)),
                "faults": float(np.median(faults)),
            }
        )
    return pd.DataFrame(rows).sort_values(["op", "bytes"]).reset_index(drop=True)


def predict_op(op: str, n: float, world: int, link: collectives.Link) -> float:
    """The model's seconds for one measured operation (the same formulas ``predict`` uses)."""
    if op == "allreduce":
        return collectives.allreduce(n, world, link, "ring")
    if op == "allgather":
        return collectives.allgather(n, world, link)
    if op == "reduce_scatter":
        return collectives.reduce_scatter(n, world, link)
    if op == "broadcast":
        return collectives.broadcast(n, world, link)
    if op == "send_recv":
        return collectives.send_recv(n, link)
    raise ValueError(f"unknown operation {op!r}")


def reduce_seconds_per_byte(nbytes: int = 16 << 20, repeats: int = 15) -> float:
    """Gamma: what one thread takes per byte to add a received float32 buffer into its own (gloo
    reduces on the CPU). With 2 ranks, gamma and beta both scale with the message and cannot be told
    apart from allreduce timings alone, so gamma comes from this local measurement."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.ones(nbytes // 4), torch.ones(nbytes // 4)
        for _ in range(3):
            a.add_(b)
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            a.add_(b)
            samples.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return float(np.median(samples)) / nbytes


def _basis(op: str, n: float, world: int) -> np.ndarray:
    """The operation's time as a linear function of (alpha, beta): its two coefficients."""
    return np.array(
        [
            predict_op(op, n, world, collectives.Link(1.0, 0.0, 0.0, GLOO_SEGMENT)),
            predict_op(op, n, world, collectives.Link(0.0, 1.0, 0.0, GLOO_SEGMENT)),
        ]
    )


def fit_op(
    rows: pd.DataFrame,
    op: str,
    world: int,
    gamma: float,
    page_fault_s: float = 0.0,
    statistic: str = "median_s",
) -> dict[str, float] | None:
    """Alpha (s) and bandwidth (bytes/s) of one operation, gamma given, minimising the relative error
    of its rows' ``statistic`` (each size weighs alike) once their counted page faults (a ``faults``
    column) are taken off at ``page_fault_s``; an alpha the fit would make negative is held at zero.
    None when the timings give no positive bandwidth term (too noisy to say how time grows with
    size): the operation then keeps the machine's default link.

    ``statistic``: ``median_s`` fits the typical call; ``mean_s`` the expected one, what a step that
    makes tens of calls pays on average (STEP_STATISTIC)."""
    mine = rows[rows["op"] == op]
    mine = mine.assign(median_s=mine[statistic])
    if "faults" in mine:
        mine = mine.assign(median_s=mine["median_s"] - mine["faults"] * page_fault_s)
    reduced = np.array(
        [
            predict_op(op, r.bytes, world, collectives.Link(0.0, 0.0, gamma, GLOO_SEGMENT))
            for r in mine.itertuples()
        ]
    )
    design = np.array([_basis(op, r.bytes, world) / r.median_s for r in mine.itertuples()])
    target = 1 - reduced / mine["median_s"].to_numpy()
    (alpha, beta), *_ = np.linalg.lstsq(design, target, rcond=None)
    if alpha < 0:
        alpha = 0.0
        beta = float(np.linalg.lstsq(design[:, 1:], target, rcond=None)[0][0])
    if not beta > 0:
        return None
    return {"alpha": float(alpha), "bandwidth": float(1 / beta), "reduce_bandwidth": 1 / gamma}


def _fits(
    rows: pd.DataFrame, world: int, gamma: float, page_fault_s: float, statistic: str
) -> dict[str, dict[str, float]]:
    """Every operation's fit (fit_op) on ``statistic``, those without one left out."""
    fits = {op: fit_op(rows, op, world, gamma, page_fault_s, statistic) for op in rows["op"].unique()}
    return {op: fit for op, fit in fits.items() if fit is not None}


def _step_fits(
    rows: pd.DataFrame, world: int, gamma: float, page_fault_s: float
) -> dict[str, dict[str, float]]:
    """Every operation's fit for steps: on its means (STEP_STATISTIC); where the means give no line (a
    few slow calls can make a small message's mean exceed a large one's: loopback's send/receive,
    2026-11-25), on its medians rather than none."""
    return {
        **_fits(rows, world, gamma, page_fault_s, "median_s"),
        **_fits(rows, world, gamma, page_fault_s, STEP_STATISTIC),
    }


def held_out(sizes: Sequence[int]) -> set[int]:
    """Every other size, from the second: the fit never sees them."""
    return set(sorted(sizes)[1::2])


def compare(
    frame: pd.DataFrame, links: dict[str, dict[str, float]], world: int, page_fault_s: float = 0.0
) -> pd.DataFrame:
    """Every measured row with its operation's prediction (page faults at ``page_fault_s`` each) and
    the relative error (NaN for an operation without a fit)."""
    out = frame.copy()
    predicted = []
    for r in frame.itertuples():
        fit = links.get(r.op)
        if fit is None:
            predicted.append(float("nan"))
            continue
        link = collectives.Link.of(
            fit["alpha"], fit["bandwidth"], fit["reduce_bandwidth"], GLOO_SEGMENT, page_fault_s
        )
        predicted.append(predict_op(r.op, r.bytes, world, link))
    out["predicted_s"] = predicted
    out["error"] = out["predicted_s"] / out["median_s"] - 1
    out["held_out"] = out["bytes"].isin(held_out(frame["bytes"].unique()))
    return out


def calibrate(
    world: int = 2, rounds: int = ROUNDS, ops: Sequence[str] = OPS
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Measure ``ops``, fit each operation's medians on the sizes not held out, compare on all: the
    table.

    Returns the link for ``machine.from_profile`` (the allreduce fit as the machine's link, every
    operation's own fit under ``ops``, the operations measured under ``calibrated``), fitted on every
    size's mean, what a step pays (STEP_STATISTIC), and the comparison table of the typical call."""
    gamma, fault = reduce_seconds_per_byte(), page_fault_cost()
    frame = measure(world, rounds=rounds, ops=ops)
    fitted_on = frame[~frame["bytes"].isin(held_out(frame["bytes"].unique()))]
    typical = _fits(fitted_on, world, gamma, fault, "median_s")
    table = compare(frame, typical, world, fault)
    # The machine's link, for steps: every size fitted on its mean (STEP_STATISTIC).
    fits = _step_fits(frame, world, gamma, fault)
    source = (
        f"gloo microbenchmark on {platform.node()}, {world} ranks, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC"
    )
    return link_of({op: {"fit": fits.get(op), "source": source} for op in ops}), table


def link_of(measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The link ``machine.from_profile`` takes, from each measured operation's ``fit`` (None where the
    timings gave no line) and ``source``: the allreduce fit as the machine's own link."""
    fits = {op: entry["fit"] for op, entry in measured.items() if entry["fit"] is not None}
    return {
        **fits.get("allreduce", {}),
        "ops": fits,
        "calibrated": [op for op in OPS if op in measured],
        "source": (measured.get("allreduce") or next(iter(measured.values())))["source"],
    }


SHAPED_ROUNDS = 7


def shaped_sizes(mbit: float | None) -> tuple[tuple[int, ...], int]:
    """Sizes to time over a link shaped to ``mbit`` (powers of 4 from 1 KiB to at least 16 MiB and 32
    token-bucket bursts) and the smallest the fit takes: 8 bursts (1 MiB at 100 Mbit/s, 4 MiB at 1
    Gbit/s), where the burst the bucket lets through at once is at most an eighth of the message.

    16 MiB because DDP's buckets reach 25 MiB, and over a shaped veth a ring allreduce's rate falls
    with size (100 Mbit/s: 11.65, 11.54 and 11.28 MB/s on the wire at 1, 4 and 16 MiB, 2026-11-25),
    so a fit that stopped at 4 MiB put gpt2's 17 MB bucket 5% short."""
    if mbit is None:
        return tuple(1024 * 4**i for i in range(8)), 0
    burst = burst_bytes(mbit)
    sizes = [1024]
    while sizes[-1] < max(16 << 20, 32 * burst):
        sizes.append(sizes[-1] * 4)
    return tuple(sizes), 8 * burst


def shaped_fits(mbit: float | None, rounds: int | None = None) -> dict[str, dict[str, float]]:
    """Every operation's alpha and bandwidth over 2 network namespaces joined by a veth pair shaped to
    ``mbit`` Mbit/s (None: the veth unshaped), fitted on every size timed there: what TCP, the veth
    and the token bucket leave of the nominal rate (frames, acknowledgements, queueing), which a cap
    at the nominal rate does not see. On a shaped link the fit takes messages of 8 token-bucket
    bursts or more (``shaped_sizes``): the bucket lets a burst through at once, so smaller messages
    outrun the rate (allgather of 64 KiB at 26.6 MB/s over 100 Mbit/s) and say little of it. Fitted
    on each size's mean (STEP_STATISTIC), from ``rounds`` samples a size: default ROUNDS on the
    unshaped veth (a mean needs more than a median), SHAPED_ROUNDS on a shaped link (where a 16 MiB
    message takes seconds and waits are a small part of each call). Root only."""
    gamma, fault = reduce_seconds_per_byte(), page_fault_cost()
    sizes, smallest = shaped_sizes(mbit)
    if rounds is None:
        rounds = ROUNDS if mbit is None else SHAPED_ROUNDS
    frame = measure(2, sizes, rounds, timeout_s=600.0, shape=LinkShape(mbit))
    return _step_fits(frame[frame["bytes"] >= smallest], 2, gamma, fault)


def cache_key(op: str) -> str:
    """Where one operation's fit is cached: each is measured once, when a prediction first needs it."""
    return f"gloo_link-5/{platform.node()}/{os.cpu_count()}/{torch.__version__}/rounds-{ROUNDS}/{op}"


def store_link(link: dict[str, Any]) -> None:
    """Cache each operation ``link`` calibrated (calibrate), for link_calibration."""
    from dnnperf.cache import JsonCache

    store = JsonCache("model-calibration")
    for op in link["calibrated"]:
        store.put(cache_key(op), {"fit": link["ops"].get(op), "source": link["source"]})


def link_calibration(ops: Sequence[str] = OPS, refresh: bool = False) -> dict[str, Any]:
    """This host's fitted link (2 ranks) for ``ops`` and allreduce (the machine's own link), each
    operation measured once and cached: those not cached yet are measured together, interleaved. An
    allreduce whose timings gave no line is measured again next time (the machine's own link would
    otherwise stay the default); another operation without one keeps the allreduce's."""
    from dnnperf.cache import JsonCache

    wanted = collectives.operations(["allreduce", *collectives.operations(ops)])
    store = JsonCache("model-calibration")
    measured: dict[str, dict[str, Any]] = {}
    for op in [] if refresh else wanted:
        entry = store.get(cache_key(op))
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("source"), str)
            and "fit" in entry
            and (entry["fit"] is not None or op != "allreduce")
        ):
            measured[op] = entry
    missing = [op for op in wanted if op not in measured]
    if missing:
        link, _ = calibrate(ops=missing)
        store_link(link)
        measured.update({op: {"fit": link["ops"].get(op), "source": link["source"]} for op in missing})
    return link_of(measured)


def summary(table: pd.DataFrame) -> dict[str, float]:
    """Median and max absolute error over the target sizes, all and held out."""
    target = table[table["bytes"] >= TARGET_MIN_BYTES]
    unseen = target[target["held_out"]]
    return {
        "median_abs_error": float(target["error"].abs().median()),
        "max_abs_error": float(target["error"].abs().max()),
        "held_out_median_abs_error": float(unseen["error"].abs().median()) if len(unseen) else float("nan"),
        "held_out_max_abs_error": float(unseen["error"].abs().max()) if len(unseen) else float("nan"),
        "within_10pct": float((target["error"].abs() <= 0.10).mean()),
    }


if (
    __name__ == "__main__"
):  # one rank of measure(): python -m dnnperf.perfmodel.collective_calibration RANK SETTINGS
    _world, _store, _out, _sizes, _rounds, _ops = json.loads(sys.argv[2])
    from dnnperf.interrupts import exit_now

    _rank_main(int(sys.argv[1]), _world, _store, _out, _sizes, _rounds, _ops)
    exit_now()
