"""A training step as the model sees it: every operator with phase, module, family, FLOPs and bytes.

One step of the real task runs under :class:`~dnnperf.analysis.opcount.OpCounter` (the layer
profiler's description), with two additions the strategies need: each top-level layer's output bytes
(pipeline cuts and tensor-parallel collectives) and the bytes autograd saves for backward (activation
memory). Descriptions are cached on disk like ``analysis/flops.py`` caches FLOPs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

import dnnperf
from dnnperf.analysis.opcount import OpCounter
from dnnperf.cache import JsonCache
from dnnperf.errors import UsageError

#: The batch sizes a sweep's description is interpolated from (FLOPs and bytes are affine in batch).
BASE_BATCHES = (2, 4)
_COLUMNS = ("phase", "module", "op", "family", "dtype")
_NUMBERS = ("flops", "bytes", "calls")


@dataclass
class Layer:
    """A direct child of the model, in the order its forward first ran."""

    name: str
    param_bytes: int
    output_bytes: int
    input_bytes: int


@dataclass
class StepGraph:
    """One training step: operator rows plus what memory and the strategies need."""

    name: str
    batch_size: int
    ops: pd.DataFrame  # phase, module, op, family, dtype, flops, bytes, calls (in first-seen order)
    param_bytes: int
    #: Parameter bytes per module (parameters owned directly), for gradient buckets.
    module_param_bytes: dict[str, int]
    optimizer_state_bytes: int
    #: Bytes autograd saved in forward for backward (storages counted once).
    saved_bytes: int
    batch_bytes: int
    layers: list[Layer] = field(default_factory=list)
    #: Modules that own parameters -> [input bytes, output bytes] of their first forward call.
    module_io: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["ops"] = {c: self.ops[c].tolist() for c in (*_COLUMNS, *_NUMBERS)}
        return document

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> StepGraph:
        values = dict(document)
        values["ops"] = pd.DataFrame(values["ops"])
        values["layers"] = [Layer(**layer) for layer in values["layers"]]
        return cls(**values)

    def at_batch(self, other: StepGraph, batch_size: int) -> StepGraph:
        """The description at ``batch_size``, by affine interpolation between this one and ``other``
        (same model, another batch size): FLOPs, bytes and activations grow linearly with the batch."""
        if other.batch_size == self.batch_size:
            raise ValueError("interpolation needs two different batch sizes")
        t = (batch_size - self.batch_size) / (other.batch_size - self.batch_size)
        keys = ["phase", "module", "op"]
        merged = self.ops.merge(other.ops[[*keys, *_NUMBERS]], on=keys, how="left", suffixes=("", "_b"))
        ops = merged[list(self.ops.columns)].copy()
        for column in _NUMBERS:
            b = merged[f"{column}_b"].fillna(merged[column]).to_numpy(float)
            a = merged[column].to_numpy(float)
            ops[column] = np.maximum(a + t * (b - a), 0.0)

        def lerp(a: float, b: float) -> int:
            return max(round(a + t * (b - a)), 0)

        layers = [
            Layer(
                x.name,
                x.param_bytes,
                lerp(x.output_bytes, y.output_bytes),
                lerp(x.input_bytes, y.input_bytes),
            )
            for x, y in zip(self.layers, other.layers, strict=False)
        ]
        io = {
            k: [lerp(v[0], other.module_io.get(k, v)[0]), lerp(v[1], other.module_io.get(k, v)[1])]
            for k, v in self.module_io.items()
        }
        return dataclasses.replace(
            self,
            batch_size=batch_size,
            module_io=io,
            ops=ops,
            saved_bytes=lerp(self.saved_bytes, other.saved_bytes),
            batch_bytes=lerp(self.batch_bytes, other.batch_bytes),
            layers=layers,
        )


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    return 0


def pipeline_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's top-level children as the units a pipeline cuts between; a container that is never
    called itself (ModuleList, ModuleDict: GPT-2's ``blocks``) stands for its children."""
    units = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            units += [(f"{name}.{inner}", c) for inner, c in child.named_children()]
        else:
            units.append((name, child))
    return units


def capture(
    model: nn.Module,
    run_step: Callable[[OpCounter], Any],
    name: str,
    batch_size: int,
    batch_bytes: int,
    optimizers: list[torch.optim.Optimizer] | None = None,
) -> StepGraph:
    """Run ``run_step(counter)`` (one training step; the counter is its ``stages``) and describe it."""
    layers: dict[str, Layer] = {}
    handles = []
    for child_name, child in pipeline_units(model):

        def hook(module: nn.Module, args: Any, output: Any, _name: str = child_name) -> None:
            if _name not in layers:
                params = sum(_nbytes(p) for p in module.parameters())
                layers[_name] = Layer(_name, params, _nbytes(output), _nbytes(args))

        handles.append(child.register_forward_hook(hook))
    module_io: dict[str, list[int]] = {}
    for module_name, module in model.named_modules():
        if module_name and any(True for _ in module.parameters(recurse=False)):

            def io_hook(module: nn.Module, args: Any, output: Any, _name: str = module_name) -> None:
                module_io.setdefault(_name, [_nbytes(args), _nbytes(output)])

            handles.append(module.register_forward_hook(io_hook))
    storages: dict[Any, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "meta":
            storages[id(tensor)] = _nbytes(tensor)
        else:
            storage = tensor.untyped_storage()
            storages[(storage.data_ptr(), storage.device.type)] = storage.nbytes()
        return tensor

    counter = OpCounter(model)
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run_step(counter)
    finally:
        for handle in handles:
            handle.remove()
    rows = [
        {
            "phase": r.phase,
            "module": r.module,
            "op": r.name,
            "family": r.family,
            "dtype": r.dtype or "float32",
            "flops": float(r.flops or 0),
            "bytes": float(r.bytes_read + r.bytes_written),
            "calls": float(r.calls),
        }
        for r in counter.table()
    ]
    module_params: dict[str, int] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for parameter in module.parameters(recurse=False):
            if parameter.requires_grad and id(parameter) not in seen:
                seen.add(id(parameter))
                key = module_name or "(root)"
                module_params[key] = module_params.get(key, 0) + _nbytes(parameter)
    state = sum(_nbytes(s) for opt in optimizers or [] for s in opt.state.values())
    return StepGraph(
        name=name,
        batch_size=batch_size,
        ops=pd.DataFrame(rows, columns=[*_COLUMNS, *_NUMBERS]),
        param_bytes=sum(module_params.values()),
        module_param_bytes=module_params,
        optimizer_state_bytes=state,
        saved_bytes=sum(storages.values()),
        batch_bytes=batch_bytes,
        layers=list(layers.values()),
        module_io=module_io,
    )


def describe_model(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor] | torch.Tensor,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    name: str = "model",
) -> StepGraph:
    """Describe one training step of a user's model on an example batch (its first dimension is the
    batch). Default loss: the sum of the output; default optimizer: SGD with momentum."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    first = batch if isinstance(batch, torch.Tensor) else next(iter(batch.values()), None)
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        raise UsageError("the example batch must be a tensor (or a dict of tensors) with a batch dimension")
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("the model has no trainable parameters")
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def loss_of(m: nn.Module, b: Any) -> torch.Tensor:
        if loss_fn is not None:
            return loss_fn(m, b)
        out = m(b) if isinstance(b, torch.Tensor) else m(**b)
        return sum(t.float().sum() for t in _flat(out))

    def step(stages: OpCounter) -> None:
        with stages("forward"):
            loss = loss_of(model, batch)
        with stages("backward"):
            loss.backward()
        with stages("update"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return capture(model, step, name, int(first.shape[0]), _nbytes(batch), [optimizer])


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _flat(v)]
    return []


def _cache_key(workload: str, preset: str, batch_size: int, device: str) -> str:
    from dnnperf.workloads import get_workload

    config = get_workload(workload).config(preset)
    described = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    identity = json.dumps(
        [workload, preset, batch_size, device, described, dnnperf.__version__, torch.__version__, "graph-3"],
        sort_keys=True,
        default=str,
    )
    return f"{workload}/{preset}/{batch_size}/{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def describe_workload(workload: str, preset: str, batch_size: int, device: str = "cpu") -> StepGraph:
    """One counted training step of a suite workload at ``batch_size`` (cached on disk). The step
    runs on ``device`` ("cpu": the operator stream this machine runs; "meta": shapes only, for presets
    too large to run here)."""
    from dnnperf.workloads import get_workload

    if batch_size <= 0:
        raise UsageError(f"batch size must be a positive integer, got {batch_size}")
    spec = get_workload(workload)  # UsageError with suggestions for an unknown name
    if preset not in spec.presets:
        raise UsageError(f"{workload} has no preset {preset!r} (presets: {', '.join(spec.presets)})")
    store = JsonCache("model-graph")
    key = _cache_key(spec.name, preset, batch_size, device)
    cached = store.get(key)
    if isinstance(cached, dict):
        try:
            return StepGraph.from_dict(cached)
        except (KeyError, TypeError, ValueError):
            pass  # an older or damaged entry: count again
    torch.manual_seed(0)
    task = spec.build(preset, device)
    batch = {k: v.to(device) for k, v in spec.data(preset).synthesize(batch_size, 0).items()}
    graph = capture(
        task.model,
        lambda counter: task.step(batch, counter),
        f"{spec.name}/{preset}",
        batch_size,
        _nbytes(batch),
        task.optimizers(),
    )
    store.put(key, graph.to_dict())
    return graph


def workload_graph(workload: str, preset: str, batch_size: int, exact: bool = True) -> StepGraph:
    """The description at ``batch_size``: counted at it (``exact``), or interpolated from the counts at
    BASE_BATCHES (a sweep over batch sizes then counts only twice)."""
    if exact or batch_size in BASE_BATCHES:
        return describe_workload(workload, preset, batch_size)
    a, b = (describe_workload(workload, preset, size) for size in BASE_BATCHES)
    return a.at_batch(b, batch_size)
