"""Choosing the compute device, moving batches to it, and timing that is correct on it."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from dnnperf.errors import UsageError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """Turn ``auto``/``cpu``/``cuda``/``cuda:N`` into a device, refusing ones this machine lacks."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}: use one of {', '.join(DEVICE_CHOICES)}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda was asked for but no CUDA GPU is available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"{name} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    elif device.type == "cpu":
        if device.index not in (None, 0):
            raise UsageError(f"{name}: the CPU has no device index; use cpu")
        device = torch.device("cpu")
    else:
        raise UsageError(f"unsupported device {name!r}: use one of {', '.join(DEVICE_CHOICES)}")
    return device


def on_device(tensor: torch.Tensor, device: torch.device) -> bool:
    """Does ``tensor`` live on ``device`` (``cuda`` without an index: the current GPU)?"""
    if tensor.device.type != device.type:
        return False
    if device.type != "cuda":
        return True
    return tensor.device.index == (device.index if device.index is not None else torch.cuda.current_device())


def current(device: torch.device | str) -> AbstractContextManager[Any]:
    """Make ``device`` the current CUDA device inside (events, streams, pinning and argument-less
    synchronisation follow it); nothing on a CPU."""
    device = torch.device(device)
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` so a host clock reading covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Copy every tensor of a batch to ``device``; non-blocking when the source is pinned."""
    return {
        key: value.to(device, non_blocking=value.is_pinned()) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }


# torch.OutOfMemoryError exists from torch 2.5; torch.cuda.OutOfMemoryError in every supported version.
_OOM_TYPES = tuple(
    t for t in (getattr(torch, "OutOfMemoryError", None), torch.cuda.OutOfMemoryError, MemoryError) if t
)


def is_out_of_memory(error: BaseException) -> bool:
    """True for allocation failures on any device (CUDA OOM, CPU allocator failure, MemoryError)."""
    if isinstance(error, _OOM_TYPES):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in message or "can't allocate memory" in message
    )
