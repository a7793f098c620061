"""How a step's time and memory change under data, pipeline and tensor (intra-layer) parallelism.

* data parallel: every rank runs the whole step on its share of the batch; gradients are allreduced
  in DDP-style buckets (first ~1 MiB, then 25 MiB, in the order backward produces them), each
  starting when its last gradient is ready and the previous bucket's allreduce is done, overlapping
  the rest of backward (:func:`bucket_overlap`); only what runs past backward's end is exposed.
  DDP's own passes over the gradients (:func:`ddp_pass_bytes`) and host work add to the step.
* pipeline: the model's top-level layers cut into contiguous stages balancing forward + backward
  time (what no layer owns in the first or last stage, :func:`outside_layers`); ``m``
  micro-batches; GPipe and 1F1B both take ``(m + S - 1)`` slots of the slowest stage, the ``S - 1``
  extra being the bubble (share ``(S - 1) / m`` of the useful time); they differ in activations held
  (``m`` micro-batches vs ``min(m, S)``).
* tensor parallel: each module with matrix-product or convolution work split ``t`` ways (its weights
  and its compute-library time divided by ``t``, everything else replicated); per split module one
  allgather of its output in forward and one allreduce of its input gradient in backward, and the
  split's own copies around them (:func:`split_copy_ops`).
* sharded data parallel (ZeRO): dp's compute on each rank's share of the batch. zero1 splits the
  optimizer state (``ZeroRedundancyOptimizer``'s greedy partition, :func:`zero_partition`), each rank
  updates its share and broadcasts it; zero2 also the gradients (reduce-scatter instead of
  all-reduce, the parameters all-gathered after the update); fsdp (ZeRO-3) also the parameters, per
  unit: an all-gather before each unit's forward and backward, a reduce-scatter after its backward,
  overlapped with compute one unit ahead as FSDP prefetches (:func:`shard_overlap`). Memory:
  :func:`sharded_memory`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dnnperf.distributed.partition import balance
from dnnperf.distributed.pipeline import BACKWARD, FORWARD, schedule_actions
from dnnperf.errors import UsageError
from dnnperf.perfmodel.compute import COMPUTE_FAMILIES

FIRST_BUCKET = 1 << 20
BUCKET = 25 << 20


def bucket_overlap(ready_s: Sequence[float], comm_s: Sequence[float], backward_end_s: float) -> float:
    """Exposed communication: buckets ready at ``ready_s`` (non-decreasing, from backward's start) take
    ``comm_s`` each, one at a time in order; what runs past ``backward_end_s`` is exposed."""
    end = 0.0
    for ready, cost in zip(ready_s, comm_s, strict=True):
        end = max(end, ready) + cost
    return max(0.0, end - backward_end_s)


def gradient_buckets(
    times: pd.DataFrame, module_param_bytes: dict[str, int]
) -> tuple[list[float], list[int], float]:
    """(ready time, bytes) per bucket and backward's length, from per-operator times in dispatch order:
    a module's gradients are ready after its last backward operator; modules without backward
    operators (tied or unattributed parameters) are ready at the end."""
    backward = times[times["phase"] == "backward"]
    ends = backward["seconds"].cumsum()
    total = float(ends.iloc[-1]) if len(ends) else 0.0
    ready = {module: float(t) for module, t in zip(backward["module"], ends, strict=True)}
    order = sorted(module_param_bytes, key=lambda m: ready.get(m, total))
    buckets: list[tuple[float, int]] = []
    cap, size, last = FIRST_BUCKET, 0, 0.0
    for module in order:
        size += module_param_bytes[module]
        last = ready.get(module, total)
        if size >= cap:
            buckets.append((last, size))
            cap, size = BUCKET, 0
    if size:
        buckets.append((last, size))
    return [b[0] for b in buckets], [b[1] for b in buckets], total


def _owners(modules: Sequence[str], layers: Sequence[str]) -> dict[str, str | None]:
    """Each module's layer: the one whose name is the longest prefix of its own (``blocks.1.attn`` to
    ``blocks.1``); None for a module no layer owns."""
    by_length = sorted(layers, key=len, reverse=True)
    return {m: next((n for n in by_length if m == n or m.startswith(n + ".")), None) for m in set(modules)}


def layer_seconds(times: pd.DataFrame, layers: Sequence[str]) -> np.ndarray:
    """Forward + backward seconds per layer, its submodules included."""
    work = times[times["phase"].isin(("forward", "backward"))]
    sums = work.groupby(work["module"].map(_owners(work["module"], layers)))["seconds"].sum()
    return np.array([float(sums.get(name, 0.0)) for name in layers])


def outside_layers(times: pd.DataFrame, layers: Sequence[str]) -> tuple[float, float]:
    """Seconds of the operators in ``times`` that no layer owns, as (first stage, last stage): where
    dnnperf's pipeline runs them. The model's own top-level code (``(root)``: GPT-2's sum of token and
    position embeddings) runs in its first layer (``partition.GPT2Embedding``); the rest is outside the
    model (the loss and its gradient's seed), computed by the last stage."""
    loose = times[times["module"].map(_owners(times["module"], layers)).isna()]
    root = float(loose.loc[loose["module"] == "(root)", "seconds"].sum())
    return root, float(loose["seconds"].sum()) - root


#: The OS page the gradient-accumulation fault estimate counts in (4 KiB on the hosts dnnperf runs on).
PAGE_BYTES = 4096


def accumulation_ops(module_param_bytes: Mapping[str, int], micro_batches: int) -> pd.DataFrame:
    """Operator rows (``StepGraph.ops``' columns) of gradient accumulation over ``micro_batches``: each
    micro-batch after the first adds its fresh weight gradient into ``.grad`` (autograd's
    AccumulateGrad: an in-place add reading two gradients and writing one), so every module's
    parameters cost ``micro_batches - 1`` adds a step. A one-micro-batch step, which the graph
    describes, takes its gradient as it is and pays none. One call per module and add (a module's
    weight and bias are two kernels: the per-call overhead is at most half counted, ~1 us each)."""
    extra = max(micro_batches - 1, 0)
    rows = [
        {
            "phase": "backward",
            "module": module,
            "op": "aten.add_",
            "family": "elementwise",
            "dtype": "float32",
            "flops": float(extra * nbytes // 4),
            "bytes": float(extra * 3 * nbytes),
            "calls": float(extra),
            "zeros": 0.0,
            "rows": 0.0,
            "inner_calls": 0.0,
        }
        for module, nbytes in module_param_bytes.items()
        if nbytes > 0 and extra > 0
    ]
    columns = [
        "phase",
        "module",
        "op",
        "family",
        "dtype",
        "flops",
        "bytes",
        "calls",
        "zeros",
        "rows",
        "inner_calls",
    ]
    return pd.DataFrame(rows, columns=columns)


def accumulation_faults(param_bytes: float, micro_batches: int) -> float:
    """Minor page faults gradient accumulation adds to a step: each micro-batch after the first maps
    its fresh weight gradients anew (they are freed after the add, and glibc gives the memory back),
    one fault a page. Counted here, 2026-11-25, 4 micro-batches of 2, one thread, in-process: gpt2
    `small` (12.8 MB of distinct parameters, 9.4 thousand pages by this rule) took 8.5 and 9.5
    thousand more faults a step than the same micro-batches with the gradients dropped between them;
    resnet18 (11.3 MB, 8.3 thousand) 5.3 and 8.5 thousand: the rule is the upper side."""
    return max(micro_batches - 1, 0) * param_bytes / PAGE_BYTES


#: Passes DistributedDataParallel makes over the gradients, each reading and writing them
#: (``distributed.ddp``; DDP's default ``gradient_as_bucket_view=False``): each gradient copied into
#: its bucket as backward makes it, the bucket divided by the world size before its all-reduce
#: (dnnperf's averaging hook), the reduced bucket copied back into the gradients.
DDP_PASSES = 3


def ddp_pass_bytes(param_bytes: float) -> float:
    """Bytes DDP's passes over ``param_bytes`` of gradients move (read and written, each pass). Their
    calls' host work is in the machine's ``ddp_param_s``."""
    return 2 * DDP_PASSES * param_bytes


def split_copy_ops(regions: Sequence[Mapping[str, Any]], ways: int, convolutions: set[str]) -> pd.DataFrame:
    """The copies tensor parallelism's split makes around its collectives (``distributed.tensor_parallel``),
    one row each (phase, module, op, bytes read and written):

    * a layer split by output channel (``column``): forward, the gathered slices concatenated into
      the full output; backward, the input gradient cloned for its all-reduce, and for a convolution
      the rank's slice of the output gradient made contiguous (a ``ways``-th of it; a matrix product
      takes the strided slice as it is);
    * a Megatron block (``attention``, ``mlp``): forward, the partial output cloned for its
      all-reduce; backward, the input gradient cloned for its all-reduce.

    Their calls' host work is in the machine's ``split_region_s``, not in these rows."""
    rows = []
    for region in regions:
        module, out_bytes, in_bytes = region["module"], region["output_bytes"], region["input_bytes"]
        copies = [("forward", "aten.cat" if region["kind"] == "column" else "aten.clone", out_bytes)]
        copies.append(("backward", "aten.clone", in_bytes))
        if region["kind"] == "column" and module in convolutions:
            copies.append(("backward", "aten.contiguous", out_bytes / ways))
        rows += [(phase, module, op, float(2 * nbytes)) for phase, op, nbytes in copies if nbytes > 0]
    return pd.DataFrame(rows, columns=["phase", "module", "op", "bytes"])


def partition(costs: Sequence[float], stages: int) -> list[int]:
    """Contiguous cut of ``costs`` into ``stages`` non-empty parts minimising the largest sum; returns
    each stage's first index (``partition.balance``, the cut dnnperf's pipeline makes). UsageError
    when there are fewer items than stages."""
    n = len(costs)
    if stages > n:
        raise UsageError(f"pipeline with {stages} stages needs at least {stages} layers; the model has {n}")
    return balance([float(c) for c in costs], stages)


@dataclass(frozen=True)
class PipelineTime:
    step_s: float
    compute_s: float
    bubble_s: float
    communication_s: float


def pipeline_time(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    micro_batches: int,
    send_s: float,
    schedule: str = "1f1b",
) -> PipelineTime:
    """One step of dnnperf's pipeline (``distributed.pipeline``), simulated action by action: stage
    ``i`` takes ``forward_s[i]`` and ``backward_s[i]`` per micro-batch and runs its schedule's actions
    (``schedule_actions``) in order, each as soon as its input is in (the activation from the stage
    before, the gradient from the stage after). A message takes ``send_s`` on its link (one per
    direction between neighbours, one message at a time); the sender goes on at once, as its
    ``isend`` does, so a send overlaps the sender's next compute.

    ``compute_s``: the busiest stage's own work, m (f + b); ``communication_s``: what the messages add
    to the step; ``bubble_s``: the rest (fill, drain, waiting on a slower stage). With equal stages and
    free messages both schedules take (m + S - 1)(f + b): a bubble of (S - 1) / m of the compute."""
    if micro_batches < 1:
        raise UsageError(f"micro-batches must be a positive integer, got {micro_batches}")
    compute = micro_batches * max(f + b for f, b in zip(forward_s, backward_s, strict=True))
    step = _schedule_end(forward_s, backward_s, micro_batches, send_s, schedule)
    free = _schedule_end(forward_s, backward_s, micro_batches, 0.0, schedule)
    return PipelineTime(step_s=step, compute_s=compute, bubble_s=free - compute, communication_s=step - free)


def _schedule_end(
    forward_s: Sequence[float], backward_s: Sequence[float], m: int, send_s: float, schedule: str
) -> float:
    stages = len(forward_s)
    actions = [schedule_actions(schedule, rank, stages, m) for rank in range(stages)]
    arrival: dict[tuple[str, int, int], float] = {}  # (kind, rank, micro-batch) -> when its input is in
    link_free: dict[tuple[int, int], float] = {}  # (from, to) -> when the link is free
    free = [0.0] * stages
    position = [0] * stages

    def send(kind: str, source: int, target: int, i: int, at: float) -> None:
        begins = max(at, link_free.get((source, target), 0.0))
        link_free[(source, target)] = arrival[(kind, target, i)] = begins + send_s

    while any(position[r] < len(actions[r]) for r in range(stages)):
        progressed = False
        for rank in range(stages):
            while position[rank] < len(actions[rank]):
                kind, i = actions[rank][position[rank]]
                needs_input = rank > 0 if kind == FORWARD else rank < stages - 1
                if needs_input and (kind, rank, i) not in arrival:
                    break  # waits for a neighbour's message
                ready = arrival.get((kind, rank, i), 0.0)
                free[rank] = max(free[rank], ready) + (forward_s if kind == FORWARD else backward_s)[rank]
                if kind == FORWARD and rank < stages - 1:
                    send(FORWARD, rank, rank + 1, i, free[rank])
                elif kind == BACKWARD and rank > 0:
                    send(BACKWARD, rank, rank - 1, i, free[rank])
                position[rank] += 1
                progressed = True
        if not progressed:  # cannot happen with schedule_actions' orders: a guard, not a model
            raise RuntimeError(f"pipeline schedule {schedule!r} deadlocks")
    return max(free)


def split_modules(times: pd.DataFrame) -> list[str]:
    """Modules whose work includes matrix products, convolutions, attention or RNN kernels."""
    mask = times["family"].isin(tuple(COMPUTE_FAMILIES)) & (times["flops"] > 0)
    return sorted(set(times.loc[mask, "module"]) - {"(none)", "(root)", "(unattributed)"})


def unit_param_bytes(module_param_bytes: Mapping[str, int], units: Sequence[str]) -> tuple[list[int], int]:
    """Parameter bytes of each fsdp unit (its modules at any depth, ``distributed.sharded.shard_units``)
    and of the root (every parameter no unit holds)."""
    owners = _owners(list(module_param_bytes), units)
    per_unit = dict.fromkeys(units, 0)
    root = 0
    for module, nbytes in module_param_bytes.items():
        owner = owners[module]
        if owner is None:
            root += nbytes
        else:
            per_unit[owner] += nbytes
    return [per_unit[u] for u in units], root


def shard_overlap(compute_s: Sequence[float], before_s: Sequence[float], after_s: Sequence[float]) -> float:
    """Exposed seconds of per-unit collectives beside per-unit compute, units in execution order, as
    FSDP prefetches: unit ``i`` needs ``before_s[i]`` (its all-gather) done before its compute, issued
    when unit ``i - 1`` starts computing (the first at the start); ``after_s[i]`` (its reduce-scatter)
    is issued when its compute ends. One lane runs the collectives one at a time in the order they
    were issued; compute runs one unit at a time. Exposed: the end of both less the compute."""
    n = len(compute_s)
    if n == 0:
        return 0.0
    lane = before_s[0]
    gathered = [0.0] * n
    gathered[0] = lane
    clock = 0.0
    for i in range(n):
        start = max(clock, gathered[i])
        if i + 1 < n:  # the next unit's all-gather, issued now, goes before this unit's reduce-scatter
            lane = max(lane, start) + before_s[i + 1]
            gathered[i + 1] = lane
        clock = start + compute_s[i]
        if after_s[i]:
            lane = max(lane, clock) + after_s[i]
    return max(clock, lane) - float(sum(compute_s))


def zero_partition(param_bytes: Sequence[int], ranks: int) -> list[int]:
    """Bytes of parameters each rank updates under ``ZeroRedundancyOptimizer``: the tensors, largest
    first, each to the rank with the fewest bytes so far (its greedy partition)."""
    shares = [0] * ranks
    for nbytes in sorted(param_bytes, reverse=True):
        shares[shares.index(min(shares))] += nbytes
    return shares


@dataclass(frozen=True)
class ShardedMemory:
    """How a ZeRO stage scales one rank's memory: shares of the parameters, gradients and optimizer
    state it holds, and the unsharded bytes held beside them at the peak."""

    param_share: float
    gradient_share: float
    state_share: float
    #: Parameters all-gathered at once: the root's (kept gathered from its forward to its backward)
    #: and the largest unit's.
    gathered_params: float = 0.0
    #: The largest unit's gradients before its reduce-scatter (fsdp), or one bucket (zero2).
    gathered_gradients: float = 0.0
    #: fsdp: per segment of the memory walk, the parameters gathered and the gradients not yet
    #: reduce-scattered while backward runs there (in place of ``gathered_params`` and
    #: ``gathered_gradients``; the update holds shards alone: everything is resharded by then).
    gathered_in_backward: tuple[tuple[float, float], ...] | None = None


def gathered_in_backward(
    modules: Sequence[str],
    units: Sequence[str],
    unit_bytes: Sequence[int],
    root_bytes: int,
    reshard_after_forward: bool = True,
) -> tuple[tuple[float, float], ...]:
    """Per memory-walk segment (the module it runs under, forward order), the (parameter, gradient)
    bytes FSDP2 holds unsharded while backward runs there.

    Resharded after forward: outside the model (the loss: module ``(none)``) nothing is gathered and
    no gradient made yet: the root's pre-backward all-gather waits for the gradient of the model's
    output. Inside it, the root's parameters (gathered from then to the end of backward) and gradients
    (reduce-scattered at the end); in a unit, also that unit's parameters and gradients and the
    parameters of the unit before it in forward order (FSDP2 prefetches the next all-gather of
    backward when a unit's backward starts).

    Kept gathered after forward: every group is gathered from its forward until its own backward has
    run (FSDP2 reshards a group after its backward), so at a segment every unit whose forward began
    there or earlier is still whole, and the root throughout, at the loss too; the gradients as above."""
    owners = _owners(modules, units)
    index = {unit: i for i, unit in enumerate(units)}
    first: dict[str, int] = {}
    for k, module in enumerate(modules):
        if owners.get(module) is not None:
            first.setdefault(owners[module], k)
    held = []
    for k, module in enumerate(modules):
        unit = owners[module] if module != "(none)" else None
        grads = 0.0 if module == "(none)" else float(root_bytes + (unit_bytes[index[unit]] if unit else 0))
        if not reshard_after_forward:
            params = float(root_bytes + sum(unit_bytes[index[u]] for u, start in first.items() if start <= k))
        elif module == "(none)":
            params = 0.0
        else:
            params = float(root_bytes)
            if unit:  # the unit's own parameters and the previous one's, prefetched
                i = index[unit]
                params += unit_bytes[i] + (unit_bytes[i - 1] if i > 0 else 0)
        held.append((params, grads))
    return tuple(held)


def sharded_memory(
    stage: str,
    ranks: int,
    unit_bytes: Sequence[int],
    root_bytes: int,
    param_bytes: int,
    heaviest_share: float | None = None,
    reshard_after_forward: bool = True,
) -> ShardedMemory:
    """``stage``: zero1 (optimizer state split: ``heaviest_share`` of it on the heaviest rank, else
    1/ranks), zero2 (and the gradients, one ``BUCKET`` unsharded at a time), fsdp (ZeRO-3: and the
    parameters; the root and the largest unit gathered at once, every unit when not resharded after
    forward; the largest unit's gradients before their reduce-scatter)."""
    share = 1.0 / ranks
    if stage == "zero1":
        return ShardedMemory(1.0, 1.0, heaviest_share if heaviest_share is not None else share)
    if stage == "zero2":
        return ShardedMemory(1.0, share, share, gathered_gradients=float(min(BUCKET, param_bytes)))
    largest = float(max(unit_bytes, default=0))
    held = float(sum(unit_bytes)) if not reshard_after_forward else largest
    return ShardedMemory(
        share, share, share, gathered_params=root_bytes + held, gathered_gradients=max(largest, root_bytes)
    )
