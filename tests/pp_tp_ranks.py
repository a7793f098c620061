"""Test helpers for pipeline and tensor parallelism: run a function on N gloo ranks (spawned, one
thread each, bounded in time) and compare a rank's gradients with single-process training."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from dnnperf.workloads import get_workload
from dnnperf.workloads.base import Batch, Task

PRESET, SEED = "tiny", 0
#: Workloads checked in float64: deep batch-normalised networks amplify float32 rounding (a split
#: convolution sums in another order) past 1e-5, which would hide a real error behind noise.
DOUBLE = {"resnet50", "inception_v3"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device() -> torch.device:
    """Where a rank computes: cuda:RANK under NCCL, else (and outside a process group) the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", dist.get_rank())
    return torch.device("cpu")


def _entry(rank: int, fn: Callable, world: int, port: int, out: str, backend: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cuda = torch.device("cuda", rank) if backend == "nccl" else None
    if cuda is not None:
        torch.cuda.set_device(cuda)
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=timedelta(seconds=60), device_id=cuda
    )
    try:
        result = fn(*args)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 120, backend: str = "gloo") -> list[Any]:
    """``fn(*args)`` on ``world`` ranks (gloo on CPU; NCCL: one GPU each); each rank's JSON result, in
    rank order. A rank that fails fails the call; ranks still running after ``timeout`` seconds are
    killed and the call fails."""
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(
            _entry,
            args=(fn, world, free_port(), out, backend, args),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks still running after {timeout} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in range(world)]


def no_dropout(model: nn.Module) -> None:
    """Dropout masks cannot match between differently cut computations: turn it off in both."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):  # attention's dropout probability
            module.dropout = 0.0


def build(workload: str) -> Task:
    torch.manual_seed(SEED)
    task = get_workload(workload).build(PRESET, device())
    no_dropout(task.model)
    if workload in DOUBLE:
        task.model.double()  # in place: the optimizer keeps its parameters
    return task


def batch_of(workload: str, size: int) -> Batch:
    batch = {
        k: v.to(device()) for k, v in get_workload(workload).data(PRESET).synthesize(size, seed=1).items()
    }
    if workload in DOUBLE:
        batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    return batch


def reference_gradients(workload: str, batch: Batch, microbatches: int = 1) -> tuple[float, dict]:
    """Single-process loss and gradients (by parameter name) of one step on ``batch``; with
    ``microbatches`` > 1, accumulated over the batch cut the same way, each weighted by its share."""
    task = build(workload)
    total = next(iter(batch.values())).shape[0]
    loss = 0.0
    for i in range(microbatches):
        part = {k: torch.tensor_split(v, microbatches)[i] for k, v in batch.items()}
        weighted = task.loss_fn(task.model, part) * (part[next(iter(part))].shape[0] / total)
        weighted.backward()
        loss += float(weighted.detach())
    return loss, {name: p.grad.clone() for name, p in task.model.named_parameters()}


class GradCapture:
    """Each parameter's gradient at the optimizer step (the step clears them after)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.grads: dict[int, torch.Tensor] = {}
        self.handle = optimizer.register_step_pre_hook(self._capture)

    def _capture(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.grads = {id(p): p.grad.clone() for group in optimizer.param_groups for p in group["params"]}


def compare(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, str]:
    """Per parameter name, '' where ``actual`` matches within rtol = atol = 1e-5, else the mismatch."""
    result = {}
    for name, tensor in actual.items():
        try:
            torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-5)
            result[name] = ""
        except AssertionError as error:
            result[name] = str(error).splitlines()[0] + " " + " ".join(str(error).split()[-12:])
    return result
