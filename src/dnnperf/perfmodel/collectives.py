"""Alpha-beta-gamma costs of collectives: ``n`` bytes on ``p`` ranks over a :class:`Link`.

alpha: seconds per message (latency), beta: seconds per byte sent, gamma: seconds per byte reduced.
The formulas (Thakur, Rabenseifner and Gropp 2005; background.md):

=====================  ================================================================
ring allreduce         2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ
rabenseifner           2·log2(p)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ   (halving/doubling)
recursive doubling     log2(p)·(α + n·β + n·γ)
tree allreduce         2·log2(p)·(α + n·β) + log2(p)·n·γ   (binomial reduce, then broadcast)
allgather (ring)       (p-1)·α + (p-1)/p·n·β   (n: the gathered result)
reduce-scatter (ring)  (p-1)·α + (p-1)/p·n·(β + γ)   (n: the input)
broadcast (binomial)   log2(p)·(α + n·β)
send/recv              α + n·β
=====================  ================================================================

log2 is rounded up for p not a power of two. A backend that cuts messages into segments (gloo: at most
``segment_bytes`` per piece) pays alpha once per segment of each step: the alpha term is multiplied
by ``ceil(chunk / segment_bytes)`` where the chunk is what one step sends.

On CPU, gloo's list all-gather also allocates the gathered result each call (:func:`gather_buffer_faults`):
above glibc's largest mmap threshold those are fresh pages, each costing the link's ``fault_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dnnperf.errors import UsageError

ALLREDUCE_ALGORITHMS = ("ring", "rabenseifner", "recursive_doubling", "tree")
#: The collectives a prediction times, each calibrated on its own (collective_calibration).
OPERATIONS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "send_recv")


def operations(names: Sequence[str]) -> list[str]:
    """``names`` (collectives of OPERATIONS) in OPERATIONS' order; a UsageError names any other."""
    if isinstance(names, str):
        raise UsageError(f"collectives are a list of names, not the string {names!r}")
    unknown = sorted(set(names) - set(OPERATIONS))
    if unknown:
        raise UsageError(f"unknown collective {', '.join(unknown)}: use {', '.join(OPERATIONS)}")
    return [op for op in OPERATIONS if op in names]


@dataclass(frozen=True)
class Link:
    alpha: float  # seconds per message
    beta: float  # seconds per byte
    gamma: float = 0.0  # seconds per byte reduced
    segment_bytes: int = 0  # 0: messages go in one piece
    #: Seconds per page fault of a buffer the backend allocates per call (gloo on CPU: all-gather's
    #: result, :func:`gather_buffer_faults`); 0: none paid (NCCL's caching allocator keeps its memory).
    fault_s: float = 0.0

    @classmethod
    def of(
        cls,
        latency: float,
        bandwidth: float,
        reduce_bandwidth: float = 0.0,
        segment_bytes: int = 0,
        fault_s: float = 0.0,
    ) -> Link:
        gamma = 1.0 / reduce_bandwidth if reduce_bandwidth > 0 else 0.0
        return cls(latency, 1.0 / bandwidth, gamma, segment_bytes, fault_s)

    def messages(self, chunk: float) -> float:
        """Messages one step of ``chunk`` bytes costs (1 without segmentation)."""
        if self.segment_bytes <= 0 or chunk <= self.segment_bytes:
            return 1.0
        return float(math.ceil(chunk / self.segment_bytes))


def _check(n: float, p: int) -> None:
    if not (isinstance(p, int) and p >= 1):
        raise UsageError(f"a collective needs a positive number of ranks, got {p!r}")
    if not n >= 0:
        raise UsageError(f"message size must be zero or more bytes, got {n!r}")


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def allreduce(n: float, p: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds to allreduce ``n`` bytes on ``p`` ranks."""
    _check(n, p)
    if p == 1 or n == 0:
        return 0.0
    share = (p - 1) / p * n
    if algorithm == "ring":
        return 2 * (p - 1) * link.alpha * link.messages(n / p) + 2 * share * link.beta + share * link.gamma
    if algorithm == "rabenseifner":
        return 2 * _log2(p) * link.alpha * link.messages(n / 2) + 2 * share * link.beta + share * link.gamma
    if algorithm == "recursive_doubling":
        return _log2(p) * (link.alpha * link.messages(n) + n * link.beta + n * link.gamma)
    if algorithm == "tree":
        steps = _log2(p)
        return 2 * steps * (link.alpha * link.messages(n) + n * link.beta) + steps * n * link.gamma
    raise UsageError(
        f"unknown allreduce algorithm {algorithm!r}: use one of {', '.join(ALLREDUCE_ALGORITHMS)}"
    )


def allgather(n: float, p: int, link: Link) -> float:
    """Ring allgather whose result is ``n`` bytes (each rank contributes n/p), with the page faults of
    the result's buffer at ``link.fault_s``."""
    _check(n, p)
    if p == 1 or n == 0:
        return 0.0
    wire = (p - 1) * link.alpha * link.messages(n / p) + (p - 1) / p * n * link.beta
    return wire + gather_buffer_faults(n) * link.fault_s


#: glibc serves a heap allocation larger than this from fresh mmap pages every time: its dynamic mmap
#: threshold never rises above DEFAULT_MMAP_THRESHOLD_MAX (32 MiB on 64-bit), while a smaller buffer
#: freed and allocated again is reused from the heap without faults.
MMAP_THRESHOLD_MAX = 32 << 20
PAGE_BYTES = 4096


def gather_buffer_faults(n: float) -> float:
    """Page faults of one gloo ``all_gather`` into a list whose result is ``n`` bytes: gloo gathers into
    a flat buffer it allocates per call, then copies out of it. 16,386 counted per rank at 64 MiB, 1
    or none at 16 MiB and below (2 ranks, this host, 2026-11-25)."""
    return math.ceil(n / PAGE_BYTES) if n > MMAP_THRESHOLD_MAX else 0.0


def reduce_scatter(n: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of ``n`` input bytes (each rank keeps n/p, reduced)."""
    _check(n, p)
    if p == 1 or n == 0:
        return 0.0
    return (p - 1) * link.alpha * link.messages(n / p) + (p - 1) / p * n * (link.beta + link.gamma)


def broadcast(n: float, p: int, link: Link) -> float:
    """Binomial-tree broadcast of ``n`` bytes."""
    _check(n, p)
    if p == 1 or n == 0:
        return 0.0
    return _log2(p) * (link.alpha * link.messages(n) + n * link.beta)


def send_recv(n: float, link: Link) -> float:
    """One point-to-point message of ``n`` bytes."""
    _check(n, 1)
    return link.alpha * link.messages(n) + n * link.beta


def hierarchical_allreduce(
    n: float, per_node: int, nodes: int, intra: Link, inter: Link, algorithm: str = "ring"
) -> float:
    """Reduce-scatter inside each node, allreduce of the 1/per_node shards across nodes, allgather
    inside the node (NCCL-style two-level). Equals the flat formula on one node."""
    if nodes == 1:
        return allreduce(n, per_node, intra, algorithm)
    if per_node == 1:
        return allreduce(n, nodes, inter, algorithm)
    shard = n / per_node
    return (
        reduce_scatter(n, per_node, intra)
        + allreduce(shard, nodes, inter, algorithm)
        + allgather(n, per_node, intra)
    )
