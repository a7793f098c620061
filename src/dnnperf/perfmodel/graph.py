"""A training step as the model sees it: every operator with phase, module, family, FLOPs and bytes.

One step of the real task runs under :class:`~dnnperf.probes.opcount.OpCounter` (the layer
profiler's description), with additions the strategies and the memory estimate need: each top-level
layer's output bytes (pipeline cuts and tensor-parallel collectives), the bytes autograd saves for
backward (activation memory) and the *memory walk*: the forward pass as a sequence of module calls,
each with the bytes it saved for backward, the gradient bytes that flow through it in backward and the
parameter gradients backward makes there (``perfmodel/predict.py`` walks it backwards for the peak).
Descriptions are cached on disk like ``analysis/flops.py`` caches FLOPs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import json
import platform
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from dnnperf.cache import JsonCache
from dnnperf.errors import UsageError
from dnnperf.perfmodel import workspace
from dnnperf.perfmodel.faults import counting_workload_faults, steady_page_faults
from dnnperf.perfmodel.issue import gap_seconds, issue_seconds
from dnnperf.perfmodel.kernels import KernelCalls
from dnnperf.perfmodel.subnormals import SubnormalCount, flushed_slowdown, notable
from dnnperf.perfmodel.zeros import ZeroCounts
from dnnperf.probes.opcount import OpCall, OpCounter
from dnnperf.probes.saved import observe_saved
from dnnperf.restore import put_back
from dnnperf.version import __version__
from dnnperf.workloads.base import Workload, no_stages

#: The batch sizes a sweep's description is interpolated from (FLOPs and bytes are affine in batch).
BASE_BATCHES = (2, 4)
_COLUMNS = ("phase", "module", "op", "family", "dtype", "kind")
_NUMBERS = ("flops", "bytes", "calls", "zeros", "rows", "inner_calls")


def _with_numbers(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` with every count of ``_NUMBERS`` it lacks at 0: a description from before that count
    was kept, or one built by hand."""
    missing = {c: 0.0 for c in _NUMBERS if c not in ops}
    return ops.assign(**missing) if missing else ops


@dataclass
class Layer:
    """A pipeline unit (``pipeline_units``), in the order its forward first ran."""

    name: str
    param_bytes: int
    output_bytes: int
    input_bytes: int


@dataclass
class Segment:
    """A stretch of one forward pass under one module call, for the memory walk (forward order).

    ``saved``: bytes autograd saved for backward here (each storage once per forward pass; parameters,
    buffers and the batch are not activations). ``flow``: the gradient bytes alive while backward
    passes here: the input and output bytes of the latest leaf module called (its output's gradient
    arrives, its input's gradient is made) or, where operators outside leaf modules saved something
    (a loss, attention written with functions), twice the largest storage they saved, whichever is
    larger. ``grads``: parameter-gradient bytes backward makes here (at the last forward call of the
    module that owns them, the first one backward reaches). ``cycle``: which forward-backward-update
    cycle of the step (WGAN-GP's step has several)."""

    cycle: int
    module: str
    saved: int
    flow: int
    grads: int
    #: The largest library workspace of an operator backward runs here (perfmodel/workspace.py: measured
    #: in isolation on the describing device; 0 on "meta" and in older descriptions).
    workspace: int = 0


@dataclass
class StepGraph:
    """One training step: operator rows plus what memory and the strategies need."""

    name: str
    batch_size: int
    #: phase, module, op, family, dtype, flops, bytes, calls and zeros (input elements equal to zero,
    #: for perfmodel/zeros.py's operators), in first-seen order.
    ops: pd.DataFrame
    param_bytes: int
    #: Parameter bytes per module (parameters owned directly), for gradient buckets.
    module_param_bytes: dict[str, int]
    optimizer_state_bytes: int
    #: Bytes autograd saved in forward for backward: activations, each storage once, neither parameters
    #: nor the batch; the largest forward pass's where a step has several (WGAN-GP).
    saved_bytes: int
    batch_bytes: int
    layers: list[Layer] = field(default_factory=list)
    #: Modules that own parameters -> [input bytes, output bytes] of their first forward call.
    module_io: dict[str, list[int]] = field(default_factory=dict)
    #: The forward passes as the memory estimate walks them (see Segment); empty in older descriptions.
    memory_walk: list[Segment] = field(default_factory=list)
    #: Transient bytes of the optimizer's update on top of gradients and state (per optimizer type,
    #: see ``update_temporaries``), the largest over the step's optimizers.
    update_temp_bytes: int = 0
    #: Parameters that train no gradient (frozen): memory, but no gradient, state or allreduce.
    frozen_param_bytes: int = 0
    #: Trainable parameter tensors, each once (DDP hooks each and copies its gradient in and out of
    #: a bucket); 0 in older descriptions.
    param_tensors: int = 0
    #: How tensor parallelism splits the model (``distributed.tensor_parallel.split_layout``), each
    #: region's first call: module, kind (attention, mlp, column), the count the ranks must divide,
    #: input bytes that need a gradient (backward's all-reduce), output bytes. Empty in older ones.
    tp_regions: list[dict[str, Any]] = field(default_factory=list)
    #: Minor page faults one step takes in steady state on the host that described it (perfmodel/faults.py:
    #: a suite workload's in a fresh process); None when not counted (shapes only, or a prediction
    #: for a machine that charges none).
    page_faults: float | None = None
    #: Trainable parameters held by more than one pipeline layer (GPT-2's token embedding, tied to its
    #: output projection): bytes and the layers holding them. Pipeline stages that share one sum its
    #: gradient with an all-reduce every step (distributed/pipeline.py). Empty in older descriptions.
    shared_params: list[dict[str, Any]] = field(default_factory=list)
    #: For a suite workload that ``--strategy pp`` can cut: its pipeline layers in order
    #: (``distributed.partition.pipeline_split``), each with the first unit of ``layers`` it starts at
    #: and the forward cost it is balanced by (``layer_costs``), so that a prediction cuts the stages
    #: where dnnperf's pipeline does. Empty for a user's model and in older descriptions.
    pipeline_layers: list[dict[str, Any]] = field(default_factory=list)
    #: The step's distinct convolution, matrix-product and CPU attention calls as plain data, each with
    #: the rows that made it and how often (perfmodel/kernels.py): replayed for workspace and, on this
    #: host, for time. Empty in older descriptions, shapes-only ones and interpolated ones (their shapes
    #: are not the step's).
    kernels: list[dict[str, Any]] = field(default_factory=list)
    #: An interpolated description's two sources' kernels: [{"batch": B, "kernels": [...]}, ...], so
    #: that on this host a row replayed in both takes the replays' seconds interpolated to its batch
    #: (kernels.replayed_between). Empty otherwise.
    kernels_between: list[dict[str, Any]] = field(default_factory=list)
    #: On a GPU of the host that described it: the host seconds each phase of the step takes to issue
    #: ("forward", "backward", "update"; perfmodel/issue.py). Empty where not measured (a CPU, which
    #: runs the operators itself, shapes only, older descriptions).
    issue_s: dict[str, float] = field(default_factory=dict)
    #: On a CPU of the host that described it, where asked (describe_model's ``time_gaps``): per phase,
    #: [host seconds between the step's operator calls, the calls] (perfmodel/issue.gap_seconds): the
    #: model's own Python and the autograd engine's bookkeeping around its operators. Empty where not
    #: measured.
    gaps: dict[str, list[float]] = field(default_factory=dict)
    #: An interpolated description's ``gaps`` on the line through its two sources' extended to batch 0:
    #: the part of the host's seconds between calls that does not grow with the batch (the model's
    #: Python, not the freeing of larger tensors). Empty otherwise.
    fixed_gaps: dict[str, list[float]] = field(default_factory=dict)
    #: On a CPU, per phase: [subnormal elements, floating elements] of the described step's operator
    #: outputs (perfmodel/subnormals.py); a prediction says where a step has them
    #: (Prediction.detail["subnormal_outputs"]). Empty where not counted.
    subnormal_outputs: dict[str, list[float]] = field(default_factory=dict)
    #: On a CPU, where a phase's outputs are notably subnormal (subnormals.notable): for each phase
    #: that flushing subnormals to zero made faster in every timed pair, its seconds as it ran over
    #: its seconds flushed (subnormals.flushed_slowdown), which ``ComputeOptions.subnormals``
    #: multiplies the phase's operators by. Empty otherwise.
    subnormal_slowdown: dict[str, float] = field(default_factory=dict)

    @property
    def update_steps(self) -> int:
        """Optimizer steps the step takes: one a forward-backward-update cycle (``memory_walk``; one
        where the description walked none), none without an update phase."""
        if not (self.ops["phase"] == "update").any():
            return 0
        return len({s.cycle for s in self.memory_walk}) or 1

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        ops = _with_numbers(self.ops if "kind" in self.ops else self.ops.assign(kind=""))
        document["ops"] = {c: ops[c].tolist() for c in (*_COLUMNS, *_NUMBERS)}
        return document

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> StepGraph:
        values = dict(document)
        values["ops"] = _with_numbers(pd.DataFrame(values["ops"]))
        if "kind" not in values["ops"]:  # a description from before convolutions' shape classes
            values["ops"]["kind"] = ""
        values["layers"] = [Layer(**layer) for layer in values["layers"]]
        values["memory_walk"] = [Segment(**segment) for segment in values.get("memory_walk", [])]
        return cls(**values)

    def at_batch(self, other: StepGraph, batch_size: int) -> StepGraph:
        """The description at ``batch_size``, by affine interpolation between this one and ``other``
        (same model, another batch size): FLOPs, bytes and activations grow linearly with the batch."""
        if other.batch_size == self.batch_size:
            raise ValueError("interpolation needs two different batch sizes")
        t = (batch_size - self.batch_size) / (other.batch_size - self.batch_size)
        keys = ["phase", "module", "op"]
        mine, theirs = _with_numbers(self.ops), _with_numbers(other.ops)
        merged = mine.merge(theirs[[*keys, *_NUMBERS]], on=keys, how="left", suffixes=("", "_b"))
        ops = merged[list(mine.columns)].copy()
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
        walk = [
            Segment(
                x.cycle,
                x.module,
                lerp(x.saved, y.saved),
                lerp(x.flow, y.flow),
                x.grads,
                lerp(x.workspace, y.workspace),
            )
            for x, y in matched_segments(
                self.memory_walk, other.memory_walk, self.saved_bytes, other.saved_bytes
            )
        ]
        others = {r["module"]: r for r in other.tp_regions}
        regions = [
            {
                **r,
                "input_bytes": lerp(r["input_bytes"], others.get(r["module"], r)["input_bytes"]),
                "output_bytes": lerp(r["output_bytes"], others.get(r["module"], r)["output_bytes"]),
            }
            for r in self.tp_regions
        ]
        return dataclasses.replace(
            self,
            batch_size=batch_size,
            tp_regions=regions,
            module_io=io,
            memory_walk=walk,
            ops=ops,
            saved_bytes=lerp(self.saved_bytes, other.saved_bytes),
            page_faults=(
                None
                if self.page_faults is None or other.page_faults is None
                else float(lerp(self.page_faults, other.page_faults))
            ),
            batch_bytes=lerp(self.batch_bytes, other.batch_bytes),
            layers=layers,
            kernels=[],
            kernels_between=(
                [
                    {"batch": self.batch_size, "kernels": self.kernels},
                    {"batch": other.batch_size, "kernels": other.kernels},
                ]
                if self.kernels and other.kernels
                else []
            ),
            # The host's work does not grow with the batch; a device a full queue behind makes it
            # wait, so the smaller of the two measurements is the host's own (perfmodel/issue.py).
            issue_s={
                phase: min(seconds, other.issue_s[phase])
                for phase, seconds in self.issue_s.items()
                if phase in other.issue_s
            },
            # The Python between the calls does not grow with the batch; freeing larger tensors does.
            gaps=_gaps_at(self.gaps, other.gaps, t),
            fixed_gaps=_fixed_gaps(self, other),
            subnormal_outputs={
                phase: [
                    lerp(count, other.subnormal_outputs[phase][0]),
                    lerp(total, other.subnormal_outputs[phase][1]),
                ]
                for phase, (count, total) in self.subnormal_outputs.items()
                if phase in other.subnormal_outputs
            },
            # A description without a notable share was not timed: as it runs, no slower. Between
            # the two measured factors, never beyond them (a ratio is no line in the batch).
            subnormal_slowdown={
                phase: min(max(mine + t * (theirs - mine), min(mine, theirs)), max(mine, theirs))
                for phase in {*self.subnormal_slowdown, *other.subnormal_slowdown}
                for mine, theirs in [
                    (self.subnormal_slowdown.get(phase, 1.0), other.subnormal_slowdown.get(phase, 1.0))
                ]
            },
        )


def _gaps_at(gaps: dict[str, list[float]], other: dict[str, list[float]], t: float) -> dict[str, list[float]]:
    """Each phase's [seconds, calls] of ``gaps`` and ``other`` at the fraction ``t`` of the way from one
    to the other (beyond them for ``t`` outside [0, 1]), never below zero."""
    return {
        phase: [max(a + t * (b - a), 0.0) for a, b in zip(pair, other[phase], strict=True)]
        for phase, pair in gaps.items()
        if phase in other
    }


def _fixed_gaps(graph: StepGraph, other: StepGraph) -> dict[str, list[float]]:
    """The gaps of two descriptions of one model on their line at batch 0 (StepGraph.fixed_gaps)."""
    return _gaps_at(graph.gaps, other.gaps, -graph.batch_size / (other.batch_size - graph.batch_size))


def matched_segments(
    walk: list[Segment], other: list[Segment], saved: int, other_saved: int
) -> list[tuple[Segment, Segment]]:
    """Each segment of ``walk`` beside its counterpart in ``other`` (the same model's walk at another
    batch), to interpolate between: the same module in the same cycle, or a module and one inside it
    (at one batch a dropout inside an attention saved last, at another the attention); where one walk
    has segments the other lacks (a layer LayerDrop skipped in one step), its own segment beside
    itself scaled by the two walks' ratio of saved bytes."""
    ratio = other_saved / saved if saved > 0 else 1.0
    pairs: list[tuple[Segment, Segment]] = []
    keys = [(s.cycle, s.module) for s in walk]
    others = [(s.cycle, s.module) for s in other]
    for tag, i0, i1, j0, j1 in difflib.SequenceMatcher(a=keys, b=others, autojunk=False).get_opcodes():
        if tag == "equal":
            pairs.extend(zip(walk[i0:i1], other[j0:j1], strict=True))
            continue
        for x, y in _aligned(walk[i0:i1], other[j0:j1]):
            if y is None:
                y = dataclasses.replace(
                    x,
                    saved=round(x.saved * ratio),
                    flow=round(x.flow * ratio),
                    workspace=round(x.workspace * ratio),
                )
            pairs.append((x, y))
    return pairs


def _related(x: Segment, y: Segment) -> bool:
    """Same cycle, and the same module or one inside the other."""
    a, b = x.module, y.module
    return x.cycle == y.cycle and (a == b or a.startswith(b + ".") or b.startswith(a + "."))


def _aligned(walk: list[Segment], other: list[Segment]) -> list[tuple[Segment, Segment | None]]:
    """The longest in-order pairing of related segments (_related) of two stretches of walk; each of
    ``walk``'s segments with its partner, or None."""
    n, m = len(walk), len(other)
    best = np.zeros((n + 1, m + 1), dtype=int)
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i, j] = max(best[i + 1, j], best[i, j + 1], best[i + 1, j + 1] + _related(walk[i], other[j]))
    out: list[tuple[Segment, Segment | None]] = []
    i = j = 0
    while i < n:
        if j < m and _related(walk[i], other[j]) and best[i, j] == best[i + 1, j + 1] + 1:
            out.append((walk[i], other[j]))
            i, j = i + 1, j + 1
        elif j < m and best[i, j] == best[i, j + 1]:
            j += 1
        else:
            out.append((walk[i], None))
            i += 1
    return out


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    return 0


def pipeline_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The units a pipeline cuts between: the model's top-level children, a container opened into its
    children (``nn.Sequential``: a ResNet's stages, a VGG's features; ``nn.ModuleList`` and
    ``nn.ModuleDict``, never called themselves: GPT-2's ``blocks``), so that every cut dnnperf's
    pipeline makes (``distributed.partition``) falls between two units."""
    units = []
    for name, child in model.named_children():
        if isinstance(child, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) and any(
            True for _ in child.children()
        ):
            units += [(f"{name}.{inner}", c) for inner, c in child.named_children()]
        else:
            units.append((name, child))
    return units


def pipeline_layers(workload: str, model: nn.Module) -> list[dict[str, Any]]:
    """``StepGraph.pipeline_layers`` of a suite workload's model ([] where pp cannot cut it)."""
    from dnnperf.distributed.partition import PIPELINE_SPLITS, layer_costs

    split = PIPELINE_SPLITS.get(workload)
    if split is None:
        return []
    layers = split.layers(model)
    shape, dtype = split.sample(model)
    costs = layer_costs(layers, torch.zeros(shape, dtype=dtype, device="meta"))
    unit_of = {}  # module -> the unit it is, or lies in
    for unit, module in pipeline_units(model):
        for inner in module.modules():
            unit_of.setdefault(id(inner), unit)
    # A layer's first unit: its own module's, or (a wrapper: GPT-2's embedding) its first child's;
    # None for a module made for the cut (VGG's Flatten), which lies between two units.
    return [
        {
            "layer": name,
            "unit": next((unit_of[id(m)] for m in layer.modules() if id(m) in unit_of), None),
            "cost": cost,
        }
        for (name, layer), cost in zip(layers, costs, strict=True)
    ]


def _saves_its_output(tensor: torch.Tensor) -> bool:
    """Whether the autograd node that made ``tensor`` keeps its result for backward (ReluBackward0,
    SoftmaxBackward0: torch names that saved field ``_saved_result``; a private name, so where torch
    renames it every node reads as one that does not, and the walk counts the producer's own save as
    a reader's, as tests/test_model_memory.py notices)."""
    return hasattr(type(tensor.grad_fn), "_saved_result")


def _storage(tensor: torch.Tensor) -> tuple[Any, int]:
    """(identity, bytes) of a tensor's storage; on "meta" (no storage) the tensor it views."""
    if tensor.device.type == "meta":
        base = tensor._base if tensor._base is not None else tensor
        return ("meta", id(base)), _nbytes(tensor)
    storage = tensor.untyped_storage()
    return (storage.data_ptr(), storage.device.type), storage.nbytes()


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def update_temporaries(optimizer: torch.optim.Optimizer, updated: Collection[int] | None = None) -> int:
    """Bytes the optimizer's update allocates for a moment on top of gradients and state, over the
    parameters that have a gradient (``updated``: their ids, as the step left them; None: every one
    that requires one): torch's optimizers skip the others (an embedding the step never looked up).

    torch's single-tensor implementations (the default off CUDA) update one parameter at a time, each
    with transient buffers of that parameter's size: SGD one for weight decay (``grad + wd * param``)
    and one for Nesterov; Adam and AdamW two (``exp_avg_sq.sqrt()``, then its quotient), plus one for
    Adam's coupled weight decay; RMSprop one (``square_avg.sqrt()``) plus one for weight decay; one
    more with ``maximize`` (``-grad``). Any other optimizer: two, a guess. The foreach implementations
    (CUDA's default) make them for a whole parameter group at once; the fused ones make none.
    """
    kind = type(optimizer).__name__
    worst = 0
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.requires_grad and (updated is None or id(p) in updated)]
        if not params or group.get("fused"):
            continue
        decay = bool(group.get("weight_decay"))
        if kind == "SGD":
            factor = decay + bool(group.get("nesterov"))
        elif kind in ("Adam", "AdamW"):
            decoupled = kind == "AdamW" or bool(group.get("decoupled_weight_decay"))
            factor = 2 + (decay and not decoupled)
        elif kind == "RMSprop":
            factor = 1 + decay
        else:
            factor = 2
        factor += bool(group.get("maximize"))
        foreach = group.get("foreach")
        if foreach is None:  # torch's default: foreach where every parameter is on CUDA
            foreach = all(p.device.type == "cuda" for p in params)
        sizes = [_nbytes(p) for p in params]
        worst = max(worst, factor * (sum(sizes) if foreach else max(sizes)))
    return worst


class _MemoryWalk:
    """Records the memory walk of one step (see :class:`Segment`): module hooks say which module runs,
    the saved-tensor pack hook what each saves, the step's stage marks where a cycle begins (a forward
    after a backward or update) and, when an update begins, which parameters got gradients."""

    def __init__(self, model: nn.Module, inputs: Any, stages: Callable[[str], Any]) -> None:
        self.model, self.stages = model, stages
        self.names = {id(m): name or "(root)" for name, m in model.named_modules()}
        self.leaves = {id(m) for m in model.modules() if next(m.children(), None) is None}
        self.owner: dict[int, str] = {}
        for name, module in model.named_modules():
            for parameter in module.parameters(recurse=False):
                self.owner.setdefault(id(parameter), name or "(root)")
        # Alive before the step and after it: not activations even when saved (a weight, the batch,
        # batch norm's running statistics).
        tensors = [*model.parameters(), *model.buffers(), *tensors_in(inputs)]
        self.excluded = {_storage(t)[0] for t in tensors}
        self.stack: list[str] = []
        self.stage = "other"  # the stage running now
        self.last = "other"  # the last stage entered
        self.cycle = 0  # a step that marks no stages is one cycle
        self.segments: list[dict[str, Any]] = []
        #: per segment: the largest storage saved there outside any leaf module (-1: a leaf's own)
        self.largest: list[int] = []
        #: per segment: whether a module's call begins there
        self.calls: list[bool] = []
        self.flow = 0
        self.seen: set[Any] = set()
        #: per (cycle, storage) saved that needs a gradient: the first and last segment whose operators
        #: read it (-1: none yet) and its bytes. Backward accumulates its gradient from the last
        #: reader to the first.
        self.uses: dict[tuple[int, Any], list[int]] = {}
        #: per cycle: parameters with a gradient when its update began
        self.updated: dict[int, list[torch.nn.Parameter]] = {}
        self.handles: list[Any] = []

    def __enter__(self) -> _MemoryWalk:
        for module in self.model.modules():
            self.handles.append(module.register_forward_pre_hook(self._enter))
            self.handles.append(module.register_forward_hook(self._leave, always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """The step's ``stages``: marks the walk's stage, then the counter's."""
        forward_side = stage not in ("backward", "update")
        if forward_side and self.last in ("backward", "update"):
            self.cycle += 1
            self.seen.clear()
        self.last = stage
        if stage == "update":
            self.updated.setdefault(self.cycle, []).extend(
                p for p in self.model.parameters() if p.grad is not None
            )
        previous, self.stage = self.stage, stage
        try:
            with self.stages(stage):
                yield
        finally:
            self.stage = previous

    def _recording(self) -> bool:
        return self.stage not in ("backward", "update")

    def _segment(self, module: str, leaf: bool = False, call: bool = False) -> None:
        if self._recording():
            self.segments.append(
                {"cycle": self.cycle, "module": module, "saved": 0, "flow": self.flow, "grads": 0}
            )
            self.largest.append(0 if not leaf else -1)
            self.calls.append(call)

    def _enter(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module), type(module).__name__)
        self.stack.append(name)
        if id(module) in self.leaves:
            self.flow = _nbytes(args)
        self._segment(name, leaf=id(module) in self.leaves, call=True)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self.names.get(id(module), type(module).__name__)
        if name in self.stack:
            del self.stack[len(self.stack) - 1 - self.stack[::-1].index(name) :]
        if id(module) in self.leaves:
            self.flow = _nbytes(args) + _nbytes(output)
            if self.segments and self._recording():
                self.segments[-1]["flow"] = self.flow
        self._segment(self.stack[-1] if self.stack else "(none)")

    def pack(self, tensor: torch.Tensor) -> None:
        if not self._recording():
            return
        key, nbytes = _storage(tensor)
        if key in self.excluded:
            return
        if key in self.seen:
            use = self.uses.get((self.cycle, key))
            if use is not None and tensor.requires_grad:
                here = len(self.segments) - 1
                use[0] = here if use[0] < 0 else use[0]
                use[1] = here
            return
        self.seen.add(key)
        if not self.segments or self.segments[-1]["cycle"] != self.cycle:
            self._segment(self.stack[-1] if self.stack else "(none)")
        if tensor.requires_grad:
            here = len(self.segments) - 1
            # An operator that keeps its own output (a ReLU, a softmax) saves it first: not a reader.
            first = -1 if _saves_its_output(tensor) else here
            self.uses[(self.cycle, key)] = [first, here, nbytes]
        self.segments[-1]["saved"] += nbytes
        if self.largest[-1] >= 0:  # not a leaf module's own segment
            self.largest[-1] = max(self.largest[-1], nbytes)

    def result(self, workspace: Mapping[str, int] | None = None, outside_flow: int = 0) -> list[Segment]:
        """The walk, gradients and ``workspace`` (module -> bytes) placed, segments that change nothing
        for the walk dropped. ``outside_flow``: the flow of a segment outside any module that saved
        something, where a double backward runs (0: none does)."""
        workspace = workspace or {}
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        held = [0] * len(self.segments)  # gradients being accumulated, per segment
        for cycle in range(self.cycle + 1):
            indices = [i for i, s in enumerate(self.segments) if s["cycle"] == cycle]
            if not indices:
                continue
            last = {self.segments[i]["module"]: i for i in indices}
            unique = {id(p): p for p in self.updated.get(cycle, trainable)}
            for parameter in unique.values():
                where = last.get(self.owner.get(id(parameter), ""), indices[-1])
                self.segments[where]["grads"] += _nbytes(parameter)
            # A module called several times (a recurrent cell stepped by hand, a layer applied again):
            # backward reaches its last call first; every call before it makes a partial gradient of its
            # parameters' size and adds it to the sum so far, and while the largest is added the sum,
            # the partial and the new sum are alive (a GRU cell of 256 stepped 16 times: 1.69 MB of
            # temporaries at its peak, its weights 0.89 MB, the largest 0.79).
            owned: dict[str, int] = {}
            biggest: dict[str, int] = {}
            for parameter in unique.values():
                module = self.owner.get(id(parameter), "")
                owned[module] = owned.get(module, 0) + _nbytes(parameter)
                biggest[module] = max(biggest.get(module, 0), _nbytes(parameter))
            starts: dict[str, list[int]] = {}
            for i in indices:
                if self.calls[i]:
                    starts.setdefault(self.segments[i]["module"], []).append(i)
            for module, nbytes in owned.items():
                for i in starts.get(module, [])[:-1]:
                    held[i] += nbytes + biggest[module]
        # A tensor saved in several segments (keys read by each of a loop's iterations, an input
        # three projections read) has its gradient accumulated by backward from the last of them to
        # the first: held beside what flows there (a slot attention's keys and values, read by three
        # iterations, made its peak 2.2 MB above the flow alone at batch 4).
        for first, last, nbytes in self.uses.values():
            for index in range(max(first, 0), last):
                held[index] += nbytes
        for s, largest, accumulating in zip(self.segments, self.largest, held, strict=True):
            # Operators outside leaf modules (a loss, attention written as functions): the gradient
            # that flows there is about the size of what they save, arriving and leaving.
            s["flow"] = max(s["flow"], 2 * largest) + accumulating
            if s["module"] == "(none)" and s["saved"]:
                s["flow"] = max(s["flow"], outside_flow)
            s["workspace"] = workspace.get(s["module"], 0)
        kept: list[Segment] = []
        for s in self.segments:
            previous = kept[-1] if kept else None
            same = previous is not None and previous.cycle == s["cycle"] and previous.flow == s["flow"]
            if same and not s["saved"] and not s["grads"] and s["workspace"] <= previous.workspace:
                continue
            kept.append(Segment(**s))
        return kept


def operator_row(r: OpCall) -> dict[str, Any]:
    """One counted operator as a StepGraph's row."""
    return {
        "phase": r.phase,
        "module": r.module,
        "op": r.name,
        "family": r.family,
        "dtype": r.dtype or "float32",
        "kind": r.kind,
        "rows": float(r.rows),
        "flops": float(r.flops or 0),
        "bytes": float(r.bytes_read + r.bytes_written),
        "calls": float(r.calls),
        "inner_calls": float(r.inner_calls),
    }


def capture(
    model: nn.Module,
    run_step: Callable[[Callable[[str], Any]], Any],
    name: str,
    batch_size: int,
    batch_bytes: int,
    optimizers: list[torch.optim.Optimizer] | None = None,
    inputs: Any = None,
    warm: bool = True,
) -> StepGraph:
    """Run ``run_step(stages)`` (one training step; ``stages`` is its stage clock) twice and describe
    the second. ``inputs``: the batch, whose storages are not activations when saved for backward.
    ``warm=False``: the caller ran the first step itself; describe the next.

    The first step is not counted: it creates the optimizer's state (Adam's ``zeros_like`` of every
    parameter twice, SGD's momentum as a clone of the gradient), which no later step repeats; counted,
    it put 9.3 ms of a 136 ms step into seq2seq's predicted update."""
    if warm:
        run_step(no_stages)
    layers: dict[str, Layer] = {}
    handles = []
    holders: dict[int, tuple[int, list[str]]] = {}
    for child_name, child in pipeline_units(model):
        for parameter in child.parameters():
            if parameter.requires_grad:
                names = holders.setdefault(id(parameter), (_nbytes(parameter), []))[1]
                if child_name not in names:
                    names.append(child_name)

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

    from dnnperf.distributed.tensor_parallel import split_layout

    tp_regions: dict[str, dict[str, Any]] = {}
    for region, kind, count in split_layout(model):

        def region_hook(module: nn.Module, args: Any, output: Any, _region=(region, kind, count)) -> None:
            name = _region[0]
            if name not in tp_regions:
                needing = [t for t in tensors_in(args) if t.requires_grad]
                tp_regions[name] = {
                    "module": name,
                    "kind": _region[1],
                    "count": _region[2],
                    "input_bytes": sum(_nbytes(t) for t in needing),
                    "output_bytes": _nbytes(output),
                }

        handles.append(model.get_submodule(region).register_forward_hook(region_hook))

    kernels, zeros = KernelCalls(), ZeroCounts()

    subnormals = SubnormalCount()

    def observe(*seen: Any) -> None:
        kernels(*seen)
        zeros(*seen)
        subnormals(*seen)

    counter = OpCounter(model, observer=observe)
    walk = _MemoryWalk(model, inputs, counter)
    try:
        with counter, walk, observe_saved(walk.pack):
            run_step(walk)
    finally:
        for handle in handles:
            handle.remove()
    rows = [
        {**operator_row(r), "zeros": float(zeros.zeros.get((r.module, r.phase, r.name), 0))}
        for r in counter.table()
    ]
    module_params: dict[str, int] = {}
    seen: set[int] = set()
    frozen, trainable = 0, 0
    for module_name, module in model.named_modules():
        for parameter in module.parameters(recurse=False):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if parameter.requires_grad:
                trainable += 1
                key = module_name or "(root)"
                module_params[key] = module_params.get(key, 0) + _nbytes(parameter)
            else:
                frozen += _nbytes(parameter)
    # What the optimizers keep per element (momentum, Adam's moments), not their step counters: the
    # memory profiler counts the same (probes/memory.py: optimizer_tensors).
    state = sum(
        _nbytes(value)
        for opt in optimizers or []
        for per_param in opt.state.values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor) and value.numel() > 1
    )
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    described = kernels.to_list()
    # A convolution's double backward (``_convolution_double_backward``) holds about three tensors of
    # its output's size and two of its input's at once (two convolutions and a clone of each side:
    # wgan_gp's peak, traced); it runs when backward reaches the penalty's operators, outside modules.
    double = max(
        (
            3 * module_io[m][1] + 2 * module_io[m][0]
            for m in workspace.double_backward_modules(described)
            if m in module_io
        ),
        default=0,
    )
    segments = walk.result(workspace.per_module(described, device), outside_flow=double)
    # The parameters an update found with a gradient (all, where the step marks no update).
    with_grads = [id(p) for params in walk.updated.values() for p in params]
    updated = set(with_grads) if walk.updated else None
    per_cycle: dict[int, int] = {}
    for segment in segments:
        per_cycle[segment.cycle] = per_cycle.get(segment.cycle, 0) + segment.saved
    return StepGraph(
        name=name,
        batch_size=batch_size,
        ops=pd.DataFrame(rows, columns=[*_COLUMNS, *_NUMBERS]),
        param_bytes=sum(module_params.values()),
        module_param_bytes=module_params,
        optimizer_state_bytes=state,
        saved_bytes=max(per_cycle.values(), default=0),
        batch_bytes=batch_bytes,
        layers=list(layers.values()),
        module_io=module_io,
        memory_walk=segments,
        update_temp_bytes=max((update_temporaries(opt, updated) for opt in optimizers or []), default=0),
        frozen_param_bytes=frozen,
        param_tensors=trainable,
        tp_regions=list(tp_regions.values()),
        shared_params=[{"bytes": n, "layers": names} for n, names in holders.values() if len(names) > 1],
        kernels=described,
        subnormal_outputs=subnormals.counts,
    )


@dataclass(frozen=True)
class ScalableGraph:
    """A model described at two batch sizes: its step at any batch size by affine interpolation
    (:meth:`StepGraph.at_batch`), the description itself at the batch it was made at."""

    graph: StepGraph
    other: StepGraph

    @property
    def name(self) -> str:
        return self.graph.name

    def at(self, batch_size: int) -> StepGraph:
        if batch_size == self.graph.batch_size:
            return dataclasses.replace(self.graph, fixed_gaps=_fixed_gaps(self.graph, self.other))
        return self.graph.at_batch(self.other, batch_size)


def describe_model(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    name: str = "model",
    count_faults: bool = True,
    time_gaps: bool = False,
) -> StepGraph:
    """Describe one training step of a user's model on an example batch (a tensor, or a dict, tuple or
    list of tensors: :func:`example_rows`). Default loss: the sum of the output (the model called on
    the tensor, the dict's items as keywords, the tuple's as arguments); default optimizer: SGD with
    momentum. On the CPU, ``count_faults`` runs twelve more plain steps to count the step's page
    faults (``page_faults``); ``time_gaps`` seven more to time the host between their operator calls
    (``gaps``, which ``ComputeOptions(host_gaps=True)`` charges); where a phase's outputs are notably
    subnormal, twelve more time their slowdown (``subnormal_slowdown``, subnormals.flushed_slowdown).
    The steps train the model: its weights, buffers, gradients, the optimizer's state and the random
    generators are put back as they were afterwards (``dnnperf.restore``)."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rows = example_rows(batch)
    first = tensors_in(batch)[0]
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("the model has no trainable parameters")
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def loss_of(m: nn.Module, b: Any) -> torch.Tensor:
        if loss_fn is not None:
            return loss_fn(m, b)
        out = m(**b) if isinstance(b, Mapping) else m(*b) if isinstance(b, (list, tuple)) else m(b)
        return sum(t.float().sum() for t in _flat(out))

    def step(stages: Callable[[str], Any]) -> None:
        with stages("forward"):
            loss = loss_of(model, batch)
        with stages("backward"):
            loss.backward()
        with stages("update"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    with put_back(model, [optimizer]):
        try:  # the first, uncounted step alone: what fails there is the model's or its batch's
            step(no_stages)
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as error:
            first_line = (str(error).strip().splitlines() or [""])[0]
            failed = f"{type(error).__name__}: {first_line}"
            raise UsageError(
                f"a training step of the model on an example batch of {rows} failed: {failed}"
            ) from error
        graph = capture(model, step, name, rows, _nbytes(batch), [optimizer], inputs=batch, warm=False)
        if count_faults and first.device.type == "cpu":  # in this process: see perfmodel/faults.py
            graph.page_faults = steady_page_faults(lambda: step(no_stages))
        if first.device.type == "cpu" and notable(graph.subnormal_outputs):
            graph.subnormal_slowdown = flushed_slowdown(step)
        if first.device.type == "cuda":
            graph.issue_s = issue_seconds(step, first.device)
        elif time_gaps and first.device.type == "cpu":
            graph.gaps = gap_seconds(step)
    return graph


def example_rows(batch: Any) -> int:
    """The size of an example batch: a tensor, or a dict, tuple or list of tensors (nested), whose first
    tensor's first dimension is the batch; UsageError where there is none."""
    tensors = tensors_in(batch)
    if not tensors or tensors[0].dim() == 0:
        raise UsageError(
            "the example batch must be a tensor, or a dict, tuple or list of tensors, whose first "
            f"dimension is the batch; got {type(batch).__name__}"
            + ("" if not tensors else " whose first tensor is a scalar")
        )
    return int(tensors[0].shape[0])


def first_rows(batch: Any, rows: int) -> Any:
    """``batch`` (as :func:`example_rows` takes it) cut to its first ``rows`` examples: every tensor
    with a batch dimension sliced, the structure kept."""
    if isinstance(batch, torch.Tensor):
        return batch[:rows] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        cut = {key: first_rows(value, rows) for key, value in batch.items()}
        try:  # the mapping's own type where it takes a dict (a BatchEncoding does)
            return type(batch)(cut)
        except TypeError:
            return cut
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple: its fields as arguments
        return type(batch)(*(first_rows(value, rows) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(first_rows(value, rows) for value in batch)
    return batch


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
    which = _device_identity(device)
    identity = json.dumps(
        [workload, preset, batch_size, which, described, __version__, torch.__version__, "graph-34"],
        sort_keys=True,
        default=str,
    )
    return f"{workload}/{preset}/{batch_size}/{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def _device_identity(device: str) -> str:
    """``device``, and for a GPU which one (its host and model): GPUs run different kernels; for a CPU
    its host and thread count, whose page faults and subnormal slowdown a description keeps."""
    if device == "cpu":
        return f"cpu/{platform.node()}/{torch.get_num_threads()}"
    if not device.startswith("cuda"):
        return device
    from dnnperf.hardware import device_key

    return f"{device}/{device_key(device)}"


def describe_workload(
    workload: str, preset: str, batch_size: int, device: str = "cpu", count_faults: bool = False
) -> StepGraph:
    """One counted training step of a suite workload at ``batch_size`` (cached on disk). The step
    runs on ``device`` ("cpu": the operator stream this machine runs; "meta": shapes only, for presets
    too large to run here). ``count_faults``: also its page faults on this CPU (perfmodel/faults.py:
    fresh processes), once, kept with the description; only a machine that charges them needs them."""
    return describe_workload_batches(workload, preset, [batch_size], device, count_faults)[0]


def describe_workload_batches(
    workload: str,
    preset: str,
    batch_sizes: Sequence[int],
    device: str = "cpu",
    count_faults: bool = False,
) -> list[StepGraph]:
    """:func:`describe_workload` at each of ``batch_sizes``; the page faults of those not counted
    before are counted together, in fresh processes side by side with the descriptions
    (faults.counting_workload_faults). Each description is cached as soon as it is made, so a stop
    while faults are counted keeps it."""
    from dnnperf.workloads import get_workload

    for batch_size in batch_sizes:
        if batch_size <= 0:
            raise UsageError(f"batch size must be a positive integer, got {batch_size}")
    spec = get_workload(workload)  # UsageError with suggestions for an unknown name
    if preset not in spec.presets:
        raise UsageError(f"{workload} has no preset {preset!r} (presets: {', '.join(spec.presets)})")
    store = JsonCache("model-graph")
    keys = {b: _cache_key(spec.name, preset, b, device) for b in batch_sizes}  # each batch size once
    graphs: dict[int, StepGraph] = {}
    for batch_size, key in keys.items():
        found = store.get(key)
        if isinstance(found, dict):
            with contextlib.suppress(KeyError, TypeError, ValueError):  # older or damaged: count again
                graphs[batch_size] = StepGraph.from_dict(found)
    counting = count_faults and device == "cpu"
    uncounted = [b for b in keys if counting and (b not in graphs or graphs[b].page_faults is None)]
    # The fresh processes count while this one describes: neither is timed.
    with counting_workload_faults(spec.name, preset, uncounted) as faults_counted:
        for batch_size, key in keys.items():
            if batch_size not in graphs:
                graphs[batch_size] = _capture_workload(spec, preset, batch_size, device)
                store.put(key, graphs[batch_size].to_dict())
        for batch_size, faults in faults_counted().items():
            graphs[batch_size].page_faults = faults
            store.put(keys[batch_size], graphs[batch_size].to_dict())
    # Timed once the fault counters beside it have stopped.
    for batch_size, graph in graphs.items():
        if device == "cpu" and notable(graph.subnormal_outputs) and not graph.subnormal_slowdown:
            graph.subnormal_slowdown = _time_subnormals(spec, preset, batch_size)
            store.put(keys[batch_size], graph.to_dict())
    return [graphs[b] for b in batch_sizes]


def _capture_workload(spec: Workload, preset: str, batch_size: int, device: str) -> StepGraph:
    """The counted step of the suite workload ``spec`` at ``batch_size`` on ``device``."""
    torch.manual_seed(0)
    task = spec.build(preset, device)
    batch = {k: v.to(device) for k, v in spec.data(preset).synthesize(batch_size, 0).items()}
    try:
        graph = capture(
            task.model,
            lambda counter: task.step(batch, counter),
            f"{spec.name}/{preset}",
            batch_size,
            _nbytes(batch),
            task.optimizers(),
            inputs=batch,
        )
    except ValueError as error:  # e.g. BatchNorm on one value per channel: training itself fails
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(
            f"{spec.name} ({preset}) cannot train at a batch of {batch_size} per device "
            f"(micro-batch, with pp): {first}"
        ) from None
    graph.pipeline_layers = pipeline_layers(spec.name, task.model)
    if torch.device(device).type == "cuda":
        with put_back(task.model, task.optimizers()):
            graph.issue_s = issue_seconds(lambda stages: task.step(batch, stages), torch.device(device))
    return graph


def _time_subnormals(spec: Workload, preset: str, batch_size: int) -> dict[str, float]:
    """subnormals.flushed_slowdown of the suite workload ``spec``'s CPU step at ``batch_size``, built as
    :func:`_capture_workload` builds it."""
    torch.manual_seed(0)
    task = spec.build(preset, "cpu")
    batch = spec.data(preset).synthesize(batch_size, 0)
    task.step(batch)  # the optimizer's state made, as in the described step
    return flushed_slowdown(lambda stages: task.step(batch, stages))


def workload_graph(
    workload: str,
    preset: str,
    batch_size: int,
    exact: bool = True,
    count_faults: bool = False,
    device: str = "cpu",
) -> StepGraph:
    """The description at ``batch_size`` on ``device``: counted at it (``exact``), or interpolated from
    the counts at BASE_BATCHES (a sweep over batch sizes then counts only twice). An interpolated
    description has no kernels to replay, so neither has a base batch's here: every point of a sweep is
    the roofline's."""
    if exact:
        return describe_workload(workload, preset, batch_size, device, count_faults=count_faults)
    if batch_size in BASE_BATCHES:
        graph = describe_workload(workload, preset, batch_size, device, count_faults=count_faults)
        return dataclasses.replace(graph, kernels=[])
    a, b = (
        dataclasses.replace(graph, kernels=[])
        for graph in describe_workload_batches(workload, preset, BASE_BATCHES, device, count_faults)
    )
    return a.at_batch(b, batch_size)
