"""The per-operator dispatch overhead: a one-element add, timed on the host."""

from __future__ import annotations

from functools import partial

import torch

from dnnperf.calibration.plans import Plan
from dnnperf.calibration.timing import Tracker, measure
from dnnperf.hardware import KernelTiming


def measure_dispatch(device: torch.device, plan: Plan, tracker: Tracker) -> KernelTiming:
    """A one-element add into a preallocated output, called back to back: what one operator costs
    beyond its arithmetic (Python binding, dispatcher, kernel selection; on CUDA the launch, timed on
    the host without waiting for the kernels)."""
    a, b, out = (torch.ones(1, device=device) for _ in range(3))
    with tracker.step("dispatch overhead", plan.dispatch_s + plan.warmup_s):
        fn = partial(torch.add, a, b, out=out)
        calls, seconds = measure(fn, device, plan, plan.dispatch_s, plan.warmup_s, device.type == "cuda")
    return KernelTiming("torch.add 1 element", 1.0, "call", calls, tuple(seconds), {"numel": 1})
