"""Data parallelism: the suite's supervised step under DistributedDataParallel, with every gradient
bucket's allreduce timed from launch to completion and the exposed exchange cut out of backward.

A DDP comm hook does the averaging allreduce itself (what DDP's default does: divide by the world
size, then sum) and notes when each bucket was launched and when its allreduce completed: host
clock readings on CPU (the completion callback runs when gloo finishes), CUDA events on GPU (the
callback's current stream waits for NCCL's work, so an event recorded there completes with it).
After each step the ranks exchange their launches (CPU), so each bucket's wait splits into skew
(until the last rank launched it), queueing and the collective's own time (:func:`split_wait`).

The ``exchange`` stage is the communication the step is exposed to: from the launch of the last
bucket (all of backward's gradients are computed by then) until ``backward()`` returns, which DDP
makes wait for every bucket's allreduce. Communication that overlapped the backward pass stays in
``backward``.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dnnperf.distributed.gather import all_gather_rows
from dnnperf.errors import UsageError
from dnnperf.workloads.base import Batch, Stages, SupervisedTask, Task, no_stages


def require_supervised(task: Task, workload: str, strategy: str = "dp") -> SupervisedTask:
    """DDP (and FSDP) wraps the model a plain forward/backward/update step calls; other steps are
    refused."""
    if not isinstance(task, SupervisedTask):
        raise UsageError(
            f"--strategy {strategy} runs workloads with a plain forward/backward/update step; "
            f"{workload} has its own step (several optimizers or an environment)"
        )
    return task


def check_divisible(batch_size: int, world: int, strategy: str = "dp") -> None:
    """dp (and the sharded strategies) split the global batch evenly over the ranks."""
    if batch_size % world:
        raise UsageError(
            f"{strategy} splits the global batch {batch_size} over {world} ranks: "
            f"give a batch size divisible by {world}"
        )


def _boot_id() -> int:
    """This kernel's boot id as an integer: processes with the same one read the same CLOCK_MONOTONIC
    (``time.perf_counter`` on Linux); 0 where there is none to read."""
    try:
        return int(
            Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:13], 16
        )  # exact in a float64
    except (OSError, ValueError):
        return 0


class PeerClock:
    """Every rank's host-clock readings in this rank's clock, to put the ranks' bucket launches on one
    time line. A collective (construct and call it on every rank, in the same order).

    Ranks on one machine (same kernel boot id) read the same CLOCK_MONOTONIC: no offset. Across
    machines the offset of every rank's clock from rank 0's is estimated once, at construction, as the
    median over a few rounds of the difference of the clock readings taken right after a barrier
    returns; its error is how unevenly a barrier releases the ranks (about one network latency)."""

    ROUNDS = 7

    def __init__(self) -> None:
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        boots = all_gather_rows(torch.tensor([[float(_boot_id())]], dtype=torch.float64))
        self.shared = len({float(b[0, 0]) for b in boots}) == 1 and float(boots[0][0, 0]) != 0.0
        self.offsets = [0.0] * self.world  # rank r's clock reads rank 0's plus offsets[r]
        if not self.shared:
            rounds = []
            for _ in range(self.ROUNDS):
                dist.barrier()
                now = torch.tensor([[time.perf_counter()]], dtype=torch.float64)
                rounds.append([float(r[0, 0]) for r in all_gather_rows(now)])
            self.offsets = [statistics.median(row[r] - row[0] for row in rounds) for r in range(self.world)]

    def gather(self, stamps: dict[int, list[float]], width: int) -> list[dict[int, list[float]]]:
        """``stamps``: this rank's ``width`` clock readings per key (a bucket index; a rank may have no
        keys); every rank's, in rank order, shifted into this rank's clock."""
        rows = torch.tensor([[key, *values] for key, values in stamps.items()], dtype=torch.float64)
        gathered = []
        for peer, theirs in enumerate(all_gather_rows(rows.reshape(-1, 1 + width))):
            shift = self.offsets[self.rank] - self.offsets[peer]
            gathered.append({int(row[0]): [v + shift for v in row[1:]] for row in theirs.tolist()})
        return gathered

    def latest(self, stamps: dict[int, list[float]], width: int) -> dict[int, list[float]]:
        """For every key all ranks gave, the latest of the ranks' ``width`` readings (each position
        apart), in this rank's clock."""
        gathered = self.gather(stamps, width)
        common = set.intersection(*(set(g) for g in gathered))
        return {
            key: [max(values) for values in zip(*(g[key] for g in gathered), strict=True)] for key in common
        }


def process_group_lanes() -> int:
    """How many collectives the default process group runs at once: gloo's worker threads (2 unless
    set otherwise), 1 for others (NCCL runs a group's collectives one after another on its stream)."""
    try:
        group = dist.distributed_c10d._get_default_group()
        return max(1, int(group._get_backend(torch.device("cpu")).options._threads))
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return 1


def ready_times(pending: list[tuple[int, int, float, float]], lanes: int = 1) -> dict[int, float]:
    """Per bucket index, when this rank's process group could start its collective: at its launch, or
    later when every one of the group's ``lanes`` (collectives run at once, in launch order) was still
    busy with earlier buckets, at the completion that freed one. ``pending``: (index, bytes, launch,
    completion) on one clock."""
    ready: dict[int, float] = {}
    earlier: list[float] = []  # completions of the buckets launched before
    previous_start = float("-inf")
    for index, _, begin, end in sorted(pending, key=lambda b: b[2]):
        free = sorted(earlier)[-lanes] if len(earlier) >= lanes else float("-inf")
        previous_start = ready[index] = min(max(begin, free, previous_start), end)
        earlier.append(end)
    return ready


def split_wait(
    pending: list[tuple[int, int, float, float]], latest: dict[int, list[float]] | None = None, lanes: int = 1
) -> list[dict[str, float]]:
    """Each bucket's launch-to-completion wait on this rank, split in four that add up to it.

    ``pending``: (index, bytes, launch, completion) in seconds on one clock; ``latest``: per index the
    latest over all ranks of [launch, ready (:func:`ready_times`)] on the same clock (None: this rank
    alone is known, as if every rank were this one).

    - ``skew_s``: until the last rank launched it (a collective cannot complete before then);
    - ``queued_s``: then until every rank's process group could start it (earlier buckets occupying
      every lane);
    - ``shared_s`` and ``allreduce_s``: from then to its completion here, while other buckets' own
      time ran beside it in the group's other lanes. The collectives in flight share the link (and
      the cores), so each moment is divided evenly among them (processor sharing): ``allreduce_s`` is
      the collective's own share, ``shared_s`` the rest, the others' shares. The buckets' own shares
      add up to the time any bucket's collective was running.
    """
    ready = ready_times(pending, lanes)
    spans = []
    for index, size, begin, end in pending:
        last_launch, last_ready = (latest or {}).get(index, [begin, ready[index]])
        launched = min(max(begin, last_launch), end)
        start = min(max(launched, ready[index], last_ready), end)
        spans.append((index, size, begin, launched, start, end))
    own = _shares([(start, end) for *_, start, end in spans])
    buckets = []
    for (index, size, begin, launched, start, end), mine in zip(spans, own, strict=True):
        running = max(end - start, 0.0)
        buckets.append(
            {
                "index": index,
                "bytes": size,
                "seconds": max(end - begin, 0.0),
                "skew_s": max(launched - begin, 0.0),
                "queued_s": max(start - launched, 0.0),
                "shared_s": max(running - mine, 0.0),
                "allreduce_s": min(mine, running),
            }
        )
    return sorted(buckets, key=lambda b: b["index"])


def _shares(spans: list[tuple[float, float]]) -> list[float]:
    """Per (start, end) span: the integral over it of 1 / (the number of spans running then)."""
    edges = sorted({t for span in spans for t in span})
    shares = [0.0] * len(spans)
    for lo, hi in itertools.pairwise(edges):
        running = [i for i, (start, end) in enumerate(spans) if start <= lo and hi <= end]
        for i in running:
            shares[i] += (hi - lo) / len(running)
    return shares


class BucketTimer:
    """A DDP comm hook that averages gradients with one allreduce per bucket and times each one."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.world = dist.get_world_size()
        self.stages: Any = None  # the step's clock, to mark where the exposed exchange begins
        self.launches = 0  # buckets launched so far (a progress count the heartbeat reports)
        self._lock = threading.Lock()  # gloo completes futures on its own threads
        self._pending: list[tuple[int, int, Any, Any]] = []
        # Host clocks of all ranks on one time line (CPU: gloo completes on the host clock too).
        self.peers = None if self.cuda else PeerClock()
        self.lanes = process_group_lanes()

    def _stamp(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # No annotations on bucket and the result: DDP checks them against dist.GradBucket and
    # torch.futures.Future, and postponed (string) annotations never match.
    def hook(self, state, bucket):  # type: ignore[no-untyped-def]
        """Launch the bucket's averaging allreduce; the returned future completes with it."""
        tensor = bucket.buffer()
        if bucket.is_last():  # every gradient is computed: what follows is waiting for the exchange
            mark = getattr(self.stages, "mark", None)
            if mark is not None:
                mark("exchange")
        index, size = bucket.index(), tensor.numel() * tensor.element_size()
        self.launches += 1
        tensor.div_(self.world)  # averaging is the rank's own work, before the launch
        start = self._stamp()
        work = dist.all_reduce(tensor, async_op=True)

        def done(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            stop = self._stamp()
            with self._lock:
                self._pending.append((index, size, start, stop))
            return future.value()[0]

        return work.get_future().then(done)

    def take_step(self) -> list[dict[str, float]]:
        """The buckets of the step just finished (call after the device is synchronised), each with its
        bytes, ``seconds`` from launch to completion on this rank and that time split into
        ``skew_s``, ``queued_s`` and ``allreduce_s`` (see :func:`split_wait`).

        On CPU a collective: every rank calls it after every step (the ranks' launches are exchanged
        to find each bucket's latest). On CUDA the launches are GPU events, which do not compare across
        devices: ``skew_s`` is 0 there and the collective's own time includes waiting for peers."""
        with self._lock:
            pending, self._pending = self._pending, []
        if self.cuda:
            if not pending:
                return []
            origin = pending[0][2]
            seconds = [
                (i, n, origin.elapsed_time(a) / 1e3, origin.elapsed_time(b) / 1e3) for i, n, a, b in pending
            ]
            return split_wait(seconds, lanes=self.lanes)
        assert self.peers is not None
        ready = ready_times(pending, self.lanes)
        latest = self.peers.latest({index: [start, ready[index]] for index, _, start, _ in pending}, 2)
        return split_wait(pending, latest, self.lanes)


class DataParallelTask(Task):
    """A supervised task whose model is wrapped in DDP: forward, backward (with the overlapped
    allreduces), exchange (the exposed rest), update. Every rank steps on its own shard."""

    def __init__(
        self, task: Task, workload: str, device: torch.device, bucket_cap_mb: float | None = None
    ) -> None:
        require_supervised(task, workload)
        self.inner = task
        self.module = task.model
        self.model = DistributedDataParallel(
            task.model,
            device_ids=[device.index] if device.type == "cuda" else None,
            # Only a cap the user gave: DDP keeps its 1 MiB first bucket only when none is passed.
            **({} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}),
        )
        self.timer = BucketTimer(device)
        self.model.register_comm_hook(None, self.timer.hook)
        self.optimizer = task.optimizer

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        self.timer.stages = stages
        try:
            with stages("forward"):
                loss = self.inner.loss_fn(self.model, batch)
            with stages("backward"):
                loss.backward()  # the last bucket's hook switches the clock to "exchange"
            with stages("update"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        finally:
            self.timer.stages = None
        return loss.detach()

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]
