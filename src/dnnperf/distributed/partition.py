"""Cutting the suite's models for model parallelism: each model as a sequence of layers, a cost per
layer, a balanced cut into consecutive stages, and what pipeline and tensor parallelism share (the
optimizer rebuilt over this rank's parameters, the per-step detail meter).

A layer's cost is its forward FLOPs for one sample (``torch.utils.flop_counter``) plus its output's
element count, so that layers without arithmetic (activations, pooling) are not free. Costs are
counted on the ``meta`` device through ``torch.func.functional_call``: shapes only, no memory, no
arithmetic, whatever the preset.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from dnnperf.errors import UsageError
from dnnperf.probes.clock import StageClock
from dnnperf.workloads.base import SupervisedTask, Task

#: The figures of ``last_step_detail()``: seconds of this rank's last step.
DETAIL_NAMES = ("compute", "send", "recv", "bubble", "collective")


class GPT2Embedding(nn.Module):
    """GPT-2's first layer (token + position embedding, dropout), sharing the model's modules."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.dropout = model.wte, model.wpe, model.dropout

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.dropout(self.wte(tokens) + self.wpe(positions))


Layers = list[tuple[str, nn.Module]]


def _children(prefix: str, module: nn.Module) -> Layers:
    return [(f"{prefix}.{name}", child) for name, child in module.named_children()]


def _vgg_layers(model: nn.Module) -> Layers:
    return [
        *_children("features", model.features),
        ("avgpool", model.avgpool),
        ("flatten", nn.Flatten()),
        *_children("classifier", model.classifier),
    ]


def _resnet_layers(model: nn.Module) -> Layers:
    blocks = [
        (f"layer{i}.{name}", block)
        for i in range(1, 5)
        for name, block in getattr(model, f"layer{i}").named_children()
    ]
    return [
        *_children("stem", model.stem),
        *blocks,
        ("avgpool", model.avgpool),
        ("flatten", nn.Flatten()),
        ("fc", model.fc),
    ]


def _basic_cnn_layers(model: nn.Module) -> Layers:
    names = ("conv1", "relu1", "pool1", "conv2", "relu2", "pool2")
    tail = ("fc1", "relu3", "fc2")
    return [
        *[(n, getattr(model, n)) for n in names],
        ("flatten", nn.Flatten()),
        *[(n, getattr(model, n)) for n in tail],
    ]


def _gpt2_layers(model: nn.Module) -> Layers:
    blocks = [(f"blocks.{i}", block) for i, block in enumerate(model.blocks)]
    return [("embedding", GPT2Embedding(model)), *blocks, ("ln_f", model.ln_f), ("lm_head", model.lm_head)]


@dataclass(frozen=True)
class LayerSplit:
    """How a workload's model reads as consecutive layers: the batch key its first layer takes, the
    layers, and a small batch's input (shape, dtype) for costing them."""

    input_key: str
    layers: Callable[[nn.Module], Layers]
    sample: Callable[[nn.Module], tuple[tuple[int, ...], torch.dtype]]


def _image_sample(model: nn.Module) -> tuple[tuple[int, ...], torch.dtype]:
    config = model.config
    return (2, config.in_channels, config.image_size, config.image_size), torch.float32


#: Workloads pipeline parallelism can cut (AlexNet reads like VGG: features, avgpool, flatten, classifier).
_IMAGES = {"vgg16": _vgg_layers, "vgg19": _vgg_layers, "alexnet": _vgg_layers}
_IMAGES |= {"resnet18": _resnet_layers, "resnet50": _resnet_layers, "basic_cnn": _basic_cnn_layers}
PIPELINE_SPLITS: dict[str, LayerSplit] = {
    name: LayerSplit("image", layers, _image_sample) for name, layers in _IMAGES.items()
}
PIPELINE_SPLITS["gpt2"] = LayerSplit(
    "tokens", _gpt2_layers, lambda model: ((2, model.config.seq_len), torch.long)
)


def pipeline_split(workload: str) -> LayerSplit:
    """The workload's layer sequence, or a UsageError listing the workloads that have one."""
    if workload not in PIPELINE_SPLITS:
        raise UsageError(
            f"--strategy pp cannot cut {workload!r} into stages: supported workloads are "
            f"{', '.join(sorted(PIPELINE_SPLITS))}"
        )
    return PIPELINE_SPLITS[workload]


def supervised(task: Task, workload: str, strategy: str) -> SupervisedTask:
    """Model parallelism rewrites the plain forward/backward/update step; other steps are refused."""
    if not isinstance(task, SupervisedTask):
        raise UsageError(f"--strategy {strategy} needs a plain supervised step; {workload!r} has its own")
    return task


def layer_costs(layers: Layers, sample: torch.Tensor) -> list[float]:
    """Forward FLOPs + output elements of each layer for ``sample``, counted on the meta device
    (give two samples or more: batch norm refuses one value per channel in training mode)."""
    x = sample.to("meta")
    costs = []
    for _, layer in layers:
        state = {
            name: torch.empty_like(t, device="meta")
            for name, t in (*layer.named_parameters(), *layer.named_buffers())
        }
        with FlopCounterMode(display=False) as counter:
            x = functional_call(layer, state, (x,), tie_weights=True, strict=False)
        costs.append(float(counter.get_total_flops() + x.numel()))
    return costs


def balance(costs: list[float], parts: int) -> list[int]:
    """Cut points of the best split of ``costs`` into ``parts`` non-empty consecutive runs: the one
    whose most expensive run is cheapest (dynamic programming over prefix sums). Returns the start
    index of each run."""
    n = len(costs)
    if parts > n:
        raise UsageError(f"cannot cut {n} layers into {parts} pipeline stages")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    inf = float("inf")
    # best[k][i]: the smallest possible maximum over the first i layers cut into k runs.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    start = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], start[k][i] = value, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = start[k][i]
        starts.append(i)
    return starts[::-1]


def rebuild_optimizer(
    optimizer: torch.optim.Optimizer, replace: dict[nn.Parameter, nn.Parameter | None]
) -> torch.optim.Optimizer | None:
    """The same optimizer class and hyper-parameters (per group) over this rank's parameters:
    ``replace`` maps each original parameter to its shard, or None where the rank does not hold it;
    parameters not in ``replace`` are kept. Empty groups are dropped; None if nothing is left (a
    stage of parameter-free layers)."""
    groups = []
    for group in optimizer.param_groups:
        params = [p for p in (replace.get(p, p) for p in group["params"]) if p is not None]
        if params:
            groups.append({**group, "params": params})
    # Every hyper-parameter travels in the groups; the constructor's defaults fill nothing.
    return type(optimizer)(groups) if groups else None


def unique_parameters(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    """Every parameter of the modules once, in order (tied weights appear once)."""
    seen: dict[int, nn.Parameter] = {}
    for module in modules:
        for parameter in module.parameters():
            seen.setdefault(id(parameter), parameter)
    return list(seen.values())


MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)


def memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """The layout a dense tensor is stored in. Split computations keep it: CPU convolutions of few
    channels produce channels-last tensors, and the next convolution rounds differently on the same
    values in another layout (batch norm over a few samples amplifies the difference)."""
    for layout in MEMORY_FORMATS:
        if tensor.is_contiguous(memory_format=layout):
            return layout
    return torch.contiguous_format


def flat_alias(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements in memory order as a 1-D alias (gloo takes only plain-contiguous
    tensors; this keeps a channels-last tensor's layout without a copy)."""
    return tensor.as_strided((tensor.numel(),), (1,), tensor.storage_offset())


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters are (the CPU for a model without any)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of the parameters this rank holds."""
    return sum(p.numel() * p.element_size() for p in unique_parameters([module]))


def named_sequential(layers: Layers) -> nn.Sequential:
    """The layers as one module, named by their path in the full model ('.' is not allowed: '/')."""
    return nn.Sequential(OrderedDict((name.replace(".", "/"), layer) for name, layer in layers))


class DetailMeter:
    """Seconds of one step by kind (compute, send, recv, bubble, collective): a :class:`StageClock`
    whose stage names are the detail's, so boundaries are host-clock readings on CPU and CUDA events
    on GPU, resolved after the step's final synchronisation (``result`` is called after it)."""

    def __init__(self, device: torch.device) -> None:
        self.clock = StageClock(device)
        self._last: dict[str, float] = dict.fromkeys(DETAIL_NAMES, 0.0)

    def begin(self) -> None:
        if self.clock.in_step:  # a step that failed half-way: drop it
            self.clock.end_step()
        self.clock.begin_step()

    def __call__(self, name: str):
        return self.clock(name)

    def end(self) -> None:
        """End the step: at once on CPU; on CUDA at ``result``, after the runner's synchronisation."""
        if not self.clock.cuda:
            self.result()

    def result(self) -> dict[str, float]:
        """The last step's seconds per kind (closing it on first call: on CUDA, after the sync)."""
        if self.clock.in_step:
            stages = self.clock.end_step().stages
            self._last = {name: float(stages.get(name, 0.0)) for name in DETAIL_NAMES}
        return dict(self._last)

    def close(self) -> None:
        self.clock.close()
