"""Per-layer operator times of real training steps, with the FLOPs, bytes and library of each.

One step is *counted* (:class:`~dnnperf.probes.opcount.OpCounter` with formulas, bytes and library
attribution: some tens of microseconds of Python per operator, so its time is not used); the steps
after it are *timed* by the same counter with counting off (a few microseconds per operator, outside
the timed region). Each operator call is timed on its own: host clock on the CPU, where operators run
synchronously; CUDA events on the current stream on a GPU, resolved after the step synchronised.

The result, a :class:`~dnnperf.results.layers.LayerProfile`, is one row per (module, phase, operator)
with that row's time in every timed step; the tables people read (per layer, per layer type,
coverage, libraries) are functions over it in :mod:`dnnperf.analysis.layers`.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from dnnperf.devices import synchronize
from dnnperf.probes.memory import AllocatorEvents, ChangingValue, StepTrace
from dnnperf.probes.opcount import NO_MODULE, ROOT_MODULE, UNATTRIBUTED, OpCounter, OpRecord
from dnnperf.results.layers import LayerProfile, ModuleInfo, OpTiming

# Module classes -> layer type (seed 001 compares convolution and fully-connected layers).
_CATEGORIES: tuple[tuple[tuple[type[nn.Module], ...], str], ...] = (
    (
        (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
        "convolution",
    ),
    ((nn.Linear, nn.Bilinear), "linear"),
    ((nn.RNNBase, nn.RNNCellBase), "recurrent"),
    ((nn.MultiheadAttention,), "attention"),
    (
        (
            nn.modules.batchnorm._NormBase,
            nn.LayerNorm,
            nn.GroupNorm,
            nn.LocalResponseNorm,
            *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
        ),
        "normalization",
    ),
    (
        (
            nn.modules.pooling._MaxPoolNd,
            nn.modules.pooling._AvgPoolNd,
            nn.modules.pooling._AdaptiveAvgPoolNd,
            nn.modules.pooling._AdaptiveMaxPoolNd,
        ),
        "pooling",
    ),
    ((nn.Embedding, nn.EmbeddingBag), "embedding"),
    (
        (
            nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
            nn.Mish, nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softmax,
            nn.LogSoftmax, nn.Softplus, nn.GLU, nn.Threshold,
        ),
        "activation",
    ),
)  # fmt: skip
#: Layer types in display order.
CATEGORIES = (
    "convolution",
    "linear",
    "recurrent",
    "attention",
    "normalization",
    "pooling",
    "activation",
    "embedding",
    "other",
    "instrumentation",
)


def layer_category(module: nn.Module, families: Iterable[str] = ()) -> str:
    """The layer type of a module: torch's own layer classes by class; any other module by the operators
    it runs itself in forward (``families``, as the operator counter names them: transformers' ``Conv1D``
    runs ``addmm``, a linear layer), then by its class's name (``...Attention``, ``...Norm``,
    ``...Embedding``); else "other"."""
    for classes, category in _CATEGORIES:
        if isinstance(module, classes):
            return category
    leaf = next(module.children(), None) is None
    category = category_of_operators(set(families), leaf)
    if category is not None:
        return category
    name = type(module).__name__.lower()
    for word, category in (("attention", "attention"), ("norm", "normalization"), ("embed", "embedding")):
        if word in name:
            return category
    return "other"


def category_of_operators(families: set[str], leaf: bool = True) -> str | None:
    """The layer type the operator families of a module's own forward make it (None: none decides):
    scores through a softmax between matrix products are attention; then, for a leaf (a block's own
    glue, its residual adds and reshapes, says nothing of it), the heaviest kind of work."""
    families = families - {"memory", "free"}  # views and copies say nothing of a layer
    if "attention" in families or {"matmul", "softmax"} <= families:
        return "attention"
    if not leaf or "random" in families:  # dropout's masking is no activation
        return None
    for family, category in (
        ("convolution", "convolution"),
        ("rnn", "recurrent"),
        ("matmul", "linear"),
        ("normalization", "normalization"),
        ("pooling", "pooling"),
        ("embedding", "embedding"),
    ):
        if family in families:
            return category
    if families and families <= {"elementwise", "softmax"}:
        return "activation"
    return None


#: The layer timer's own forward work (finding each call's autograd nodes), timed apart: not a layer.
PROFILER = "(profiler)"


def describe_modules(model: nn.Module, counted: Iterable[OpRecord] = ()) -> dict[str, ModuleInfo]:
    """Every module by qualified name (the model itself as ``(root)``) with its layer type (from the
    operators ``counted`` books to it in forward), plus the pseudo-modules the counter books work under
    that no module did."""
    families: dict[str, set[str]] = {}
    for record in counted:
        if record.phase == "forward":
            families.setdefault(record.module, set()).add(record.family)
    modules: dict[str, ModuleInfo] = {}
    for name, module in model.named_modules():
        key = name or ROOT_MODULE
        category = layer_category(module, families.get(key, ()))
        modules.setdefault(key, ModuleInfo(type(module).__name__, category))
    modules[NO_MODULE] = ModuleInfo("(outside the model)", "other")
    modules[UNATTRIBUTED] = ModuleInfo("(unattributed backward)", "other")
    modules[PROFILER] = ModuleInfo("(dnnperf's layer hooks)", "instrumentation")
    return modules


def build_profile(
    model: nn.Module,
    counted: list[OpRecord],
    module_calls: Mapping[str, int],
    timed: list[list[OpRecord]],
    step_s: list[float],
    timing: str,
    formula_errors: Mapping[str, str],
    layer_seconds: list[dict[str, dict[str, float]]] | None = None,
) -> LayerProfile:
    """Join one counted step's table with the timed steps' tables, key by key.

    FLOPs and bytes per call come from the counted step and are scaled to the calls of the timed
    steps (the median step's, for operators whose calls vary with the data)."""
    by_key = {(r.module, r.phase, r.name): r for r in counted}
    keys: dict[tuple[str, str, str], None] = dict.fromkeys(by_key)
    for table in timed:
        keys.update(dict.fromkeys((r.module, r.phase, r.name) for r in table))
    steps = [{(r.module, r.phase, r.name): r for r in table} for table in timed]
    ops = []
    for key in keys:
        seen = [step.get(key) for step in steps]
        calls = sorted(r.calls if r is not None else 0 for r in seen)
        median_calls = calls[len(calls) // 2] if calls else by_key[key].calls
        reference = by_key.get(key) or next(r for r in seen if r is not None)
        counted_record = by_key.get(key)
        scale = (
            median_calls / counted_record.calls if counted_record is not None and counted_record.calls else 0
        )
        flops = (
            counted_record.flops * scale
            if counted_record is not None and counted_record.flops is not None
            else None
        )
        ops.append(
            OpTiming(
                module=key[0],
                phase=key[1],
                op=key[2],
                family=reference.family,
                calls=median_calls,
                flops=flops,
                bytes_read=counted_record.bytes_read * scale if counted_record is not None else 0.0,
                bytes_written=counted_record.bytes_written * scale if counted_record is not None else 0.0,
                library=counted_record.library if counted_record is not None else None,
                dtype=reference.dtype if counted_record is None else counted_record.dtype,
                seconds=[r.seconds or 0.0 if r is not None else 0.0 for r in seen],
            )
        )
    modules = describe_modules(model, counted)
    for name, calls in module_calls.items():
        if name in modules:
            modules[name].calls = calls
    per_layer: dict[str, dict[str, list[float]]] = {}
    for index, step in enumerate(layer_seconds or []):
        for module, phases in step.items():
            for phase, seconds in phases.items():
                values = per_layer.setdefault(module, {}).setdefault(phase, [0.0] * len(layer_seconds or []))
                values[index] = seconds
    return LayerProfile(
        steps=len(layer_seconds or []),
        timing=timing,
        ops=ops,
        modules=modules,
        step_s=step_s,
        formula_errors=dict(formula_errors),
        layer_seconds=per_layer,
        op_steps=len(timed),
    )


class LayerTimer:
    """Each layer's own time per step, forward and backward, from hooks only (no dispatch mode).

    Forward: a pre- and a post-hook on every module; a module's own time is its call's time minus its
    children's calls. Backward: when a module's forward returns, the autograd nodes it created are
    found by walking back from its outputs to nodes already known (its children's, the previous
    layers', the model's inputs); each gets a pre- and a post-hook timing the node. Autograd's own
    work between nodes, and nodes no module made (the loss), are no layer's.

    On CUDA a layer's time is the device time of the work it launched: the profiler's kernels (copies
    and memsets too), each placed by the host moment of its launch in the module that was innermost
    (forward) or in the node that was running (backward), as the hooks saw them on the host clock.
    Events recorded by the hooks would time the device's timeline between them instead, which holds
    idle gaps wherever the host is the bottleneck: the hooks' own work starves a fast GPU (resnet50
    `full` at batch 64 on an H200: the layers' forward summed to 18.5 ms of a 10.7 ms forward).

    Costs a few microseconds per module call and per autograd node: far less than timing every
    operator through a dispatch mode (on CUDA, plus the profiler's tracing of each step).
    """

    def __init__(self, model: nn.Module, device: Any = None) -> None:
        self.model = model
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._cuda = self.device.type == "cuda"
        self._names = {id(m): name or ROOT_MODULE for name, m in model.named_modules()}
        self._owners: dict[int, str] = {}
        for name, module in model.named_modules():
            for parameter in module.parameters(recurse=False):
                self._owners.setdefault(id(parameter), name or ROOT_MODULE)
        # A parameter's AccumulateGrad node outlives the step (autograd reuses it): its hooks are
        # removed after every step, not left to pile up.
        self._node_handles: list[Any] = []
        self._handles: list[Any] = []
        self._stack: list[list[Any]] = []  # [name, start, children's inclusive time]
        self._claimed: dict[int, Any] = {}  # node id -> node (kept alive for the step)
        self._boundary: set[int] = set()
        self._node_start: dict[int, Any] = {}
        self._forward: dict[str, Any] = {}
        self._backward: dict[str, Any] = {}
        self._overhead = 0.0
        # CUDA: the innermost module over time and each node's (start, end, owner), on the host clock,
        # and the profiler tracing the device's work of the step.
        self._changes: list[tuple[float, str]] = []
        self._nodes: list[tuple[float, float, str]] = []
        self._trace: AllocatorEvents | None = None

    def _now(self) -> float:
        return time.perf_counter()

    def _start_trace(self) -> None:
        self._trace = AllocatorEvents(self.device, origin=0.0, memory=False).__enter__()

    def _stop_trace(self, *exc: Any) -> StepTrace:
        """Stop the profiler; its trace is read unless the block ended with an error (``exc``)."""
        trace, self._trace = self._trace, None
        if trace is None:
            return StepTrace()
        trace.__exit__(*(exc or (None, None, None)))
        return trace.trace

    def __enter__(self) -> LayerTimer:
        try:
            for module in self.model.modules():
                self._handles.append(module.register_forward_pre_hook(self._pre))
                self._handles.append(module.register_forward_hook(self._post, always_call=True))
            if self._cuda:
                self._start_trace()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        try:
            self._stop_trace(*exc)
        finally:
            self._reset()

    def _reset(self) -> None:
        for handle in self._node_handles:
            handle.remove()
        self._node_handles.clear()
        self._stack.clear()
        self._claimed.clear()
        self._boundary.clear()
        self._node_start.clear()
        self._forward, self._backward = {}, {}
        self._overhead = 0.0
        self._changes, self._nodes = [], []

    # -- forward --------------------------------------------------------------------------------------

    def _pre(self, module: nn.Module, args: Any) -> None:
        entered = time.perf_counter()
        # The nodes behind this call's inputs existed before it: its walk stops there (the outermost
        # call's inputs' nodes are no layer's at all).
        inputs = {id(t.grad_fn) for t in _tensor_leaves(args) if t.grad_fn is not None}
        if not self._stack:
            self._boundary.update(inputs)
        parent = self._stack[-1] if self._stack else None
        start = self._now()
        self._stack.append([self._names.get(id(module), type(module).__name__), start, [], inputs])
        if self._cuda:
            self._changes.append((start, self._stack[-1][0]))
        if parent is not None and not self._cuda:
            # This hook's own work falls inside the parent's call: timed apart and taken out of it.
            self._hook_time(parent, entered, start)

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        end = self._now()
        name = self._names.get(id(module), type(module).__name__)
        for i in range(len(self._stack) - 1, -1, -1):  # normally the last entry
            if self._stack[i][0] == name:
                _, start, children, inputs = self._stack[i]
                del self._stack[i:]
                break
        else:
            return
        # own time = this call minus its children's calls (as (start, end) pairs, resolved later)
        self._forward.setdefault(name, []).append((start, end, children))
        if self._cuda:
            self._changes.append((end, self._stack[-1][0] if self._stack else NO_MODULE))
        if self._stack:
            self._stack[-1][2].append((start, end))
        if torch.is_grad_enabled():
            self._claim(output, name, inputs)
        # The walk, like the rest of this hook, is this profiler's own work, not the parent's. (On
        # CUDA host work delays launches, not the GPU's timeline the events measure.)
        if self._stack and not self._cuda:
            self._hook_time(self._stack[-1], end, time.perf_counter())

    def _hook_time(self, parent: list[Any], start: float, end: float) -> None:
        """Seconds our hooks spent inside ``parent``'s call: out of its own time, into ``(profiler)``."""
        self._overhead += end - start
        parent[2].append((start, end))

    def _claim(self, output: Any, name: str, inputs: set[int]) -> None:
        # Walk the graph this call made, from its outputs back to its inputs' nodes, through its
        # children's nodes (already theirs) to the nodes of its own code between them.
        stack = [t.grad_fn for t in _tensor_leaves(output) if t.grad_fn is not None]
        visited: set[int] = set()
        while stack:
            node = stack.pop()
            key = id(node)
            if key in visited or key in self._boundary or key in inputs:
                continue
            visited.add(key)
            if key in self._claimed:
                stack.extend(n for n, _ in node.next_functions if n is not None)
                continue
            self._claimed[key] = node
            variable = getattr(node, "variable", None)
            if variable is not None:  # gradient accumulation into a parameter: its module's work
                owner = self._owners.get(id(variable))
                if owner is not None:
                    self._node_handles.append(node.register_prehook(self._node_pre(key)))
                    self._node_handles.append(node.register_hook(self._node_post(key, owner)))
                continue
            node.register_prehook(self._node_pre(key))
            node.register_hook(self._node_post(key, name))
            stack.extend(n for n, _ in node.next_functions if n is not None)

    # -- backward -------------------------------------------------------------------------------------

    def _node_pre(self, key: int) -> Any:
        def hook(grad_outputs: Any) -> None:
            self._node_start[key] = self._now()

        return hook

    def _node_post(self, key: int, name: str) -> Any:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            start = self._node_start.pop(key, None)
            if start is not None:
                end = self._now()
                self._backward.setdefault(name, []).append((start, end))
                if self._cuda:
                    self._nodes.append((start, end, name))

        return hook

    # -- results --------------------------------------------------------------------------------------

    def take_step(self) -> dict[str, dict[str, float]]:
        """module -> {"forward": own seconds, "backward": seconds} of the step since the last call
        (on CUDA, call after the device synchronised); then a clean slate."""
        if self._cuda:
            result = device_times(self._stop_trace().kernels, self._changes, self._nodes)
            self._reset()
            self._start_trace()
            return result
        result: dict[str, dict[str, float]] = {}
        for name, calls in self._forward.items():
            own = 0.0
            for start, end, children in calls:
                own += end - start - sum(b - a for a, b in children)
            result.setdefault(name, {})["forward"] = max(own, 0.0)
        for name, spans in self._backward.items():
            result.setdefault(name, {})["backward"] = sum(b - a for a, b in spans)
        if self._overhead:
            result[PROFILER] = {"forward": self._overhead}
        self._reset()
        return result


def device_times(
    kernels: Sequence[tuple[float, float]],
    changes: Sequence[tuple[float, str]],
    nodes: Sequence[tuple[float, float, str]],
) -> dict[str, dict[str, float]]:
    """module -> {"forward"/"backward": device seconds} from the device's work of one step, each piece
    given as (host launch time, seconds it ran): in backward, the module owning the autograd node that
    was running when it was launched (the latest such node: re-entrant ones nest); else, in forward,
    the module innermost at that moment (``changes``: when each module became innermost). Work
    launched outside both (the loss, the optimizer, autograd between nodes) is no layer's."""
    innermost = ChangingValue(list(changes), NO_MODULE)
    ordered = sorted(nodes)
    starts = [start for start, _, _ in ordered]
    # Each node's nearest enclosing node (-1: none): nodes run on one thread, so they nest or follow.
    enclosing, open_nodes = [], []
    for start, _, _ in ordered:
        while open_nodes and ordered[open_nodes[-1]][1] < start:
            open_nodes.pop()
        enclosing.append(open_nodes[-1] if open_nodes else -1)
        open_nodes.append(len(enclosing) - 1)
    result: dict[str, dict[str, float]] = {}
    for launched, seconds in kernels:
        index = bisect.bisect_right(starts, launched) - 1
        while index >= 0 and ordered[index][1] < launched:  # ended before: try the one around it
            index = enclosing[index]
        if index >= 0:
            owner, phase = ordered[index][2], "backward"
        else:
            owner, phase = innermost.at(launched), "forward"
        if owner != NO_MODULE:
            phases = result.setdefault(owner, {})
            phases[phase] = phases.get(phase, 0.0) + seconds
    return result


def with_outside_the_model(
    table: dict[str, dict[str, float]], stage_s: Mapping[str, float]
) -> dict[str, dict[str, float]]:
    """Add ``(none)``: the forward and backward stage time of the same step that no layer took (the
    loss, work outside the model, autograd's engine between nodes), so the rows add up to the stages."""
    outside = {}
    for phase in ("forward", "backward"):
        if phase in stage_s:
            inside = sum(t.get(phase, 0.0) for name, t in table.items() if name != NO_MODULE)
            outside[phase] = max(0.0, stage_s[phase] - inside)
    return {**table, NO_MODULE: outside} if outside else table


def _tensor_leaves(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensor_leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensor_leaves(item)


class CountingStages:
    """The ``stages`` protocol for both a step clock and an operator counter: every stage block is
    entered in both (the clock times the step, the counter learns the phase)."""

    def __init__(self, clock: Any, counter: OpCounter) -> None:
        self.clock, self.counter = clock, counter

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(self.clock(name))
            stack.enter_context(self.counter(name))
            yield

    def __getattr__(self, name: str) -> Any:  # begin_step, end_step, mark, close: the clock's
        return getattr(self.clock, name)


class LayerProfiler:
    """Per-layer times, FLOPs, efficiency and library of a user's own training loop::

        profiler = dnnperf.LayerProfiler(model, optimizer)
        with profiler:
            for inputs, targets in loader:
                ...forward, backward, optimizer.step()...
                profiler.step()
        table = dnnperf.analysis.layers.layer_table(profiler.result(), dnnperf.load_profile("cpu"))

    The first ``op_steps`` steps time every operator (the first also counts FLOPs, bytes, libraries);
    every step after is layer-timed with hooks only. Hooks on the model and the optimizer are removed
    on exit, also on error.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        op_steps: int = 2,
        device: Any = None,
    ) -> None:
        if op_steps < 1:
            raise ValueError("op_steps must be at least 1: the first step is the counted one")
        self.model, self.optimizer, self.op_steps = model, optimizer, op_steps
        first = next(model.parameters(), None)
        if device is not None:
            self.device = torch.device(device)
        else:
            self.device = first.device if first is not None else torch.device("cpu")
        self._counter = OpCounter(model, count=True, timed=True, device=self.device)
        self._timer = LayerTimer(model, self.device)
        self._stack: ExitStack | None = None
        self._inner: ExitStack | None = None
        self._counted: list[OpRecord] | None = None
        self._module_calls: dict[str, int] = {}
        self._op_tables: list[list[OpRecord]] = []
        self._layer_tables: list[dict[str, dict[str, float]]] = []
        self._step_s: list[float] = []
        self._steps_seen = 0
        self._last: float | None = None

    def __enter__(self) -> LayerProfiler:
        stack = ExitStack()
        try:
            if self.optimizer is not None:
                stage: ExitStack | None = None

                def enter_update(*_: Any) -> None:
                    nonlocal stage
                    stage = ExitStack()
                    stage.enter_context(self._counter("update"))

                def leave_update(*_: Any) -> None:
                    if stage is not None:
                        stage.close()

                stack.callback(self.optimizer.register_step_pre_hook(enter_update).remove)
                stack.callback(self.optimizer.register_step_post_hook(leave_update).remove)
            self._inner = ExitStack()
            stack.callback(self._close_inner)
            self._inner.enter_context(self._counter)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        synchronize(self.device)
        self._last = time.perf_counter()
        return self

    def _close_inner(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def step(self) -> None:
        """Mark the end of one training step."""
        if self._stack is None:
            raise RuntimeError("LayerProfiler.step() called outside `with profiler:`")
        synchronize(self.device)
        now = time.perf_counter()
        elapsed = now - (self._last or now)
        self._steps_seen += 1
        if self._steps_seen <= self.op_steps:
            calls = dict(self._counter.module_calls)
            table = self._counter.take_step()
            if self._steps_seen == 1:
                self._counted, self._module_calls = table, calls
                self._counter.count = False
            self._op_tables.append(table)
            if self._steps_seen == self.op_steps:  # from now on, hooks only
                self._close_inner()
                self._inner = ExitStack()
                self._inner.enter_context(self._timer)
        else:
            self._layer_tables.append(self._timer.take_step())
            self._step_s.append(elapsed)
        self._last = time.perf_counter()

    def result(self) -> LayerProfile:
        """The profile of the steps so far."""
        if self._counted is None or not self._layer_tables:
            raise RuntimeError(
                f"no layer-timed step: LayerProfiler needs {self.op_steps} operator-timed step(s) and at "
                f"least one more, each ended with profiler.step() (saw {self._steps_seen})"
            )
        return build_profile(
            self.model,
            self._counted,
            self._module_calls,
            self._op_tables,
            self._step_s,
            "cuda-kernels" if self.device.type == "cuda" else "host-clock",
            self._counter.formula_errors,
            self._layer_tables,
        )
