"""Which units save each storage: the planner's per-storage model of one step (docs/memsave.md).

A storage saved for backward by several units (a ReLU's output, saved by the ReLU and by the
convolution after it) is freed in forward only when *every* unit that saves it drops it (recomputes
or offloads it): one unit that keeps it keeps it alive until that unit's backward. So the planner
needs every saved tensor (a *pack*), in forward order, with the unit that was running and the
storage it lies on, not bytes given to the first unit that saves a storage.

``profile_storages`` runs one plain step with a saved-tensor hook and unit hooks and records:

- every pack: the innermost unit running (``None`` outside every unit: the loss), the storage (an
  index into ``storages``; ``None`` for parameters and buffers, which are never offloaded) and its
  bytes;
- every storage: its bytes, and whether it existed before the step (the input batch: alive anyway);
- per unit: the storages of its tensor inputs (what a checkpoint of a segment starting there keeps),
  of its outputs, and how many packs came before it started (where such a checkpoint saves its
  input).

A storage is told apart from a later one at the same address by a weak reference to the first tensor
seen on it (a saved tensor is alive until backward, so the address cannot be reused before).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from dnnperf.memsave.policy import Unit
from dnnperf.probes.saved import observe_saved


@dataclass(frozen=True)
class Pack:
    """One tensor saved for backward, in forward order."""

    #: Index of the innermost unit running (``None``: outside every unit).
    unit: int | None
    #: Index into ``StorageProfile.storages`` (``None``: a parameter or buffer, never offloaded).
    storage: int | None
    nbytes: int


@dataclass(frozen=True)
class Storage:
    nbytes: int
    #: Allocated before the step (the input batch): alive whatever the plan.
    external: bool = False


@dataclass
class StorageProfile:
    storages: list[Storage] = field(default_factory=list)
    packs: list[Pack] = field(default_factory=list)
    #: Per unit: storages of its tensor inputs, of its outputs, and the packs before it started.
    inputs: list[tuple[int, ...]] = field(default_factory=list)
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    packs_before: list[int] = field(default_factory=list)

    def savers(self, storage: int) -> list[int | None]:
        """The units that save ``storage``, in forward order (each once)."""
        found: list[int | None] = []
        for p in self.packs:
            if p.storage == storage and p.unit not in found:
                found.append(p.unit)
        return found

    def first_saver_bytes(self, n_units: int) -> list[int]:
        """Per unit: bytes of the storages it is the first to save (the memory profiler's view)."""
        seen: set[int] = set()
        out = [0] * n_units
        for p in self.packs:
            if p.storage is None or p.storage in seen:
                continue
            seen.add(p.storage)
            if p.unit is not None and not self.storages[p.storage].external:
                out[p.unit] += self.storages[p.storage].nbytes
        return out


class _Recorder:
    def __init__(self, units: Sequence[Unit], protected: set[int], external: set[int]) -> None:
        self.index = {u.name: i for i, u in enumerate(units)}
        self.protected, self.external = protected, external
        self.profile = StorageProfile(
            inputs=[()] * len(units), outputs=[()] * len(units), packs_before=[0] * len(units)
        )
        self._ids: dict[tuple[int, int], tuple[int, weakref.ref]] = {}
        self._stack: list[int] = []
        self._entered: set[int] = set()
        self._left: set[int] = set()

    def storage_of(self, tensor: torch.Tensor) -> int | None:
        if tensor.device.type == "meta" or tensor.layout != torch.strided:
            return None
        storage = tensor.untyped_storage()
        if storage.data_ptr() in self.protected or isinstance(tensor, torch.nn.Parameter):
            return None
        key = (storage.data_ptr(), storage.nbytes())
        known = self._ids.get(key)
        if known is not None:
            first = known[1]()
            if first is not None and first.untyped_storage().data_ptr() == key[0]:
                return known[0]
        index = len(self.profile.storages)
        self.profile.storages.append(Storage(storage.nbytes(), storage.data_ptr() in self.external))
        self._ids[key] = (index, weakref.ref(tensor))
        return index

    def pack(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "meta":
            unit = self._stack[-1] if self._stack else None
            nbytes = tensor.untyped_storage().nbytes()
            self.profile.packs.append(Pack(unit, self.storage_of(tensor), nbytes))

    def _storages(self, value: Any) -> tuple[int, ...]:
        found: list[int] = []
        for leaf in tree_leaves(value):
            if isinstance(leaf, torch.Tensor) and (k := self.storage_of(leaf)) is not None and k not in found:
                found.append(k)
        return tuple(found)

    def enter(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if index not in self._entered:  # a unit run several times (a shared layer): its first run
                self._entered.add(index)
                self.profile.packs_before[index] = len(self.profile.packs)
                self.profile.inputs[index] = self._storages(args)
            self._stack.append(index)

        return hook

    def leave(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._stack and self._stack[-1] == index:
                self._stack.pop()
            if index not in self._left:
                self._left.add(index)
                self.profile.outputs[index] = self._storages(output)

        return hook


def profile_storages(model: torch.nn.Module, units: Sequence[Unit], step: Any, batch: Any) -> StorageProfile:
    """Run ``step()`` once (a plain training step) and record its packs (see the module doc)."""
    protected = {
        t.untyped_storage().data_ptr()
        for t in [*model.parameters(), *model.buffers()]
        if t.device.type != "meta"
    }
    values = list(batch.values()) if isinstance(batch, dict) else batch
    external = {
        t.untyped_storage().data_ptr()
        for t in tree_leaves(values)
        if isinstance(t, torch.Tensor) and t.device.type != "meta"
    }
    recorder = _Recorder(units, protected, external)
    modules = dict(model.named_modules())
    handles = []
    try:
        for i, unit in enumerate(units):
            handles.append(modules[unit.name].register_forward_pre_hook(recorder.enter(i)))
            handles.append(modules[unit.name].register_forward_hook(recorder.leave(i), always_call=True))
        with observe_saved(recorder.pack):
            step()
    finally:
        for handle in handles:
            handle.remove()
    return recorder.profile


def profile_from_units(saved: Sequence[int], inputs: Sequence[int]) -> StorageProfile:
    """A profile of units that each save one storage of their own (``saved[i]`` bytes) and take the
    previous unit's output (``inputs[i]`` bytes, saved by nobody): the simplest model, for tests and
    for costs without a profiled step."""
    profile = StorageProfile()
    n = len(saved)
    output_of: list[int | None] = [None] * n
    for i in range(n):
        if inputs[i] > 0:
            profile.storages.append(Storage(inputs[i]))
            output_of[i] = len(profile.storages) - 1
    for i in range(n):
        profile.packs_before.append(len(profile.packs))
        profile.inputs.append(() if output_of[i] is None else (output_of[i],))
        profile.outputs.append(() if i + 1 >= n or output_of[i + 1] is None else (output_of[i + 1],))
        if saved[i] > 0:
            profile.storages.append(Storage(saved[i]))
            profile.packs.append(Pack(i, len(profile.storages) - 1, saved[i]))
    return profile
