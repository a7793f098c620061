"""Offload to pinned host memory (the CUDA tier), after vDNN and seed 003.

- One pinned pool, allocated once per saver (``cudaHostAlloc`` is slow and synchronising), handed
  out as a bump allocator; reused only after the side stream's copies are done (event sync).
- Copies run on a dedicated side stream that first waits for the compute stream, so they overlap
  the next layers' compute.
- The device copy is freed only when the copy and its consumers are done: ``record_stream`` on the
  side stream tells the caching allocator not to reuse the block before the copy completes, and the
  forward consumers hold their own references.
- Backward prefetches in reverse pack order on the side stream into blocks allocated there; the
  compute stream waits on each block's event before use and the block is ``record_stream``-ed on it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from dnnperf.memsave.disk import read_ahead

_ALIGN = 512  # bytes: keeps every slice of the pool aligned for fast DMA


@dataclass(eq=False)
class PinnedHandle:
    host: torch.Tensor  # uint8 slice of the pool
    nbytes: int
    position: int
    copied: torch.cuda.Event
    device_copy: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None


class PinnedPool:
    """Pinned host bytes handed out front to back, rewound when a step ends."""

    def __init__(self, nbytes: int) -> None:
        self.buffer = torch.empty(max(nbytes, _ALIGN), dtype=torch.uint8, pin_memory=True)
        self.used = 0

    def take(self, nbytes: int) -> torch.Tensor | None:
        start = self.used
        end = start + nbytes
        if end > self.buffer.numel():
            return None
        self.used = -(-end // _ALIGN) * _ALIGN
        return self.buffer[start:end]


class PinnedStore:
    """Saved tensors copied to a pinned pool on a side stream and brought back ahead of use."""

    def __init__(self, device: torch.device, pool: PinnedPool, prefetch_bytes: int) -> None:
        self.device, self.pool, self.prefetch_bytes = device, pool, prefetch_bytes
        self.stream = torch.cuda.Stream(device)
        self.bytes_written = 0
        self.bytes_read = 0
        self._order: list[weakref.ref[PinnedHandle]] = []  # weak: the graph owns the handles
        self._cursor: int | None = None

    def put(self, tensor: torch.Tensor, position: int = 0) -> PinnedHandle | None:
        raw = _raw_device(tensor)
        host = self.pool.take(raw.numel())
        if host is None:
            return None  # the pool is full: the tensor stays on the device
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # the tensor is produced on the compute stream
        with torch.cuda.stream(self.stream):
            host.copy_(raw, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        tensor.record_stream(self.stream)  # not reused before the copy is done
        handle = PinnedHandle(host, raw.numel(), position, copied)
        self._order.append(weakref.ref(handle))
        self.bytes_written += raw.numel()
        return handle

    def get(self, handle: PinnedHandle) -> torch.Tensor:
        if handle.device_copy is None:
            self._prefetch(handle)
        assert handle.device_copy is not None and handle.ready is not None
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(handle.ready)
        handle.device_copy.record_stream(compute)
        return handle.device_copy

    def reached(self, position: int) -> None:
        """Prefetch what backward needs within ``prefetch_bytes`` before ``position`` (see disk.py)."""
        self._cursor = read_ahead(
            self._order,
            self._cursor,
            position,
            self.prefetch_bytes,
            self._prefetch,
            lambda h: h.device_copy is None,
        )

    def _prefetch(self, handle: PinnedHandle) -> None:
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(handle.copied)
            device_copy = torch.empty(handle.nbytes, dtype=torch.uint8, device=self.device)
            device_copy.copy_(handle.host, non_blocking=True)
            handle.ready = torch.cuda.Event()
            handle.ready.record(self.stream)
        handle.device_copy = device_copy
        self.bytes_read += handle.nbytes

    def end_step(self) -> None:
        # Event sync before the pool's bytes are reused by the next step.
        self.stream.synchronize()
        self.pool.used = 0
        self._order = []
        self._cursor = None

    def close(self) -> None:
        self.end_step()


def _raw_device(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
