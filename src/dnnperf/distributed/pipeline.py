"""Pipeline parallelism: the model cut into ``world_size`` stages of consecutive layers, one per rank,
and every step's batch cut into micro-batches that flow through them (GPipe or 1F1B).

The two schedules are written here with ``torch.distributed`` point-to-point operations (``isend`` /
``irecv``; gloo on CPU, NCCL on CUDA) rather than ``torch.distributed.pipelining``: its schedules run a
whole step inside one call and expose no per-rank timing, and a step here has to say where each rank's
time went. A schedule is a list of actions per rank (``("F", i)``: forward of micro-batch ``i``;
``("B", i)``: its backward), run in order; a rank blocks only on the receives its next action needs,
so the order alone makes the pipeline.

Every message is a small header (dtype and shape) followed by the tensor. The header tells the
receiver what to allocate, and splits its waiting in two: until the header arrives the peer has not
finished the data (``bubble``: idle), from then on the tensor is in flight (``recv``). Sends are
asynchronous: ``send`` is the time to issue them; the wait for the peers to take the last ones at the
end of the step is idle (``bubble``), as is the wait for the last stage's loss.

Loss: the micro-batch losses weighted by their share of the batch (n_i / N), summed, so gradients are
the full batch's mean-loss gradients; the sum is broadcast from the last stage to every rank.
Parameters used by several stages (GPT-2's token embedding, tied to its output projection) live on
each of those ranks; their gradients are summed across them before the update (``collective``).
Batch normalisation sees micro-batches, as in GPipe: its statistics are per micro-batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dnnperf.distributed import SCHEDULES
from dnnperf.distributed.partition import (
    MEMORY_FORMATS,
    DetailMeter,
    Layers,
    balance,
    device_of,
    flat_alias,
    layer_costs,
    memory_format,
    named_sequential,
    parameter_bytes,
    pipeline_split,
    rebuild_optimizer,
    supervised,
    unique_parameters,
)
from dnnperf.errors import UsageError
from dnnperf.workloads.base import Batch, Stages, Task, Workload, no_stages

FORWARD, BACKWARD = "F", "B"
Action = tuple[str, int]

# Header: dtype code, memory-format code, number of dimensions, up to eight sizes (the layout travels:
# see ``partition.memory_format``).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64)
_MAX_DIMS = 8
_HEADER = 3 + _MAX_DIMS


def schedule_actions(schedule: str, rank: int, world: int, microbatches: int) -> list[Action]:
    """The order in which ``rank`` runs the forward and backward of each micro-batch.

    GPipe: every forward, then every backward. 1F1B: ``world - rank - 1`` forwards to fill the pipe,
    then one forward and one backward in turn, then the remaining backwards; at most ``world - rank``
    micro-batches' activations are alive at once instead of all of them.
    """
    if schedule == "gpipe":
        return [(FORWARD, i) for i in range(microbatches)] + [(BACKWARD, i) for i in range(microbatches)]
    if schedule != "1f1b":
        raise UsageError(f"unknown pipeline schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    warmup = min(world - rank - 1, microbatches)
    actions = [(FORWARD, i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        actions += [(FORWARD, warmup + i), (BACKWARD, i)]
    actions += [(BACKWARD, i) for i in range(microbatches - warmup, microbatches)]
    return actions


class PointToPoint:
    """Messages between neighbouring stages: a header, then the tensor (see the module docstring)."""

    def __init__(self, device: torch.device, meter: DetailMeter) -> None:
        self.device, self.meter = device, meter
        self.pending: list[tuple[Any, torch.Tensor]] = []  # sends in flight, with their tensors alive
        self.sent_bytes = self.received_bytes = 0

    def reset(self) -> None:
        self.sent_bytes = self.received_bytes = 0

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        layout = memory_format(tensor)
        tensor = tensor.detach().contiguous(memory_format=layout)
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[:3] = torch.tensor([_DTYPES.index(tensor.dtype), MEMORY_FORMATS.index(layout), tensor.dim()])
        header[3 : 3 + tensor.dim()] = torch.tensor(tensor.shape)
        header = header.to(self.device)
        with self.meter("send"):
            for message, message_tag in ((header, 2 * tag), (flat_alias(tensor), 2 * tag + 1)):
                self.pending.append((dist.isend(message, dst, tag=message_tag), message))
        self.sent_bytes += tensor.numel() * tensor.element_size()

    def recv(self, src: int, tag: int) -> torch.Tensor:
        header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
        with self.meter("bubble"):
            dist.irecv(header, src, tag=2 * tag).wait()
            dtype, layout, ndim, *sizes = header.tolist()  # on CUDA this waits for the header: still idle
        tensor = torch.empty(
            sizes[:ndim], dtype=_DTYPES[dtype], device=self.device, memory_format=MEMORY_FORMATS[layout]
        )
        with self.meter("recv"):
            dist.irecv(flat_alias(tensor), src, tag=2 * tag + 1).wait()
        self.received_bytes += tensor.numel() * tensor.element_size()
        return tensor

    def drain(self) -> None:
        """Wait until the peers have taken every message sent this step (idle: nothing left to do)."""
        with self.meter("bubble"):
            for work, _ in self.pending:
                work.wait()
        self.pending.clear()


def _tag(kind: str, microbatch: int) -> int:
    return 2 * microbatch + (kind == BACKWARD)


class PipelineTask(Task):
    """This rank's stage of a pipelined model, trained with a GPipe or 1F1B schedule."""

    def __init__(
        self,
        stages: list[Layers],
        loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        input_key: str,
        schedule: str,
        microbatches: int,
        device: torch.device,
    ) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if microbatches < 1:
            raise UsageError(f"--microbatches must be at least 1, got {microbatches}")
        self.schedule, self.microbatches, self.input_key = schedule, microbatches, input_key
        self.actions = schedule_actions(schedule, self.rank, self.world, microbatches)
        self.layer_names = [[name for name, _ in layers] for layers in stages]
        self.model = named_sequential(stages[self.rank])
        self.loss_fn = loss_fn
        self.first, self.last = self.rank == 0, self.rank == self.world - 1
        # A stage starting with an in-place layer must not write into its received (leaf) input.
        self.clone_input = bool(getattr(stages[self.rank][0][1], "inplace", False))
        self.shared = self._shared_parameters(stages)
        mine = {id(p) for p in self.model.parameters()}
        others = [p for layers in stages for p in unique_parameters(m for _, m in layers)]
        self.optimizer = rebuild_optimizer(optimizer, {p: None for p in others if id(p) not in mine})
        self.device = device
        self.meter = DetailMeter(device)
        self.link = PointToPoint(device, meter=self.meter)
        self.parameter_bytes = parameter_bytes(self.model)

    def _shared_parameters(self, stages: list[Layers]) -> list[tuple[nn.Parameter, Any]]:
        """This rank's parameters that other stages also hold, each with the group to sum them over.
        Every rank creates every group, in the same order (``new_group`` is collective)."""
        holders: dict[int, list[int]] = {}
        by_id: dict[int, nn.Parameter] = {}
        for rank, layers in enumerate(stages):
            for p in unique_parameters(m for _, m in layers):
                holders.setdefault(id(p), []).append(rank)
                by_id[id(p)] = p
        groups: dict[tuple[int, ...], Any] = {}
        shared = []
        for key, ranks in holders.items():
            if len(ranks) < 2:
                continue
            ranks_key = tuple(ranks)
            if ranks_key not in groups:
                groups[ranks_key] = None if len(ranks) == self.world else dist.new_group(list(ranks))
            if self.rank in ranks:
                shared.append((by_id[key], groups[ranks_key]))
        return shared

    # -- one step ---------------------------------------------------------------------------------------

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        self.meter.begin()
        self.link.reset()
        try:
            micro, weights = self._split(batch)
            saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
            # Summed in float64 (the last stage's losses, whatever the model's precision; zero elsewhere
            # until the broadcast).
            loss = torch.zeros((), dtype=torch.float64, device=self.device)
            for kind, i in self.actions:
                if kind == FORWARD:
                    loss += self._forward(i, micro[i], weights[i], saved, stages)
                else:
                    self._backward(i, saved, stages)
            with stages("exchange"):
                with self.meter("bubble"):  # waits for the last stage to finish: idle
                    dist.broadcast(loss, src=self.world - 1)
                with self.meter("collective"):
                    for parameter, group in self.shared:
                        if parameter.grad is None:
                            parameter.grad = torch.zeros_like(parameter)
                        dist.all_reduce(parameter.grad, group=group)
            with stages("update"), self.meter("compute"):
                for optimizer in self.optimizers():
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            with stages("exchange"):
                self.link.drain()
            return loss
        finally:
            self.meter.end()

    def _split(self, batch: Batch) -> tuple[list[Batch], list[float]]:
        """The batch as micro-batches (every tensor cut along dim 0) and each one's share of it."""
        total = batch[self.input_key].shape[0]
        check_microbatches(total, self.microbatches)
        micro: list[Batch] = [{} for _ in range(self.microbatches)]
        for key, value in batch.items():
            cut = value.dim() > 0 and value.shape[0] == total
            parts = torch.tensor_split(value, self.microbatches) if cut else [value] * self.microbatches
            for target, part in zip(micro, parts, strict=True):
                target[key] = part
        weights = [m[self.input_key].shape[0] / total for m in micro]
        return micro, weights

    def _forward(
        self, i: int, micro: Batch, weight: float, saved: dict, stages: Stages
    ) -> torch.Tensor | float:
        """Forward of micro-batch ``i``: receive (or read) its input, run the stage, pass it on.
        Returns the micro-batch's weighted loss on the last stage, 0 elsewhere."""
        if self.first:
            x, received = micro[self.input_key], None
        else:
            with stages("exchange"):
                received = self.link.recv(self.rank - 1, _tag(FORWARD, i)).requires_grad_()
            x = received.clone() if self.clone_input else received
        with stages("forward"), self.meter("compute"):
            if self.last:  # the workload's own loss, with this stage standing in for the model
                out = self.loss_fn(self.model, {**micro, self.input_key: x}) * weight
            else:
                out = self.model(x)
        saved[i] = (received, out)
        if self.last:
            return out.detach()
        with stages("exchange"):
            self.link.send(out, self.rank + 1, _tag(FORWARD, i))
        return 0.0

    def _backward(self, i: int, saved: dict, stages: Stages) -> None:
        """Backward of micro-batch ``i``: receive its output's gradient, back-propagate, pass it on."""
        received, out = saved.pop(i)
        grad = None
        if not self.last:
            with stages("exchange"):
                grad = self.link.recv(self.rank + 1, _tag(BACKWARD, i))
        with stages("backward"), self.meter("compute"):
            torch.autograd.backward(out, grad)
        if received is not None:
            with stages("exchange"):
                self.link.send(received.grad, self.rank - 1, _tag(BACKWARD, i))

    # -- what the runtime reads ------------------------------------------------------------------------

    def last_step_detail(self) -> dict[str, float]:
        """Seconds of this rank's last step: compute, send, recv, bubble, collective (tied weights)."""
        return self.meter.result()

    def last_step_bytes(self) -> dict[str, int]:
        """Tensor bytes this rank sent and received in its last step (headers not counted)."""
        return {"send": self.link.sent_bytes, "recv": self.link.received_bytes}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer] if self.optimizer is not None else []


def check_microbatches(batch_size: int, microbatches: int) -> None:
    """Every micro-batch needs one sample at least (a batch need not divide evenly: they differ by one)."""
    if batch_size < microbatches:
        raise UsageError(
            f"a batch of {batch_size} cannot be cut into {microbatches} micro-batches: "
            f"give a batch size of at least {microbatches}"
        )


def check_pipeline(
    workload: Workload, preset: str, batch_sizes: Sequence[int], microbatches: int, world: int
) -> None:
    """What pp refuses, checked before any rank starts (on the meta device: nothing is allocated): a
    workload it cannot cut or with a step of its own, more stages than layers, a batch too small."""
    task = supervised(workload.build(preset, "meta"), workload.name, "pp")
    layers = pipeline_split(workload.name).layers(task.model)
    if world > len(layers):
        raise UsageError(f"cannot cut {len(layers)} layers into {world} pipeline stages")
    for size in batch_sizes:
        check_microbatches(size, microbatches)


def pipeline_task(task: Task, workload: str, *, schedule: str = "1f1b", microbatches: int = 4) -> Task:
    """Cut the single-process task's model into ``world_size`` stages balanced by forward FLOPs (see
    ``partition.layer_costs``) and return this rank's stage as a task (call on every rank after
    ``torch.distributed`` is initialised, with the same task built from the same seed)."""
    task = supervised(task, workload, "pp")
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown pipeline schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    split = pipeline_split(workload)
    layers = split.layers(task.model)
    shape, dtype = split.sample(task.model)
    costs = layer_costs(layers, torch.zeros(shape, dtype=dtype))
    starts = [*balance(costs, dist.get_world_size()), len(layers)]
    stages = [layers[a:b] for a, b in itertools.pairwise(starts)]
    return PipelineTask(
        stages,
        task.loss_fn,
        task.optimizer,
        split.input_key,
        schedule,
        microbatches,
        device_of(task.model),
    )
