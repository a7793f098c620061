"""Host<->device copy bandwidth (CUDA), pageable and pinned, both directions."""

from __future__ import annotations

from functools import partial

import torch

from dnnperf.calibration.plans import Plan
from dnnperf.calibration.timing import Tracker, bytes_text, measure, release
from dnnperf.hardware import KernelTiming


def measure_transfers(device: torch.device, plan: Plan, tracker: Tracker) -> dict[str, KernelTiming]:
    """Host<->device copies of one large buffer: pageable memory goes through a staging buffer in the
    driver, pinned memory is copied by DMA directly."""
    n = plan.transfer_bytes
    pageable = torch.empty(n, dtype=torch.uint8).fill_(1)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    on_device = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    copies = {
        "h2d_pageable": partial(on_device.copy_, pageable),
        "h2d_pinned": partial(on_device.copy_, pinned, non_blocking=True),
        "d2h_pageable": partial(pageable.copy_, on_device),
        "d2h_pinned": partial(pinned.copy_, on_device, non_blocking=True),
    }
    timings = {}
    for name, fn in copies.items():
        with tracker.step(f"host transfer {name} {bytes_text(n)}", plan.transfer_s + plan.warmup_s):
            calls, seconds = measure(fn, device, plan, plan.transfer_s, plan.warmup_s)
        timings[name] = KernelTiming(
            f"{name} {bytes_text(n)}", float(n), "B", calls, tuple(seconds), {"nbytes": n}
        )
    del pageable, pinned, on_device
    release(device)
    return timings
