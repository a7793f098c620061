"""Sharded data parallelism: ``fsdp`` (PyTorch FSDP2 ``fully_shard``, ZeRO-3: parameters, gradients
and optimizer state each split over the ranks) and ``zero1`` (``ZeroRedundancyOptimizer`` under DDP:
the optimizer state split, parameters and gradients replicated). Both split the global batch like dp.

fsdp shards per *unit*: the memory planner's units (``memsave.policy.find_units``, a walk to any depth
that opens ``Sequential``/``ModuleList``/``ModuleDict`` containers) that are repeated blocks (their
class occurs more than once among the units: transformer layers, ResNet blocks, a CNN's convolutions)
and share no parameter with a module outside them (tied weights stay with the root); then the root,
which holds every other parameter. Each unit's parameters are all-gathered before its forward (and
again before its backward when resharded after forward) and its gradients reduce-scattered after its
backward.

The ``exchange`` stage is the communication the step is exposed to, i.e. the time the training thread
spends in FSDP's own hooks rather than computing: each unit's pre-forward (unshard: the all-gather, or
the wait for one already prefetched, with its copy in and out), pre-backward (the same, when resharded
after forward) and post-backward (the reduce-scatter of its gradients). The hooks that mark it are
placed around FSDP's: forward pre-hooks prepended and appended around FSDP's, a hook on the unit's
output tensor registered before FSDP's pre-backward hook there with a pre-hook of the output's autograd
node after it, and pre- and post-hooks of the autograd node FSDP's pre-forward puts on the unit's inputs
(its post-backward). On CUDA, all-gathers and reduce-scatters that run on FSDP's own streams while the
rank computes are not exposed and stay in ``forward`` and ``backward``. The root's post-backward runs in
FSDP's end-of-backward callback when its inputs need no gradient (token ids, images): that
reduce-scatter stays in ``backward``.

On the CPU, FSDP's collectives are ``WatchedAllGather`` and ``WatchedReduceScatter`` (installed
through FSDP's public ``set_custom_all_gather``/``set_custom_reduce_scatter``): the same buffers and
collectives as FSDP's defaults, told to the memory profiler. gloo's worker thread sometimes drops a
collective's last reference to its tensors, FSDP's buffers and gloo's own copies, and torch's profiler
does not see a release made there: each buffer's release is noted (``probes.memory.watch_release``),
and the copies a synchronous collective makes inside itself end with it
(``probes.memory.synchronous_collective``).

zero1's ``exchange`` is DDP's (see ``ddp.py``); the parameter broadcast of ``ZeroRedundancyOptimizer``'s
step is in ``update``.
"""

from __future__ import annotations

import inspect
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from dnnperf.distributed.ddp import DataParallelTask, require_supervised
from dnnperf.distributed.partition import device_of, rebuild_optimizer
from dnnperf.errors import UsageError
from dnnperf.memsave.policy import find_units
from dnnperf.probes.memory import synchronous_collective, watch_release
from dnnperf.workloads.base import Batch, Stages, Task, no_stages

MIXED_PRECISIONS = ("bf16",)


def shard_units(model: nn.Module) -> list[str]:
    """The names of the modules fsdp shards on their own (the root is sharded last, over the rest)."""
    units = [u.name for u in find_units(model) if u.name]
    modules = {name: model.get_submodule(name) for name in units}
    classes = Counter(type(m) for m in modules.values())
    owners: dict[int, set[str]] = {}  # parameter -> the modules (any depth) that hold it
    for name, module in model.named_modules(remove_duplicate=False):
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), set()).add(name)

    def inside(owner: str, unit: str) -> bool:
        return owner == unit or owner.startswith(unit + ".")

    chosen = []
    for name, module in modules.items():
        params = list(module.parameters())
        if not params or classes[type(module)] < 2:
            continue
        if all(inside(owner, name) for p in params for owner in owners[id(p)]):
            chosen.append(name)
    return chosen


def _collective(async_op: bool) -> AbstractContextManager[None]:
    return nullcontext() if async_op else synchronous_collective()


class _WatchedBuffers:
    """FSDP's ``Comm.allocate`` as its default allocates, each buffer watched (``watch_release``)."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = torch.empty(*size, dtype=dtype, device=device)
        watch_release(buffer)
        return buffer


class WatchedAllGather(_WatchedBuffers):
    """FSDP's all-gather as its default runs it (FSDP's ``AllGather`` protocol), its buffer watched."""

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        with _collective(async_op):
            return gather(output_tensor, input_tensor, group=group, async_op=async_op)


class WatchedReduceScatter(_WatchedBuffers):
    """FSDP's reduce-scatter as its default runs it (FSDP's ``ReduceScatter`` protocol), its buffers
    watched."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        with _collective(async_op):
            return scatter(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def watch_collective_buffers(module: nn.Module) -> bool:
    """Give a CPU ``fully_shard`` module the watched collectives (False where this torch's FSDP has no
    custom collectives: its buffers' releases on gloo's thread then go unseen)."""
    if not (hasattr(module, "set_custom_all_gather") and hasattr(module, "set_custom_reduce_scatter")):
        return False
    module.set_custom_all_gather(WatchedAllGather())  # type: ignore[operator]
    module.set_custom_reduce_scatter(WatchedReduceScatter())  # type: ignore[operator]
    return True


class ExposedComm:
    """Marks the step's clock ``exchange`` while the training thread is inside FSDP's hooks of the
    modules given (see the module docstring), and back to the stage it interrupted after."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.stages: Any = None
        self.module_hooks: list[Any] = []
        self.tensor_hooks: list[Any] = []  # on the step's tensors and autograd nodes
        for module in modules:
            self.module_hooks.append(module.register_forward_pre_hook(self._before_pre_forward, prepend=True))
            self.module_hooks.append(module.register_forward_pre_hook(self._after_pre_forward))
            self.module_hooks.append(module.register_forward_hook(self._before_post_forward, prepend=True))
        self._inputs: list[int] = []

    def _mark(self, stage: str) -> None:
        mark = getattr(self.stages, "mark", None)
        if mark is not None:
            mark(stage)

    def _before_pre_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self._inputs = [id(a) for a in args]
        self._mark("exchange")

    def _after_pre_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self._mark("forward")
        # The inputs FSDP replaced carry the autograd node of its post-backward (the reduce-scatter).
        for arg in args:
            if isinstance(arg, torch.Tensor) and id(arg) not in self._inputs and arg.grad_fn is not None:
                node = arg.grad_fn
                self.tensor_hooks.append(node.register_prehook(lambda *_: self._mark("exchange")))
                self.tensor_hooks.append(node.register_hook(lambda *_: self._mark("backward")))
                break

    def _before_post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        tensor = output if isinstance(output, torch.Tensor) else None
        if isinstance(output, (tuple, list)):
            tensor = next((o for o in output if isinstance(o, torch.Tensor) and o.requires_grad), None)
        if tensor is None or tensor.grad_fn is None:
            return
        # Registered before FSDP's post-forward adds its pre-backward hook to the same tensor: tensor
        # hooks run in registration order, node pre-hooks after all of them.
        self.tensor_hooks.append(tensor.register_hook(lambda grad: self._mark("exchange")))
        self.tensor_hooks.append(tensor.grad_fn.register_prehook(lambda *_: self._mark("backward")))

    def forget_step(self) -> None:
        """Drop the hooks on the step's tensors and nodes (the module hooks stay)."""
        for handle in self.tensor_hooks:
            handle.remove()
        self.tensor_hooks = []

    def remove(self) -> None:
        self.forget_step()
        for handle in self.module_hooks:
            handle.remove()
        self.module_hooks = []


class FullyShardedTask(Task):
    """A supervised task with ``fully_shard`` applied per unit and on the root: forward, backward,
    exchange (the exposed all-gathers and reduce-scatters), update. Every rank steps on its shard."""

    def __init__(
        self,
        task: Task,
        workload: str,
        reshard_after_forward: bool = True,
        mixed_precision: str | None = None,
    ) -> None:
        inner = require_supervised(task, workload, "fsdp")
        self.inner = inner
        model = inner.model
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if mixed_precision == "bf16" else None
        options: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
        if policy is not None:
            options["mp_policy"] = policy
        names = dict(model.named_parameters())
        self.units = shard_units(model)
        sharded = [model.get_submodule(name) for name in self.units]
        for module in sharded:
            fully_shard(module, **options)
        fully_shard(model, **options)
        #: Whether FSDP's collective buffers are watched (the CPU: see the module docstring).
        self.watched = device_of(model).type == "cpu" and all(
            watch_collective_buffers(m) for m in [*sharded, model]
        )
        self.model = model
        self.module = model
        # fully_shard replaced every parameter by its DTensor shard: the optimizer follows them.
        replaced: dict[nn.Parameter, nn.Parameter | None] = {
            names[name]: p for name, p in model.named_parameters()
        }
        optimizer = rebuild_optimizer(inner.optimizer, replaced)
        if optimizer is None:
            raise UsageError(f"--strategy fsdp: {workload} has no parameters to shard")
        self.optimizer = optimizer
        self.comm = ExposedComm([*sharded, model])

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        self.comm.stages = stages
        try:
            with stages("forward"):
                loss = self.inner.loss_fn(self.model, batch)
            with stages("backward"):
                loss.backward()
            with stages("update"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        finally:
            self.comm.stages = None
            self.comm.forget_step()
        return loss.detach()

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def close(self) -> None:
        self.comm.remove()

    def local_parameters(self) -> list[torch.Tensor]:
        """This rank's shards of the parameters (plain tensors)."""
        return [p.to_local() for p in self.model.parameters()]  # type: ignore[attr-defined]


class ZeroOneTask(DataParallelTask):
    """dp (DDP, every bucket's allreduce timed) with the optimizer state split over the ranks by
    ``ZeroRedundancyOptimizer``: each rank updates its share of the parameters and broadcasts it."""

    def __init__(self, task: Task, workload: str, device: torch.device, bucket_cap_mb: float | None = None):
        require_supervised(task, workload, "zero1")
        super().__init__(task, workload, device, bucket_cap_mb)
        original = self.optimizer
        groups = [{**group, "params": list(group["params"])} for group in original.param_groups]
        first, *rest = groups
        # A group holds keys its class's constructor does not take (AdamW's decoupled_weight_decay,
        # which AdamW sets itself): only the constructor's own go to it, the groups keep every key.
        accepted = inspect.signature(type(original)).parameters
        self.optimizer = ZeroRedundancyOptimizer(
            first["params"],
            optimizer_class=type(original),
            **{k: v for k, v in first.items() if k in accepted and k != "params"},
        )
        for group in rest:
            self.optimizer.add_param_group(group)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        # The rank's own optimizer over its share: it holds the state (the wrapper's ``state`` is
        # empty), and its step is where the gradients are read.
        return [self.optimizer.optim]


def check_mixed_precision(mixed_precision: str | None, device: torch.device) -> None:
    """bf16 parameters where the device computes in bf16 (gloo all-gathers them on CPU too)."""
    if mixed_precision is None:
        return
    if mixed_precision not in MIXED_PRECISIONS:
        raise UsageError(f"--mixed-precision {mixed_precision}: choose from {', '.join(MIXED_PRECISIONS)}")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError(f"--mixed-precision bf16: {torch.cuda.get_device_name(device)} has no bf16")
