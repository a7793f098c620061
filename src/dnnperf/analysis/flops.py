"""Training FLOPs of a workload, counted from the operators one real training step dispatches.

Counting uses ``torch.utils.flop_counter.FlopCounterMode`` over a full step (forward and backward as
they actually run, no "backward = 2x forward" rule). It has formulas for matrix products,
convolutions and attention, which carry nearly all the FLOPs of these models; element-wise operators
count as zero. The step runs on the meta device (shapes only: no memory, no arithmetic) when the
workload allows it. Steps with data-dependent shapes (detection's NMS), double backward (WGAN-GP) or
host-side logic (A3C's game, packed sequences) run for real on the CPU instead, and that result is
cached on disk, keyed by everything that could change it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import cache

import torch
from torch.utils.flop_counter import FlopCounterMode

import dnnperf
from dnnperf.cache import JsonCache
from dnnperf.workloads import get_workload

COUNT_BATCH_SIZE = 2  # > 1 so that batch-norm layers run as in training


def count_step_flops(workload_name: str, preset: str, batch_size: int, device: str) -> int:
    """FLOPs of one training step of a freshly built task on ``device``."""
    workload = get_workload(workload_name)
    torch.manual_seed(0)
    task = workload.build(preset, device)
    batch = {k: v.to(device) for k, v in workload.data(preset).synthesize(batch_size, 0).items()}
    with FlopCounterMode(display=False) as counter:
        task.step(batch)
    return int(counter.get_total_flops())


def _cache_key(workload_name: str, preset: str, batch_size: int) -> str:
    config = get_workload(workload_name).config(preset)
    described = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    identity = json.dumps(
        [workload_name, preset, batch_size, described, dnnperf.__version__, torch.__version__],
        sort_keys=True,
        default=str,
    )
    return f"{workload_name}/{preset}/{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


@cache
def training_flops_per_sample(workload_name: str, preset: str) -> float | None:
    """FLOPs of one training step divided by the batch size; None if the step cannot be counted."""
    try:
        return count_step_flops(workload_name, preset, COUNT_BATCH_SIZE, "meta") / COUNT_BATCH_SIZE
    except Exception:  # meta has no data-dependent kernels: count on the CPU instead
        pass
    store = JsonCache("flops")
    key = _cache_key(workload_name, preset, COUNT_BATCH_SIZE)
    cached = store.get(key)
    if isinstance(cached, (int, float)):
        return float(cached)
    try:
        flops = count_step_flops(workload_name, preset, COUNT_BATCH_SIZE, "cpu") / COUNT_BATCH_SIZE
    except Exception:  # e.g. out of memory for a full preset on a small machine
        return None
    store.put(key, flops)
    return flops
