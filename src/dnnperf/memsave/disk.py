"""Offload to disk (the CPU tier): saved tensors written by a background thread during forward and read
back by another during backward, ahead of use.

At most one write is in flight: saving the next tensor waits for the previous write (the planner's
model of forward, and a budget that holds on a busy machine). Every allocation and release happens
on the calling (training) thread: read buffers are allocated
when a read is scheduled, and a written tensor is released when the training thread next looks at the
finished writes. So torch's allocator (and the memory profiler watching it) sees the real lifetimes,
and a write that has not finished by the start of backward still counts at the peak.

One file holds every offloaded storage as raw bytes (numpy's view of the storage): no pickle. Each
storage has its own extent of it; extents are handed out end to end and from the start again once none
is alive (each step, after backward has read everything back), so steady training rewrites the same
pages of the page cache. A file per tensor, created and unlinked every step, costs about twice as much
per byte, and a new file each step costs resnet50 `small` about twice what one file for the whole loop
does, which is why a ``MemorySaver`` keeps its store from block to block (figures:
docs/benchmarks-memsave.md#design-decisions-with-the-figures-behind-them). The file, and the fresh
directory it is made in, are unlinked as soon as it is opened: the open descriptor keeps it, and its
space returns when the store closes (also on error) or the process ends, however it ends. A full disk
is a ``DnnperfError`` naming the directory.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dnnperf.errors import DnnperfError

#: Extents start on page boundaries: a write of whole pages needs no read of the page it partly covers.
_ALIGN = 4096


class Extents:
    """Places in the store's file: handed out end to end, and from offset 0 again once none is alive.
    Released by the handles' finalisers, which may run on any thread (a reader's work item can hold
    the last reference) or inside ``take`` (a collection): hence a reentrant lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._live = 0
        self._end = 0

    def take(self, nbytes: int) -> int:
        with self._lock:
            if self._live == 0:
                self._end = 0
            offset = self._end
            self._end += -(-nbytes // _ALIGN) * _ALIGN
            self._live += 1
            return offset

    def release(self) -> None:
        with self._lock:
            self._live -= 1


@dataclass(eq=False)
class DiskHandle:
    """One offloaded storage: its extent of the store's file (the saved-tensor hook keeps each view's
    shape beside it)."""

    offset: int
    nbytes: int
    version: int
    #: Bytes saved (every tensor) before this one in forward: where it sits in backward's reverse walk.
    position: int
    extents: Extents
    written: Future | None = None
    reading: tuple[Future, torch.Tensor] | None = None
    loaded: torch.Tensor | None = None

    def __del__(self) -> None:  # the saved tensor is released: its extent may be reused
        self.extents.release()


def read_ahead(
    order: list[weakref.ref[Any]],
    cursor: int | None,
    position: int,
    window: int,
    schedule: Callable[[Any], None],
    wanted: Callable[[Any], bool],
) -> int:
    """Walk ``order`` (pack order) back from ``cursor``, scheduling every handle that ends within
    ``window`` bytes before ``position``; the new cursor. Shared by the disk and pinned stores."""
    cursor = len(order) - 1 if cursor is None else cursor
    while cursor >= 0:
        handle = order[cursor]()
        if handle is not None and handle.position + handle.nbytes < position - window:
            break
        if handle is not None and wanted(handle):
            schedule(handle)
        cursor -= 1
    return cursor


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's whole storage as bytes (a uint8 view sharing its memory)."""
    return torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())


class DiskStore:
    """Writes and reads saved tensors in a file in ``directory`` (default: the system's temporary
    directory), unlinked as soon as it is opened; its space returns on ``close``."""

    def __init__(self, directory: Path | str | None = None, prefetch_bytes: int = 64 * 2**20) -> None:
        where = Path(directory if directory is not None else tempfile.gettempdir())
        try:
            where.mkdir(parents=True, exist_ok=True)
            made = tempfile.mkdtemp(prefix="dnnperf-memsave-", dir=where)
            try:
                self._fd = os.open(Path(made) / "offloaded.bin", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            finally:
                # Unlinked at once, with the fresh directory it was made in: the open descriptor keeps
                # the file, and nothing is left on disk once it closes, however the process ends.
                shutil.rmtree(made, ignore_errors=True)
        except OSError as error:
            raise DnnperfError(f"cannot use offload directory {where}: {error.strerror}") from None
        self.directory = where
        self._extents = Extents()
        self.prefetch_bytes = prefetch_bytes
        self.bytes_written = 0
        self.bytes_read = 0
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="dnnperf-memsave-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="dnnperf-memsave-read")
        self._pending: list[tuple[DiskHandle, torch.Tensor]] = []  # writes whose tensor we still hold
        # Pack order, for prefetching backwards; weak: a handle (and what it read back) lives only as
        # long as the graph holds it.
        self._order: list[weakref.ref[DiskHandle]] = []
        self._cursor: int | None = None  # the next handle (backwards) not yet read back
        self._lock = threading.Lock()
        self._closed = False

    # -- forward ------------------------------------------------------------------------------------

    def put(self, tensor: torch.Tensor, position: int = 0) -> DiskHandle:
        # Back-pressure: at most one write in flight. Without it a writer that falls behind (a busy
        # machine, a slow disk) keeps every offloaded tensor in memory until backward, and a plan
        # the planner called feasible misses its budget; the planner's model counts only the newest
        # write as still held, and the wait here is the offload's exposed cost, measured as such.
        wait([h.written for h, _ in self._pending if h.written is not None])
        self.release_written()
        storage = tensor.untyped_storage()
        handle = DiskHandle(
            offset=self._extents.take(storage.nbytes()),
            nbytes=storage.nbytes(),
            version=tensor._version,
            position=position,
            extents=self._extents,
        )
        # The writer gets the tensor in a box it empties: the last reference stays the training
        # thread's (``_pending``), so the storage is released there, where the memory profiler sees it;
        # a release on the writer thread would leave the block alive in the profiler's trace.
        handle.written = self._writer.submit(self._write, handle.offset, [tensor.detach()])
        self._pending.append((handle, tensor))
        self._order.append(weakref.ref(handle))
        return handle

    def _write(self, offset: int, box: list[torch.Tensor]) -> int:
        data = _raw(box.pop()).numpy()
        try:
            self._pwrite(memoryview(data), offset)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DnnperfError(
                    f"disk full: cannot offload {len(data)} bytes of activations to {self.directory} "
                    "(choose another --offload-dir or a smaller budget cut)"
                ) from None
            raise DnnperfError(
                f"cannot write offloaded activations to a file in {self.directory}: {error.strerror}"
            ) from None
        with self._lock:
            self.bytes_written += len(data)
        return len(data)

    def _pwrite(self, data: memoryview, offset: int) -> None:
        """All of ``data`` at ``offset`` of the file (a seam for the disk tests)."""
        while data:
            done = os.pwrite(self._fd, data, offset)
            if done <= 0:
                raise OSError(errno.EIO, "write made no progress")
            data, offset = data[done:], offset + done

    def release_written(self) -> None:
        """Drop our reference to tensors already on disk (on the training thread: see the module doc);
        a failed write is raised here, at the next saved tensor, not at the end of forward."""
        keep = []
        for handle, tensor in self._pending:
            assert handle.written is not None
            if not handle.written.done():
                keep.append((handle, tensor))
                continue
            handle.written.result()  # raises the writer's error
            if tensor._version != handle.version:  # autograd's own check, which hooks bypass
                raise DnnperfError(
                    "a tensor saved for backward was modified in place while it was being offloaded"
                )
        self._pending = keep

    # -- backward -----------------------------------------------------------------------------------

    def get(self, handle: DiskHandle) -> torch.Tensor:
        """The storage's bytes (uint8), read back (or waited for, when prefetched)."""
        if handle.loaded is None:
            if handle.reading is None:
                self._schedule(handle)
            future, buffer = handle.reading  # type: ignore[misc]
            future.result()
            handle.reading = None
            with self._lock:
                self.bytes_read += handle.nbytes
            handle.loaded = buffer
        self.release_written()
        return handle.loaded

    def _schedule(self, handle: DiskHandle) -> None:
        assert handle.written is not None
        buffer = torch.empty(handle.nbytes, dtype=torch.uint8)  # allocated here: the training thread
        handle.reading = (self._reader.submit(self._read, handle, buffer), buffer)

    def _read(self, handle: DiskHandle, buffer: torch.Tensor) -> None:
        assert handle.written is not None
        handle.written.result()  # the write finished (or its error is raised at get)
        view, offset, got = memoryview(buffer.numpy()), handle.offset, 0
        while got < handle.nbytes:
            done = os.preadv(self._fd, [view[got:]], offset + got)
            if done <= 0:
                raise DnnperfError(
                    f"the offloaded file in {self.directory} is short: {got} of {handle.nbytes} bytes"
                )
            got += done

    def reached(self, position: int) -> None:
        """Backward has reached ``position`` (in forward's saved bytes): read back every offloaded
        storage within ``prefetch_bytes`` before it, nearest first, and nothing further back (an
        early layer read back at the start of backward would recreate the peak). First waits for the
        writes still in flight and drops their tensors: else forward's last one stays alive until
        the first offloaded tensor is read back, which can be most of backward later (resnet50
        `small`: 4-6 MB held from the start of backward to layer2's, above the planner's model), and
        on a busy machine, whose writer thread lags, a write in flight is held into backward's peak
        (measured 0.45 MB above the plan's prediction beside a CPU hog)."""
        wait([h.written for h, _ in self._pending if h.written is not None])
        self.release_written()
        self._cursor = read_ahead(
            self._order,
            self._cursor,
            position,
            self.prefetch_bytes,
            self._schedule,
            lambda h: h.loaded is None and h.reading is None,
        )

    # -- the end ------------------------------------------------------------------------------------

    def end_step(self) -> None:
        """Forget this step's handles (the graph keeps the ones it still needs)."""
        self.release_written()
        self._order = []
        self._cursor = None

    def close(self) -> None:
        """Stop the threads and remove every file, also after an error."""
        if self._closed:
            return
        self._closed = True
        self._writer.shutdown(wait=True, cancel_futures=True)
        self._reader.shutdown(wait=True, cancel_futures=True)
        self._pending = []
        for ref in self._order:
            if (handle := ref()) is not None:
                handle.reading = None
                handle.loaded = None
        self._order = []
        with suppress(OSError):
            os.close(self._fd)


def measure_bandwidth(directory: Path | str | None = None, nbytes: int = 64 * 2**20) -> dict[str, float]:
    """Write then read ``nbytes`` through the same path the store uses (bytes per second each), the
    second of two rounds: the first pays for the file's new pages, which only a run's first step does."""
    import time

    store = DiskStore(directory)
    try:
        data = torch.ones(nbytes // 4)
        for _ in range(2):
            start = time.perf_counter()
            handle = store.put(data)
            assert handle.written is not None
            handle.written.result()
            write_s = time.perf_counter() - start
            start = time.perf_counter()
            store.get(handle)
            read_s = time.perf_counter() - start
            store.end_step()
            del handle  # its extent is free: the second round rewrites the same pages
        return {"write_bytes_per_s": nbytes / write_s, "read_bytes_per_s": nbytes / read_s}
    finally:
        store.close()
