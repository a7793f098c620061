"""Operator workspace: bytes a library allocates inside one operator call and frees before returning.

oneDNN's scratchpad and cuDNN's workspace are invisible to a description made of shapes and saved
tensors, yet they sit on top of everything else while their operator runs: deepspeech2's second
convolution (a 21x11 kernel) allocates 2.0 MiB inside its backward at ``tiny`` batch 8, more than half
of the step's growth. So each distinct backward convolution of a description is run once more, in
isolation, on random operands of the call's shapes, strides and dtypes, and its allocations are
measured: a microbenchmark of the library on this device, never the step being predicted.

The workspace of one call is the allocator's highest point during the call, above what was allocated
when it began, less the bytes of the results it returns (those the memory estimate counts already:
the input gradient flowing on, the weight gradient). On the CPU the allocator's events come from the
profiler (``probes.memory.AllocatorEvents``); on CUDA from the caching allocator's peak counter.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from dnnperf.analysis.opcount import _tensors

#: Calls made in backward only (the memory estimate walks backward, where the step's peak is):
#: convolutions' backward and, in a double backward (a gradient penalty), the convolutions it runs.
MEASURED_OPS = ("aten.convolution_backward", "aten.convolution")


def signature(op_name: str, args: Sequence[Any]) -> dict[str, Any] | None:
    """A call as plain data (tensors by shape, strides and dtype), or None if it cannot be replayed."""
    encoded: list[Any] = []
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.device.type == "meta" or value.layout != torch.strided:
                return None
            encoded.append(
                {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype)[6:]}
            )
        elif value is None or isinstance(value, (bool, int, float)):
            encoded.append(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int)) for v in value):
            encoded.append(list(value))
        else:
            return None
    return {"op": op_name, "args": encoded}


def _operands(call: dict[str, Any], device: torch.device) -> list[Any]:
    operands: list[Any] = []
    for value in call["args"]:
        if isinstance(value, dict):
            dtype = getattr(torch, value["dtype"])
            shape, stride = value["shape"], value["stride"]
            # The storage the strides reach (an expanded gradient has stride 0: one element per row).
            span = 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True)) if all(shape) else 0
            storage = torch.empty(span, dtype=dtype, device=device)
            storage = storage.normal_() if storage.is_floating_point() else storage.zero_()
            operands.append(storage.as_strided(shape, stride))
        else:
            operands.append(value)
    return operands


def _resolve(op_name: str) -> Any:
    namespace, name = op_name.split(".", 1)
    return getattr(getattr(torch.ops, namespace), name).default


def measure(calls: Iterable[dict[str, Any]], device: torch.device | str = "cpu") -> list[int]:
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


def _measure_one(call: dict[str, Any], device: torch.device) -> int:
    from dnnperf.probes.memory import AllocatorEvents, storages

    op = _resolve(call["op"])
    operands = _operands(call, device)
    op(*operands)  # once unmeasured: a library's first call may set up caches of its own
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = op(*operands)
        torch.cuda.synchronize(device)
        highest = torch.cuda.max_memory_allocated(device) - before
    else:
        with AllocatorEvents(device, time.perf_counter()) as events:
            result = op(*operands)
        running, highest = 0, 0
        for event in events.trace.allocations:
            running += event.bytes
            highest = max(highest, running)
    return max(highest - sum(storages(_tensors(result)).values()), 0)


class WorkspaceCalls:
    """An ``OpCounter`` observer that keeps the distinct backward calls worth measuring, per module."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.modules: list[set[str]] = []
        self._index: dict[str, int] = {}

    def __call__(self, module: str, phase: str, call: Any, info: Any) -> None:
        if phase != "backward" or info.name not in MEASURED_OPS:
            return
        found = signature(info.name, call.args)
        if found is None:
            return
        key = repr(found)
        if key not in self._index:
            self._index[key] = len(self.calls)
            self.calls.append(found)
            self.modules.append(set())
        self.modules[self._index[key]].add(module)

    def per_module(self, device: torch.device | str = "cpu") -> dict[str, int]:
        """Module -> the largest workspace of its backward calls, measured now."""
        largest: dict[str, int] = {}
        for nbytes, modules in zip(measure(self.calls, device), self.modules, strict=True):
            for module in modules:
                largest[module] = max(largest.get(module, 0), nbytes)
        return largest
