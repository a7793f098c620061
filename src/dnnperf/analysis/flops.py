"""Training FLOPs of a workload, counted from the operators one real training step dispatches.

Counting uses ``torch.utils.flop_counter.FlopCounterMode`` over a full step (forward and backward as
they actually run, no "backward = 2x forward" rule). It has formulas for matrix products,
convolutions and attention, which carry nearly all the FLOPs of these models; element-wise operators
count as zero. The step runs on the meta device (shapes only: no memory, no arithmetic) when the
workload allows it. Steps with data-dependent shapes (detection's NMS) or host-side logic (A3C's
game, packed sequences) run for real on the CPU instead. Counts are cached on disk, keyed by
everything that could change them (workload config, dnnperf and torch versions).
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


class _NoModuleTracking:
    """Stands in for FlopCounterMode's module tracker, whose autograd hooks break double backward
    (``torch.autograd.grad`` inside a step, as WGAN-GP's gradient penalty does). Totals need no
    per-module attribution: every FLOP is counted under "Global"."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _NoModuleTracking:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def total_flop_counter() -> FlopCounterMode:
    """A FlopCounterMode counting totals only. It swaps in :class:`_NoModuleTracking` through an
    attribute that is not public API; if that attribute is gone, the stock counter is returned (a
    test compares both on a model where both work, so a change in torch is noticed)."""
    counter = FlopCounterMode(display=False)
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _NoModuleTracking()
    return counter


def count_step_flops(workload_name: str, preset: str, batch_size: int, device: str) -> int:
    """FLOPs of one training step of a freshly built task on ``device``."""
    workload = get_workload(workload_name)
    torch.manual_seed(0)
    task = workload.build(preset, device)
    batch = {k: v.to(device) for k, v in workload.data(preset).synthesize(batch_size, 0).items()}
    with total_flop_counter() as counter:
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
