"""Data parallelism: the suite's supervised step under DistributedDataParallel, with every gradient
bucket's allreduce timed from launch to completion and the exposed exchange cut out of backward.

A DDP comm hook does the averaging allreduce itself (what DDP's default does: divide by the world
size, then sum) and notes when each bucket was launched and when its allreduce completed: host
clock readings on CPU (the completion callback runs when gloo finishes), CUDA events on GPU (the
callback's current stream waits for NCCL's work, so an event recorded there completes with it).

The ``exchange`` stage is the communication the step is exposed to: from the launch of the last
bucket (all of backward's gradients are computed by then) until ``backward()`` returns, which DDP
makes wait for every bucket's allreduce. Communication that overlapped the backward pass stays in
``backward``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dnnperf.errors import UsageError
from dnnperf.workloads.base import Batch, Stages, SupervisedTask, Task, no_stages


def require_supervised(task: Task, workload: str) -> SupervisedTask:
    """DDP wraps the model a plain forward/backward/update step calls; other steps are refused."""
    if not isinstance(task, SupervisedTask):
        raise UsageError(
            f"--strategy dp runs workloads with a plain forward/backward/update step; {workload} has its "
            "own step (several optimizers or an environment)"
        )
    return task


def check_divisible(batch_size: int, world: int) -> None:
    """dp splits the global batch evenly over the ranks."""
    if batch_size % world:
        raise UsageError(
            f"dp splits the global batch {batch_size} over {world} ranks: "
            f"give a batch size divisible by {world}"
        )


class BucketTimer:
    """A DDP comm hook that averages gradients with one allreduce per bucket and times each one."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.world = dist.get_world_size()
        self.stages: Any = None  # the step's clock, to mark where the exposed exchange begins
        self.launches = 0  # buckets launched so far (a progress count the heartbeat reports)
        self._lock = threading.Lock()  # gloo completes futures on its own threads
        self._pending: list[tuple[int, int, Any, Any]] = []

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
        start = self._stamp()
        work = dist.all_reduce(tensor.div_(self.world), async_op=True)

        def done(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            stop = self._stamp()
            with self._lock:
                self._pending.append((index, size, start, stop))
            return future.value()[0]

        return work.get_future().then(done)

    def take_step(self) -> list[dict[str, float]]:
        """The buckets of the step just finished (call after the device is synchronised): for each, its
        bytes, ``seconds`` from launch to completion, and the split of that time into ``queued_s``
        (waiting for the buckets launched before it: a process group runs its collectives in order)
        and ``allreduce_s`` (its own allreduce: from when it could start to its completion)."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return []
        origin = pending[0][2]

        def at(stamp: Any) -> float:  # seconds since the first launch
            return origin.elapsed_time(stamp) / 1e3 if self.cuda else stamp - origin

        buckets = []
        previous_end = float("-inf")
        for index, size, start, stop in sorted(pending, key=lambda b: at(b[3])):  # completion order
            begin, end = at(start), at(stop)
            service_start = max(begin, previous_end)
            previous_end = end
            buckets.append(
                {
                    "index": index,
                    "bytes": size,
                    "seconds": max(end - begin, 0.0),
                    "queued_s": max(service_start - begin, 0.0),
                    "allreduce_s": max(end - service_start, 0.0),
                }
            )
        return sorted(buckets, key=lambda b: b["index"])


class DataParallelTask(Task):
    """A supervised task whose model is wrapped in DDP: forward, backward (with the overlapped
    allreduces), exchange (the exposed rest), update. Every rank steps on its own shard."""

    def __init__(self, task: Task, workload: str, device: torch.device, bucket_cap_mb: float = 25.0) -> None:
        require_supervised(task, workload)
        self.inner = task
        self.module = task.model
        self.model = DistributedDataParallel(
            task.model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=bucket_cap_mb,
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
