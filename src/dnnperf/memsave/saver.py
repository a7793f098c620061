"""``MemorySaver``: a plan applied to a user's model for the steps run inside it.

    saver = MemorySaver(model, plan)   # plan: dnnperf.memsave.plan_for(...).plan, or plan_of(...) by hand
    for x, y in loader:
        with saver:                    # one block a step
            loss = loss_fn(model(x), y)
            loss.backward()
        optimizer.step()
    saver.close()                      # or let it be collected

Inside a block: the saved-tensor hook (offload), recompute segments, and forward hooks naming the unit
that runs. All of it is removed on exit, also on error; backward must run inside the block (the
offloaded tensors live there). The disk tier's file and threads last from the first block to
``close`` (or the saver's collection, or the interpreter's exit), so each step rewrites the same
pages of the page cache (a new file each step costs resnet50 `small` about twice as much per
offloaded byte: docs/benchmarks-memsave.md#design-decisions-with-the-figures-behind-them); the file
is unlinked as soon as it is opened, so nothing remains on disk even if the process is killed. A block
that raises closes the tier (the next block opens a new one).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dnnperf.errors import UsageError
from dnnperf.memsave.disk import DiskStore
from dnnperf.memsave.hooks import SavedTensorHook, Store, protected_storages
from dnnperf.memsave.pinned import PinnedPool, PinnedStore
from dnnperf.memsave.policy import find_units
from dnnperf.memsave.recompute import Checkpointing
from dnnperf.probes.saved import packing
from dnnperf.results.memsave import KEEP, OFFLOAD, Plan

#: The pinned pool's first size where none is asked for (it grows to what a step needs).
DEFAULT_POOL_BYTES = 256 * 2**20


def refuse_compiled(model: nn.Module) -> None:
    """torch.compile, compiled autograd and CUDA graphs bypass saved-tensor hooks silently: refuse."""
    if hasattr(model, "_orig_mod") or any(hasattr(m, "_orig_mod") for m in model.modules()):
        raise UsageError("memsave cannot wrap a torch.compile'd model: its hooks would be bypassed silently")


class MemorySaver:
    """Runs a model under a memory-saving plan (see the module doc). Stats of the last block:
    ``bytes_written`` / ``bytes_read`` (offload tier), ``offloaded_bytes`` (distinct storages)."""

    def __init__(
        self,
        model: nn.Module,
        plan: Plan,
        offload_dir: Path | str | None = None,
        pool_bytes: int | None = None,
    ) -> None:
        refuse_compiled(model)
        self.model, self.plan, self.offload_dir = model, plan, offload_dir
        self.units = find_units(model)
        plan.validate(self.units)
        parameter = next(iter(model.parameters()), None)
        self.device = parameter.device if parameter is not None else torch.device("cpu")
        self.pool_bytes = pool_bytes
        self._pool: PinnedPool | None = None
        self._handles: list[Any] = []
        self._stack: list[str] = []
        self._store: Store | None = None
        self._disk: DiskStore | None = None  # the disk tier, kept from block to block
        self._counted = (0, 0)  # the store's bytes written and read when the block started
        self._hook: SavedTensorHook | None = None
        self._context: Any = None
        self._checkpointing: Checkpointing | None = None
        self.bytes_written = self.bytes_read = self.offloaded_bytes = 0

    def _make_store(self) -> Store | None:
        if not any(p == OFFLOAD for p in self.plan.policies.values()):
            return None
        if self.device.type == "cuda":
            if self._pool is None:
                # Allocated once per saver (cudaHostAlloc is slow and synchronising) and grown by what
                # a step needs beyond it (pinned.py); kept for the saver's later blocks.
                self._pool = PinnedPool(self.pool_bytes or DEFAULT_POOL_BYTES)
            return PinnedStore(self.device, self._pool, self.plan.prefetch_bytes)
        if self._disk is None:
            self._disk = DiskStore(self.offload_dir, self.plan.prefetch_bytes)
            weakref.finalize(self, self._disk.close)  # the store's own method: no reference to us
        return self._disk

    def _policy_now(self) -> str:
        return self.plan.policy(self._stack[-1]) if self._stack else KEEP

    def __enter__(self) -> MemorySaver:
        try:
            self._store = self._make_store()
            if self._store is not None:
                self._counted = (self._store.bytes_written, self._store.bytes_read)
            modules = dict(self.model.named_modules())
            self._hook = SavedTensorHook(
                self._policy_now, self._store, protected_storages([self.model]), self.plan.min_bytes
            )
            for unit in self.units:
                module = modules[unit.name]
                self._handles.append(module.register_forward_pre_hook(self._enter_unit(unit.name)))
                self._handles.append(module.register_forward_hook(self._leave_unit, always_call=True))
            self._checkpointing = Checkpointing(self.model, self.units, self.plan.segments)
            self._checkpointing.apply()
            self._context = packing(self._hook.pack, self._hook.unpack)
            self._context.__enter__()
        except BaseException:
            self._remove(failed=True)
            raise
        return self

    def _enter_unit(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._stack.append(name)

        return hook

    def _leave_unit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._remove(failed=exc_type is not None)

    def close(self) -> None:
        """Remove the disk tier's file and stop its threads (a later block opens a new one)."""
        if self._disk is not None:
            disk, self._disk = self._disk, None
            disk.close()

    def _remove(self, failed: bool) -> None:
        if self._context is not None:
            self._context.__exit__(None, None, None)
            self._context = None
        if self._checkpointing is not None:
            self._checkpointing.remove()
            self._checkpointing = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()
        if self._hook is not None:
            self.offloaded_bytes = self._hook.offloaded_bytes
            self._hook.end_step()
            self._hook = None
        if self._store is not None:
            store, self._store = self._store, None
            self.bytes_written = store.bytes_written - self._counted[0]
            self.bytes_read = store.bytes_read - self._counted[1]
            if store is self._disk and not failed:
                store.end_step()
            else:
                store.close()
                if store is self._disk:
                    self._disk = None
