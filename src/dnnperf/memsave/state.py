"""The training state off the device: each parameter's update fused into backward, its optimizer state
kept off the device between updates (ZeRO-Offload's idea on one device; torch's optimizer-in-backward
recipe for the gradients).

Where parameters, gradients and optimizer state outweigh the activations (vgg19 `small` at batch 32:
228 of the step's 327 MB), no keep/offload/recompute plan of activations can halve the peak. Inside a
``StateSaver``:

- each parameter is updated as soon as autograd has accumulated its gradient
  (``register_post_accumulate_grad_hook``), by the task's own optimizer class and hyper-parameters run
  over that parameter alone, one chunk at a time, and its gradient is freed there: the gradients never
  all exist at once. The task's own ``optimizer.step()`` then finds no gradient and does nothing;
- the optimizer's state tensors of each parameter (momentum, Adam's moments) live in a file (CPU) or
  in pinned host memory (CUDA) between its updates: each chunk is read back, updated with the
  parameter and written out again, so only a chunk of state is on the device at a time. The next
  chunk is read ahead while one updates, and after a parameter's last chunk the first chunk of the
  parameter the last backward updated next;
- on exit the whole state is read back into the optimizer, so after the block it is as if the steps
  had run plainly.

Fusing is exact only where a step runs one backward per optimizer step and each parameter's update
needs nothing but its own gradient (no clipping by a global norm, no gradient accumulated over
several backward passes, no closure): :func:`check_fusable` compares one fused step with one plain
step on copies of the task and refuses with the first parameter that differs.
"""

from __future__ import annotations

import copy
import errno
import os
import tempfile
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dnnperf.errors import DnnperfError, UsageError

#: Per optimizer (the first a saver was given), the order its parameters were last updated in: a saver
#: entered again (one per measured step in ``memsave``) reads ahead in the right order from its first
#: step.
LEARNT_ORDER: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[int]] = weakref.WeakKeyDictionary()

#: Elements updated at once on the CPU: the update's temporaries and the state read back are at most
#: this big.
CHUNK_ELEMENTS = 1 << 18
#: The same on a GPU, where each chunk's update costs launches and Python (some 100 us whatever its
#: size) and 16 MiB of float32 is a sliver of the device: vgg19 `full` at 2^18 took 550 chunks a step.
CUDA_CHUNK_ELEMENTS = 1 << 22


def chunk_elements(device: torch.device) -> int:
    return CUDA_CHUNK_ELEMENTS if device.type == "cuda" else CHUNK_ELEMENTS


@dataclass(eq=False)
class _Chunk:
    """One chunk of one parameter: an alias of its slice and a one-tensor optimizer over it, whose state
    holds the scalars (Adam's step) and, during the chunk's update, its per-element state."""

    start: int
    stop: int
    alias: torch.Tensor
    optimizer: torch.optim.Optimizer
    #: The alias is the whole parameter, in its shape (a parameter that is not contiguous).
    whole: bool = False
    #: Per-element state keys this chunk holds off the device, with their dtype.
    stored: dict[str, torch.dtype] = field(default_factory=dict)
    reading: dict[str, _Read] = field(default_factory=dict)

    @property
    def state(self) -> dict[str, Any]:
        return self.optimizer.state[self.alias]


@dataclass(eq=False)
class _Parameter:
    parameter: torch.Tensor
    group: dict[str, Any]
    optimizer: torch.optim.Optimizer
    chunks: list[_Chunk]


def _per_element(value: Any, tensor: torch.Tensor) -> bool:
    """A state entry with one value per element of ``tensor`` (momentum, Adam's moments; not its step)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == tensor.numel()


@dataclass(eq=False)
class _Read:
    """A chunk of state being read back: the buffer (the training thread's) and the read filling it (a
    reader thread's on the CPU; on CUDA a copy on the side stream, done at ``copied``)."""

    future: Future[None] | None
    out: torch.Tensor
    copied: torch.cuda.Event | None = None

    def result(self) -> torch.Tensor:
        if self.future is not None:
            self.future.result()
        if self.copied is not None:  # the stream that uses it waits for the copy, not for every copy
            compute = torch.cuda.current_stream(self.out.device)
            compute.wait_event(self.copied)
            self.out.record_stream(compute)
            self.copied = None
        return self.out

    def cancel(self) -> None:
        if self.future is not None:
            self.future.cancel()


class _Backing:
    """Where the state lies between updates: one file (CPU; opened once, ``pwrite`` and ``preadv``)
    or one pinned host tensor (CUDA) per parameter and state key, written and read by element range.
    CPU reads run on a reader thread; CUDA copies on a side stream."""

    def __init__(self, device: torch.device, directory: Path | str | None) -> None:
        self.device = device
        self.bytes_written = self.bytes_read = 0
        self._pinned: dict[tuple[int, str], torch.Tensor] = {}
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._reader: ThreadPoolExecutor | None = None
        self._fds: dict[tuple[int, str], int] = {}
        self.directory: Path | None = None
        if self._stream is None:
            self.directory = Path(directory if directory is not None else tempfile.gettempdir())
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                os.close(self._unlinked_file())  # refused here, before any step, if it cannot be written
            except OSError as error:
                reason = error.strerror
                raise DnnperfError(f"cannot use offload directory {self.directory}: {reason}") from None
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="dnnperf-state-read")

    def _unlinked_file(self) -> int:
        """A new file in the offload directory, unlinked as soon as it is made: the descriptor keeps it,
        and nothing of it is left on disk once it closes, however the process ends (a kill included)."""
        fd, path = tempfile.mkstemp(prefix="dnnperf-state-", suffix=".bin", dir=self.directory)
        try:
            os.unlink(path)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _fd(self, key: tuple[int, str]) -> int:
        """The key's file, made once and kept open to ``close`` (on the training thread: its reads are
        scheduled there too)."""
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = self._unlinked_file()
        return fd

    def write(self, key: tuple[int, str], start: int, values: torch.Tensor, total: int) -> None:
        """``values`` at elements [start, start + numel) of the key's ``total`` elements."""
        values = values.detach().reshape(-1)
        if self._stream is not None:
            host = self._pinned.get(key)
            if host is None:
                host = self._pinned[key] = torch.empty(total, dtype=values.dtype, pin_memory=True)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                host[start : start + values.numel()].copy_(values, non_blocking=True)
            values.record_stream(self._stream)  # its memory not reused before the copy is done
        else:
            try:
                data = memoryview(values.view(torch.uint8).numpy())
                offset = start * values.element_size()
                while data:
                    done = os.pwrite(self._fd(key), data, offset)
                    if done <= 0:
                        raise OSError(errno.EIO, "write made no progress")
                    data, offset = data[done:], offset + done
            except OSError as error:
                full = error.errno in (errno.ENOSPC, errno.EDQUOT)
                raise DnnperfError(
                    f"{'disk full: ' if full else ''}cannot write optimizer state to {self.directory}: "
                    f"{error.strerror}"
                ) from None
        self.bytes_written += values.numel() * values.element_size()

    def read(self, key: tuple[int, str], start: int, count: int, dtype: torch.dtype) -> _Read:
        """Elements [start, start + count) of the key's state, on the device, once ``result()`` returns
        (CUDA: the copy is queued on the side stream and the compute stream waits for it)."""
        self.bytes_read += count * torch.empty(0, dtype=dtype).element_size()
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                out = self._pinned[key][start : start + count].to(self.device, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self._stream)
            return _Read(None, out, copied)
        assert self._reader is not None
        out = torch.empty(count, dtype=dtype)  # allocated here, on the training thread
        # The reader gets the buffer in a box it empties and returns nothing: only the training thread
        # holds it after the read, so it is released there, where the memory profiler sees it.
        return _Read(self._reader.submit(self._read_file, key, self._fd(key), start, [out]), out)

    def _read_file(self, key: tuple[int, str], fd: int, start: int, box: list[torch.Tensor]) -> None:
        out = box.pop()
        view, offset, got = memoryview(out.view(torch.uint8).numpy()), start * out.element_size(), 0
        while got < len(view):
            done = os.preadv(fd, [view[got:]], offset + got)
            if done <= 0:
                raise DnnperfError(
                    f"an optimizer state file in {self.directory} is short: {got} of {len(view)} bytes"
                )
            got += done

    def close(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=True, cancel_futures=True)
        if self._stream is not None:
            self._stream.synchronize()
        self._pinned.clear()
        for fd in self._fds.values():
            with suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _chunks(parameter: torch.Tensor, optimizer: torch.optim.Optimizer) -> list[_Chunk]:
    """Aliases of the parameter's memory, ``chunk_elements`` each (one, of its shape, when it is not
    contiguous), each with a one-tensor optimizer of the task's class (hyper-parameters set per step)."""

    def over(alias: torch.Tensor) -> torch.optim.Optimizer:
        try:
            return type(optimizer)([alias])
        except (TypeError, ValueError) as error:
            raise UsageError(
                f"cannot fuse {type(optimizer).__name__}'s update into backward: it cannot be built "
                f"over one tensor ({error})"
            ) from None

    detached = parameter.detach()
    if not detached.is_contiguous():
        return [_Chunk(0, detached.numel(), detached, over(detached), whole=True)]
    flat, chunks, size = detached.view(-1), [], chunk_elements(detached.device)
    for start in range(0, flat.numel(), size):
        alias = flat[start : start + size]
        chunks.append(_Chunk(start, start + alias.numel(), alias, over(alias)))
    return chunks


class StateSaver:
    """Fuses each parameter's update into backward and, with ``offload_state``, keeps its optimizer
    state off the device between updates (module doc). Enter it once around the training loop: its
    start moves the whole state off the device and its end brings it back. On the CPU its files (and
    reader thread) last from block to block until ``close`` (or the saver's collection, or the
    interpreter's exit), so a saver entered again rewrites the same pages; a block that raises closes
    them."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        offload_dir: Path | str | None = None,
        offload_state: bool = True,
    ) -> None:
        self.offload_dir, self.offload_state = offload_dir, offload_state
        self._parameters: dict[int, _Parameter] = {}
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) in self._parameters:
                        raise UsageError("a parameter is in two optimizer groups: its update cannot be fused")
                    if p.requires_grad:
                        self._parameters[id(p)] = _Parameter(p, group, optimizer, _chunks(p, optimizer))
        if not self._parameters:
            raise UsageError("the optimizers hold no trainable parameter: nothing to fuse")
        self._handles: list[Any] = []
        self._backing: _Backing | None = None
        self._kept: _Backing | None = None  # the CPU's files between blocks
        self._first_optimizer = optimizers[0]
        self._order: list[int] = []  # parameters in the order the last backward updated them
        self._updated: list[int] = []
        #: State bytes written and read by the updates of the last block (not its start's and end's moves).
        self.bytes_written = self.bytes_read = 0
        self._moved_at_start = (0, 0)

    def _moved(self) -> tuple[int, int]:
        backing = self._backing
        return (backing.bytes_written, backing.bytes_read) if backing is not None else (0, 0)

    def __enter__(self) -> StateSaver:
        try:
            device = next(iter(self._parameters.values())).parameter.device
            if self.offload_state:
                kept, self._kept = self._kept, None
                self._backing = kept if kept is not None else _Backing(device, self.offload_dir)
                if kept is None and self._backing.directory is not None:
                    weakref.finalize(self, self._backing.close)  # the backing's method: no reference to us
            for entry in self._parameters.values():
                self._split_state(entry)
                self._handles.append(entry.parameter.register_post_accumulate_grad_hook(self._update))
            # The order the last block's backward updated these parameters in; before any, the reverse
            # of registration order, backward's usual one.
            learnt = LEARNT_ORDER.get(self._first_optimizer)
            fits = learnt is not None and sorted(learnt) == sorted(self._parameters)
            self._order = list(learnt) if fits else list(reversed(self._parameters))
            self._moved_at_start = self._moved()
        except BaseException:
            self._restore(failed=True)
            raise
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._restore(failed=exc_type is not None)

    def close(self) -> None:
        """Remove the files kept between blocks and stop their reader (a later block opens new ones)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def _split_state(self, entry: _Parameter) -> None:
        """The optimizer's state of this parameter handed to its chunks: scalars copied into each;
        per-element tensors written out (and freed) when offloading, else viewed chunk by chunk."""
        state = entry.optimizer.state.get(entry.parameter, {})
        for chunk in entry.chunks:
            chunk.optimizer.state[chunk.alias] = {
                k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                for k, v in state.items()
                if not _per_element(v, entry.parameter)
            }
        for key, value in list(state.items()):
            if not _per_element(value, entry.parameter):
                continue
            if self._backing is not None:
                for chunk in entry.chunks:
                    self._backing.write(
                        self._key(entry, key), chunk.start, _slice(value, chunk), value.numel()
                    )
                    chunk.stored[key] = value.dtype
                del state[key]
            else:
                for chunk in entry.chunks:
                    chunk.state[key] = _slice(value, chunk)

    @staticmethod
    def _key(entry: _Parameter, key: str) -> tuple[int, str]:
        return (id(entry.parameter), key)

    # -- backward ------------------------------------------------------------------------------------

    def _update(self, parameter: torch.Tensor) -> None:
        entry = self._parameters[id(parameter)]
        if parameter.grad is None:
            return
        grad = parameter.grad.detach()
        grad = grad if entry.chunks[0].whole else grad.contiguous()
        hyper = {k: v for k, v in entry.group.items() if k != "params"}
        for index, chunk in enumerate(entry.chunks):
            if self._backing is not None:
                self._read_ahead(entry, index)
            state = chunk.state
            for key, pending in chunk.reading.items():
                state[key] = pending.result().view(chunk.alias.shape)
            chunk.reading.clear()
            chunk.optimizer.param_groups[0].update(hyper)  # a scheduler may have changed the group
            chunk.alias.grad = _slice(grad, chunk)
            chunk.optimizer.step()
            chunk.alias.grad = None
            for key, value in list(state.items()):
                if not _per_element(value, chunk.alias):
                    continue
                if self._backing is not None:
                    self._backing.write(self._key(entry, key), chunk.start, value, parameter.numel())
                    chunk.stored[key] = value.dtype
                    del state[key]
        if self._backing is None:
            self._adopt(entry)
        parameter.grad = None  # applied: freed now, not at the optimizer's zero_grad
        self._learn_order(id(parameter))

    def _learn_order(self, pid: int) -> None:
        """The order of this backward's updates, for the next one's read-ahead: complete when every
        parameter was updated, or when one comes again (a step that leaves some without a gradient)."""
        if pid in self._updated:
            self._order = self._updated + [p for p in self._order if p not in self._updated]
            self._updated = []
        self._updated.append(pid)
        if len(self._updated) == len(self._parameters):
            self._order, self._updated = self._updated, []
            LEARNT_ORDER[self._first_optimizer] = self._order

    def _adopt(self, entry: _Parameter) -> None:
        """State the chunks created (a first step) joined into the optimizer's, the chunks viewing it."""
        state = entry.optimizer.state[entry.parameter]
        for key, value in entry.chunks[0].state.items():
            if _per_element(value, entry.chunks[0].alias) and key not in state:
                whole = torch.cat([c.state[key].reshape(-1) for c in entry.chunks]).view_as(entry.parameter)
                state[key] = whole
                for chunk in entry.chunks:
                    chunk.state[key] = _slice(whole, chunk)

    def _read_ahead(self, entry: _Parameter, index: int) -> None:
        """Before chunk ``index`` of ``entry`` updates: that chunk and the next one asked for (the next
        one is the first chunk of the parameter the last backward updated next, after the last chunk):
        at most two chunks of state read back at once."""
        assert self._backing is not None
        wanted = [(entry, entry.chunks[index])]
        if index + 1 < len(entry.chunks):
            wanted.append((entry, entry.chunks[index + 1]))
        else:
            # The next parameter in the learnt order not updated yet in this backward (a guessed order
            # must not leave a read of one already updated waiting, and held, until the next step).
            pid = id(entry.parameter)
            at = self._order.index(pid) if pid in self._order else -1
            updated = {*self._updated, pid}
            following = self._order[at + 1 :] + self._order[: at + 1]
            upcoming = next((p for p in following if p not in updated), None)
            if upcoming is None:  # the last one of this backward: the next step's first
                upcoming = self._order[0]
            nxt = self._parameters[upcoming]
            wanted.append((nxt, nxt.chunks[0]))
        for target, chunk in wanted:
            for key, dtype in chunk.stored.items():
                if key not in chunk.reading:
                    chunk.reading[key] = self._backing.read(
                        self._key(target, key), chunk.start, chunk.stop - chunk.start, dtype
                    )

    # -- the end -------------------------------------------------------------------------------------

    def _restore(self, failed: bool = False) -> None:
        """Hooks removed; the whole state back in the optimizers; pinned memory gone, and the files and
        their reader too after an error (else kept for the next block)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        written, read = self._moved()
        self.bytes_written = written - self._moved_at_start[0]
        self.bytes_read = read - self._moved_at_start[1]
        backing, self._backing = self._backing, None
        restored = False
        try:
            for entry in self._parameters.values():
                p, first = entry.parameter, entry.chunks[0]
                state = entry.optimizer.state[p]
                for key, value in first.state.items():
                    if not _per_element(value, first.alias):
                        state[key] = value  # the scalars: every chunk advanced them alike
                if backing is not None:
                    for chunk in entry.chunks:
                        for pending in chunk.reading.values():
                            pending.cancel()
                    # Every chunk wrote it (a backward stopped by an error may have left some without).
                    for key, dtype in entry.chunks[-1].stored.items():
                        if all(key in chunk.stored for chunk in entry.chunks):
                            read = backing.read(self._key(entry, key), 0, p.numel(), dtype)
                            state[key] = read.result().view_as(p)
                for chunk in entry.chunks:
                    chunk.stored.clear()
                    chunk.reading.clear()
                    chunk.optimizer.state.clear()
                if not state:
                    del entry.optimizer.state[p]
            restored = True
        finally:
            if backing is not None and restored and not failed and backing.directory is not None:
                self._kept = backing  # the CPU's files, for the next block
            elif backing is not None:
                backing.close()


def _slice(tensor: torch.Tensor, chunk: _Chunk) -> torch.Tensor:
    """The chunk's part of a tensor of the parameter's shape (all of it for a whole chunk): a view where
    the tensor is contiguous, as state and gradients of a contiguous parameter are."""
    return tensor if chunk.whole else tensor.reshape(-1)[chunk.start : chunk.stop]


def check_fusable(task: Any, batch: Any) -> None:
    """A one-line error unless one step with the update fused into backward leaves the same parameters
    as one plain step: each on a deep copy of ``task``, from the same random state."""
    try:
        plain, fused = copy.deepcopy(task), copy.deepcopy(task)
    except (TypeError, copy.Error, RuntimeError) as error:  # a member that cannot be copied
        raise UsageError(
            f"cannot check whether this task's update can be fused: copying it failed ({error})"
        ) from None
    devices = [p.device for p in task.model.parameters() if p.device.type == "cuda"][:1]
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    for copied, context in ((plain, None), (fused, StateSaver(fused.optimizers(), offload_state=False))):
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            if context is None:
                copied.step(batch)
            else:
                with context:
                    copied.step(batch)
    for (name, a), b in zip(plain.model.named_parameters(), fused.model.parameters(), strict=True):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-8):
            raise UsageError(
                f"this task's update cannot be fused into backward: parameter {name} differs from a plain "
                "step's (several backward passes per update, or an update that needs every gradient)"
            )


__all__ = ["CHUNK_ELEMENTS", "CUDA_CHUNK_ELEMENTS", "StateSaver", "check_fusable", "chunk_elements"]
