"""Subnormal floats in a step's operator outputs.

A subnormal (denormal) float is non-zero and smaller in magnitude than its dtype's smallest normal
number. On an x86 CPU each instruction that meets one takes a microcode assist: hf:efficientnet
`tiny` batch 4 on the Xeon of docs/validation-heldout-third-host.md took 149.9 ms a step as it ran
and 79.8 ms with ``torch.set_flush_denormal(True)``, 2.8% of its operators' outputs subnormal (most
from the backward of its squeeze-excite means). The performance model's rooflines price no such
arithmetic, and its replays run on random operands with none. A description counts them
(:class:`SubnormalCount`), so that a prediction can say where a step has them
(``Prediction.detail["subnormal_outputs"]``); where a phase has a notable share (NOTABLE_SHARE), it
also times the step as it runs against the same step with them flushed to zero
(:func:`flushed_slowdown`): a ratio per phase that the warning gives and that
``ComputeOptions.subnormals`` (off by default: the slowdown can be a moment of training, not its
steady state) multiplies the phase by, where the phase's own outputs are notably subnormal
(:func:`priced_slowdown`). Only the model's own steps at the description's
batch are timed, as its convolutions are replayed. A GPU computes on them at full speed: counted and
timed on a CPU only.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from dnnperf.perfmodel.issue import PhaseClock
from dnnperf.probes.opcount import written_tensors
from dnnperf.workloads.base import Stages

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
    """An ``OpCounter`` observer: per phase, the floating elements the operators write on a CPU (their
    results and the arguments they update in place, as an optimizer's foreach update does) and how
    many of them are subnormal (``counts``: phase -> [subnormal, elements], the first estimated from
    samples of large outputs: :func:`subnormal_elements`). Views (family "free") are left out: their
    elements are another operator's."""

    def __init__(self) -> None:
        self.counts: dict[str, list[float]] = {}

    def __call__(self, module: str, phase: str, call: Any, info: Any) -> None:
        if info.family == "free":
            return
        for tensor in written_tensors(info, call):
            if tensor.device.type == "cpu" and tensor.is_floating_point() and tensor.numel():
                count = self.counts.setdefault(phase, [0.0, 0.0])
                count[0] += subnormal_elements(tensor)
                count[1] += tensor.numel()


def subnormal_share(count: float, total: float) -> float:
    """The subnormal share of a phase's [subnormal, elements] count (as ``Prediction.detail`` gives it)."""
    return count / max(total, 1)


def notable_phases(counts: dict[str, list[float]]) -> set[str]:
    """The phases of a description's counts (``StepGraph.subnormal_outputs``) with at least
    NOTABLE_SHARE of their outputs subnormal."""
    return {
        phase for phase, (count, total) in counts.items() if subnormal_share(count, total) >= NOTABLE_SHARE
    }


def notable(counts: dict[str, list[float]]) -> bool:
    """Whether any phase of a description's counts is notably subnormal (:func:`notable_phases`)."""
    return bool(notable_phases(counts))


#: Timed pairs of steps (one as it runs, one flushed) behind a slowdown, after one untimed pair.
PAIRS = 5


def flushing() -> bool:
    """Whether this thread flushes subnormal floats to zero now: half the smallest normal float survives
    a product or not (torch can set the mode but not say it)."""
    tiny = torch.finfo(torch.float32).tiny
    return bool((torch.tensor(tiny / 2) * torch.tensor(1.0)) == 0)


def flushed_slowdown(step: Callable[[Stages], Any], pairs: int = PAIRS) -> dict[str, float]:
    """Per phase of ``step(stages)`` (one training step on a CPU): its median seconds as it runs over
    its median seconds with subnormal floats flushed to zero (``torch.set_flush_denormal``), from
    ``pairs`` pairs of steps after one untimed pair, the order within a pair alternating (as it runs
    first, then flushed first) so that neither mode always follows the other. A phase that flushing
    did not make faster in every pair gets 1: with five pairs a phase without subnormals passes one
    time in 32, and its ratio is then the host's noise. Empty where the CPU cannot flush them. The
    mode is the calling thread's: with several intra-op threads the others keep theirs, so the
    slowdown is then a lower bound. The thread's mode is put back afterwards, also on an error."""
    before = flushing()
    if not torch.set_flush_denormal(True):
        return {}
    samples: list[dict[bool, dict[str, float]]] = []
    try:
        for index in range(pairs + 1):
            pair: dict[bool, dict[str, float]] = {}
            for flushed in (False, True) if index % 2 else (True, False):
                torch.set_flush_denormal(flushed)
                clock = PhaseClock()
                step(clock)
                pair[flushed] = dict(clock.seconds)
            if index:  # the first pair warms each mode
                samples.append(pair)
    finally:
        torch.set_flush_denormal(before)
    slowdown = {}
    for phase in samples[0][False] if samples else {}:
        timed = [(p[False][phase], p[True][phase]) for p in samples if phase in p[False] and phase in p[True]]
        faster = len(timed) == len(samples) and all(a > b > 0 for a, b in timed)
        slowdown[phase] = (
            statistics.median(a for a, _ in timed) / statistics.median(b for _, b in timed) if faster else 1.0
        )
    return slowdown


def priced_slowdown(outputs: dict[str, list[float]], slowdown: dict[str, float]) -> dict[str, float]:
    """The slowdowns ``ComputeOptions.subnormals`` prices: those of the phases whose own outputs are
    notably subnormal (a StepGraph's ``subnormal_outputs``, ``subnormal_slowdown``). Another phase of the
    same step that ran slower than flushed is the host's noise or another phase's cost: a GRU
    language model's forward, which makes none, came out 1.09x."""
    priced = notable_phases(outputs)
    return {phase: factor for phase, factor in slowdown.items() if phase in priced}


def notable_shares(detail: dict[str, Any]) -> dict[str, float]:
    """The phases of a prediction's ``detail`` whose operator outputs are at least NOTABLE_SHARE
    subnormal, and that share."""
    shares = detail.get("subnormal_outputs", {})
    return {phase: part for phase, part in shares.items() if part >= NOTABLE_SHARE}


def warning_text(phase: str, part: float, slowdown: float | None = None, priced: bool = False) -> str:
    """What dnnperf says of a phase's subnormal outputs (the CLI's warning, ``dnnperf.predict``'s):
    ``slowdown``, where timed, is how much slower the phase ran with them than flushed when the model
    was described (between its descriptions' batches, where it was described at two); ``priced``,
    whether the prediction multiplied the phase by it."""
    if slowdown is None:
        cost = "their cost was not timed"
    elif slowdown <= 1.0:
        cost = "flushing them did not make the phase faster where the model was described"
    else:
        cost = (
            f"the phase ran {slowdown:.2f}x as long with them as flushed in the steps that described the "
            "model (a moment of training: it can change as training goes on)"
        )
    charged = priced and slowdown is not None and slowdown > 1.0
    priced_text = "which the prediction prices" if charged else "which the prediction does not price"
    return (
        f"{part:.1%} of the {phase}'s operator outputs are subnormal floats, slow on an x86 CPU: {cost}, "
        f"{priced_text} (torch.set_flush_denormal(True) flushes them to zero)"
    )


def warnings_of(detail: dict[str, Any]) -> list[str]:
    """The warnings of a prediction's ``detail``: one a phase with notable subnormal outputs."""
    slowdown, priced = detail.get("subnormal_slowdown", {}), bool(detail.get("subnormals_priced"))
    return [
        warning_text(phase, part, slowdown.get(phase), priced)
        for phase, part in notable_shares(detail).items()
    ]
