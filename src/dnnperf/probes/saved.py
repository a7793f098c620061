"""Observing what autograd saves for backward, without keeping any of it alive longer.

A pack hook that returns the very tensor it was given can hold that tensor's own graph in a reference
cycle: a leaf that requires grad, saved by an operator whose gradient is taken with
``create_graph=True`` (a gradient penalty), stays allocated until the garbage collector runs. A
probe that did that would measure a step that holds more memory than the step without it. So the
hooks here keep a detached alias (the same storage, no autograd history); autograd re-attaches the
history when it unpacks, and in-place checks still see the shared version counter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


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
