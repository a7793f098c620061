"""Per-module, per-phase operator counts of one training step: FLOPs, bytes moved and calls.

:class:`OpCounter` watches every aten operator a step dispatches (a ``TorchDispatchMode``) and books
each call under the innermost ``nn.Module`` whose forward is running, the phase it ran in ("forward",
"backward" or "update") and its operator, with the FLOPs of an analytic formula and a lower bound on
the bytes it read and wrote. Backward operators are booked under the module whose forward created the
autograd node they run for, so a layer's backward cost sits beside its forward cost. Operators without
a formula are counted by name (:meth:`OpCounter.uncovered`), so coverage can be reported rather than
silently read as zero.

Phases. Inside autograd's backward (``torch.autograd.grad`` and ``.backward()``, double backward
included) is "backward". Elsewhere the phase is the step's own stage mark: the counter is a ``stages``
clock for ``Task.step``, so the optimizer's operators are "update" and everything else, the A3C game's
acting under ``no_grad`` included, is "forward".

Module names. Qualified names from ``model.named_modules()``; a module registered in two places is one
object and is reported under its first name, with the operators of every call. The model itself is
``(root)``; operators outside every module's forward (losses, the optimizer) are ``(none)``; backward
operators whose autograd node is unknown (gradient accumulation between nodes, or a torch without
``torch._C._current_autograd_node``) are ``(unattributed)``.

FLOP formulas (per call; "element" = element of the output unless said otherwise)

====================  ========================================================================
family                count
====================  ========================================================================
matmul, convolution,  ``torch.utils.flop_counter.flop_registry`` (2 FLOPs per multiply-add; bias
attention             additions not counted) for mm, addmm, bmm, baddbmm, _scaled_mm, convolution
                      and the fused attention kernels of CUDA. Added here: mv/addmv/dot (2 per
                      multiply-add), ``_grouped_mm`` (a mixture of experts' products: 2 per
                      multiply-add of each row through its group's matrix), the CPU flash
                      attention kernel (QKᵀ and PV forward; the five products of the backward,
                      recomputed scores included, as torch counts its own kernels; causal masks
                      not discounted) and ``convolution_backward`` as
                      one forward's worth per gradient computed (grad input, grad weight), which
                      equals torch's formula except for grouped convolutions, whose weight
                      gradient torch counts ``groups`` times over.
rnn                   oneDNN LSTM layers (CPU) and cuDNN RNNs: 2 per multiply-add of every weight
                      matrix on every token, plus the gate arithmetic of the cell per hidden unit
                      and token (LSTM 13: gate pre-activation sum 4, nonlinearities 4, cell update
                      3, output 2; GRU 10; tanh/relu RNN 2); bias additions not counted (in the
                      decomposed cells they ride in addmm). Backward: the products once for the
                      data gradients and once for the weight gradients, twice the gate arithmetic.
                      GRUs, and LSTMs without oneDNN, decompose on the CPU into mm/addmm and
                      element-wise operators counted one by one: the same forward count for
                      time-major input (a batch-first layer adds its input bias separately, which
                      then counts as element-wise work).
elementwise           1 per element for arithmetic, comparisons, selections (relu, where, clamp,
                      threshold_backward) and elementary functions (exp, log, sqrt, tanh, sigmoid,
                      gelu... each one operation); 2 for add/sub with alpha != 1; 3 for addcmul,
                      addcdiv, lerp and sigmoid/tanh backward (written-out formulas); 2 for the
                      backward of the other smooth activations and for dropout's mask-and-scale;
                      scatter_add/index_add/accumulating index_put: 1 per source element.
reduction             1 per input element (sum, mean, max, any...); 2 for vector norms; 3 for
                      var/std and logsumexp.
softmax               5 per element (max, subtract, exp, sum, divide; log_softmax alike); its
                      backward 4 per element.
normalization         batch/layer/group norm forward with batch statistics: 8 per element (mean 1,
                      variance 3, normalize 2, scale and shift 2; 6 without affine); with running
                      statistics 4 (2 without affine). Backward: x̂ 2, Σg 1, Σg·x̂ 2, grad input 4,
                      each only when a gradient needing it is asked for (eval-mode batch norm:
                      grad input 1, weight 4, bias 1).
pooling               max pool: k comparisons per output element (k = window size); its backward 1
                      per grad element. avg pool: k per output element, backward k per grad
                      element. adaptive avg pool: 1 per input element + 1 per output element
                      (the division); backward 1 per input element.
embedding             forward 0 (a gather: bytes only); ``embedding_dense_backward`` 1 per grad
                      element (the row additions).
loss                  nll_loss forward/backward: 1 per target; BCE-with-logits 5 per element;
                      BCE 7, backward 5; MSE 3 and 3; smooth L1/Huber 7, backward 5; CTC: 13 per
                      lattice cell (T x B x (2S+1)) forward, 16 per cell + 6 per log-prob element
                      backward (log-space recursions, approximate).
optimizer             ``_foreach_*``: the element-wise count of the operator, per element of every
                      tensor in the first list; fused Adam(W) 13 per element (+1 weight decay, +1
                      amsgrad), fused SGD 1 (+1 weight decay, +2 momentum, +1 nesterov).
selection             sort n·⌈log₂ n⌉ per sorted slice of n; topk ⌈log₂ k⌉ (at least 1) per input
                      element; unique, nonzero, searchsorted alike.
memory, random        0 FLOPs, bytes counted: copies, concatenation, gathers, fills, factories,
                      random number generation.
free                  0 FLOPs, 0 bytes: views, metadata, allocation without initialisation.
====================  ========================================================================

Operators with a CompositeImplicitAutograd kernel are run decomposed, as FlopCounterMode runs them,
so that the matmul, convolution and attention operators seen here are the ones it sees: on the suite
their subtotal equals ``dnnperf.analysis.flops.count_step_flops`` exactly.

Bytes: a lower bound from the tensor arguments and results of each call, ``numel * element_size``
per distinct view, the views of one storage together capped at the storage's size (so ``x * x`` or
an expanded operand counts once); arguments an operator overwrites without reading (``out=``,
``copy_``, ``fill_``) count as written only; gathers (embedding, index, index_select, gather) read
the gathered rows and the indices, not the whole table.
"""

from __future__ import annotations

import inspect
import math
import re
import resource
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import flop_registry as _TORCH_FLOP_REGISTRY

try:  # private API: the only way to see every aten operator of an eager step
    from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode
except ImportError as error:  # pragma: no cover - depends on the installed torch
    _TorchDispatchMode = object  # type: ignore[assignment,misc]
    _DISPATCH_MODE_ERROR: ImportError | None = error
else:
    _DISPATCH_MODE_ERROR = None

__all__ = [
    "FREE_FAMILIES",
    "NO_MODULE",
    "PHASES",
    "ROOT_MODULE",
    "TORCH_FAMILIES",
    "UNATTRIBUTED",
    "OpCounter",
    "OpRecord",
    "count_step",
]

PHASES = ("forward", "backward", "update")
# Stages of the runner's step that are their own phase: the optimizer, and the batch's copy and data
# making (which are no layer's work). Every other stage mark (forward, environment) is "forward".
_OWN_PHASE_STAGES = ("backward", "update", "copy", "data_wait", "read", "preprocess")
ROOT_MODULE = "(root)"
NO_MODULE = "(none)"
UNATTRIBUTED = "(unattributed)"
#: Families whose formulas come from torch.utils.flop_counter (plus the few added here, see above).
TORCH_FAMILIES = ("matmul", "convolution", "attention")
#: Families known to cost no FLOPs.
FREE_FAMILIES = ("memory", "random", "free")

# Private autograd introspection; both fall back gracefully where a torch lacks them.
_graph_task_id: Callable[[], int] | None = getattr(torch._C, "_current_graph_task_id", None)
_current_node: Callable[[], Any] | None = getattr(torch._C, "_current_autograd_node", None)

_aten = torch.ops.aten


@dataclass(frozen=True)
class OpRecord:
    """Calls of one operator under one module in one phase, summed."""

    name: str  # overload packet, e.g. "aten.addmm"
    module: str
    phase: str
    family: str  # how the operator is counted (see the module docstring)
    flops: int | None  # None: no formula for this operator
    bytes_read: int
    bytes_written: int
    calls: int
    #: Seconds the calls took (summed), when the counter timed them; None otherwise.
    seconds: float | None = None
    #: Of which the host's: dispatch and launch (on a CPU all of ``seconds``); None when not timed.
    host_seconds: float | None = None
    #: Minor page faults the calls took, when timed on the host clock (a CPU); None otherwise.
    faults: int | None = None
    #: The library that ran the calls (see :func:`library_of`); None when not counted.
    library: str | None = None
    #: dtype of the first floating-point tensor argument ("float32"...); None when there was none.
    dtype: str | None = None
    #: A convolution's shape class (:func:`convolution_kind`); "" for every other operator.
    kind: str = ""
    #: A convolution's output rows (batch x output pixels: its matrix product's rows,
    #: :func:`convolution_rows`), a matrix product's smallest dimension (:func:`product_rows`), summed
    #: over the calls; 0 for every other operator.
    rows: int = 0
    #: Of ``calls``, the forward's kernel calls issued inside a compiled (C++) function called from
    #: Python after that function's first kernel (:class:`CallScopes`): a ``GRUCell`` call is one
    #: Python call of a dozen kernels. 0 in the other phases, for calls that launch no kernel and
    #: from a timed counter.
    inner_calls: int = 0


# ---------------------------------------------------------------------------------------------------------
# FLOP formulas
# ---------------------------------------------------------------------------------------------------------


@dataclass
class OpCall:
    """One operator call as the formulas see it: arguments by schema name, and the result."""

    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    out: Any
    index: Mapping[str, int]

    def arg(self, name: str, default: Any = None) -> Any:
        i = self.index.get(name)
        if i is not None and i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)


Formula = Callable[[OpCall], int]


def tensors_of(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument or result: itself, or the items of a (nested) list or tuple."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_of(item)


def _first(value: Any) -> torch.Tensor | None:
    return next(tensors_of(value), None)


def _numel(value: Any) -> int:
    tensor = _first(value)
    return tensor.numel() if tensor is not None else 0


def _out_numel(call: OpCall) -> int:
    """Elements of the result; for operators returning nothing (in-place lists), of the first argument."""
    tensor = _first(call.out)
    return tensor.numel() if tensor is not None else _numel(call.args[0] if call.args else None)


def _per_output(cost: int) -> Formula:
    return lambda call: cost * _out_numel(call)


def _per_input(cost: int) -> Formula:
    return lambda call: cost * _numel(call.args[0])


def _names(text: str) -> frozenset[str]:
    """Operator names written as whitespace-separated words (long lists stay readable)."""
    return frozenset(text.split())


def _add_like(call: OpCall) -> int:
    # x + alpha * y is one operation per element, two when alpha scales the second operand
    alpha = call.arg("alpha", 1)
    return (1 if alpha == 1 else 2) * _out_numel(call)


# One operation per element. Elementary functions count as one operation whatever their
# implementation costs in instructions; selections (relu, where, clamp, masks) count as one.
_ONE_PER_ELEMENT = _names(
    """
    mul div neg abs reciprocal sqrt rsqrt square exp exp2 expm1 log log2 log10 log1p sin cos tan
    asin acos atan atan2 sinh cosh tanh sigmoid logit erf erfc erfinv relu relu6 gelu silu mish elu
    selu celu softplus log_sigmoid_forward hardtanh hardsigmoid hardswish leaky_relu prelu
    _prelu_kernel threshold threshold_backward hardtanh_backward clamp clamp_min clamp_max maximum
    minimum fmax fmin pow float_power sign sgn signbit floor ceil round trunc frac remainder fmod
    floor_divide eq ne lt le gt ge logical_and logical_or logical_xor logical_not bitwise_and
    bitwise_or bitwise_xor bitwise_not where masked_fill isnan isinf isfinite nan_to_num xlogy hypot
    copysign heaviside conj_physical polar __and__ __or__
    """
)
# Operators written as a fixed sequence of several element-wise operations.
_SEVERAL_PER_ELEMENT = {
    "addcmul": 3,  # self + value * t1 * t2
    "addcdiv": 3,  # self + value * t1 / t2
    "lerp": 3,  # self + weight * (end - self)
    "sigmoid_backward": 3,  # grad * y * (1 - y)
    "tanh_backward": 3,  # grad * (1 - y * y)
    "leaky_relu_backward": 2,  # x > 0 ? grad : slope * grad
    # The derivative, one elementary function, times the incoming gradient.
    "gelu_backward": 2,
    "silu_backward": 2,
    "elu_backward": 2,
    "softplus_backward": 2,
    "mish_backward": 2,
    "hardswish_backward": 2,
    "hardsigmoid_backward": 2,
    "log_sigmoid_backward": 2,
    "native_dropout": 2,  # keep-mask comparison, scaled product
    "native_dropout_backward": 2,  # mask product, scale
    "_masked_scale": 2,
}
_ELEMENTWISE_COST: dict[str, int] = {
    **dict.fromkeys(_ONE_PER_ELEMENT, 1),
    **_SEVERAL_PER_ELEMENT,
    "add": 1,
    "sub": 1,
    "rsub": 1,
}

# Reductions and scans: operations per input element.
_ONE_PER_INPUT = _names(
    """
    sum mean nansum nanmean prod amax amin max min argmax argmin any all equal count_nonzero cumsum
    cumprod cummax cummin bincount
    """
)
_REDUCTION_COST = {
    **dict.fromkeys(_ONE_PER_INPUT, 1),
    "aminmax": 2,
    "linalg_vector_norm": 2,  # |x| or x², then accumulate
    "norm": 2,
    "var": 3,  # subtract the mean, square, accumulate
    "std": 3,
    "var_mean": 3,
    "std_mean": 3,
    "logsumexp": 3,
    "logcumsumexp": 3,
}


def _mv(call: OpCall) -> int:
    return 2 * call.args[0].numel()


def _dot(call: OpCall) -> int:
    return 2 * call.args[0].numel()


def _grouped_mm(call: OpCall) -> int:
    """Products of groups (a mixture of experts' layers, each token through its expert's matrix): 2 per
    multiply-add, each output element a dot product over the shared dimension, which the groups split
    where both operands are 2-D (the weights' gradient: one matrix a group)."""
    a, b, out = call.args[0], call.args[1], call.out
    if a.dim() == 2 and b.dim() == 2:
        return 2 * (out.numel() // out.shape[0]) * a.shape[-1]
    return 2 * out.numel() * a.shape[-1]


def _addmm_activation(call: OpCall) -> int:
    m, k = call.arg("mat1").shape
    return 2 * m * k * call.arg("mat2").shape[1]


def _addbmm(call: OpCall) -> int:
    b, m, k = call.arg("batch1").shape
    return 2 * b * m * k * call.arg("batch2").shape[2]


def _conv_forward_flops(
    x_shape: Sequence[int], w_shape: Sequence[int], out_shape: Sequence[int], transposed: bool
) -> int:
    """2 x multiply-adds of a convolution; the weight's channel dimensions already carry the groups."""
    spatial = x_shape[2:] if transposed else out_shape[2:]
    return 2 * x_shape[0] * math.prod(w_shape) * math.prod(spatial)


def _convolution_backward(call: OpCall) -> int:
    # Each gradient asked for (input, weight) costs one forward convolution's multiply-adds.
    grad_out, x, w = call.args[0], call.args[1], call.args[2]
    transposed = bool(call.arg("transposed"))
    mask = call.arg("output_mask")
    forward = _conv_forward_flops(x.shape, w.shape, grad_out.shape, transposed)
    return forward * (int(bool(mask[0])) + int(bool(mask[1])))


def _flash_cpu_forward(call: OpCall) -> int:
    q, k, v = call.args[0], call.args[1], call.args[2]
    b, h, lq, e = q.shape
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * b * h * lq * s * (e + ev)  # QKᵀ and PV


def _flash_cpu_backward(call: OpCall) -> int:
    q, k, v = call.args[1], call.args[2], call.args[3]
    b, h, lq, e = q.shape
    s, ev = k.shape[-2], v.shape[-1]
    # Recomputed scores QKᵀ, dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q.
    return 2 * b * h * lq * s * (3 * e + 2 * ev)


# Gate arithmetic per hidden unit and token, by gate count (1: tanh/relu RNN, 3: GRU, 4: LSTM).
_RNN_CELL_COST = {1: 2, 3: 10, 4: 13}
_CUDNN_MODE_GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # RNN_RELU, RNN_TANH, LSTM, GRU


def _tokens(x: torch.Tensor) -> int:
    """Time steps x batch of an RNN input ([T, B, I], [B, T, I] or packed [N, I])."""
    return x.numel() // x.shape[-1] if x.dim() else 0


def _oneDNN_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor) -> tuple[int, int]:
    tokens = _tokens(x)
    hidden = w_hh.shape[1]
    gates = w_hh.shape[0] // hidden
    products = 2 * tokens * (w_ih.numel() + w_hh.numel())
    return products, _RNN_CELL_COST.get(gates, gates * 3) * hidden * tokens


def _mkldnn_rnn_layer(call: OpCall) -> int:
    products, cells = _oneDNN_layer(call.args[0], call.args[1], call.args[2])
    return products + cells


def _mkldnn_rnn_layer_backward(call: OpCall) -> int:
    # oneDNN computes every gradient: data (input and recurrence) and weights.
    products, cells = _oneDNN_layer(call.args[0], call.args[1], call.args[2])
    return 2 * products + 2 * cells


def _cudnn_rnn_parts(call: OpCall) -> tuple[int, int]:
    x = call.arg("input")
    tokens = _tokens(x)
    matrices = [w for w in tensors_of(call.arg("weight")) if w.dim() == 2]
    products = 2 * tokens * sum(w.numel() for w in matrices)
    gates = _CUDNN_MODE_GATES.get(int(call.arg("mode")), 1)
    layers = int(call.arg("num_layers")) * (2 if call.arg("bidirectional") else 1)
    cells = _RNN_CELL_COST[gates] * int(call.arg("hidden_size")) * tokens * layers
    return products, cells


def _cudnn_rnn(call: OpCall) -> int:
    products, cells = _cudnn_rnn_parts(call)
    return products + cells


def _cudnn_rnn_backward(call: OpCall) -> int:
    products, cells = _cudnn_rnn_parts(call)
    mask = call.arg("output_mask") or (True, True, True, True)
    # cuDNN's backward-data pass runs whatever is asked; the weight pass only for weight gradients.
    return products + (products if mask[3] else 0) + 2 * cells


def _fused_cell(cost: int, arg: str) -> Formula:
    return lambda call: cost * call.arg(arg).numel()


def _norm_forward(call: OpCall, training: bool) -> int:
    n = call.args[0].numel()
    affine = call.arg("weight") is not None
    statistics = 4 * n if training else 0  # mean 1, variance 3
    return statistics + 2 * n + (2 * n if affine else 0)  # normalize 2, scale and shift 2


def _batch_norm_forward(call: OpCall) -> int:
    return _norm_forward(call, bool(call.arg("training", True)))


def _norm_backward_flops(n: int, mask: Sequence[bool], training: bool) -> int:
    grad_input, grad_weight, grad_bias = (bool(m) for m in mask)
    if not training:  # running statistics: grad input is a per-channel scaling
        return (n if grad_input else 0) + (4 * n if grad_weight else 0) + (n if grad_bias else 0)
    flops = 0
    if grad_input or grad_weight:
        flops += 2 * n + 2 * n  # x̂ = (x - mean) * rstd; Σ g·x̂
    if grad_input or grad_bias:
        flops += n  # Σ g
    if grad_input:
        flops += 4 * n  # rstd * γ * (g - mean(g) - x̂ * mean(g·x̂))
    return flops


def _norm_backward(train_arg: str | None) -> Formula:
    def formula(call: OpCall) -> int:
        x = call.arg("input")
        training = True if train_arg is None else bool(call.arg(train_arg, True))
        mask = call.arg("output_mask") or (True, True, True)
        return _norm_backward_flops(x.numel(), mask, training)

    return formula


def _sizes(value: Any, dims: int) -> list[int]:
    sizes = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return sizes * dims if len(sizes) == 1 else sizes


def _window(kernel: Any, dims: int, spatial: Sequence[int] | None = None, padding: Any = 0) -> int:
    """Elements a pooling window covers: its kernel, cut to the padded input where the kernel is larger
    (EfficientNet pools a 2x2 map with a 1280-wide kernel and ceil_mode)."""
    sizes = _sizes(kernel, dims)
    if spatial is not None:
        pads = _sizes(padding or 0, dims)
        sizes = [min(k, s + 2 * p) for k, s, p in zip(sizes, spatial, pads, strict=True)]
    return math.prod(sizes)


def _pool(dims: int, per_grad: bool = False) -> Formula:
    # k per output element (max: comparisons; avg: additions and the division)
    def formula(call: OpCall) -> int:
        size = call.arg("grad_output").numel() if per_grad else _out_numel(call)
        source = call.arg("self")
        spatial = tuple(source.shape[-dims:]) if isinstance(source, torch.Tensor) else None
        return _window(call.arg("kernel_size"), dims, spatial, call.arg("padding", 0)) * size

    return formula


def _adaptive_avg_pool(call: OpCall) -> int:
    return call.args[0].numel() + _out_numel(call)


def _ctc_cells(call: OpCall) -> tuple[int, int]:
    log_probs, targets = call.arg("log_probs"), call.arg("targets")
    steps = log_probs.shape[0]
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    if targets.dim() == 2:
        longest = targets.shape[1]
    else:
        lengths = call.arg("target_lengths")
        if isinstance(lengths, torch.Tensor) and lengths.device.type == "cpu" and lengths.numel():
            longest = int(lengths.max())
        elif isinstance(lengths, (list, tuple)) and lengths:
            longest = max(int(length) for length in lengths)
        else:
            longest = math.ceil(targets.numel() / max(batch, 1))
    return steps * batch * (2 * longest + 1), log_probs.numel()


def _ctc_forward(call: OpCall) -> int:
    cells, _ = _ctc_cells(call)
    return 13 * cells


def _ctc_backward(call: OpCall) -> int:
    cells, elements = _ctc_cells(call)
    return 16 * cells + 6 * elements


def _sort(call: OpCall) -> int:
    x = call.args[0]
    if x.dim() == 0:
        return 0
    n = x.shape[call.arg("dim", -1)]
    return x.numel() * max(1, math.ceil(math.log2(max(n, 1))))


def _topk(call: OpCall) -> int:
    k = int(call.arg("k"))
    return call.args[0].numel() * max(1, math.ceil(math.log2(max(k, 1))))


def _sort_all(call: OpCall) -> int:
    n = call.args[0].numel()
    return n * max(1, math.ceil(math.log2(max(n, 1))))


def _searchsorted(call: OpCall) -> int:
    boundaries = call.args[0]
    n = boundaries.shape[-1] if boundaries.dim() else 1
    return _out_numel(call) * max(1, math.ceil(math.log2(max(n, 1))))


def _scatter_source(name: str) -> Formula:
    return lambda call: call.arg(name).numel()


def _index_put(call: OpCall) -> int:
    return call.arg("values").numel() if call.arg("accumulate", False) else 0


def _foreach(cost: int) -> Formula:
    return lambda call: cost * sum(t.numel() for t in tensors_of(call.args[0]))


def _fused_adam(call: OpCall) -> int:
    # The foreach implementation's element-wise operations: lerp 3, mul 1, addcmul 3, sqrt 1,
    # div 1, add 1, addcdiv 3 = 13, plus weight decay and the amsgrad maximum.
    cost = 13 + int(call.arg("weight_decay", 0) != 0) + int(bool(call.arg("amsgrad", False)))
    return cost * sum(t.numel() for t in tensors_of(call.args[0]))


def _fused_sgd(call: OpCall) -> int:
    cost = 1 + int(call.arg("weight_decay", 0) != 0)
    if call.arg("momentum", 0) != 0:
        cost += 2 + int(bool(call.arg("nesterov", False)))
    return cost * sum(t.numel() for t in tensors_of(call.args[0]))


def _zero(call: OpCall) -> int:
    return 0


_NAMED_FORMULAS: dict[str, tuple[str, Formula]] = {
    # matmul and attention beyond torch's registry
    "mv": ("matmul", _mv),
    "addmv": ("matmul", lambda call: 2 * call.arg("mat").numel()),
    "dot": ("matmul", _dot),
    "vdot": ("matmul", _dot),
    "_addmm_activation": ("matmul", _addmm_activation),
    "addbmm": ("matmul", _addbmm),
    "_grouped_mm": ("matmul", _grouped_mm),
    "convolution_backward": ("convolution", _convolution_backward),
    "_scaled_dot_product_flash_attention_for_cpu": ("attention", _flash_cpu_forward),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ("attention", _flash_cpu_backward),
    # recurrent layers run as one kernel
    "mkldnn_rnn_layer": ("rnn", _mkldnn_rnn_layer),
    "mkldnn_rnn_layer_backward": ("rnn", _mkldnn_rnn_layer_backward),
    "_cudnn_rnn": ("rnn", _cudnn_rnn),
    "_cudnn_rnn_backward": ("rnn", _cudnn_rnn_backward),
    "_thnn_fused_lstm_cell": ("rnn", _fused_cell(_RNN_CELL_COST[4], "cx")),
    "_thnn_fused_lstm_cell_backward_impl": ("rnn", _fused_cell(2 * _RNN_CELL_COST[4], "cx")),
    "_thnn_fused_gru_cell": ("rnn", _fused_cell(_RNN_CELL_COST[3], "hx")),
    "_thnn_fused_gru_cell_backward": ("rnn", _fused_cell(2 * _RNN_CELL_COST[3], "grad_hy")),
    # element-wise with a twist
    "add": ("elementwise", _add_like),
    "sub": ("elementwise", _add_like),
    "rsub": ("elementwise", _add_like),
    "scatter_add": ("elementwise", _scatter_source("src")),
    "scatter_reduce": ("elementwise", _scatter_source("src")),
    "index_add": ("elementwise", _scatter_source("source")),
    "index_put": ("elementwise", _index_put),
    "_index_put_impl": ("elementwise", _index_put),
    # softmax
    "_softmax": ("softmax", _per_output(5)),
    "_safe_softmax": ("softmax", _per_output(5)),
    "_log_softmax": ("softmax", _per_output(5)),
    "_softmax_backward_data": ("softmax", _per_output(4)),
    "_log_softmax_backward_data": ("softmax", _per_output(4)),
    # normalization
    "native_batch_norm": ("normalization", _batch_norm_forward),
    "_native_batch_norm_legit": ("normalization", _batch_norm_forward),
    "_native_batch_norm_legit_no_training": ("normalization", lambda call: _norm_forward(call, False)),
    "_batch_norm_with_update": ("normalization", lambda call: _norm_forward(call, True)),
    "_batch_norm_no_update": ("normalization", lambda call: _norm_forward(call, False)),
    "cudnn_batch_norm": ("normalization", _batch_norm_forward),
    "miopen_batch_norm": ("normalization", _batch_norm_forward),
    "native_layer_norm": ("normalization", lambda call: _norm_forward(call, True)),
    "native_group_norm": ("normalization", lambda call: _norm_forward(call, True)),
    "native_batch_norm_backward": ("normalization", _norm_backward("train")),
    "batch_norm_backward": ("normalization", _norm_backward("update")),
    "cudnn_batch_norm_backward": ("normalization", _norm_backward(None)),
    "miopen_batch_norm_backward": ("normalization", _norm_backward(None)),
    "native_layer_norm_backward": ("normalization", _norm_backward(None)),
    "native_group_norm_backward": ("normalization", _norm_backward(None)),
    # pooling
    "max_pool1d": ("pooling", _pool(1)),
    "max_pool2d": ("pooling", _pool(2)),
    "max_pool2d_with_indices": ("pooling", _pool(2)),
    "max_pool3d_with_indices": ("pooling", _pool(3)),
    "max_pool2d_with_indices_backward": ("pooling", lambda call: call.arg("grad_output").numel()),
    "max_pool3d_with_indices_backward": ("pooling", lambda call: call.arg("grad_output").numel()),
    "avg_pool2d": ("pooling", _pool(2)),
    "avg_pool3d": ("pooling", _pool(3)),
    "avg_pool2d_backward": ("pooling", _pool(2, per_grad=True)),
    "avg_pool3d_backward": ("pooling", _pool(3, per_grad=True)),
    "_adaptive_avg_pool2d": ("pooling", _adaptive_avg_pool),
    "_adaptive_avg_pool3d": ("pooling", _adaptive_avg_pool),
    "_adaptive_avg_pool2d_backward": ("pooling", lambda call: call.arg("self").numel()),
    "_adaptive_avg_pool3d_backward": ("pooling", lambda call: call.arg("self").numel()),
    "adaptive_max_pool2d": ("pooling", _per_input(1)),
    "adaptive_max_pool2d_backward": ("pooling", lambda call: call.arg("grad_output").numel()),
    # embedding
    "embedding": ("embedding", _zero),
    "embedding_dense_backward": ("embedding", lambda call: call.arg("grad_output").numel()),
    # losses
    "nll_loss_forward": ("loss", lambda call: call.arg("target").numel()),
    "nll_loss_backward": ("loss", lambda call: call.arg("target").numel()),
    "nll_loss2d_forward": ("loss", lambda call: call.arg("target").numel()),
    "nll_loss2d_backward": ("loss", lambda call: call.arg("target").numel()),
    "binary_cross_entropy_with_logits": ("loss", _per_input(5)),  # log-sigmoid, 1 - y, mul, sub, reduce
    "binary_cross_entropy": ("loss", _per_input(7)),
    "binary_cross_entropy_backward": ("loss", lambda call: 5 * call.arg("self").numel()),
    "mse_loss": ("loss", _per_input(3)),  # subtract, square, reduce
    "mse_loss_backward": ("loss", lambda call: 3 * call.arg("self").numel()),
    "smooth_l1_loss": ("loss", _per_input(7)),  # sub, abs, compare, quadratic branch 3, reduce
    "huber_loss": ("loss", _per_input(7)),
    "smooth_l1_loss_backward": ("loss", lambda call: 5 * call.arg("self").numel()),
    "huber_loss_backward": ("loss", lambda call: 5 * call.arg("self").numel()),
    "_ctc_loss": ("loss", _ctc_forward),
    "_ctc_loss_backward": ("loss", _ctc_backward),
    # fused optimizers
    "_fused_adam": ("optimizer", _fused_adam),
    "_fused_adamw": ("optimizer", _fused_adam),
    "_fused_sgd": ("optimizer", _fused_sgd),
    # selection
    "sort": ("selection", _sort),
    "topk": ("selection", _topk),
    "kthvalue": ("selection", _per_input(1)),
    "median": ("selection", _per_input(1)),
    "mode": ("selection", _per_input(1)),
    "nonzero": ("selection", _per_input(1)),
    "_unique": ("selection", _sort_all),
    "_unique2": ("selection", _sort_all),
    "unique_dim": ("selection", _sort_all),
    "unique_consecutive": ("selection", _per_input(1)),
    "searchsorted": ("selection", _searchsorted),
    "bucketize": ("selection", _searchsorted),
}

# Data movement without arithmetic: 0 FLOPs, bytes counted.
_MEMORY_OPS = _names(
    """
    clone copy _to_copy _copy_from _copy_from_and_resize cat stack index _unsafe_index index_select
    gather take scatter index_fill index_copy masked_scatter masked_select repeat repeat_interleave
    flip roll constant_pad_nd reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
    zero fill zeros zeros_like ones ones_like full full_like new_zeros new_ones new_full
    scalar_tensor arange linspace eye tril triu _local_scalar_dense lift_fresh_copy im2col col2im
    _pack_padded_sequence _pack_padded_sequence_backward slice_scatter select_scatter
    diagonal_scatter as_strided_scatter narrow_copy _foreach_copy _foreach_zero
    split_with_sizes_copy unbind_copy view_copy _pin_memory resize_as _embedding_bag_forward_only
    tensor_split contiguous _reshape_copy unfold_copy upsample_nearest2d upsample_nearest2d_backward
    _cudnn_rnn_flatten_weight
    """
)
_RANDOM_OPS = _names(
    """
    bernoulli rand randn randint rand_like randn_like randint_like randperm normal uniform
    exponential geometric cauchy log_normal random multinomial _fused_dropout poisson
    _cudnn_init_dropout_state
    """
)
# Metadata, views and allocation: no arithmetic, no data touched.
_FREE_OPS = _names(
    """
    detach alias lift_fresh lift empty empty_like empty_strided new_empty new_empty_strided resize
    set squeeze unsqueeze transpose t as_strided swapdims swapaxes _reshape_alias _unsafe_view
    unsafe_split unsafe_split_with_sizes unsafe_chunk is_same_size _has_same_storage_numel
    record_stream _efficientzerotensor _record_function_enter _record_function_enter_new
    _record_function_exit sym_size sym_stride sym_numel sym_storage_offset size stride
    storage_offset numel dim is_contiguous is_non_overlapping_and_dense is_strides_like_format
    device layout _nested_tensor_size _version _conj _neg_view view expand permute select slice
    narrow unbind split split_with_sizes chunk diagonal view_as_real view_as_complex unfold real
    imag reshape flatten movedim expand_as view_as _indices _values
    """
)
# Mutating operators that overwrite their mutated argument without reading it.
_WRITE_ONLY = _RANDOM_OPS | {"copy", "zero", "fill", "_foreach_copy", "_foreach_zero", "index_put", "scatter"}
# Operators that read only the rows they gather: (index argument names, gathered from argument).
_GATHERS: dict[str, tuple[str, ...]] = {
    "embedding": ("indices",),
    "index": ("indices",),
    "_unsafe_index": ("indices",),
    "index_select": ("index",),
    "gather": ("index",),
    "take": ("index",),
}
# Queries FlopCounterMode leaves to tensor subclasses (it returns NotImplemented for them; so do we).
_METADATA_QUERIES = frozenset(
    {
        _aten.is_contiguous.default,
        _aten.is_contiguous.memory_format,
        _aten.is_strides_like_format.default,
        _aten.is_non_overlapping_and_dense.default,
        _aten.size.default,
        _aten.sym_size.default,
        _aten.stride.default,
        _aten.sym_stride.default,
        _aten.storage_offset.default,
        _aten.sym_storage_offset.default,
        _aten.numel.default,
        _aten.sym_numel.default,
        _aten.dim.default,
        torch.ops.prim.layout.default,
    }
    | ({_aten.sym_is_contiguous.default} if hasattr(_aten, "sym_is_contiguous") else set())
)
_PRIM_DEVICE = torch.ops.prim.device.default
_CIA = torch._C.DispatchKey.CompositeImplicitAutograd


def _base_name(name: str) -> str:
    """``add_`` -> ``add``, ``_foreach_add_`` -> ``_foreach_add`` (dunder names kept)."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _torch_family(name: str) -> str:
    if "conv" in name:
        return "convolution"
    if "attention" in name:
        return "attention"
    return "matmul"


def _torch_formula(packet: Any) -> Formula:
    formula = _TORCH_FLOP_REGISTRY[packet]
    # Called exactly as FlopCounterMode calls it, so that the two agree.
    return lambda call: int(formula(*call.args, **call.kwargs, out_val=call.out))


def _classify(func: Any, base: str) -> tuple[str, Formula | None]:
    """(family, formula) of an operator overload; formula None for 0-FLOP families and uncovered ones."""
    packet = func._overloadpacket
    if base in _NAMED_FORMULAS:
        family, formula = _NAMED_FORMULAS[base]
        return family, formula
    if packet in _TORCH_FLOP_REGISTRY:
        return _torch_family(base), _torch_formula(packet)
    if base in _ELEMENTWISE_COST:
        return "elementwise", _per_output(_ELEMENTWISE_COST[base])
    if base in _REDUCTION_COST:
        return "reduction", _per_input(_REDUCTION_COST[base])
    if base.startswith("_foreach_"):
        inner = base[len("_foreach_") :]
        if inner in _ELEMENTWISE_COST:
            return "optimizer", _foreach(_ELEMENTWISE_COST[inner])
        if inner in _REDUCTION_COST:
            return "optimizer", _foreach(_REDUCTION_COST[inner])
    if base in _MEMORY_OPS:
        return "memory", _zero
    if base in _RANDOM_OPS:
        return "random", _zero
    if base in _FREE_OPS or func.namespace in ("profiler", "prim") or _is_view(func):
        return "free", _zero
    return "uncovered", None


def _is_view(func: Any) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


#: Operators whose kernel an argument chooses, with the argument and its default: a call with
#: another value is its own row, ``name[value]`` (GELU's tanh approximation ran 5x slower than its erf
#: form here, 1.05 against 0.21 ms for 524,288 elements, and GPT-2 uses it).
KERNEL_VARIANTS: dict[str, tuple[str, Any]] = {
    "aten.gelu": ("approximate", "none"),
    "aten.gelu_backward": ("approximate", "none"),
}


def variant_name(name: str, call: OpCall) -> str:
    """The operator's row name: ``name``, or ``name[value]`` for a kernel variant (KERNEL_VARIANTS)."""
    variant = KERNEL_VARIANTS.get(name)
    if variant is None:
        return name
    value = call.arg(variant[0], variant[1])
    return name if value == variant[1] else f"{name}[{value}]"


@dataclass(frozen=True)
class _OpInfo:
    name: str
    family: str
    formula: Formula | None
    index: Mapping[str, int]
    written: frozenset[int | str]  # positions and names of the arguments the operator writes
    write_only: frozenset[int | str]  # those it overwrites without reading
    gather_indices: tuple[str, ...] | None
    decomposable: bool

    @classmethod
    def of(cls, func: Any) -> _OpInfo:
        base = _base_name(func._overloadpacket.__name__)
        family, formula = _classify(func, base)
        arguments = func._schema.arguments
        written: set[int | str] = set()
        write_only: set[int | str] = set()
        for i, argument in enumerate(arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                keys = {argument.name} if argument.kwarg_only else {i, argument.name}
                written |= keys
                if argument.kwarg_only or base in _WRITE_ONLY:  # out= arguments, fills, copies
                    write_only |= keys
        # Mirrors FlopCounterMode, which runs every operator with a CompositeImplicitAutograd kernel
        # decomposed, so that both count the same operators.
        decomposable = func is not _PRIM_DEVICE and (
            _CIA in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _CIA)
        )
        return cls(
            name=f"{func.namespace}.{func._overloadpacket.__name__}",
            family=family,
            formula=formula,
            index={argument.name: i for i, argument in enumerate(arguments)},
            written=frozenset(written),
            write_only=frozenset(write_only),
            gather_indices=_GATHERS.get(base),
            decomposable=decomposable,
        )


# ---------------------------------------------------------------------------------------------------------
# Bytes
# ---------------------------------------------------------------------------------------------------------


def _bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct views among ``tensors``, the views of one storage capped at its size."""
    seen: set[tuple[Any, ...]] = set()
    per_storage: dict[Any, list[int]] = {}
    for t in tensors:
        size = t.numel() * t.element_size()
        if size == 0:
            continue
        try:
            storage = t.untyped_storage()
            key: Any = storage._cdata
            cap = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage (sparse, nested...)
            key, cap = ("tensor", id(t)), size
        view = (key, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if view in seen:
            continue
        seen.add(view)
        entry = per_storage.setdefault(key, [0, cap])
        entry[0] += size
    return sum(min(total, cap) for total, cap in per_storage.values())


def _arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Iterator[tuple[int | str, Any]]:
    yield from enumerate(args)
    yield from kwargs.items()


def written_tensors(info: _OpInfo, call: OpCall) -> list[torch.Tensor]:
    """The tensors one call writes: the arguments its schema marks written (an in-place operator's
    target, a foreach update's parameters) and its results; the target an in-place call returns (the
    same tensor object) is there once. Tensors without storage (a subclass, sparse) are fine: only
    their identity is used."""
    arguments = _arguments(call.args, call.kwargs)
    written = [t for key, value in arguments if key in info.written for t in tensors_of(value)]
    seen = {id(t) for t in written}
    return written + [t for t in tensors_of(call.out) if id(t) not in seen]


def _traffic(info: _OpInfo, call: OpCall) -> tuple[int, int]:
    """(bytes read, bytes written) of one call."""
    if info.family == "free":
        return 0, 0
    read: list[torch.Tensor] = []
    written: list[torch.Tensor] = []
    for key, value in _arguments(call.args, call.kwargs):
        if key in info.written:
            written.extend(tensors_of(value))
            if key in info.write_only:
                continue
        read.extend(tensors_of(value))
    written.extend(tensors_of(call.out))
    if info.gather_indices is not None:  # the gathered rows (the result's size) and the indices
        read = [t for name in info.gather_indices for t in tensors_of(call.arg(name))]
        read.extend(tensors_of(call.out))
    return _bytes(iter(read)), _bytes(iter(written))


# ---------------------------------------------------------------------------------------------------------
# The counter
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Libraries
# ---------------------------------------------------------------------------------------------------------

# torch's convolution backend selection (private; see library_of) -> the library it names.
_CONV_BACKENDS = {
    "Mkldnn": "oneDNN",
    "MkldnnTranspose": "oneDNN",
    "MkldnnEmpty": "oneDNN",
    "Cudnn": "cuDNN",
    "CudnnTranspose": "cuDNN",
    "Miopen": "MIOpen",
    "MiopenDepthwise": "MIOpen",
    "MiopenTranspose": "MIOpen",
    "CudaDepthwise2d": "native",
    "CudaDepthwise3d": "native",
    "Mps": "MPS",
    "MpsTranspose": "MPS",
    "Empty": "native",
}
_select_conv_backend: Callable[..., Any] | None = getattr(torch._C, "_select_conv_backend", None)


@cache
def cpu_blas() -> str:
    """The BLAS torch was built with (its build settings' BLAS_INFO: "mkl", "openblas"...)."""
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    if found is None:
        return "BLAS"
    return {"mkl": "MKL", "openblas": "OpenBLAS", "accelerate": "Accelerate"}.get(found[1], found[1])


def _conv_library(base: str, call: OpCall, device_type: str) -> str:
    """The library torch's own backend selection picks for this convolution (forward or backward)."""
    if _select_conv_backend is None:
        return "unknown"
    try:
        if base == "convolution_backward":
            a = call.args
            backend = _select_conv_backend(a[1], a[2], None, *a[4:10], a[3])
        else:
            backend = _select_conv_backend(*call.args[:9], None)
    except Exception:  # a private API: any change lands here, and a test notices
        return "unknown"
    name = getattr(backend, "name", str(backend).rsplit(".", 1)[-1])
    if name.startswith("Slow"):  # THNN-style: im2col (unfold) + a matrix product in BLAS/cuBLAS
        return f"native im2col + {'cuBLAS' if device_type == 'cuda' else cpu_blas()}"
    return _CONV_BACKENDS.get(name, name)


#: Convolution shape classes (:func:`convolution_kind`): libraries run each on its own kernels, off a
#: dense convolution's rate (the performance model's zoo on a 2-core AMD EPYC's oneDNN, 2026-11-27:
#: depthwise at 0.29 forward and 0.06 backward of the roofline, dense at 0.83 and 0.77).
CONVOLUTION_KINDS = ("pointwise", "depthwise", "grouped")


def convolution_kind(name: str, call: OpCall) -> str:
    """A convolution call's shape class: "depthwise" (one group per input channel), "grouped" (other
    groups), "pointwise" (a 1x1 kernel, one group), "" for a dense convolution with a larger kernel, a
    transposed one, and every operator that is not ``aten.convolution``/``convolution_backward``."""
    args = call.args
    if name == "aten.convolution":
        data, weight, transposed, groups = args[0], args[1], args[6], args[8]
    elif name == "aten.convolution_backward":
        data, weight, transposed, groups = args[1], args[2], args[7], args[9]
    else:
        return ""
    if transposed or not isinstance(data, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return ""
    if groups > 1:
        return "depthwise" if groups == data.shape[1] else "grouped"
    return "pointwise" if all(size == 1 for size in weight.shape[2:]) else ""


def convolution_rows(name: str, call: OpCall) -> int:
    """A convolution call's output rows: batch times output pixels, the rows of the matrix product it
    amounts to (libraries lose much of their rate below a hundred or so); 0 for every other operator."""
    if name == "aten.convolution":
        out = call.out
    elif name == "aten.convolution_backward":
        out = call.args[0]  # the output's gradient
    else:
        return 0
    if not isinstance(out, torch.Tensor) or out.dim() < 3:
        return 0
    return int(out.shape[0] * math.prod(out.shape[2:]))


def product_rows(name: str, call: OpCall) -> int:
    """A matrix product call's smallest dimension (``aten.mm``, ``aten.addmm``): a linear layer's rows
    at a small batch or on few tokens, or its weight gradient's inner dimension; the BLAS loses most
    of its rate below a few dozen. 0 for every other operator."""
    if name == "aten.mm":
        a, b = call.args[0], call.args[1]
    elif name == "aten.addmm":
        a, b = call.args[1], call.args[2]
    else:
        return 0
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2):
        return 0
    return int(min(a.shape[0], a.shape[1], b.shape[1]))


def library_of(name: str, family: str, call: OpCall) -> str:
    """Which library ran one operator call: oneDNN, MKL/OpenBLAS (CPU BLAS), cuDNN, cuBLAS, a fused
    attention kernel, or ``native`` (ATen's own kernels).

    Decided the way torch decides at dispatch: convolutions by torch's backend selection (a private
    API, ``torch._C._select_conv_backend``; "unknown" if it changes), everything else by operator name
    and device. CPU float32 matrix products run in the BLAS torch was built with; half precision ones
    in oneDNN."""
    base = _base_name(name.rsplit(".", 1)[-1])
    tensor = _first(call.args)
    device_type = tensor.device.type if tensor is not None else "cpu"
    if "mkldnn" in base:
        return "oneDNN"
    if "cudnn" in base:
        return "cuDNN"
    if family == "convolution" and base in ("convolution", "convolution_backward"):
        return _conv_library(base, call, device_type)
    if family == "attention":
        if "flash" in base:
            return "FlashAttention" if device_type == "cuda" else "native flash attention"
        if "efficient" in base:
            return "mem-efficient attention"
        return "native"
    if family == "matmul":
        if device_type == "cuda":
            return "cuBLAS"
        if tensor is not None and tensor.dtype in (torch.bfloat16, torch.float16):
            return "oneDNN" if torch.backends.mkldnn.is_available() else cpu_blas()
        return cpu_blas()
    return "native"


def _dtype_of(call: OpCall) -> str | None:
    for value in (*call.args, *call.kwargs.values()):
        for tensor in tensors_of(value):
            if tensor.is_floating_point():
                return str(tensor.dtype).removeprefix("torch.")
    return None


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------


def minor_faults() -> int:
    """This process's minor page faults so far (the OS's count)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class HostTimer:
    """Operator times on the host clock: exact on the CPU, where operators run synchronously. Each
    call's minor page faults are counted too (``last_faults``): a fresh block the allocator maps from
    the OS faults on first touch, a cost that depends on the allocator's history, not the operator."""

    def __init__(self) -> None:
        self.last_faults = 0

    def start(self) -> tuple[int, int]:
        return minor_faults(), time.perf_counter_ns()

    def stop(self, token: tuple[int, int]) -> float:
        seconds = (time.perf_counter_ns() - token[1]) * 1e-9
        self.last_faults = minor_faults() - token[0]
        return seconds


class _EventTimer:
    """Operator times from CUDA events on the current stream, resolved after the step has synchronised:
    no synchronisation is added between operators. Events come from a pool reused across steps. Each
    call's host time (its dispatch and launch) is kept too. ``lead``, if given, runs before each timed
    call: work that keeps the device busy while the host launches the call, so that the events time
    its kernels alone, not the launch's latency on an idle device (the model's calibration); the
    queue is emptied before it, so that the host's times are its own."""

    def __init__(self, lead: Callable[[], None] | None = None) -> None:
        self._pool: list[Any] = []
        self._used = 0
        self._lead = lead

    def _event(self) -> Any:
        if self._used == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        event = self._pool[self._used]
        self._used += 1
        return event

    def start(self) -> tuple[Any, int]:
        if self._lead is not None:
            # From an empty queue: with the device behind, the host's launches would soon wait for
            # free slots in it, and its times would count the device's (timed so, an H200's zoo puts
            # views at 10 us and convolutions at 100 us more than an add, twice what its steps take).
            torch.cuda.synchronize()
            self._lead()
        event = self._event()
        event.record()
        return event, time.perf_counter_ns()

    def stop(self, token: tuple[Any, int]) -> tuple[Any, Any, float]:
        host_s = (time.perf_counter_ns() - token[1]) * 1e-9
        end = self._event()
        end.record()
        return token[0], end, host_s

    def reset(self) -> None:
        self._used = 0


@dataclass
class _Totals:
    family: str
    flops: int = 0
    covered: bool = True
    bytes_read: int = 0
    bytes_written: int = 0
    calls: int = 0
    seconds: float = 0.0
    host_seconds: float = 0.0
    faults: int = 0
    events: list[tuple[Any, Any]] = field(default_factory=list)
    library: str | None = None
    dtype: str | None = None
    kind: str | None = None
    rows: int = 0
    inner_calls: int = 0


class CallScopes(TorchFunctionMode):
    """Sees each torch call a step makes from Python and keeps, for the compiled one running, how
    many kernels it has issued (``issued``; None outside one): its first pays the Python around it,
    the rest its compiled code issues back to back. A torch function written in Python (most of
    ``torch.nn.functional``) is no scope, and the compiled calls it makes are unseen (a mode is off
    inside its own handler): their kernels all count as outer ones."""

    def __init__(self) -> None:
        super().__init__()
        self.issued: int | None = None

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if inspect.isfunction(func) or inspect.ismethod(func):
            return func(*args, **kwargs)
        outer, self.issued = self.issued, 0
        try:
            return func(*args, **kwargs)
        finally:
            self.issued = outer


class CountingMode(_TorchDispatchMode):  # type: ignore[misc,valid-type]
    """The dispatch mode: sees every aten operator below autograd and reports it to the counter."""

    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _METADATA_QUERIES or isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        counter = self.counter
        counter._resolve_pending()
        info = counter._info(func)
        if info.decomposable:
            with self:
                result = func.decompose(*args, **kwargs)
            if result is not NotImplemented:
                return result
        timer = counter._timer
        if timer is None:
            out = func(*args, **kwargs)
            counter._record(info, OpCall(args, kwargs, out, info.index))
            return out
        token = timer.start()
        out = func(*args, **kwargs)
        elapsed = timer.stop(token)
        faults = timer.last_faults if isinstance(timer, HostTimer) else 0
        counter._record(info, OpCall(args, kwargs, out, info.index), elapsed, faults)
        return out


class GapClock(_TorchDispatchMode):  # type: ignore[misc,valid-type]
    """Host seconds between consecutive operator calls, by phase: what a step spends outside its
    operators (its modules' Python, the autograd engine's bookkeeping, freeing tensors), each call's
    own time left out. ``with clock:`` sees the calls; ``with clock("forward"):`` names the phase the
    gaps inside it count in (a gap into a phase's first call counts nowhere). ``seconds`` and
    ``calls`` by phase; ``calls`` counts every operator call, views included."""

    def __init__(self) -> None:
        _check_available()
        super().__init__()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._phase: str | None = None
        self._last: float | None = None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        outer, self._phase, self._last = self._phase, name, None
        self.seconds.setdefault(name, 0.0)
        self.calls.setdefault(name, 0)
        try:
            yield
        finally:
            self._phase, self._last = outer, None

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        started = time.perf_counter()
        phase = self._phase
        if phase is not None:
            if self._last is not None:
                self.seconds[phase] += started - self._last
            self.calls[phase] += 1
        out = func(*args, **(kwargs or {}))
        self._last = time.perf_counter()
        return out


def _check_available() -> None:
    if _DISPATCH_MODE_ERROR is not None:
        raise RuntimeError(
            f"dnnperf's operator counter needs torch.utils._python_dispatch.TorchDispatchMode, a private "
            f"torch API that torch {torch.__version__} does not provide ({_DISPATCH_MODE_ERROR}); "
            "whole-step FLOP totals (dnnperf.analysis.flops) still work"
        )


class OpCounter:
    """Counts the operators of whatever runs inside ``with OpCounter(model):``, per module and phase.

    Also a ``stages`` clock: pass it to ``task.step(batch, counter)`` so that the step's own stage
    marks decide the phase of the operators outside autograd's backward ("update" for the optimizer).
    Hooks on every submodule of ``model`` track which module's forward is running; they and the
    dispatch mode are removed on exit, also when the counted code raises. The autograd nodes created
    inside are kept (not their saved tensors, which backward frees) until exit, to attribute backward.
    Counting costs some tens of microseconds of Python per operator call.

    ``count=False`` skips the FLOP formulas, bytes and libraries (a timing-only counter, a few
    microseconds per call); ``timed=True`` times every operator call (host clock on the CPU, CUDA
    events on a GPU: pass ``device``; ``lead`` runs before each timed call there, see _EventTimer),
    and leaves ``inner_calls`` at 0: their scopes' Python would fall in the step it times.
    :meth:`take_step` hands back one step's table and starts the next,
    so one counter can stay installed over many steps.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        count: bool = True,
        timed: bool = False,
        device: Any = None,
        observer: Callable[[str, str, OpCall, _OpInfo], None] | None = None,
        lead: Callable[[], None] | None = None,
    ) -> None:
        _check_available()
        self.model = model
        self.count = count
        #: Called after every operator with (module, phase, the call with its result, operator info).
        self.observer = observer
        self._device_type = torch.device(device).type if device is not None else "cpu"
        self._timer: HostTimer | _EventTimer | None = None
        if timed:
            self._timer = _EventTimer(lead) if self._device_type == "cuda" else HostTimer()
        #: Forward calls per module name (a module called twice counts 2).
        self.module_calls: Counter[str] = Counter()
        #: Operator name -> the error of a formula that failed (the calls count as uncovered).
        self.formula_errors: dict[str, str] = {}
        self._totals: dict[tuple[str, str, str], _Totals] = {}
        self._infos: dict[Any, _OpInfo] = {}
        self._stage: str | None = None
        self._stack: list[str] = []
        self._names: dict[int, str] = {}
        self._param_owner: dict[int, str] = {}
        # Autograd node (kept alive for the step, so identity is stable) -> (node, module name).
        self._nodes: dict[int, tuple[Any, str]] = {}
        # Results of the last operators, waiting for autograd to attach their grad_fn (see _record).
        self._pending: list[tuple[Any, str, bool]] = []
        self._handles: list[Any] = []
        self._mode: CountingMode | None = None
        self._scopes: CallScopes | None = None

    # -- context manager and stages ------------------------------------------------------------------

    def __enter__(self) -> OpCounter:
        if self._mode is not None:
            raise RuntimeError("this OpCounter is already counting")
        try:
            for name, module in self.model.named_modules():
                self._names[id(module)] = name or ROOT_MODULE
                for parameter in module.parameters(recurse=False):
                    self._param_owner.setdefault(id(parameter), name or ROOT_MODULE)
                self._handles.append(module.register_forward_pre_hook(self._enter_module))
                self._handles.append(module.register_forward_hook(self._exit_module, always_call=True))
            if self._timer is None:
                scopes = CallScopes()
                scopes.__enter__()
                self._scopes = scopes  # only once entered: the except below exits it
            self._mode = CountingMode(self)
            self._mode.__enter__()
        except BaseException:
            if self._scopes is not None:
                self._scopes.__exit__(None, None, None)
            self._mode = self._scopes = None
            self._remove_hooks()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(exc_type, exc, tb)
        finally:
            try:
                if self._scopes is not None:
                    self._scopes.__exit__(exc_type, exc, tb)
            finally:
                self._mode = self._scopes = None
            self._remove_hooks()
            self._stack.clear()
            self._pending.clear()
            self._nodes.clear()  # releases the step's autograd nodes

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __call__(self, stage: str) -> AbstractContextManager[None]:
        """The ``stages`` protocol of ``Task.step``: operators inside run in phase ``stage``."""
        return self._in_stage(stage)

    @contextmanager
    def _in_stage(self, stage: str) -> Iterator[None]:
        previous, self._stage = self._stage, stage
        try:
            yield
        finally:
            self._stage = previous

    # -- module tracking -----------------------------------------------------------------------------

    def _enter_module(self, module: nn.Module, args: Any) -> None:
        name = self._names.get(id(module), type(module).__name__)
        self._stack.append(name)
        self.module_calls[name] += 1

    def _exit_module(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self._names.get(id(module), type(module).__name__)
        if torch.is_grad_enabled():
            self._claim_graph(output, name)
        # The last entry is this module's unless a forward raised past its own hook.
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i] == name:
                del self._stack[i:]
                break

    def _claim(self, node: Any, module: str) -> None:
        if node is not None and id(node) not in self._nodes:
            self._nodes[id(node)] = (node, module)

    def _claim_graph(self, output: Any, module: str) -> None:
        """Claim for ``module`` every autograd node its forward made that no operator result did:
        walking back from the outputs to nodes already known. These are the nodes of autograd
        Functions (custom operators, ``torch.autograd.Function``), whose inner operators run with
        grad mode off and so leave no pending result."""
        self._resolve_pending()
        stack = [t.grad_fn for t in tensors_of(output) if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if id(node) in self._nodes or getattr(node, "variable", None) is not None:
                continue  # known, or a leaf's AccumulateGrad (booked by its parameter's owner)
            self._nodes[id(node)] = (node, module)
            stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)

    def _resolve_pending(self) -> None:
        """Book the autograd nodes autograd attached to the last operators' results since they ran.

        Inside the dispatch mode a result has no grad_fn yet (autograd sets it after the kernel
        returns), so results wait here until the next operator, by when their node exists.
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for out, module, mutated in pending:
            for tensor in tensors_of(out):
                self._claim(tensor.grad_fn, module)
                if mutated and tensor._is_view() and tensor._base is not None:
                    self._claim(tensor._base.grad_fn, module)  # CopySlices of an in-place op on a view

    def _node_module(self) -> str:
        if _current_node is None:
            return UNATTRIBUTED
        node = _current_node()
        if node is None:
            return UNATTRIBUTED
        entry = self._nodes.get(id(node))
        if entry is not None and entry[0] is node:
            return entry[1]
        variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter's module
        if variable is not None:
            return self._param_owner.get(id(variable), UNATTRIBUTED)
        return UNATTRIBUTED

    # -- recording -----------------------------------------------------------------------------------

    def _info(self, func: Any) -> _OpInfo:
        info = self._infos.get(func)
        if info is None:
            info = self._infos[func] = _OpInfo.of(func)
        return info

    def _phase(self) -> str:
        if _graph_task_id is not None and _graph_task_id() != -1:
            return "backward"
        if self._stage in _OWN_PHASE_STAGES:
            return self._stage
        return "forward"

    def _record(self, info: _OpInfo, call: OpCall, elapsed: Any = None, faults: int = 0) -> None:
        phase = self._phase()
        name = variant_name(info.name, call)
        # Backward operators belong to the module that made their autograd node; the rest to the
        # innermost module whose forward is running.
        module = (
            self._node_module() if phase == "backward" else (self._stack[-1] if self._stack else NO_MODULE)
        )
        totals = self._totals.get((module, phase, name))
        if totals is None:
            totals = self._totals[(module, phase, name)] = _Totals(info.family)
        totals.calls += 1
        scopes = self._scopes
        if phase == "forward" and info.family != "free" and scopes is not None and scopes.issued is not None:
            totals.inner_calls += int(scopes.issued > 0)
            scopes.issued += 1
        if isinstance(elapsed, float):
            totals.seconds += elapsed
            totals.host_seconds += elapsed
            totals.faults += faults
        elif elapsed is not None:
            totals.events.append(elapsed[:2])
            totals.host_seconds += elapsed[2]
        if self.count:
            self._count(info, call, totals)
        if self.observer is not None:
            self.observer(module, phase, call, info)
        self._remember_results(call, module, info)

    def _count(self, info: _OpInfo, call: OpCall, totals: _Totals) -> None:
        flops: int | None = None
        if info.formula is not None:
            try:
                flops = info.formula(call)
            except Exception as error:  # a formula must never break the step it counts
                self.formula_errors.setdefault(info.name, f"{type(error).__name__}: {error}")
        bytes_read, bytes_written = _traffic(info, call)
        totals.bytes_read += bytes_read
        totals.bytes_written += bytes_written
        if flops is None:
            totals.covered = False
        else:
            totals.flops += flops
        if totals.library is None and self._device_type != "meta":
            totals.library = library_of(info.name, info.family, call)
        if totals.dtype is None:
            totals.dtype = _dtype_of(call)
        if totals.kind is None:
            totals.kind = convolution_kind(info.name, call)
        totals.rows += convolution_rows(info.name, call) or product_rows(info.name, call)

    def _remember_results(self, call: OpCall, module: str, info: _OpInfo) -> None:
        # Results that may get an autograd node: remember under which module they were made.
        if torch.is_grad_enabled() and any(
            t.requires_grad for value in (*call.args, *call.kwargs.values()) for t in tensors_of(value)
        ):
            self._pending.append((call.out, module, bool(info.written)))

    # -- results -------------------------------------------------------------------------------------

    def table(self) -> list[OpRecord]:
        """Every (module, phase, operator) seen, in the order first seen; flops None if uncovered (or
        not counted), seconds None if not timed. On CUDA, call after the device has synchronised."""
        timed = self._timer is not None
        return [
            OpRecord(
                name=name,
                module=module,
                phase=phase,
                family=totals.family,
                flops=totals.flops if totals.covered and self.count else None,
                bytes_read=totals.bytes_read,
                bytes_written=totals.bytes_written,
                calls=totals.calls,
                seconds=totals.seconds + sum(a.elapsed_time(b) for a, b in totals.events) * 1e-3
                if timed
                else None,
                host_seconds=totals.host_seconds if timed else None,
                faults=totals.faults if isinstance(self._timer, HostTimer) else None,
                library=totals.library,
                dtype=totals.dtype,
                kind=totals.kind or "",
                rows=totals.rows,
                inner_calls=totals.inner_calls,
            )
            for (module, phase, name), totals in self._totals.items()
        ]

    def take_step(self) -> list[OpRecord]:
        """The table of everything since the last call, then a clean slate for the next step (the
        autograd nodes of the step are released; hooks and the mode stay installed)."""
        table = self.table()
        self._totals.clear()
        self.module_calls.clear()
        self._nodes.clear()
        self._pending.clear()
        if isinstance(self._timer, _EventTimer):
            self._timer.reset()
        return table

    def by_module(self) -> dict[str, dict[str, dict[str, float]]]:
        """module -> phase -> {flops, bytes_read, bytes_written, calls} (uncovered operators add 0 FLOPs)."""
        result: dict[str, dict[str, dict[str, float]]] = {}
        for record in self.table():
            sums = result.setdefault(record.module, {}).setdefault(
                record.phase, {"flops": 0, "bytes_read": 0, "bytes_written": 0, "calls": 0}
            )
            sums["flops"] += record.flops or 0
            sums["bytes_read"] += record.bytes_read
            sums["bytes_written"] += record.bytes_written
            sums["calls"] += record.calls
        return result

    def uncovered(self) -> dict[str, int]:
        """Operator name -> calls, for operators without a FLOP formula (views and copies excluded)."""
        calls: Counter[str] = Counter()
        for record in self.table():
            if record.flops is None:
                calls[record.name] += record.calls
        return dict(calls.most_common())

    def coverage(self) -> float:
        """Share of the calls of operators that do arithmetic or may (all but views, copies, random
        generation) that have a formula; 1.0 when there were none."""
        counted = [r for r in self.table() if r.family not in FREE_FAMILIES]
        total = sum(r.calls for r in counted)
        return 1.0 - sum(r.calls for r in counted if r.flops is None) / total if total else 1.0

    def total_flops(self, phase: str | None = None, families: Sequence[str] | None = None) -> int:
        """FLOPs counted, optionally of one phase and of some families only (e.g. TORCH_FAMILIES)."""
        return sum(
            r.flops or 0
            for r in self.table()
            if (phase is None or r.phase == phase) and (families is None or r.family in families)
        )


def count_step(workload_name: str, preset: str, batch_size: int, device: str = "cpu") -> OpCounter:
    """Count one training step of a freshly built task (seeded as ``count_step_flops`` seeds it)."""
    from dnnperf.workloads import get_workload

    workload = get_workload(workload_name)
    torch.manual_seed(0)
    task = workload.build(preset, device)
    batch = {k: v.to(device) for k, v in workload.data(preset).synthesize(batch_size, 0).items()}
    counter = OpCounter(task.model)
    with counter:
        task.step(batch, counter)
    return counter
