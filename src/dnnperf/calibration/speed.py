"""This host's speed now, beside its profile's: a shared machine runs faster or slower by the hour,
and a slow spell moves every step measured in it, not the profile a prediction was calibrated from."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from dnnperf.calibration.timing import time_samples
from dnnperf.hardware import bytes_moved, matmul_flops

#: A square float32 product of the size a profile's matmul curve starts at, and a copy from memory.
PROBE_SIDE = 512
PROBE_COPY_BYTES = 64 * 2**20


def product_rate(device: str, repeats: int = 20) -> float:
    """A ``PROBE_SIDE`` square float32 product's FLOP/s (``matmul_flops``): the median of ``repeats``
    calls after one untimed."""
    where = torch.device(device)
    a = torch.randn(PROBE_SIDE, PROBE_SIDE, device=where)
    return matmul_flops(PROBE_SIDE, PROBE_SIDE, PROBE_SIDE) / _median_call(
        lambda: torch.mm(a, a), where, repeats
    )


def host_speed(device: str, repeats: int = 20) -> dict[str, float]:
    """:func:`product_rate` and a ``PROBE_COPY_BYTES`` copy's bytes read and written per second (the
    median of ``repeats`` calls after one untimed)."""
    flops = product_rate(device, repeats)
    where = torch.device(device)
    source = torch.empty(PROBE_COPY_BYTES // 4, device=where)
    target = torch.empty_like(source)
    copy_s = _median_call(lambda: target.copy_(source), where, repeats)
    return {"matmul_flops": flops, "copy_bytes_per_s": bytes_moved("copy", PROBE_COPY_BYTES) / copy_s}


def _median_call(call: Callable[[], object], where: torch.device, repeats: int) -> float:
    call()
    return statistics.median(time_samples(call, where, calls=1, repeats=repeats))


#: How far this host's product rate may stray from its profile's before `dnnperf predict` says so.
DRIFT = 0.15


def drift_warning(profiled_flops: float, device: str, created: str, repeats: int = 7) -> str | None:
    """A line for the user where this host's ``PROBE_SIDE`` product runs more than ``DRIFT`` off the
    rate its profile (made at ``created``) gives that size (``profiled_flops``); None otherwise."""
    now = product_rate(device, repeats)
    change = now / profiled_flops - 1
    if abs(change) <= DRIFT:
        return None
    return (
        f"this host runs a {PROBE_SIDE}x{PROBE_SIDE} product at {now / 1e9:.0f} GFLOP/s now and ran it "
        f"at {profiled_flops / 1e9:.0f} when profiled ({created}), {change:+.0%}: predictions follow the "
        "profile; run `dnnperf hw` again if the host's load has changed"
    )
