"""Convolution libraries compared layer by layer: the default kernel against explicit im2col + GEMM.

Seed paper 001 timed every convolution of a network with cuDNN and with cuBLAS (im2col + GEMM, as Caffe
does). This module repeats the experiment on whatever device torch runs on. For each ``nn.Conv2d`` (and
``nn.Conv1d``) call of a model it times two methods:

* ``"default"``: ``F.conv2d`` / ``F.conv1d`` with the layer's hyper-parameters, as the model runs it
  (oneDNN on the CPU, cuDNN on CUDA); backward through autograd (``convolution_backward``);
* ``"im2col+gemm"``: :func:`im2col_conv2d`: ``F.unfold`` (im2col) to a column matrix, a batched matrix
  product of the weight reshaped to (groups, Cout/groups, Cin/groups*kh*kw) with the columns (BLAS),
  a reshape to the output and the bias added; backward through autograd over these operators (the
  GEMMs' transposes and ``fold``, i.e. col2im). A 1-D layer is run as a 2-D one of height 1. The
  unfold runs for 1x1 kernels too (Caffe skips it there), so those layers pay for the copy.

How a layer is timed (:func:`compare_layer`). The layer's input shape and dtype come from one real
forward of the model (:func:`capture_conv_inputs`; one site per module and distinct input shape). Each
method gets its own leaves made from the same random data (a private generator; torch's global RNG is
not touched): the input with ``requires_grad=True``, a copy of the layer's weight and bias, and one
pre-made ``grad_out`` shared by both. Every layer's input requires grad, the first layer's included
(whose input in real training does not), so backward always computes grad input and grad weight (and
grad bias). A sample is one forward call (the timed region is the conv call) followed by one
``out.backward(grad_out)``, each timed alone with ``time.perf_counter`` and the device synchronised
before and after; gradients are set to None before each sample, so backward writes them fresh rather
than accumulating. Warm-up rounds come first, then ``repeats`` rounds in which the methods alternate
(default, im2col, default, im2col, ...), so that drifts of the machine fall on both alike. Raw samples
are kept (:class:`~dnnperf.stats.Samples`, seconds); statistics are medians.

Work. FLOPs are 2 per multiply-add, bias not counted (:func:`conv_flops`): forward
2 * N * Cout * prod(out spatial) * (Cin/groups) * prod(kernel); backward twice that (grad input and
grad weight, one forward's worth each; the bias gradient's reduction is not counted). Efficiency is
achieved FLOP/s over a given peak (for instance ``HardwareProfile.peak_flops()``).

Skipped layers (a reason in :attr:`LayerComparison.skipped`, never an exception): ``padding_mode``
other than ``'zeros'``; ``padding='same'`` that needs uneven padding (``F.unfold`` pads evenly);
column matrices whose estimated size (forward plus about twice that for backward) exceeds
``max_bytes``; out-of-memory or kernel errors while timing. Not covered: ``Conv3d`` and transposed
convolutions (not captured at all). Module subclasses that override ``forward`` are timed as the
plain ``F.conv*`` of their hyper-parameters and weight.

Caveats. On CUDA the default path may use TF32 for float32 (``torch.backends.cudnn.allow_tf32``, on by
default) while the GEMM path follows ``torch.backends.cuda.matmul.allow_tf32`` (off by default); this
module leaves both flags as they are. An input captured under autocast is timed in autocast's dtype.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.devices import is_out_of_memory, resolve_device, synchronize
from dnnperf.errors import UsageError
from dnnperf.stats import Samples

METHODS = ("default", "im2col+gemm")
PHASES = ("forward", "backward")
ROOT_MODULE = "(root)"
#: The column-matrix budget of one layer (forward plus backward estimate) before it is skipped.
DEFAULT_MAX_BYTES = 2 << 30
#: Extra column-matrix copies that backward holds beside forward's (grad of the columns, fold's work).
BACKWARD_COLUMN_FACTOR = 2

Progress = Callable[[str, float], None]
ConvFunction = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]

_SUPPORTED = (nn.Conv1d, nn.Conv2d)
_FUNCTIONAL = {1: F.conv1d, 2: F.conv2d}


# ---------------------------------------------------------------------------------------------------------
# Work accounting


def _tuple(value: int | Sequence[int], n: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    result = tuple(int(v) for v in value)
    if len(result) != n:
        raise ValueError(f"expected {n} values, got {tuple(value)}")
    return result


def conv_output_shape(
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
) -> tuple[int, ...]:
    """Output shape (N, Cout, *spatial) of a convolution with symmetric zero padding (PyTorch's formula)."""
    spatial = len(input_shape) - 2
    kernel = tuple(weight_shape[2:])
    stride_, padding_, dilation_ = (_tuple(v, spatial) for v in (stride, padding, dilation))
    out = tuple(
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, s, p, d in zip(input_shape[2:], kernel, stride_, padding_, dilation_, strict=True)
    )
    return (int(input_shape[0]), int(weight_shape[0]), *out)


def conv_flops(
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> int:
    """FLOPs of one forward convolution without bias, 1-D or 2-D, 2 per multiply-add:
    2 * N * Cout * prod(out spatial) * (Cin / groups) * prod(kernel).

    Equals :func:`dnnperf.hardware.conv2d_flops` for 2-D layers; this one takes per-dimension tuples."""
    in_channels = input_shape[1]
    per_group = weight_shape[1]
    if per_group * groups != in_channels:
        raise ValueError(
            f"weight {tuple(weight_shape)} does not fit {in_channels} channels in {groups} groups"
        )
    out = conv_output_shape(input_shape, weight_shape, stride, padding, dilation)
    return 2 * out[0] * out[1] * math.prod(out[2:]) * per_group * math.prod(weight_shape[2:])


def column_bytes(
    input_shape: Sequence[int], output_shape: Sequence[int], kernel: Sequence[int], element_size: int
) -> int:
    """Bytes of im2col's column matrix: N * Cin * prod(kernel) * prod(out spatial) * element size."""
    return (
        int(input_shape[0])
        * int(input_shape[1])
        * math.prod(kernel)
        * math.prod(output_shape[2:])
        * element_size
    )


# ---------------------------------------------------------------------------------------------------------
# The explicit path


def im2col_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``F.conv2d`` as im2col + GEMM: ``F.unfold`` then a batched matmul, reshaped, bias added.

    ``x`` is (N, Cin, H, W), ``weight`` (Cout, Cin/groups, kh, kw); padding is symmetric zero padding
    (ints, no strings). Differentiable: autograd's backward is the GEMMs' transposes and col2im."""
    if x.dim() != 4 or weight.dim() != 4:
        raise ValueError(
            f"im2col_conv2d needs a 4-D input and weight, got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    batch, in_channels = x.shape[:2]
    out_channels, per_group, kh, kw = weight.shape
    if per_group * groups != in_channels or out_channels % groups:
        raise ValueError(
            f"weight {tuple(weight.shape)} does not fit {in_channels} input channels in {groups} groups"
        )
    stride, padding, dilation = (_tuple(v, 2) for v in (stride, padding, dilation))
    _, _, out_h, out_w = conv_output_shape(x.shape, weight.shape, stride, padding, dilation)
    columns = F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)  # (N, Cin*kh*kw, L)
    # Unfold's rows run channel-major, so each group's channels are one contiguous block of rows.
    columns = columns.reshape(batch, groups, per_group * kh * kw, out_h * out_w)
    matrix = weight.reshape(groups, out_channels // groups, per_group * kh * kw)
    out = torch.matmul(matrix, columns)  # (N, groups, Cout/groups, L): one GEMM per sample and group
    out = out.reshape(batch, out_channels, out_h, out_w)
    if bias is not None:
        out = out + bias.view(1, out_channels, 1, 1)
    return out


def im2col_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``F.conv1d`` as im2col + GEMM: :func:`im2col_conv2d` on a height-1 image."""
    (stride_,), (padding_,), (dilation_,) = (_tuple(v, 1) for v in (stride, padding, dilation))
    out = im2col_conv2d(
        x.unsqueeze(2), weight.unsqueeze(2), bias, (1, stride_), (0, padding_), (1, dilation_), groups
    )
    return out.squeeze(2)


# ---------------------------------------------------------------------------------------------------------
# Capturing the layers


@dataclass(eq=False)
class ConvSite:
    """One convolution module called on one input shape during the captured forward."""

    name: str
    module: nn.Module
    #: Batched input shape (an unbatched call is recorded with N = 1).
    input_shape: tuple[int, ...]
    #: The dtype the convolution computes in (autocast's when it was active).
    dtype: torch.dtype
    device: torch.device
    channels_last: bool = False
    #: Calls of this module on this shape in the captured forward.
    calls: int = 1


def capture_conv_inputs(model: nn.Module, run_forward: Callable[[], object]) -> list[ConvSite]:
    """Run ``run_forward()`` once, as given, and return the ``nn.Conv1d``/``nn.Conv2d`` calls it made.

    One site per module and distinct (shape, dtype, device), in the order first called; a module
    reachable under several names takes its first name from ``model.named_modules()``. The hooks are
    removed afterwards, also when ``run_forward`` raises (the error propagates)."""
    names = {id(m): name or ROOT_MODULE for name, m in model.named_modules()}
    sites: dict[tuple[Any, ...], ConvSite] = {}
    handles = []

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor):
            return
        spatial = 1 if isinstance(module, nn.Conv1d) else 2
        shape = tuple(x.shape) if x.dim() == spatial + 2 else (1, *x.shape)
        dtype = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        channels_last = spatial == 2 and x.dim() == 4 and not x.is_contiguous()
        channels_last = channels_last and x.is_contiguous(memory_format=torch.channels_last)
        key = (id(module), shape, dtype, x.device, channels_last)
        if key in sites:
            sites[key].calls += 1
        else:
            name = names.get(id(module), type(module).__name__)
            sites[key] = ConvSite(name, module, shape, dtype, x.device, channels_last)

    try:
        for module in model.modules():
            if isinstance(module, _SUPPORTED):
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
        run_forward()
    finally:
        for handle in handles:
            handle.remove()
    return list(sites.values())


# ---------------------------------------------------------------------------------------------------------
# The comparison


@dataclass(frozen=True)
class LayerComparison:
    """One convolution site timed both ways, forward and backward, with its work.

    Times are seconds per call; ``default_*`` is ``F.conv*``, ``im2col_*`` is :func:`im2col_conv2d`.
    A skipped layer has a reason in ``skipped`` and empty samples."""

    name: str
    module_type: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    bias: bool
    dtype: str
    device: str
    #: Calls of this module on this shape in the captured forward.
    calls: int
    #: 2 FLOPs per multiply-add, bias not counted.
    flops_forward: int
    #: Grad input plus grad weight: 2 x forward (every layer's input requires grad here).
    flops_backward: int
    #: Bytes of one im2col column matrix (forward).
    column_bytes: int
    default_forward: Samples = field(default_factory=lambda: Samples(()))
    default_backward: Samples = field(default_factory=lambda: Samples(()))
    im2col_forward: Samples = field(default_factory=lambda: Samples(()))
    im2col_backward: Samples = field(default_factory=lambda: Samples(()))
    peak_flops: float | None = None
    skipped: str | None = None

    def samples(self, method: str, phase: str) -> Samples:
        """Raw seconds of ``method`` ("default" or "im2col+gemm") in ``phase`` ("forward"/"backward")."""
        if method not in METHODS or phase not in PHASES:
            raise ValueError(f"method must be one of {METHODS} and phase one of {PHASES}")
        prefix = "default" if method == "default" else "im2col"
        return getattr(self, f"{prefix}_{phase}")

    def flops(self, phase: str) -> int:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}")
        return self.flops_forward if phase == "forward" else self.flops_backward

    def median_s(self, method: str, phase: str) -> float | None:
        """Median seconds per call; None when not measured."""
        samples = self.samples(method, phase)
        return samples.median if len(samples) else None

    def achieved_flops(self, method: str, phase: str) -> float | None:
        """FLOP/s at the median time; None when not measured."""
        seconds = self.median_s(method, phase)
        return self.flops(phase) / seconds if seconds else None

    def efficiency(self, method: str, phase: str) -> float | None:
        """Achieved FLOP/s over ``peak_flops``; None without a peak or a measurement."""
        achieved = self.achieved_flops(method, phase)
        return achieved / self.peak_flops if achieved is not None and self.peak_flops else None

    def ratio(self, phase: str) -> float | None:
        """im2col+GEMM time over default time (above 1: the default library is faster)."""
        default, im2col = self.median_s("default", phase), self.median_s("im2col+gemm", phase)
        return im2col / default if default and im2col is not None else None

    @property
    def speedup(self) -> dict[str, float | None]:
        """Per phase, im2col+GEMM time / default time: how many times faster the default library is."""
        return {phase: self.ratio(phase) for phase in PHASES}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record with the raw samples (seconds)."""
        return {
            "name": self.name,
            "module_type": self.module_type,
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
            "kernel": list(self.kernel),
            "stride": list(self.stride),
            "padding": list(self.padding),
            "dilation": list(self.dilation),
            "groups": self.groups,
            "bias": self.bias,
            "dtype": self.dtype,
            "device": self.device,
            "calls": self.calls,
            "flops_forward": self.flops_forward,
            "flops_backward": self.flops_backward,
            "column_bytes": self.column_bytes,
            "peak_flops": self.peak_flops,
            "skipped": self.skipped,
            "samples_s": {
                method: {phase: list(self.samples(method, phase).values) for phase in PHASES}
                for method in METHODS
            },
        }


def _resolve_padding(module: nn.Module, spatial: int) -> tuple[tuple[int, ...], str | None]:
    """The module's padding as symmetric ints, or zeros and the reason it cannot be."""
    padding = module.padding
    if padding == "valid":
        return (0,) * spatial, None
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size, strict=True)]
        if any(t % 2 for t in totals):
            return (0,) * spatial, (
                f"padding='same' with kernel {tuple(module.kernel_size)} and dilation "
                f"{tuple(module.dilation)} pads unevenly, which F.unfold cannot"
            )
        return tuple(t // 2 for t in totals), None
    return _tuple(padding, spatial), None


def _bytes_text(nbytes: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"


def _leaves(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Fresh leaf copies that require grad (one set per method)."""
    return (
        x.clone().requires_grad_(True),
        weight.clone().requires_grad_(True),
        None if bias is None else bias.clone().requires_grad_(True),
    )


def _sample(
    fn: ConvFunction,
    leaves: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    grad_out: torch.Tensor,
    device: torch.device,
) -> tuple[float, float]:
    """One forward call and one backward, each timed alone; returns (forward s, backward s)."""
    for leaf in leaves:
        if leaf is not None:
            leaf.grad = None
    synchronize(device)
    start = time.perf_counter()
    out = fn(*leaves)
    synchronize(device)
    forward = time.perf_counter() - start
    synchronize(device)
    start = time.perf_counter()
    out.backward(grad_out)
    synchronize(device)
    return forward, time.perf_counter() - start


def _check_counts(repeats: int, warmup: int, peak_flops: float | None, max_bytes: int) -> None:
    if repeats < 1:
        raise UsageError(f"repeats must be at least 1, got {repeats}")
    if warmup < 0:
        raise UsageError(f"warmup must be 0 or more, got {warmup}")
    if peak_flops is not None and not peak_flops > 0:
        raise UsageError(f"peak_flops must be a positive FLOP/s rate, got {peak_flops!r}")
    if max_bytes < 0:
        raise UsageError(f"max_bytes must be 0 or more, got {max_bytes}")


def _device(device: torch.device | str | None, site: ConvSite) -> torch.device:
    if device is None:
        return site.device
    return resolve_device(device) if isinstance(device, str) else torch.device(device)


def compare_layer(
    site: ConvSite,
    device: torch.device | str | None = None,
    repeats: int = 10,
    warmup: int = 2,
    *,
    peak_flops: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    seed: int = 0,
) -> LayerComparison:
    """Time one site both ways (see the module docstring); ``device`` defaults to the site's own.

    Never raises for a layer that cannot be run: it comes back with ``skipped`` set instead."""
    _check_counts(repeats, warmup, peak_flops, max_bytes)
    device = _device(device, site)
    module = site.module
    if not isinstance(module, _SUPPORTED):
        raise UsageError(f"{site.name} is a {type(module).__name__}; only Conv1d and Conv2d are compared")
    spatial = 1 if isinstance(module, nn.Conv1d) else 2
    padding, reason = _resolve_padding(module, spatial)
    if module.padding_mode != "zeros":
        reason = f"padding_mode={module.padding_mode!r}: the im2col path pads with zeros only"
    weight_shape = tuple(module.weight.shape)
    stride, dilation, groups = tuple(module.stride), tuple(module.dilation), module.groups
    output_shape = conv_output_shape(site.input_shape, weight_shape, stride, padding, dilation)
    flops_forward = conv_flops(site.input_shape, weight_shape, stride, padding, dilation, groups)
    element_size = torch.empty((), dtype=site.dtype).element_size()
    columns = column_bytes(site.input_shape, output_shape, weight_shape[2:], element_size)
    needed = columns * (1 + BACKWARD_COLUMN_FACTOR)
    if reason is None and needed > max_bytes:
        reason = (
            f"im2col's column matrices need about {_bytes_text(needed)} (forward {_bytes_text(columns)} "
            f"plus backward), over max_bytes={_bytes_text(max_bytes)}"
        )
    result = LayerComparison(
        name=site.name,
        module_type=type(module).__name__,
        input_shape=site.input_shape,
        output_shape=output_shape,
        kernel=tuple(weight_shape[2:]),
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=module.bias is not None,
        dtype=str(site.dtype).removeprefix("torch."),
        device=str(device),
        calls=site.calls,
        flops_forward=flops_forward,
        flops_backward=2 * flops_forward,
        column_bytes=columns,
        peak_flops=peak_flops,
        skipped=reason,
    )
    if reason is not None:
        return result
    try:
        seconds = _time_methods(site, module, spatial, padding, output_shape, device, repeats, warmup, seed)
    except (RuntimeError, MemoryError) as error:
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        what = "out of memory" if is_out_of_memory(error) else type(error).__name__
        return replace(result, skipped=f"{what} while timing: {first_line}")
    return replace(
        result,
        default_forward=Samples.of(seconds[("default", "forward")]),
        default_backward=Samples.of(seconds[("default", "backward")]),
        im2col_forward=Samples.of(seconds[("im2col+gemm", "forward")]),
        im2col_backward=Samples.of(seconds[("im2col+gemm", "backward")]),
    )


def _time_methods(
    site: ConvSite,
    module: nn.Module,
    spatial: int,
    padding: tuple[int, ...],
    output_shape: tuple[int, ...],
    device: torch.device,
    repeats: int,
    warmup: int,
    seed: int,
) -> dict[tuple[str, str], list[float]]:
    """Raw seconds per (method, phase): warm-up rounds, then ``repeats`` alternating rounds."""
    stride, dilation, groups = tuple(module.stride), tuple(module.dilation), module.groups
    im2col = im2col_conv1d if spatial == 1 else im2col_conv2d  # looked up now: tests may patch them
    functions: dict[str, ConvFunction] = {
        # The model's own padding (a string included), as the model would call it.
        "default": partial(
            _FUNCTIONAL[spatial], stride=stride, padding=module.padding, dilation=dilation, groups=groups
        ),
        "im2col+gemm": partial(im2col, stride=stride, padding=padding, dilation=dilation, groups=groups),
    }
    memory_format = torch.channels_last if site.channels_last else torch.contiguous_format
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.enable_grad():
        x = torch.randn(site.input_shape, dtype=site.dtype, device=device, generator=generator)
        x = x.contiguous(memory_format=memory_format)
        grad_out = torch.randn(output_shape, dtype=site.dtype, device=device, generator=generator)
        grad_out = grad_out.contiguous(memory_format=memory_format)
        weight = module.weight.detach().to(device=device, dtype=site.dtype, copy=True)
        bias = None if module.bias is None else module.bias.detach().to(device=device, dtype=site.dtype)
        leaves = {method: _leaves(x, weight, bias) for method in METHODS}
        del x
        for _ in range(warmup):
            for method in METHODS:
                _sample(functions[method], leaves[method], grad_out, device)
        seconds: dict[tuple[str, str], list[float]] = {(m, p): [] for m in METHODS for p in PHASES}
        for _ in range(repeats):
            for method in METHODS:
                forward, backward = _sample(functions[method], leaves[method], grad_out, device)
                seconds[(method, "forward")].append(forward)
                seconds[(method, "backward")].append(backward)
    return seconds


def compare_convolutions(
    model: nn.Module,
    run_forward: Callable[[], object],
    device: torch.device | str | None = None,
    *,
    repeats: int = 10,
    warmup: int = 2,
    peak_flops: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Progress | None = None,
    seed: int = 0,
) -> list[LayerComparison]:
    """Capture the convolutions one ``run_forward()`` makes, then time each both ways, in call order.

    ``device`` defaults to each site's own. ``progress(description, fraction_done)`` is called before
    each layer and once with 1.0 at the end. A UsageError when the forward calls no Conv1d/Conv2d."""
    _check_counts(repeats, warmup, peak_flops, max_bytes)
    sites = capture_conv_inputs(model, run_forward)
    if not sites:
        others = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)})
        also = f" (its {', '.join(others)} layers are not covered)" if others else ""
        raise UsageError(f"the model's forward called no nn.Conv1d or nn.Conv2d layer to compare{also}")
    comparisons = []
    for index, site in enumerate(sites):
        if progress is not None:
            progress(f"{site.name} {'x'.join(map(str, site.input_shape))}", index / len(sites))
        comparisons.append(
            compare_layer(
                site, device, repeats, warmup, peak_flops=peak_flops, max_bytes=max_bytes, seed=seed + index
            )
        )
    if progress is not None:
        progress("convolutions compared", 1.0)
    return comparisons


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def comparison_table(comparisons: Sequence[LayerComparison]) -> list[dict[str, Any]]:
    """One plain, JSON-safe row per layer (None where not measured) for printing or recording."""
    rows = []
    for c in comparisons:
        row: dict[str, Any] = {
            "layer": c.name,
            "type": c.module_type,
            "input_shape": "x".join(map(str, c.input_shape)),
            "output_shape": "x".join(map(str, c.output_shape)),
            "kernel": "x".join(map(str, c.kernel)),
            "stride": list(c.stride),
            "padding": list(c.padding),
            "dilation": list(c.dilation),
            "groups": c.groups,
            "calls": c.calls,
            "flops_forward": c.flops_forward,
            "flops_backward": c.flops_backward,
        }
        for method, prefix in zip(METHODS, ("default", "im2col"), strict=True):
            for phase, short in (("forward", "fwd"), ("backward", "bwd")):
                row[f"{prefix}_{short}_ms"] = _ms(c.median_s(method, phase))
                row[f"{prefix}_{short}_efficiency"] = c.efficiency(method, phase)
        row["ratio_fwd"] = c.ratio("forward")
        row["ratio_bwd"] = c.ratio("backward")
        row["skipped"] = c.skipped
        rows.append(row)
    return rows
