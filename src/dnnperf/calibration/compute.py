"""Compute peaks: square matrix products and 3x3 convolutions per precision, in both memory layouts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from dnnperf.calibration.memory import MemorySweeps
from dnnperf.calibration.plans import Plan
from dnnperf.calibration.timing import (
    Kernel,
    Tracker,
    calls_per_sample,
    measure_interleaved,
    one_round,
    release,
    schedule,
    time_samples,
    warm_up,
)
from dnnperf.devices import is_out_of_memory
from dnnperf.hardware import DTYPES, OPS, ComputeCurve, KernelTiming, conv2d_flops, matmul_flops

#: A reduced precision is kept only when it reaches this fraction of float32's rate at the first
#: configuration: below that it runs on a fallback path whose "peak" says nothing about the hardware.
SANE_FRACTION = 0.1


def fp32_precision_flags() -> list[Any]:
    """The torch >= 2.9 ``fp32_precision`` flag holders that the legacy TF32 setters touch."""
    backends = torch.backends
    if not (hasattr(backends.cudnn, "conv") and hasattr(backends.mkldnn, "matmul")):
        return []
    return [backends.cuda.matmul, backends.cudnn.conv, backends.cudnn.rnn, backends.mkldnn.matmul]


@contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """TF32 math on or off for float32 cuBLAS matrix products and cuDNN convolutions; every flag
    restored after.

    Sets the legacy flags (``allow_tf32``): on torch >= 2.9 their setters update the newer
    ``fp32_precision`` flags too, whereas setting only the new ones would leave the legacy ones
    disagreeing, which torch rejects ("mix of the legacy and new APIs") when cuBLAS reads them."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    # The legacy getters raise when the process set only the new flags; the legacy flags are then at
    # their defaults, which is what gets restored.
    try:
        precision = torch.get_float32_matmul_precision()
    except RuntimeError:
        precision = "highest"
    try:
        cudnn_tf32 = bool(cudnn.allow_tf32)
    except RuntimeError:
        cudnn_tf32 = True
    newer = [(flags, flags.fp32_precision) for flags in fp32_precision_flags()]
    matmul.allow_tf32 = enabled
    cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        # Legacy first (their setters overwrite some new flags), then the new flags exactly as they were.
        torch.set_float32_matmul_precision(precision)
        cudnn.allow_tf32 = cudnn_tf32
        for flags, value in newer:
            flags.fp32_precision = value


@contextmanager
def _cudnn_benchmark(device: torch.device) -> Iterator[None]:
    """Let cuDNN pick its fastest algorithm (during warm-up), as a peak measurement should."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def _compute_kernel(op: str, shape: Any, precision: str, layout: str, device: torch.device) -> Kernel:
    """A matrix product (shape: n) or a 3x3 convolution (shape: (batch, channels, pixels))."""
    dtype = DTYPES[precision]
    if op == "matmul":
        n = shape
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        params: dict[str, Any] = {"n": n}
        return Kernel(
            partial(torch.mm, a, b, out=out), f"mm n={n}", float(matmul_flops(n, n, n)), "FLOP", params
        )
    batch, channels, pixels = shape
    memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(batch, channels, pixels, pixels, device=device, dtype=dtype)
    w = torch.randn(channels, channels, 3, 3, device=device, dtype=dtype)
    x, w = x.contiguous(memory_format=memory_format), w.contiguous(memory_format=memory_format)
    params = {"batch": batch, "channels": channels, "pixels": pixels, "kernel": 3, "layout": layout}
    # F.conv2d has no out= form: its output is allocated inside the timed call. On CUDA the caching
    # allocator makes that free; on CPU it is a reused heap block, small next to the arithmetic.
    return Kernel(
        partial(F.conv2d, x, w, None, 1, 1),
        f"conv3x3 {_shape_text(op, shape)} {layout}",
        float(conv2d_flops(x.shape, w.shape, padding=1)),
        "FLOP",
        params,
    )


@dataclass
class _PendingCurve:
    """One operator in one precision, its configurations warmed up and ready to time."""

    op: str
    precision: str
    kernels: list[Kernel]
    per_call: list[float]
    notes: list[str]
    device: torch.device

    @property
    def warm_rates(self) -> dict[str, float]:
        """Label -> work per second estimated at warm-up."""
        return {k.label: k.work / t for k, t in zip(self.kernels, self.per_call, strict=True)}

    @contextmanager
    def context(self) -> Iterator[None]:
        """The backend settings this curve is measured under (TF32 on or off, cuDNN autotuning)."""
        cuda = self.device.type == "cuda"
        tf32 = tf32_mode(self.precision == "tf32") if cuda and self.precision in ("float32", "tf32") else None
        with tf32 or nullcontext(), _cudnn_benchmark(self.device):
            yield


def _configs(op: str, plan: Plan) -> list[tuple[Any, str]]:
    if op == "matmul":
        return [(n, "contiguous") for n in plan.mm_sizes]
    return [(shape, layout) for shape in plan.conv_shapes for layout in ("contiguous", "channels_last")]


def _prepare_compute(
    op: str,
    precision: str,
    device: torch.device,
    plan: Plan,
    tracker: Tracker,
    reference: Mapping[str, float] | None,
) -> ComputeCurve | _PendingCurve:
    """Build and warm up one operator in one precision at every shape of the plan (convolutions in
    both memory layouts: the fast one differs between backends, oneDNN on CPU runs channels_last
    about 2x faster). A finished (unusable) curve when nothing can be timed.

    A precision other than float32 is first tried on the first configuration; below SANE_FRACTION of
    float32's rate there (``reference``: float32's rates by label) it is timed only there and
    marked not usable."""
    configs = _configs(op, plan)
    weight = plan.compute_s + plan.warmup_s
    pending = _PendingCurve(op, precision, [], [], [], device)
    dtype_name = str(DTYPES[precision]).removeprefix("torch.")
    with pending.context():
        for index, (shape, layout) in enumerate(configs):
            text = _shape_text(op, shape) + (f" {layout}" if op == "conv2d" else "")
            with tracker.step(f"{op} {precision} {text} warm-up", plan.warmup_s):
                try:
                    kernel = _compute_kernel(op, shape, precision, layout, device)
                    kernel = replace(kernel, params={**kernel.params, "dtype": dtype_name})
                    seconds = warm_up(kernel.fn, device, plan.warmup_s)
                except (RuntimeError, MemoryError) as error:
                    reason = (
                        "out of memory" if is_out_of_memory(error) else str(error).strip().splitlines()[0]
                    )
                    pending.notes.append(f"{text} failed: {reason[:200]}")
                    release(device)
                    continue
            pending.kernels.append(kernel)
            pending.per_call.append(seconds)
            if index == 0 and precision != "float32" and reference and kernel.label in reference:
                ratio = kernel.work / seconds / reference[kernel.label]
                if ratio < SANE_FRACTION:
                    # Timed briefly, kept in the profile to show why, never used as a peak.
                    calls = calls_per_sample(seconds, plan)
                    samples = time_samples(kernel.fn, device, calls, plan.min_repeats)
                    point = KernelTiming(
                        kernel.label, kernel.work, kernel.unit, calls, tuple(samples), kernel.params
                    )
                    tracker.skip(weight * len(configs) - plan.warmup_s)
                    note = (
                        f"not used: {point.rate.median / 1e9:.3g} GFLOP/s = {ratio:.0%} of float32 at "
                        f"{text}, below {SANE_FRACTION:.0%} (no fast {precision} path on this device)"
                    )
                    release(device)
                    return ComputeCurve(op, precision, (point,), usable=False, note=note)
    if not pending.kernels:
        tracker.skip(plan.compute_s * len(configs))
        return ComputeCurve(op, precision, (), usable=False, note="; ".join(pending.notes) or None)
    return pending


def _finish_compute(
    pending: _PendingCurve, points: Sequence[KernelTiming], reference: ComputeCurve | None
) -> ComputeCurve:
    curve = ComputeCurve(pending.op, pending.precision, tuple(points))
    notes = list(pending.notes)
    best = curve.best
    if pending.op == "conv2d" and best is not None:
        notes.append(f"fastest layout: {best.params['layout']}")
    if pending.precision != "float32" and reference is not None and reference.points and best is not None:
        notes.append(
            f"kept: peak {curve.peak / 1e9:.3g} GFLOP/s = {curve.peak / reference.peak:.0%} of float32's peak"
        )
    return replace(curve, note="; ".join(notes) or None)


def measure_compute(
    op: str,
    precision: str,
    device: torch.device,
    plan: Plan,
    tracker: Tracker,
    reference: ComputeCurve | None,
) -> ComputeCurve:
    """One operator in one precision on its own (:func:`calibrate` interleaves every curve instead):
    warm-up, then its configurations in alternating blocks."""
    rates = {p.label: p.rate.median for p in reference.points} if reference is not None else None
    pending = _prepare_compute(op, precision, device, plan, tracker, rates)
    if isinstance(pending, ComputeCurve):
        return pending
    configs = len(_configs(op, plan))

    @contextmanager
    def step(index: int, rounds: int) -> Iterator[None]:
        with tracker.step(f"{op} {precision} round {index + 1}/{rounds}", plan.compute_s * configs / rounds):
            yield

    with pending.context():
        budget = plan.compute_s * len(pending.kernels)
        points = measure_interleaved(pending.kernels, pending.per_call, device, plan, budget, step)
    release(device)
    return _finish_compute(pending, points, reference)


def measure_all_compute(
    device: torch.device, plan: Plan, tracker: Tracker, sweeps: MemorySweeps
) -> list[ComputeCurve]:
    """Every compute curve of the plan, warmed up first and then timed in common rounds: each round
    runs blocks of every configuration of every curve, and the memory sweeps fall between rounds
    (a DRAM probe sample after each curve's round).
    Each kernel's samples then span the whole calibration, so a stretch of contention from other
    processes (which only ever slows samples down) leaves every kernel some quiet samples: its best
    sustained rate, the peak, does not depend on which kernel happened to run during that stretch."""
    items: list[ComputeCurve | _PendingCurve] = []
    for op in OPS:
        reference = None
        for precision in plan.precisions:
            item = _prepare_compute(op, precision, device, plan, tracker, reference)
            if precision == "float32" and isinstance(item, _PendingCurve):
                reference = item.warm_rates
            items.append(item)
    pending = [item for item in items if isinstance(item, _PendingCurve)]
    schedules = [schedule(p.per_call, plan, plan.compute_s * len(p.kernels)) for p in pending]
    seconds: list[list[list[float]]] = [[[] for _ in p.kernels] for p in pending]
    done = [0] * len(pending)
    total = max((rounds for _, _, rounds in schedules), default=0)
    weight = plan.compute_s * sum(len(_configs(p.op, plan)) for p in pending) / max(total, 1)
    for index in range(total):
        with tracker.step(f"compute round {index + 1}/{total}", weight):
            for i, (curve, (calls, blocks, rounds)) in enumerate(zip(pending, schedules, strict=True)):
                with curve.context():
                    while done[i] < (index + 1) * rounds // total:
                        one_round(curve.kernels, seconds[i], calls, blocks, device)
                        done[i] += 1
                        sweeps.probe()
        while sweeps.done < (index + 1) * sweeps.sweeps // total:
            sweeps.sweep()
    sweeps.release_probe()
    finished: list[ComputeCurve] = []
    float32: dict[str, ComputeCurve] = {}
    for item in items:
        if isinstance(item, _PendingCurve):
            i = pending.index(item)
            calls = schedules[i][0]
            points = [
                KernelTiming(k.label, k.work, k.unit, n, tuple(s), k.params)
                for k, n, s in zip(item.kernels, calls, seconds[i], strict=True)
            ]
            curve = _finish_compute(item, points, float32.get(item.op))
        else:
            curve = item
        if curve.precision == "float32":
            float32[curve.op] = curve
        finished.append(curve)
    for item in pending:
        item.kernels.clear()  # free the inputs
    release(device)
    return finished


def _shape_text(op: str, shape: Any) -> str:
    if op == "matmul":
        return f"n={shape}"
    batch, channels, pixels = shape
    return f"n={batch} c={channels} {pixels}px"
