"""The one pair of saved-tensor hooks dnnperf owns: for each tensor autograd saves, keep it or hand
it to an offload store (disk on the CPU, pinned host memory on CUDA), by the policy of the unit
running when it is saved.

Never offloaded: parameters and buffers (nor any view of their storage), tensors below the plan's
``min_bytes``, non-strided tensors. A tensor saved several times (a layer's output saved by it and
by the next layer) is offloaded once, by storage: the same view of the same live, unmodified
storage reuses the first handle. A *different* view of an offloaded storage is written again: views
made by ``unsafe_chunk`` (the GRU's gates) have their own version counters, so one chunk can be
modified in place after another was saved without autograd (or us) seeing the storage change.
Recomputed units need no hook here: ``torch.utils.checkpoint`` installs its own, innermost, pair
inside each segment (only the innermost pair applies).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dnnperf.probes.saved import detached
from dnnperf.results.memsave import OFFLOAD


class Store(Protocol):
    bytes_written: int
    bytes_read: int

    def put(self, tensor: torch.Tensor, position: int) -> Any | None: ...
    def reached(self, position: int) -> None: ...
    def get(self, handle: Any) -> torch.Tensor: ...
    def end_step(self) -> None: ...
    def close(self) -> None: ...


@dataclass(eq=False)
class Offloaded:
    """What the graph holds instead of an offloaded tensor: the storage's handle and this view."""

    handle: Any
    position: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    device: torch.device


@dataclass(eq=False)
class Kept:
    """A kept tensor, with its place in pack order (which tells the store where backward is)."""

    tensor: torch.Tensor
    position: int


class SavedTensorHook:
    """``pack``/``unpack`` for ``torch.autograd.graph.saved_tensors_hooks``."""

    def __init__(
        self,
        policy_now: Callable[[], str],
        store: Store | None,
        protected: set[int],
        min_bytes: int,
    ) -> None:
        self.policy_now, self.store, self.protected, self.min_bytes = policy_now, store, protected, min_bytes
        self._seen: dict[tuple[Any, ...], tuple[weakref.ref, Any, int]] = {}
        self._position = 0  # bytes saved so far this step that could be offloaded: forward's clock
        self.offloaded_bytes = 0  # distinct storages handed to the store
        self.offloaded_tensors = 0

    def pack(self, tensor: torch.Tensor) -> Any:
        if self.store is None:
            return detached(tensor)
        # The clock counts what could be offloaded (the planner's model counts the same: its
        # ``read_ahead_window`` is in these bytes); parameters never move the read-ahead.
        position = self._position
        if not self._may_offload(tensor):
            return Kept(detached(tensor), position)
        self._position += tensor.untyped_storage().nbytes()
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        view = (tensor.dtype, tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
        seen = self._seen.get((*key, view))
        # Saved again (by any unit) after it was offloaded: the same handle, or it would stay alive.
        handle = seen[1]() if seen is not None and self._same(seen, key, tensor) else None
        if handle is None:
            if self.policy_now() != OFFLOAD:
                return Kept(detached(tensor), position)
            handle = self.store.put(tensor, position)
            if handle is None:  # the store cannot take it (CUDA: a host tensor, no pinned memory left)
                return Kept(detached(tensor), position)
            self._seen[(*key, view)] = (weakref.ref(tensor), weakref.ref(handle), tensor._version)
            self.offloaded_bytes += storage.nbytes()
            self.offloaded_tensors += 1
        return Offloaded(
            handle,
            position,
            tensor.dtype,
            tuple(tensor.size()),
            tuple(tensor.stride()),
            tensor.storage_offset(),
            tensor.device,
        )

    @staticmethod
    def _same(seen: tuple[weakref.ref, Any, int], key: tuple[int, int], tensor: torch.Tensor) -> bool:
        """Is ``tensor``'s storage the one offloaded before, unchanged? The first tensor must still be
        alive on that very storage (an address is reused once a storage is freed, and an ``out=``
        resize moves a live tensor to a new one), and nothing may have written to it since."""
        first = seen[0]()
        if first is None or tensor._version != seen[2]:
            return False
        storage = first.untyped_storage()
        return (storage.data_ptr(), storage.nbytes()) == key and first._version == seen[2]

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        assert self.store is not None
        self.store.reached(packed.position)  # backward is here: read ahead what comes next
        if isinstance(packed, Kept):
            return packed.tensor
        raw = self.store.get(packed.handle)
        return torch.empty(0, dtype=packed.dtype, device=packed.device).set_(
            raw.untyped_storage(), packed.offset, packed.size, packed.stride
        )

    def _may_offload(self, tensor: torch.Tensor) -> bool:
        if isinstance(tensor, torch.nn.Parameter) or tensor.layout != torch.strided:
            return False
        if tensor.device.type == "meta" or tensor.is_conj() or tensor.is_neg():
            return False
        storage = tensor.untyped_storage()
        return storage.nbytes() >= self.min_bytes and storage.data_ptr() not in self.protected

    def end_step(self) -> None:
        self._seen.clear()


def protected_storages(modules: Any) -> set[int]:
    """Storage addresses of every parameter and buffer (never offloaded)."""
    found = set()
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.device.type != "meta":
                found.add(tensor.untyped_storage().data_ptr())
    return found
