"""Training FLOPs per sample of a workload, counted from the operators one real training step dispatches.

Counting runs one step under :class:`~dnnperf.probes.opcount.OpCounter`, which has a formula for
every operator the suite dispatches (matrix products, convolutions and attention from torch's own
registry; RNN kernels, normalisation, pooling, element-wise, losses from dnnperf's), forward and
backward as they actually run (no "backward = 2x forward" rule). Optimizer arithmetic is left out:
it is per step, not per sample. The step runs on the meta device (shapes only: no memory, no
arithmetic) when the workload allows it; steps with data-dependent shapes (detection's NMS) or
host-side logic (A3C's game, packed sequences) run for real on the CPU instead. Counts are cached on
disk, keyed by everything that could change them (workload config, dnnperf and torch versions).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import cache

import torch

from dnnperf.cache import JsonCache
from dnnperf.probes.opcount import count_step
from dnnperf.version import __version__
from dnnperf.workloads import get_workload

COUNT_BATCH_SIZE = 2  # > 1 so that batch-norm layers run as in training


def count_step_flops(workload_name: str, preset: str, batch_size: int, device: str) -> int:
    """Forward + backward FLOPs of one training step of a freshly built task on ``device``."""
    counter = count_step(workload_name, preset, batch_size, device)
    return counter.total_flops("forward") + counter.total_flops("backward")


def _cache_key(workload_name: str, preset: str, batch_size: int) -> str:
    config = get_workload(workload_name).config(preset)
    described = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    identity = json.dumps(
        [workload_name, preset, batch_size, described, __version__, torch.__version__, "opcount-1"],
        sort_keys=True,
        default=str,
    )
    return f"{workload_name}/{preset}/{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


@cache
def training_flops_per_sample(workload_name: str, preset: str) -> float | None:
    """FLOPs of one training step divided by the batch size; None if the step cannot be counted.

    Counted on the meta device where possible, else on the CPU; either way cached on disk.
    """
    store = JsonCache("flops")
    key = _cache_key(workload_name, preset, COUNT_BATCH_SIZE)
    cached = store.get(key)
    if isinstance(cached, (int, float)):
        return float(cached)
    flops = None
    for device in ("meta", "cpu"):
        try:
            flops = count_step_flops(workload_name, preset, COUNT_BATCH_SIZE, device) / COUNT_BATCH_SIZE
            break
        except Exception:  # meta lacks data-dependent kernels; the CPU may run out of memory
            continue
    if flops is not None:
        store.put(key, flops)
    return flops
