"""Training FLOPs of a workload, counted from the operators one real training step dispatches.

Counting uses ``torch.utils.flop_counter.FlopCounterMode`` over a full step (forward and backward as
they actually run, no "backward = 2x forward" rule). It has formulas for matrix products,
convolutions and attention, which carry nearly all the FLOPs of these models; element-wise operators
count as zero. The step runs on the meta device (shapes only, no memory, no arithmetic) when the
workload allows it, else on the CPU.
"""

from __future__ import annotations

from functools import cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from dnnperf.workloads import get_workload


def _count_step(workload_name: str, preset: str, batch_size: int, device: str) -> int:
    workload = get_workload(workload_name)
    torch.manual_seed(0)
    task = workload.build(preset, device)
    batch = {k: v.to(device) for k, v in workload.data(preset).synthesize(batch_size, 0).items()}
    with FlopCounterMode(display=False) as counter:
        task.step(batch)
    return int(counter.get_total_flops())


@cache
def training_flops_per_sample(workload_name: str, preset: str, batch_size: int = 2) -> float | None:
    """FLOPs of one training step divided by the batch size; None if the step cannot be counted."""
    for device in ("meta", "cpu"):
        try:
            return _count_step(workload_name, preset, batch_size, device) / batch_size
        except Exception:
            continue
    return None
