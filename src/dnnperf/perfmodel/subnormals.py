"""Subnormal floats in a step's operator outputs.

A subnormal (denormal) float is non-zero and smaller in magnitude than its dtype's smallest normal
number. On an x86 CPU each instruction that meets one takes a microcode assist: hf:efficientnet
`tiny` batch 4 on the Xeon of docs/validation-heldout-third-host.md took 149.9 ms a step as it ran
and 79.8 ms with ``torch.set_flush_denormal(True)``, 2.8% of its operators' outputs subnormal (most
from the backward of its squeeze-excite means). The performance model prices no such arithmetic, and
its replays run on random operands with none; a description counts them (:class:`SubnormalCount`)
so that a prediction can say where a step has them (``Prediction.detail["subnormal_outputs"]``).
A GPU computes on them at full speed: counted on a CPU only.
"""

from __future__ import annotations

from typing import Any

import torch

from dnnperf.probes.opcount import tensors_of

#: A phase whose operator outputs are at least this share subnormal gets a warning with its prediction.
NOTABLE_SHARE = 1e-3


#: Elements of an output looked at: a larger one is sampled evenly (every k-th element) and its count
#: scaled up. Counting every element made resnet50 `small`'s description at batch 16 take 1.98 s
#: against 1.38 s without.
SAMPLE = 1 << 14


def subnormal_elements(tensor: torch.Tensor) -> float:
    """Elements of ``tensor`` that are subnormal (non-zero and below the dtype's smallest normal):
    exact up to SAMPLE elements, estimated above it from every k-th element, about SAMPLE of them, k
    odd: a pattern that repeats every power of two elements (channels) is sampled in every phase."""
    flat = tensor.detach().reshape(-1)
    step = max(1, flat.numel() // SAMPLE) | 1
    sample = flat[::step]
    magnitude = sample.abs()
    found = int(torch.count_nonzero((magnitude > 0) & (magnitude < torch.finfo(tensor.dtype).tiny)))
    return found * flat.numel() / sample.numel()


class SubnormalCount:
    """An ``OpCounter`` observer: per phase, the floating elements the operators output on a CPU and
    how many of them are subnormal (``counts``: phase -> [subnormal, elements], the first estimated
    from samples of large outputs: :func:`subnormal_elements`). Views (family
    "free") are left out: their elements are another operator's."""

    def __init__(self) -> None:
        self.counts: dict[str, list[float]] = {}

    def __call__(self, module: str, phase: str, call: Any, info: Any) -> None:
        if info.family == "free":
            return
        for tensor in tensors_of(call.out):
            if tensor.device.type == "cpu" and tensor.is_floating_point() and tensor.numel():
                count = self.counts.setdefault(phase, [0.0, 0.0])
                count[0] += subnormal_elements(tensor)
                count[1] += tensor.numel()


def notable_shares(detail: dict[str, Any]) -> dict[str, float]:
    """The phases of a prediction's ``detail`` whose operator outputs are at least NOTABLE_SHARE
    subnormal, and that share."""
    shares = detail.get("subnormal_outputs", {})
    return {phase: share for phase, share in shares.items() if share >= NOTABLE_SHARE}


def warning_text(phase: str, share: float) -> str:
    """What dnnperf says of a phase's subnormal outputs (the CLI's warning, ``dnnperf.predict``'s)."""
    return (
        f"{share:.1%} of the {phase}'s operator outputs are subnormal floats, which the prediction "
        "does not price: on an x86 CPU they can make the step several times slower "
        "(torch.set_flush_denormal(True) flushes them to zero)"
    )
