"""Offload to pinned host memory (the CUDA tier), after vDNN and seed 003.

- One pinned pool per saver (``cudaHostAlloc`` is slow and synchronising), handed out as a bump
  allocator and rewound when a step ends, once the side stream's copies are done (event sync). It is
  allocated before the first step at the size asked for (``memsave`` asks for the profiled step's
  saved bytes) and, where a step needs more, grows by a segment at least as large as all it has: the
  first steps find its size, the later ones allocate nothing.
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
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dnnperf.devices import on_device
from dnnperf.memsave.disk import read_ahead

ALIGN = 512  # bytes: keeps every slice of the pool aligned for fast DMA


@dataclass(eq=False)
class PinnedHandle:
    host: torch.Tensor  # uint8 slice of the pool
    nbytes: int
    position: int
    copied: torch.cuda.Event
    device_copy: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None


def _pinned_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class PinnedPool:
    """Pinned host bytes handed out front to back in segments, rewound when a step ends."""

    def __init__(self, nbytes: int, allocate: Callable[[int], torch.Tensor] = _pinned_bytes) -> None:
        self._allocate = allocate
        self.segments = [allocate(max(nbytes, ALIGN))]
        self._segment = 0
        self.used = 0  # bytes taken from the current segment

    @property
    def capacity(self) -> int:
        return sum(s.numel() for s in self.segments)

    def take(self, nbytes: int) -> torch.Tensor | None:
        """``nbytes`` of pinned memory, or None where the host cannot pin more (the tensor then stays
        on the device)."""
        while self.used + nbytes > self.segments[self._segment].numel():
            if self._segment + 1 == len(self.segments):
                try:
                    self.segments.append(self._allocate(max(nbytes, self.capacity)))
                except RuntimeError:  # pinning failed: the host's memory is not ours to exhaust
                    return None
            self._segment += 1
            self.used = 0
        start = self.used
        self.used = -(-(start + nbytes) // ALIGN) * ALIGN
        return self.segments[self._segment][start : start + nbytes]

    def rewind(self) -> None:
        self._segment = 0
        self.used = 0


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
        if not on_device(tensor, self.device):
            return None  # a host tensor saved on the way (an index, a CPU scalar), or another GPU's: kept
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
        self.pool.rewind()
        self._order = []
        self._cursor = None

    def close(self) -> None:
        self.end_step()


def _raw_device(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
