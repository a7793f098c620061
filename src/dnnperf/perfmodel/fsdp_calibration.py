"""The host work FSDP2 (``fully_shard``) adds to a training step, from a microbenchmark on 2 gloo ranks.

:func:`measure` starts 2 processes on this host (gloo over loopback, one intra-op thread each, a file
store in a scratch directory that a lifeline removes with the ranks if this process dies). Each rank
trains stacks of tiny linear layers (``WIDTH`` features, batch 2, AdamW) in ``CONFIGS``: units of 1 or
3 layers, 2 or 8 of them, and a linear head the root holds; once bare, once sharded as
``distributed.sharded`` shards (``fully_shard`` per unit, then the root), steps interleaved. Per
configuration it takes the median paired difference of the forward and backward, and of the update,
on the training thread's CPU clock (a wait for the other rank, or a preemption by another process,
costs that clock nothing: see ``calibrate.measure_ddp_cost``), less the CPU time of the same
collectives issued bare (all-gather before each unit's forward and again before its backward, the
root's once, a reduce-scatter per unit and the root): the model prices those by their link.

The layers compute next to nothing and the flat buffers hold a few bytes, so the difference is FSDP's
own calls: its pre/post forward and backward hooks, the all-gather and reduce-scatter bookkeeping,
DTensor wrapping, the copies' calls. World size 1 would not do: FSDP2 then skips its all-gather's
copies. :func:`fit` fits the forward and backward's difference as a cost per step, per sharded group
(each unit and the root) and per parameter tensor; the update's (every optimizer call on a DTensor
shard dispatches through DTensor) as a cost per update call of the bare step.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from dnnperf.distributed.lifeline import ENV_RANK_DIR, Lifeline, run_ranks, scratch_directory

WORLD = 2
WIDTH = 8
#: (units, linear layers per unit) of the stacks measured.
CONFIGS = ((2, 1), (8, 1), (2, 3), (8, 3))
REPEATS = 30


class FsdpCost(NamedTuple):
    """Host seconds FSDP adds beyond its collectives and its copies' bytes."""

    step_s: float  # per step
    unit_s: float  # per sharded group (each unit, and the root)
    param_s: float  # per parameter tensor, forward and backward
    update_call_s: float  # per optimizer call on a sharded parameter


NONE = FsdpCost(0.0, 0.0, 0.0, 0.0)


class Sample(NamedTuple):
    """One configuration's measured differences (sharded less bare, collectives' CPU time taken off)."""

    groups: int
    tensors: int
    update_calls: int
    step_s: float  # forward and backward
    update_s: float


def stack(units: int, layers: int) -> nn.Sequential:
    """``units`` blocks of ``layers`` linear layers and a linear head, the same weights every call."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)]) for _ in range(units)]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, WIDTH))


def fit(samples: Sequence[Sample]) -> FsdpCost:
    """Least squares of the forward and backward's seconds on (1, groups, tensors), through the
    origin where the intercept comes out negative; the update's seconds per update call (summed over
    the samples); each figure at least 0."""
    basis = np.array([[1.0, s.groups, s.tensors] for s in samples])
    seconds = np.array([s.step_s for s in samples])
    (step, unit, param), *_ = np.linalg.lstsq(basis, seconds, rcond=None)
    if step < 0:
        step = 0.0
        (unit, param), *_ = np.linalg.lstsq(basis[:, 1:], seconds, rcond=None)
    calls = sum(s.update_calls for s in samples)
    update = sum(s.update_s for s in samples) / calls if calls else 0.0
    return FsdpCost(*(max(float(v), 0.0) for v in (step, unit, param, update)))


def update_calls(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> int:
    """Kernel calls of one optimizer step on ``model``'s gradients for ``x`` (views and metadata
    excluded), as the model counts an update's calls."""
    from dnnperf.perfmodel.compute import NO_KERNEL
    from dnnperf.probes.opcount import OpCounter

    model(x).sum().backward()
    counter = OpCounter(model, count=False)
    with counter, counter("update"):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return int(sum(r.calls for r in counter.table() if r.phase == "update" and r.family not in NO_KERNEL))


def _collectives_cpu_s(group_numels: Sequence[int], world: int, repeats: int) -> float:
    """CPU seconds of the step's collectives issued bare: per group an all-gather for forward, one
    more for backward (units, not the root: FSDP keeps the root gathered) and a reduce-scatter."""
    import torch.distributed as dist

    def issue() -> float:
        started = time.thread_time()
        for i, numel in enumerate(group_numels):
            shard = torch.zeros(-(-numel // world))
            whole = torch.zeros(shard.numel() * world)
            for _ in range(1 if i == 0 else 2):
                dist.all_gather_into_tensor(whole, shard)
            dist.reduce_scatter_tensor(shard, whole)
        return time.thread_time() - started

    issue()
    return statistics.median(issue() for _ in range(repeats))


def _rank_main(rank: int, store_path: str, out_path: str, repeats: int) -> None:
    """One rank: every configuration's samples; rank 0 writes both ranks'."""
    import warnings

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore", category=FutureWarning)  # gloo's *_tensor collectives' names
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=120))
    try:
        x = torch.randn(2, WIDTH)
        pairs, collectives = [], []
        for units, layers in CONFIGS:
            bare, sharded = stack(units, layers), stack(units, layers)
            for block in list(sharded)[:units]:
                fully_shard(block)
            fully_shard(sharded)
            pair = [(m, torch.optim.AdamW(m.parameters(), lr=1e-3)) for m in (bare, sharded)]
            pairs.append(pair)
            numels = [sum(p.numel() for p in block.parameters()) for block in [bare[-1], *bare[:units]]]
            collectives.append(_collectives_cpu_s(numels, WORLD, repeats))

        def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[float, float]:
            started = time.thread_time()
            model(x).sum().backward()
            middle = time.thread_time()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return middle - started, time.thread_time() - middle

        passes: list[list[float]] = [[] for _ in CONFIGS]
        updates: list[list[float]] = [[] for _ in CONFIGS]
        # Configurations interleaved round by round, so that a change in the host's load between
        # rounds lands on all of them and not on the slope between them.
        for round_ in range(repeats + 5):  # the first 5 warm up (the optimizers create their state)
            for i, pair in enumerate(pairs):
                plain, wrapped = step(*pair[0]), step(*pair[1])
                if round_ >= 5:
                    passes[i].append(wrapped[0] - plain[0])
                    updates[i].append(wrapped[1] - plain[1])
        calls = [update_calls(*pair[0], x) for pair in pairs]  # a later step's: the first creates state
        rows = [
            [units + 1, len(list(pair[0][0].parameters())), n, statistics.median(p) - c, statistics.median(u)]
            for (units, _), pair, n, c, p, u in zip(
                CONFIGS, pairs, calls, collectives, passes, updates, strict=True
            )
        ]
        gathered: list[Any] = [None] * WORLD
        dist.gather_object(rows, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            Path(out_path).write_text(json.dumps(gathered), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def measure(repeats: int = REPEATS, timeout_s: float = 300.0) -> list[Sample]:
    """Per configuration, the two ranks' mean of the differences. Nothing outlives this process,
    even a SIGKILL of it: the ranks get the parent-death signal, and a lifeline kills what is left (by
    the scratch directory in their environment) and removes the scratch directory."""
    with Lifeline() as lifeline, scratch_directory(lifeline, "dnnperf-fsdp-") as scratch:
        out = scratch / "samples.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", ENV_RANK_DIR: str(scratch)}
        settings = json.dumps([str(scratch / "store"), str(out), repeats])
        command = [sys.executable, "-m", __name__]
        run_ranks(
            [([*command, str(rank), settings], env) for rank in range(WORLD)],
            timeout_s,
            "fsdp microbenchmark",
        )
        per_rank = json.loads(out.read_text(encoding="utf-8"))

    def mean(row: int, column: int) -> float:
        return float(np.mean([rank[row][column] for rank in per_rank]))

    return [
        Sample(int(r[0]), int(r[1]), int(r[2]), mean(i, 3), mean(i, 4)) for i, r in enumerate(per_rank[0])
    ]


def measure_fsdp_cost() -> FsdpCost:
    """:func:`fit` of :func:`measure` on this host; none where this process already belongs to a
    group of several ranks (a calibration started inside a distributed run)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return NONE
    return fit(measure())


# One rank of measure(): python -m dnnperf.perfmodel.fsdp_calibration RANK SETTINGS
if __name__ == "__main__":
    _store, _out, _repeats = json.loads(sys.argv[2])
    from dnnperf.interrupts import exit_now

    _rank_main(int(sys.argv[1]), _store, _out, _repeats)
    exit_now()
