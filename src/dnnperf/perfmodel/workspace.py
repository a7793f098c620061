"""Operator workspace: bytes a library allocates inside one operator call and frees before returning.

oneDNN's scratchpad and cuDNN's workspace are invisible to a description made of shapes and saved
tensors, yet they sit on top of everything else while their operator runs: deepspeech2's second
convolution (a 21x11 kernel) allocates 2.0 MiB inside its backward at ``tiny`` batch 8, more than half
of the step's growth. So each distinct convolution call made in backward (perfmodel/kernels.py keeps
them) is run once more, in isolation, on random operands of the call's shapes, strides and dtypes,
and its allocations are measured: a microbenchmark of the library on this device, never the step
being predicted.

The workspace of one call is the allocator's highest point during the call, above what was allocated
when it began, less the bytes of the results it returns (those the memory estimate counts already:
the input gradient flowing on, the weight gradient). On the CPU the allocator's events come from the
profiler (``probes.memory.AllocatorEvents``); on CUDA from the caching allocator's peak counter.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from dnnperf.perfmodel.kernels import CONVOLUTION_OPS, operands, resolve
from dnnperf.probes.opcount import tensors_of


def measure(calls: Iterable[Mapping[str, Any]], device: torch.device | str = "cpu") -> list[int]:
    """The workspace of each call (see the module doc), in bytes, measured on ``device`` (0 where a
    call cannot be replayed)."""
    device = torch.device(device)
    found: list[int] = []
    for call in calls:
        try:
            found.append(_measure_one(call, device))
        except Exception:  # a replay must never break the description it serves: no workspace known
            found.append(0)
    return found


def _measure_one(call: Mapping[str, Any], device: torch.device) -> int:
    from dnnperf.probes.memory import AllocatorEvents, storages

    op = resolve(call["op"])
    args = operands(call, device)
    op(*args)  # once unmeasured: a library's first call may set up caches of its own
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = op(*args)
        torch.cuda.synchronize(device)
        highest = torch.cuda.max_memory_allocated(device) - before
    else:
        with AllocatorEvents(device, time.perf_counter()) as events:
            result = op(*args)
        running, highest = 0, 0
        for event in events.trace.allocations:
            running += event.bytes
            highest = max(highest, running)
    return max(highest - sum(storages(tensors_of(result)).values()), 0)


def per_module(kernels: Sequence[Mapping[str, Any]], device: torch.device | str = "cpu") -> dict[str, int]:
    """Module -> the largest workspace of the calls it makes in backward (``StepGraph.kernels``'
    entries), measured now. Only backward is walked: the memory estimate's peak is there."""
    backward = [
        k
        for k in kernels
        if k["call"]["op"] in CONVOLUTION_OPS and any(row[1] == "backward" for row in k["rows"])
    ]
    largest: dict[str, int] = {}
    for nbytes, kernel in zip(measure([k["call"] for k in backward], device), backward, strict=True):
        for module, phase, _, _ in kernel["rows"]:
            if phase == "backward":
                largest[module] = max(largest.get(module, 0), nbytes)
    return largest


def double_backward_modules(kernels: Sequence[Mapping[str, Any]]) -> set[str]:
    """Modules a double backward ran through: a forward convolution called in backward is part of the
    derivative of a convolution's backward (a gradient penalty's ``create_graph``)."""
    return {
        module
        for kernel in kernels
        for module, phase, op, _ in kernel["rows"]
        if phase == "backward" and op == "aten.convolution"
    }
