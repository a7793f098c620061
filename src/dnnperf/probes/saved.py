"""Observing what autograd saves for backward, without keeping any of it alive longer.

A pack hook that returns the very tensor it was given can hold that tensor's own graph in a reference
cycle: a leaf that requires grad, saved by an operator whose gradient is taken with
``create_graph=True`` (a gradient penalty), stays allocated until the garbage collector runs. A
probe that did that would measure a step that holds more memory than the step without it. So the
hooks here keep a detached alias (the same storage, no autograd history); autograd re-attaches the
history when it unpacks, and in-place checks still see the shared version counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

#: What hears every tensor saved for backward while it listens (:func:`listening`). Only the innermost
#: of nested saved-tensor hooks runs, so dnnperf's hooks that keep saved tensors elsewhere
#: (:func:`packing`: memsave's) tell the listeners themselves.
_listeners: list[Callable[[torch.Tensor], None]] = []
#: How many of those hooks are in force.
_packers = [0]


def detached(tensor: torch.Tensor) -> torch.Tensor:
    """What a pack hook keeps of a tensor it leaves where it is: an alias with no history."""
    return tensor.detach()


def observe_saved(on_save: Callable[[torch.Tensor], None]) -> torch.autograd.graph.saved_tensors_hooks:
    """Saved-tensor hooks that call ``on_save`` on every tensor saved for backward and keep it."""

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        on_save(tensor)
        return detached(tensor)

    return torch.autograd.graph.saved_tensors_hooks(pack, _unpack)


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _tell(tensor: torch.Tensor) -> None:
    for listener in tuple(_listeners):
        listener(tensor)


def _tell_and_keep(tensor: torch.Tensor) -> torch.Tensor:
    _tell(tensor)
    return detached(tensor)


@contextmanager
def listening(on_save: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """``on_save`` hears every tensor saved for backward inside, and changes nothing saved: where
    dnnperf's own hooks pack (:func:`packing`, entered before or after this) they tell it; elsewhere
    hooks of its own do, which hooks entered inside it override (only the innermost runs)."""
    _listeners.append(on_save)
    try:
        if _packers[0]:  # hooks of its own would take the packer's place: it tells this one
            yield
        else:
            with torch.autograd.graph.saved_tensors_hooks(_tell_and_keep, _unpack):
                yield
    finally:
        _listeners.remove(on_save)


@contextmanager
def packing(pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> Iterator[None]:
    """``saved_tensors_hooks(pack, unpack)`` for hooks that keep saved tensors elsewhere (memsave's
    offload and recompute), which the listeners (:func:`listening`) hear all the same."""

    def told(tensor: torch.Tensor) -> Any:
        _tell(tensor)
        return pack(tensor)

    with torch.autograd.graph.saved_tensors_hooks(told, unpack):
        _packers[0] += 1
        try:
            yield
        finally:
            _packers[0] -= 1
