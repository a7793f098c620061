"""Tensor (intra-layer) parallelism: large layers split across ranks, each rank holding only its
shard, with the collectives that make the split exact (Megatron-LM, Shoeybi et al. 2019).

Transformer blocks (GPT-2, the Transformer): the attention's q/k/v projections and the MLP's first
layer are *column-parallel* (each rank computes its slice of the output features: its heads, its
slice of the hidden units); the attention's output projection and the MLP's second layer are
*row-parallel* (each rank multiplies its slice of the input features, an all-reduce sums the partial
products, the bias is added once). Where a block's input enters the split region an identity in
forward all-reduces the input gradient in backward (Megatron's ``f``); the row-parallel all-reduce is
its conjugate (``g``: all-reduce forward, identity backward). Two all-reduces per block in forward,
two in backward. Embeddings, LayerNorms and the output projection stay replicated.

Convolutional networks (VGG, ResNet, AlexNet, ...): every convolution and linear layer whose output
channels divide by the world size is split by output channel; each rank computes its channels, an
all-gather assembles the full output (backward: each rank keeps its slice of the gradient), and the
input gradient, a sum over every rank's channels, is all-reduced (``f``). Batch norms, pooling and
activations are replicated.

Collectives are autograd Functions over ``torch.distributed`` (gloo on CPU, NCCL on CUDA), timed as
``collective`` in ``last_step_detail()`` and as the ``exchange`` stage of the runner's breakdown.
Everything outside the split layers computes the same values on every rank, so replicated
parameters get identical gradients and stay identical without being synchronised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dnnperf.distributed.partition import (
    DetailMeter,
    device_of,
    flat_alias,
    memory_format,
    parameter_bytes,
    rebuild_optimizer,
    supervised,
)
from dnnperf.errors import UsageError
from dnnperf.models.translation import FeedForward, MultiHeadAttention
from dnnperf.workloads.base import Batch, Stages, Task, no_stages

TRANSFORMERS = ("gpt2", "transformer")
CONVNETS = ("alexnet", "basic_cnn", "inception_v3", "resnet18", "resnet50", "vgg16", "vgg19")
SUPPORTED = tuple(sorted(TRANSFORMERS + CONVNETS))


class Communicator:
    """The split's ranks (the default group): its collectives, with their time and bytes noted, and
    the parameters split so far."""

    def __init__(self, meter: DetailMeter, rank: int | None = None, world: int | None = None) -> None:
        self.rank = dist.get_rank() if rank is None else rank
        self.world = dist.get_world_size() if world is None else world
        self.meter = meter
        #: (original parameter, this rank's shard, the dimension it was cut along)
        self.shards: list[tuple[nn.Parameter, nn.Parameter, int]] = []
        self.stages: Stages = no_stages
        self.calls: dict[str, int] = {"all_reduce": 0, "all_gather": 0}
        self.bytes: dict[str, int] = {"all_reduce": 0, "all_gather": 0}
        # The last collective's tensors, kept until the next one (or the step's end): gloo's worker
        # thread holds them until just after the collective returns, and a tensor whose last reference
        # went on that thread is a release torch's profiler never sees (the memory profiler then counts
        # the block alive to the step's end: 0.6-13.6 MB of resnet18 `small` tp's peak, by launch).
        self._held: list[torch.Tensor] = []

    def release(self) -> None:
        """Let go of the last collective's tensors (at the step's end, on the training thread)."""
        self._held = []

    def begin(self, stages: Stages) -> None:
        """A new step, timed into ``stages``: the counts start again."""
        self.stages = stages
        self.calls = dict.fromkeys(self.calls, 0)
        self.bytes = dict.fromkeys(self.bytes, 0)

    @contextmanager
    def _timed(self, kind: str, tensor: torch.Tensor) -> Iterator[None]:
        self.calls[kind] += 1
        self.bytes[kind] += tensor.numel() * tensor.element_size()
        with self.stages("exchange"), self.meter("collective"):
            yield

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in a new tensor."""
        total = tensor.contiguous().clone()
        with self._timed("all_reduce", total):
            self._all_reduce(total)
        self._held = [total]
        return total

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim``, in rank order, in its layout."""
        tensor = tensor.contiguous(memory_format=memory_format(tensor))
        chunks = [torch.empty_like(tensor) for _ in range(self.world)]
        with self._timed("all_gather", tensor):
            self._all_gather([flat_alias(c) for c in chunks], flat_alias(tensor))
        self._held = [*chunks, tensor]
        return torch.cat(chunks, dim).contiguous(memory_format=memory_format(tensor))

    # The collectives themselves: torch.distributed's (a subclass without ranks replaces them to time
    # the split's own host work, calibrate.split_region_cost).
    def _all_reduce(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)

    def _all_gather(self, chunks: list[torch.Tensor], tensor: torch.Tensor) -> None:
        dist.all_gather(chunks, tensor)


class LocalCommunicator(Communicator):
    """One rank's split run by a process without its peers (``rank`` of ``world``): the collectives
    are left out (the all-reduce keeps this rank's tensor, the all-gather leaves the peers' chunks as
    allocated), so a step times the split's own host work alone (calibrate.split_region_cost)."""

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        pass

    def _all_gather(self, chunks: list[torch.Tensor], tensor: torch.Tensor) -> None:
        pass


class _CopyToRegion(torch.autograd.Function):
    """Megatron's ``f``: identity forward; the input gradient summed over ranks backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.comm.all_reduce(grad), None


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron's ``g``: partial products summed over ranks forward; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    """Every rank's output slice concatenated forward; backward, each rank keeps its slice (the
    gradient arriving is the same on every rank: the layers after it are replicated)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim, ctx.size = comm, dim, x.shape[dim]
        return comm.all_gather(x, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.narrow(ctx.dim, ctx.comm.rank * ctx.size, ctx.size), None, None


def _shard(parameter: nn.Parameter | None, dim: int, comm: Communicator) -> nn.Parameter | None:
    """This rank's contiguous slice of a parameter along ``dim``, as a new parameter (a copy, so the
    full tensor can be freed), noted in ``comm.shards``."""
    if parameter is None:
        return None
    piece = parameter.detach().chunk(comm.world, dim)[comm.rank]
    shard = nn.Parameter(piece.clone(), requires_grad=parameter.requires_grad)
    comm.shards.append((parameter, shard, dim))
    return shard


class ColumnParallelLinear(nn.Module):
    """This rank's slice of a linear layer's output features. ``gather``: the full output after (and
    the input entering the split region here: ``f``); otherwise a ``ParallelRegion`` around the
    sub-layer provides ``f`` once for every projection of the same input."""

    def __init__(self, linear: nn.Linear, comm: Communicator, gather: bool) -> None:
        super().__init__()
        self.comm, self.gather = comm, gather
        self.weight = _shard(linear.weight, 0, comm)
        self.bias = _shard(linear.bias, 0, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gather:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(_CopyToRegion.apply(x, self.comm), self.weight, self.bias)
        return _GatherFromRegion.apply(y, self.comm, -1)


class RowParallelLinear(nn.Module):
    """This rank's slice of a linear layer's input features; partial products summed over ranks,
    then the (replicated) bias."""

    def __init__(self, linear: nn.Linear, comm: Communicator) -> None:
        super().__init__()
        self.comm = comm
        self.weight = _shard(linear.weight, 1, comm)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _ReduceFromRegion.apply(F.linear(x, self.weight), self.comm)
        return y if self.bias is None else y + self.bias


class ColumnParallelConv2d(nn.Module):
    """This rank's output channels of a convolution, gathered into the full output."""

    def __init__(self, conv: nn.Conv2d, comm: Communicator) -> None:
        super().__init__()
        self.comm = comm
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        self.weight = _shard(conv.weight, 0, comm)
        self.bias = _shard(conv.bias, 0, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(
            _CopyToRegion.apply(x, self.comm),
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
        )
        return _GatherFromRegion.apply(y, self.comm, 1)


class ParallelRegion(nn.Module):
    """A sub-layer whose tensor inputs enter the split region once (``f`` on each of them)."""

    def __init__(self, inner: nn.Module, comm: Communicator) -> None:
        super().__init__()
        self.inner, self.comm = inner, comm

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        enter = self._enter
        return self.inner(*map(enter, args), **{k: enter(v) for k, v in kwargs.items()})

    def _enter(self, value: Any) -> Any:
        return _CopyToRegion.apply(value, self.comm) if isinstance(value, torch.Tensor) else value


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, module)


def split_layout(model: nn.Module) -> list[tuple[str, str, int]]:
    """How this module splits ``model``: (module path, kind, the count the ranks must divide). Kinds:
    ``attention`` and ``mlp`` (Megatron's blocks: heads, hidden units) where the model has any, else
    ``column`` (every convolution and linear layer by output channel; one whose channels do not divide
    stays whole). The performance model reads the same layout (``perfmodel/graph.py``)."""
    blocks = []
    for path, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            blocks.append((path, "attention", module.num_heads))
        elif isinstance(module, FeedForward):
            blocks.append((path, "mlp", module.fc1.out_features))
    if blocks:
        return blocks
    columns = []
    for path, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros":
            columns.append((path, "column", module.out_channels))
        elif isinstance(module, nn.Linear):
            columns.append((path, "column", module.out_features))
    return columns


def _split_transformer(model: nn.Module, comm: Communicator, workload: str) -> None:
    """Megatron's split of every attention and MLP (heads and hidden units divided evenly)."""
    for path, kind, _ in split_layout(model):
        module = model.get_submodule(path)
        if kind == "attention":
            if module.num_heads % comm.world:
                raise UsageError(
                    f"--strategy tp splits {workload}'s attention by heads: {module.num_heads} heads do "
                    f"not divide over {comm.world} ranks"
                )
            for name in ("q_proj", "k_proj", "v_proj"):
                setattr(module, name, ColumnParallelLinear(getattr(module, name), comm, gather=False))
            module.out_proj = RowParallelLinear(module.out_proj, comm)
            _set(model, path, ParallelRegion(module, comm))
        elif kind == "mlp":
            if module.fc1.out_features % comm.world:
                raise UsageError(
                    f"--strategy tp splits {workload}'s MLP: {module.fc1.out_features} hidden units do not "
                    f"divide over {comm.world} ranks"
                )
            module.fc1 = ColumnParallelLinear(module.fc1, comm, gather=False)
            module.fc2 = RowParallelLinear(module.fc2, comm)
            _set(model, path, ParallelRegion(module, comm))


def _split_convnet(model: nn.Module, comm: Communicator, workload: str) -> None:
    """Every convolution and linear layer split by output channel, where the channels divide."""
    for path, kind, channels in split_layout(model):
        module = model.get_submodule(path)
        if kind != "column" or channels % comm.world:
            continue
        if isinstance(module, nn.Conv2d):
            _set(model, path, ColumnParallelConv2d(module, comm))
        else:
            _set(model, path, ColumnParallelLinear(module, comm, gather=True))


class TensorParallelTask(Task):
    """The workload's step over this rank's shards; same loss, gradients gathered on request."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        comm: Communicator,
        meter: DetailMeter,
        layout: dict[str, tuple[nn.Parameter, int | None]],
    ) -> None:
        self.model, self.loss_fn, self.comm, self.meter = model, loss_fn, comm, meter
        self.layout = layout
        self.optimizer = optimizer
        self.parameter_bytes = parameter_bytes(model)

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        self.meter.begin()
        self.comm.begin(stages)
        try:
            with stages("forward"), self.meter("compute"):
                loss = self.loss_fn(self.model, batch)
            with stages("backward"), self.meter("compute"):
                loss.backward()
            with stages("update"), self.meter("compute"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            return loss.detach()
        finally:
            self.comm.stages = no_stages  # gathers outside a step are not the step's
            self.comm.release()
            self.meter.end()

    def last_step_detail(self) -> dict[str, float]:
        """Seconds of this rank's last step: compute, and collective (all-reduce and all-gather)."""
        return self.meter.result()

    def last_step_collectives(self) -> dict[str, dict[str, int]]:
        """Calls and tensor bytes (this rank's contribution) of each collective in the last step."""
        return {"calls": dict(self.comm.calls), "bytes": dict(self.comm.bytes)}

    def gather_full(
        self, value: Callable[[nn.Parameter], torch.Tensor] = lambda p: p.detach()
    ) -> dict[str, torch.Tensor]:
        """``value`` of every parameter of the single-process model, by its name there, with split
        parameters' shards gathered from every rank (a collective: call it on every rank)."""
        full = {}
        for name, (parameter, dim) in self.layout.items():
            tensor = value(parameter)
            if dim is not None:
                chunks = [torch.empty_like(tensor) for _ in range(self.comm.world)]
                dist.all_gather(chunks, tensor.contiguous())
                tensor = torch.cat(chunks, dim)
            full[name] = tensor
        return full

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]


def tensor_parallel_task(task: Task, workload: str) -> Task:
    """Split the single-process task's layers over the ranks of the default group and return this
    rank's task (call on every rank, with the same task built from the same seed)."""
    task = supervised(task, workload, "tp")
    if workload not in SUPPORTED:
        raise UsageError(
            f"--strategy tp has no split for {workload!r}: supported workloads are {', '.join(SUPPORTED)}"
        )
    model = task.model
    before = dict(model.named_parameters())  # tied weights once, by their first name
    meter = DetailMeter(device_of(model))
    comm = Communicator(meter)
    if workload in TRANSFORMERS:
        _split_transformer(model, comm, workload)
    else:
        _split_convnet(model, comm, workload)
    split = {id(original): (shard, dim) for original, shard, dim in comm.shards}
    layout = {name: split.get(id(p), (p, None)) for name, p in before.items()}
    optimizer = rebuild_optimizer(task.optimizer, {original: shard for original, shard, _ in comm.shards})
    return TensorParallelTask(model, task.loss_fn, optimizer, comm, meter, layout)
