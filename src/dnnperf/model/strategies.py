"""How a step's time and memory change under data, pipeline and tensor (intra-layer) parallelism.

* data parallel: every rank runs the whole step on its share of the batch; gradients are allreduced
  in DDP-style buckets (first ~1 MiB, then 25 MiB, in the order backward produces them), each
  starting when its last gradient is ready and the previous bucket's allreduce is done, overlapping
  the rest of backward (:func:`bucket_overlap`); only what runs past backward's end is exposed.
* pipeline: the model's top-level layers cut into contiguous stages balancing forward + backward
  time; ``m`` micro-batches; GPipe and 1F1B both take ``(m + S - 1)`` slots of the slowest stage, the
  ``S - 1`` extra being the bubble (share ``(S - 1) / m`` of the useful time); they differ in
  activations held (``m`` micro-batches vs ``min(m, S)``).
* tensor parallel: each module with matrix-product or convolution work split ``t`` ways (its weights
  and its compute-library time divided by ``t``, everything else replicated); per split module one
  allgather of its output in forward and one allreduce of its input gradient in backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dnnperf.distributed.partition import balance
from dnnperf.errors import UsageError
from dnnperf.model.compute import COMPUTE_FAMILIES

FIRST_BUCKET = 1 << 20
BUCKET = 25 << 20
SCHEDULES = ("gpipe", "1f1b")


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


def layer_seconds(times: pd.DataFrame, layers: Sequence[str]) -> np.ndarray:
    """Forward + backward seconds per layer, its submodules included (a module belongs to the layer
    whose name is the longest prefix of its own: ``blocks.1.attn`` to ``blocks.1``)."""
    work = times[times["phase"].isin(("forward", "backward"))]
    by_length = sorted(layers, key=len, reverse=True)

    def owner(module: str) -> str | None:
        return next((n for n in by_length if module == n or module.startswith(n + ".")), None)

    owners = {m: owner(m) for m in work["module"].unique()}
    sums = work.groupby(work["module"].map(owners))["seconds"].sum()
    return np.array([float(sums.get(name, 0.0)) for name in layers])


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


def pipeline_time(stage_s: Sequence[float], micro_batches: int, send_s: float) -> PipelineTime:
    """GPipe/1F1B with ``len(stage_s)`` stages, each micro-batch taking ``stage_s[i]`` (forward +
    backward) on stage i and ``send_s`` per boundary crossing (activation forward, gradient back):
    (m + S - 1) slots of the slowest stage plus its two sends."""
    stages = len(stage_s)
    if micro_batches < 1:
        raise UsageError(f"micro-batches must be a positive integer, got {micro_batches}")
    slowest = max(stage_s)
    sends = 2 * send_s if stages > 1 else 0.0
    return PipelineTime(
        step_s=(micro_batches + stages - 1) * (slowest + sends),
        compute_s=micro_batches * slowest,
        bubble_s=(stages - 1) * slowest,
        communication_s=(micro_batches + stages - 1) * sends,
    )


def split_modules(times: pd.DataFrame) -> list[str]:
    """Modules whose work includes matrix products, convolutions, attention or RNN kernels."""
    mask = times["family"].isin(tuple(COMPUTE_FAMILIES)) & (times["flops"] > 0)
    return sorted(set(times.loc[mask, "module"]) - {"(none)", "(root)", "(unattributed)"})
