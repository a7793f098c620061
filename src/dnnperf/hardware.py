"""Hardware calibration: what this machine can do, measured, for roofline analyses.

:func:`calibrate` times a few kernels on one device and returns a :class:`HardwareProfile`:

* peak FLOP/s of square matrix products (``torch.mm``) and 3x3 convolutions (``F.conv2d``) per
  precision: float32 everywhere; bfloat16 on CPU when it runs at a sane speed; on CUDA also float32
  with TF32, float16 and bfloat16. The peak of a precision is the best sustained rate: the fastest
  sample of the fastest configuration (see :attr:`KernelTiming.best_rate`);
* memory bandwidth from sizes well inside the caches to well beyond them, for a copy
  (``dst.copy_(src)``, 2 x bytes moved) and a STREAM-style triad (``a = b + s * c``, 3 x bytes). The
  triad's DRAM plateau (its best sustained rate) is the roofline's memory bandwidth; the curve shows
  the cache plateaus;
* host<->device copy bandwidth (CUDA only), pageable and pinned, both directions;
* the per-operator dispatch overhead (a one-element ``torch.add``, host side).

Every quantity keeps its raw timed repetitions (mean seconds per call over a sample of back-to-back
calls, after warm-up); statistics come from :class:`~dnnperf.stats.Samples`. The sizes of one compute
curve are timed in alternating blocks, every compute curve in common rounds through the calibration,
and the memory sizes in several sweeps between those rounds, so that the machine's drifts fall on all
of them alike and every kernel gets several chances at a quiet moment. Timing
excludes the allocation of inputs and, where the operator has an ``out=`` form, of outputs. On CUDA
the device is synchronised around every timed sample. Profiles are saved as JSON (schema
``dnnperf.hardware``) under the cache directory, one per host and device.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.nn.functional as F

from dnnperf import environment
from dnnperf.cache import cache_dir
from dnnperf.devices import is_out_of_memory, synchronize
from dnnperf.errors import UsageError
from dnnperf.jsonio import read_json_file, write_json_atomic
from dnnperf.stats import Samples

SCHEMA = "dnnperf.hardware"
SCHEMA_VERSION = 1

Progress = Callable[[str, float], None]

#: Bytes each kernel moves per byte of one of its tensors (STREAM's convention: reads plus writes,
#: not counting the read a write-allocate cache adds for the destination).
BYTES_MOVED_FACTOR = {"copy": 2, "triad": 3}
#: Tensors a kernel touches: its working set is this many times the tensor size.
TENSORS_TOUCHED = {"copy": 2, "triad": 3}
#: The kernel whose DRAM plateau is the roofline's memory bandwidth: two reads and a write is what
#: most memory-bound DNN operators (element-wise with two inputs, residual adds) look like.
ROOFLINE_KERNEL = "triad"
#: A reduced precision is kept only when it reaches this fraction of float32's rate at the first
#: configuration: below that it runs on a fallback path whose "peak" says nothing about the hardware.
SANE_FRACTION = 0.1
#: Working sets at least this many times the last-level cache count as DRAM.
DRAM_FACTOR = 4
#: At most this many of the largest qualifying sizes are pooled into the DRAM plateau.
DRAM_POINTS = 4

PRECISIONS = ("float32", "tf32", "float16", "bfloat16")
_DTYPES = {
    "float32": torch.float32,
    "tf32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
OPS = ("matmul", "conv2d")
TRANSFERS = ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class HardwareProfileError(ValueError):
    """A document that is not a valid hardware profile; the message says what is wrong."""


class NotMeasuredError(LookupError):
    """The profile has no (usable) measurement of what was asked for."""


# ---------------------------------------------------------------------------------------------------
# Work accounting


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: one multiply and one add per term."""
    return 2 * m * k * n


def conv2d_output_hw(
    height: int, width: int, kernel: tuple[int, int], stride: int = 1, padding: int = 0, dilation: int = 1
) -> tuple[int, int]:
    """Output height and width of a 2-D convolution (PyTorch's formula)."""
    out = tuple(
        (size + 2 * padding - dilation * (k - 1) - 1) // stride + 1
        for size, k in zip((height, width), kernel, strict=True)
    )
    return out[0], out[1]


def conv2d_flops(
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> int:
    """FLOPs of ``F.conv2d`` without bias: 2 * N * Cout * Hout * Wout * (Cin / groups) * kh * kw.

    ``weight_shape`` is PyTorch's (Cout, Cin / groups, kh, kw)."""
    batch, in_channels, height, width = input_shape
    out_channels, per_group, kh, kw = weight_shape
    if per_group * groups != in_channels:
        raise ValueError(
            f"weight {tuple(weight_shape)} does not fit {in_channels} channels in {groups} groups"
        )
    out_h, out_w = conv2d_output_hw(height, width, (kh, kw), stride, padding, dilation)
    return 2 * batch * out_channels * out_h * out_w * per_group * kh * kw


def bytes_moved(kernel: str, nbytes: int) -> int:
    """Bytes a memory kernel reads plus writes when each of its tensors holds ``nbytes``."""
    if kernel not in BYTES_MOVED_FACTOR:
        raise ValueError(f"unknown memory kernel {kernel!r}: use one of {', '.join(BYTES_MOVED_FACTOR)}")
    return BYTES_MOVED_FACTOR[kernel] * nbytes


# ---------------------------------------------------------------------------------------------------
# The profile


@dataclass(frozen=True)
class KernelTiming:
    """Raw timed repetitions of one kernel configuration.

    Each entry of ``seconds`` is one sample: the mean time per call over ``calls`` back-to-back calls
    (kernels too short to time singly are called many times per sample)."""

    label: str
    #: Work per call, in ``unit``: FLOP, bytes moved (B) or calls.
    work: float
    unit: str
    calls: int
    seconds: tuple[float, ...]
    #: The configuration: sizes, layout, dtype.
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def time(self) -> Samples:
        return Samples(self.seconds)

    @property
    def rate(self) -> Samples:
        """Work per second, one value per sample (the slowest samples make its p10)."""
        return Samples.of([self.work / s for s in self.seconds])

    @property
    def best_rate(self) -> float:
        """Work per second of the fastest sample: the best rate the kernel sustained over one whole
        sample (back-to-back calls, at least the plan's ``min_sample_s``).

        The ceiling of a kernel on a shared machine: other processes, clock drops and a neighbour's
        memory traffic only ever slow a sample down, so the fastest sample over interleaved repeats is
        the rate the machine reaches when it is left alone, which repeats from one calibration to the
        next as long as some of each calibration's moments are quiet; a median or p90 moves with how
        busy the machine was during the calibration."""
        return self.work / min(self.seconds)


@dataclass(frozen=True)
class ComputeCurve:
    """One operator in one precision at a few sizes; its peak is the best size's best sustained rate."""

    op: str
    #: float32, tf32 (float32 tensors, TF32 math on CUDA), float16 or bfloat16.
    precision: str
    points: tuple[KernelTiming, ...]
    #: False when the precision was tried and found too slow (or failing) to count as a peak.
    usable: bool = True
    note: str | None = None

    @property
    def best(self) -> KernelTiming | None:
        """The configuration with the highest best sustained rate."""
        return max(self.points, key=lambda p: p.best_rate, default=None)

    @property
    def peak(self) -> float:
        """FLOP/s: the best configuration's best sustained rate (:attr:`KernelTiming.best_rate`); NaN
        when nothing was measured. Not a median or p90: those fall whenever the calibration shares the
        machine, and a layer timed at a quieter moment then reads above 100% of its "peak"."""
        best = self.best
        return best.best_rate if best is not None else float("nan")


@dataclass(frozen=True)
class BandwidthCurve:
    """A memory kernel across tensor sizes. Points carry ``nbytes`` (one tensor) and ``footprint``
    (all tensors the kernel touches) in their params."""

    kernel: str
    points: tuple[KernelTiming, ...]

    def curve(self) -> list[tuple[int, float]]:
        """(bytes per tensor, median bytes/s) from the smallest size to the largest."""
        return [(int(p.params["nbytes"]), p.rate.median) for p in self.points]


@dataclass(frozen=True)
class CacheLevel:
    """One data cache level as the measuring threads see it."""

    name: str
    #: Bytes of one instance (one core's private cache, or the whole shared cache).
    size_bytes: int
    #: Instances the measuring threads can use (private caches add up across threads).
    instances: int = 1

    @property
    def capacity(self) -> int:
        return self.size_bytes * self.instances


@dataclass(frozen=True)
class HardwareProfile:
    """What one device measured: compute peaks, memory bandwidth, transfers and dispatch overhead."""

    device_key: str
    device_type: str
    device_index: int | None
    device_name: str
    #: ``torch.get_num_threads()`` during the calibration (CPU peaks scale with it).
    threads: int
    quick: bool
    created: str
    duration_s: float
    environment: dict[str, Any]
    caches: tuple[CacheLevel, ...]
    compute: tuple[ComputeCurve, ...]
    memory: tuple[BandwidthCurve, ...]
    dispatch: KernelTiming
    #: h2d/d2h x pageable/pinned copy bandwidth; None where the device is the host.
    host_transfer: dict[str, KernelTiming] | None
    host_transfer_reason: str | None = None
    notes: tuple[str, ...] = ()

    # -- roofline ---------------------------------------------------------------------------------

    def curves(self, op: str | None = None, precision: str | None = None) -> list[ComputeCurve]:
        return [
            c
            for c in self.compute
            if (op is None or c.op == op) and (precision is None or c.precision == precision)
        ]

    def peak_flops(
        self, dtype: torch.dtype | str = torch.float32, op: str | None = None, tf32: bool = False
    ) -> float:
        """Peak FLOP/s for ``dtype``: the higher of the matrix products' and the convolutions' peaks
        (or ``op``'s alone), each its best configuration's best sustained rate. ``tf32=True`` asks for
        float32 with TF32 math (CUDA only)."""
        precision = _precision(dtype, tf32)
        if op is not None and op not in OPS:
            raise ValueError(f"unknown op {op!r}: use one of {', '.join(OPS)}")
        peaks = [c.peak for c in self.curves(op, precision) if c.usable and c.points]
        if not peaks:
            measured = sorted({f"{c.op}/{c.precision}" for c in self.compute if c.usable and c.points})
            raise NotMeasuredError(
                f"no usable {op or 'compute'} peak for {precision} on {self.device_key} "
                f"(measured: {', '.join(measured) or 'nothing'})"
            )
        return max(peaks)

    def bandwidth_curve(self, kernel: str = ROOFLINE_KERNEL) -> BandwidthCurve:
        for curve in self.memory:
            if curve.kernel == kernel:
                return curve
        raise NotMeasuredError(f"no {kernel} bandwidth curve in this profile")

    def dram_points(self, kernel: str = ROOFLINE_KERNEL) -> tuple[list[KernelTiming], bool]:
        """The points pooled into the DRAM plateau (the largest sizes whose working set is at least
        DRAM_FACTOR x the last-level cache), and whether such sizes exist. When none do, or the cache
        sizes are unknown, the two largest sizes stand in and the flag is False."""
        points = sorted(self.bandwidth_curve(kernel).points, key=lambda p: p.params["footprint"])
        if not points:
            raise NotMeasuredError(f"the {kernel} curve has no points")
        if self.caches:
            last_level = max(c.capacity for c in self.caches)
            beyond = [p for p in points if p.params["footprint"] >= DRAM_FACTOR * last_level]
            if beyond:
                return beyond[-DRAM_POINTS:], True
        return points[-2:], False

    def dram_bandwidth(self, kernel: str = ROOFLINE_KERNEL) -> Samples:
        """Bytes/s of the DRAM plateau: the rate samples of the largest sizes, pooled."""
        points, _ = self.dram_points(kernel)
        return Samples.of([r for p in points for r in p.rate.values])

    def dram_best(self, kernel: str = ROOFLINE_KERNEL) -> float:
        """Bytes/s: the best sustained rate of the DRAM plateau's sizes (the fastest sample among
        them; see :attr:`KernelTiming.best_rate`)."""
        points, _ = self.dram_points(kernel)
        return max(p.best_rate for p in points)

    @property
    def memory_bandwidth(self) -> float:
        """The roofline's memory bandwidth in bytes/s: the triad's DRAM plateau at its best sustained
        rate, a ceiling as the compute peak is (a neighbour's memory traffic only ever lowers it)."""
        return self.dram_best(ROOFLINE_KERNEL)

    def cache_plateaus(self, kernel: str = ROOFLINE_KERNEL) -> dict[str, Samples]:
        """Bytes/s per memory level. A cache level's value is the fastest size (by median) whose
        working set fits in half of that cache but not in the level above: smaller sizes are held back
        by the per-call overhead (a few microseconds, see :attr:`dispatch_overhead_us`), so every
        cache value is a lower bound, the L1 one most of all. "DRAM" is :meth:`dram_bandwidth`."""
        points = self.bandwidth_curve(kernel).points
        plateaus: dict[str, Samples] = {}
        smaller = 0
        for level in sorted(self.caches, key=lambda c: c.capacity):
            inside = [p for p in points if smaller < p.params["footprint"] <= level.capacity / 2]
            if inside:
                plateaus[level.name] = max(inside, key=lambda p: p.rate.median).rate
            smaller = level.capacity
        plateaus["DRAM"] = self.dram_bandwidth(kernel)
        return plateaus

    def ridge_point(self, dtype: torch.dtype | str = torch.float32, tf32: bool = False) -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_flops(dtype, tf32=tf32) / self.memory_bandwidth

    def attainable_flops(
        self, intensity: float, dtype: torch.dtype | str = torch.float32, tf32: bool = False
    ) -> float:
        """The roofline: min(peak FLOP/s, intensity x memory bandwidth) for ``intensity`` FLOP/byte."""
        if not intensity >= 0:
            raise ValueError(f"arithmetic intensity must be a non-negative number, got {intensity!r}")
        return min(self.peak_flops(dtype, tf32=tf32), intensity * self.memory_bandwidth)

    @property
    def dispatch_us(self) -> Samples:
        """Per-call overhead of a tiny operator, in microseconds."""
        return Samples.of([s * 1e6 for s in self.dispatch.seconds])

    @property
    def dispatch_overhead_us(self) -> float:
        return self.dispatch_us.median

    def host_bandwidth(self, direction: str, pinned: bool = True) -> float | None:
        """Median bytes/s of host-to-device ("h2d") or device-to-host ("d2h") copies; None on CPU."""
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        if self.host_transfer is None:
            return None
        timing = self.host_transfer.get(f"{direction}_{'pinned' if pinned else 'pageable'}")
        return timing.rate.median if timing is not None else None

    # -- serialisation ----------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The headline numbers (derived from the raw samples; ignored when a profile is read)."""
        peaks: dict[str, dict[str, float]] = {}
        for curve in self.compute:
            if curve.usable and curve.points:
                peaks.setdefault(curve.op, {})[curve.precision] = curve.peak
        plateaus = {
            curve.kernel: {name: s.median for name, s in self.cache_plateaus(curve.kernel).items()}
            for curve in self.memory
            if curve.points
        }
        transfers = None
        if self.host_transfer is not None:
            transfers = {name: t.rate.median for name, t in self.host_transfer.items()}
        return {
            "peak_flops": peaks,
            "memory_bandwidth": self.memory_bandwidth,
            "bandwidth_plateaus": plateaus,
            "host_transfer": transfers,
            "dispatch_overhead_us": self.dispatch_overhead_us,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "duration_s": self.duration_s,
            "quick": self.quick,
            "device": {
                "key": self.device_key,
                "type": self.device_type,
                "index": self.device_index,
                "name": self.device_name,
            },
            "threads": self.threads,
            "summary": self.summary(),
            "caches": [
                {"name": c.name, "size_bytes": c.size_bytes, "instances": c.instances} for c in self.caches
            ],
            "compute": [
                {
                    "op": c.op,
                    "precision": c.precision,
                    "usable": c.usable,
                    "note": c.note,
                    "points": [_timing_to_dict(p) for p in c.points],
                }
                for c in self.compute
            ],
            "memory": [
                {"kernel": m.kernel, "points": [_timing_to_dict(p) for p in m.points]} for m in self.memory
            ],
            "host_transfer": None
            if self.host_transfer is None
            else {name: _timing_to_dict(t) for name, t in self.host_transfer.items()},
            "host_transfer_reason": self.host_transfer_reason,
            "dispatch": _timing_to_dict(self.dispatch),
            "notes": list(self.notes),
            "environment": copy.deepcopy(self.environment),
        }

    @classmethod
    def from_dict(cls, document: Any) -> HardwareProfile:
        """Validate a parsed JSON document and build the profile; HardwareProfileError says what is
        wrong. The stored summary is not trusted: it is recomputed from the raw samples."""
        if not isinstance(document, dict):
            raise HardwareProfileError("not a JSON object")
        if document.get("schema") != SCHEMA:
            raise HardwareProfileError(f"schema is {document.get('schema')!r}, expected {SCHEMA!r}")
        version = document.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
            raise HardwareProfileError(
                f"schema_version {version!r} is not one this dnnperf reads (1..{SCHEMA_VERSION})"
            )
        device = _field(document, "device", dict, "")
        device_type = _field(device, "type", str, "device.")
        if device_type not in ("cpu", "cuda"):
            raise HardwareProfileError(f"device.type {device_type!r} is not 'cpu' or 'cuda'")
        index = device.get("index")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
            raise HardwareProfileError(f"device.index {index!r} is not a non-negative integer or null")
        caches = tuple(
            _cache_from_dict(c, f"caches[{i}]") for i, c in enumerate(_field(document, "caches", list))
        )
        compute = tuple(
            _curve_from_dict(c, f"compute[{i}]") for i, c in enumerate(_field(document, "compute", list))
        )
        memory = tuple(
            _bandwidth_from_dict(m, f"memory[{i}]") for i, m in enumerate(_field(document, "memory", list))
        )
        if ROOFLINE_KERNEL not in {m.kernel for m in memory if m.points}:
            raise HardwareProfileError(f"memory has no {ROOFLINE_KERNEL} curve with points")
        transfer = document.get("host_transfer")
        if transfer is not None:
            if not isinstance(transfer, dict):
                raise HardwareProfileError("host_transfer is not an object or null")
            unknown = set(transfer) - set(TRANSFERS)
            if unknown:
                raise HardwareProfileError(f"host_transfer has unknown entries {sorted(unknown)}")
            transfer = {k: _timing_from_dict(v, f"host_transfer.{k}") for k, v in transfer.items()}
        notes = _field(document, "notes", list)
        if not all(isinstance(n, str) for n in notes):
            raise HardwareProfileError("notes is not a list of strings")
        threads = _field(document, "threads", int)
        if isinstance(threads, bool) or threads <= 0:
            raise HardwareProfileError(f"threads {threads!r} is not a positive integer")
        quick = document.get("quick")
        if not isinstance(quick, bool):
            raise HardwareProfileError("field 'quick' missing or not a boolean")
        return cls(
            device_key=_field(device, "key", str, "device."),
            device_type=device_type,
            device_index=index,
            device_name=_field(device, "name", str, "device."),
            threads=threads,
            quick=quick,
            created=_field(document, "created", str),
            duration_s=_number(document.get("duration_s"), "duration_s", positive=True),
            environment=copy.deepcopy(_field(document, "environment", dict)),
            caches=caches,
            compute=compute,
            memory=memory,
            dispatch=_timing_from_dict(document.get("dispatch"), "dispatch"),
            host_transfer=transfer,
            host_transfer_reason=_optional_str(document, "host_transfer_reason"),
            notes=tuple(notes),
        )


def _precision(dtype: torch.dtype | str, tf32: bool = False) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: use one of float32, float16, bfloat16")
    if tf32:
        if name not in ("float32", "tf32"):
            raise ValueError(f"tf32 applies to float32, not {name}")
        return "tf32"
    return name


def _timing_to_dict(timing: KernelTiming) -> dict[str, Any]:
    return {
        "label": timing.label,
        "params": dict(timing.params),
        "work": timing.work,
        "unit": timing.unit,
        "calls": timing.calls,
        "seconds": list(timing.seconds),
        "rate": timing.rate.summary(),
    }


def _field(document: Mapping[str, Any], key: str, kind: type, prefix: str = "") -> Any:
    value = document.get(key)
    if not isinstance(value, kind):
        raise HardwareProfileError(f"field {prefix}{key!r} missing or not a {kind.__name__}")
    return value


def _optional_str(document: Mapping[str, Any], key: str, prefix: str = "") -> str | None:
    value = document.get(key)
    if value is not None and not isinstance(value, str):
        raise HardwareProfileError(f"field {prefix}{key!r} is not a string or null")
    return value


def _number(value: Any, where: str, positive: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise HardwareProfileError(f"{where} is {value!r}, not a number")
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0):
        raise HardwareProfileError(
            f"{where} is {value!r}, not a {'positive ' if positive else ''}finite number"
        )
    return number


def _timing_from_dict(data: Any, where: str) -> KernelTiming:
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{where} is not an object")
    seconds = data.get("seconds")
    if not isinstance(seconds, list) or not seconds:
        raise HardwareProfileError(f"{where}.seconds is not a non-empty list")
    calls = data.get("calls")
    if not isinstance(calls, int) or isinstance(calls, bool) or calls <= 0:
        raise HardwareProfileError(f"{where}.calls is {calls!r}, not a positive integer")
    params = _field(data, "params", dict, f"{where}.")
    for key, value in params.items():
        if not isinstance(value, (int, float, str, bool)) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise HardwareProfileError(f"{where}.params.{key} is {value!r}, not a number or string")
    return KernelTiming(
        label=_field(data, "label", str, f"{where}."),
        work=_number(data.get("work"), f"{where}.work", positive=True),
        unit=_field(data, "unit", str, f"{where}."),
        calls=calls,
        seconds=tuple(_number(s, f"{where}.seconds[{i}]", positive=True) for i, s in enumerate(seconds)),
        params=dict(params),
    )


def _cache_from_dict(data: Any, where: str) -> CacheLevel:
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{where} is not an object")
    sizes = [data.get("size_bytes"), data.get("instances")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        raise HardwareProfileError(f"{where}: size_bytes and instances must be positive integers")
    return CacheLevel(name=_field(data, "name", str, f"{where}."), size_bytes=sizes[0], instances=sizes[1])


def _curve_from_dict(data: Any, where: str) -> ComputeCurve:
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{where} is not an object")
    op, precision = data.get("op"), data.get("precision")
    if op not in OPS:
        raise HardwareProfileError(f"{where}.op {op!r} is not one of {', '.join(OPS)}")
    if precision not in PRECISIONS:
        raise HardwareProfileError(f"{where}.precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    usable = data.get("usable")
    if not isinstance(usable, bool):
        raise HardwareProfileError(f"{where}.usable is not a boolean")
    points = _field(data, "points", list, f"{where}.")
    return ComputeCurve(
        op=op,
        precision=precision,
        points=tuple(_timing_from_dict(p, f"{where}.points[{i}]") for i, p in enumerate(points)),
        usable=usable,
        note=_optional_str(data, "note", f"{where}."),
    )


def _bandwidth_from_dict(data: Any, where: str) -> BandwidthCurve:
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{where} is not an object")
    kernel = data.get("kernel")
    if kernel not in BYTES_MOVED_FACTOR:
        raise HardwareProfileError(f"{where}.kernel {kernel!r} is not one of {', '.join(BYTES_MOVED_FACTOR)}")
    points = []
    for i, item in enumerate(_field(data, "points", list, f"{where}.")):
        point = _timing_from_dict(item, f"{where}.points[{i}]")
        for key in ("nbytes", "footprint"):
            value = point.params.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise HardwareProfileError(f"{where}.points[{i}].params.{key} is not a positive integer")
        points.append(point)
    return BandwidthCurve(kernel=kernel, points=tuple(points))


# ---------------------------------------------------------------------------------------------------
# Where profiles live


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_key(device: torch.device | str) -> str:
    """Host plus device, safe as a file name: ``myhost-cpu``, ``myhost-cuda0-nvidia-h100-80gb-hbm3``."""
    device = torch.device(device)
    host = _slug(platform.node())
    if device.type == "cpu":
        return f"{host}-cpu"
    if device.type == "cuda":
        index = _cuda_index(device)
        return f"{host}-cuda{index}-{_slug(torch.cuda.get_device_name(index))}"
    raise UsageError(f"unsupported device {device}: calibrate cpu or cuda")


def profile_path(device: torch.device | str) -> Path:
    """The default profile file of ``device`` on this host."""
    return cache_dir() / "hardware" / f"{device_key(device)}.json"


def save_profile(profile: HardwareProfile, path: Path | str | None = None) -> Path:
    """Write the profile as JSON (atomically); the default path is keyed by the profile's device."""
    path = Path(path) if path is not None else cache_dir() / "hardware" / f"{profile.device_key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, profile.to_dict())
    except OSError as error:
        raise UsageError(f"cannot write hardware profile {path}: {error.strerror or error}") from None
    return path


def read_profile(path: Path | str) -> HardwareProfile:
    """Parse and validate one profile file; any problem is a one-line UsageError naming the file."""
    path = Path(path)
    document = read_json_file(path, "dnnperf hardware profile")
    try:
        return HardwareProfile.from_dict(document)
    except (HardwareProfileError, OverflowError, TypeError, ValueError, KeyError) as error:
        raise UsageError(f"{path} is not a dnnperf hardware profile: {error}") from None


def load_profile(device: torch.device | str, path: Path | str | None = None) -> HardwareProfile | None:
    """The saved profile of ``device`` (from ``path``, else the default place); None when there is
    none. A file that exists but is invalid, or describes another kind of device, is a UsageError."""
    device = torch.device(device)
    path = Path(path) if path is not None else profile_path(device)
    if not path.exists():
        return None
    profile = read_profile(path)
    if profile.device_type != device.type:
        raise UsageError(f"{path} profiles a {profile.device_type} device, not {device.type}")
    return profile


def stale_reasons(profile: HardwareProfile) -> list[str]:
    """Why ``profile`` may not describe this process's hardware (empty when it does)."""
    reasons = []
    if profile.environment.get("machine", {}).get("hostname") != platform.node():
        reasons.append("measured on another host")
    if profile.environment.get("software", {}).get("torch") != torch.__version__:
        reasons.append(f"measured with torch {profile.environment.get('software', {}).get('torch')}")
    if profile.device_type == "cpu" and profile.threads != torch.get_num_threads():
        reasons.append(
            f"measured with {profile.threads} threads, this process uses {torch.get_num_threads()}"
        )
    if profile.quick:
        reasons.append("a quick calibration (few, short repetitions)")
    return reasons


# ---------------------------------------------------------------------------------------------------
# Calibration settings


@dataclass(frozen=True)
class _Plan:
    """What to measure and for how long."""

    precisions: tuple[str, ...]
    mm_sizes: tuple[int, ...]
    #: (batch, channels, pixels): 3x3 convolutions, padding 1, as many output channels as input.
    conv_shapes: tuple[tuple[int, int, int], ...]
    memory_sizes: tuple[int, ...]
    transfer_bytes: int
    #: Warm-up before each configuration: first calls pay for page faults, oneDNN primitive creation,
    #: cuDNN algorithm search and clock ramp-up. Memory kernels need less (their pages are touched
    #: when the tensors are filled).
    warmup_s: float
    memory_warmup_s: float
    #: Measuring time per configuration (compute: spread over alternating blocks of about block_s).
    compute_s: float
    block_s: float
    memory_s: float
    #: The memory sizes are swept this many times (largest first, then smallest first, alternately),
    #: memory_s split between the sweeps: a neighbour's burst of memory traffic then lands on a part of
    #: every size's samples rather than on all the samples of whichever sizes ran at that moment.
    memory_sweeps: int
    transfer_s: float
    dispatch_s: float
    #: Shortest sample: a kernel shorter than this is called back to back within one sample, so that
    #: clock resolution and the synchronisation around a sample do not count.
    min_sample_s: float
    min_repeats: int
    max_repeats: int = 200


def _powers_of_two(low: int, high: int, step: int = 2) -> tuple[int, ...]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= step
    return tuple(sizes)


# Timed on this project's 2-core CI machine: the full CPU plan takes about 75 s, the quick one a few.
_PLANS = {
    ("cpu", False): _Plan(
        precisions=("float32", "bfloat16"),
        mm_sizes=(512, 1024, 2048),
        # Early layers (large images, few channels) and late ones (small images, many channels: on
        # some CPUs oneDNN's fastest case, e.g. 152 GFLOP/s at (32, 256, 4) against 116 at (8, 256, 28)
        # on one AMD EPYC core; a peak that misses it puts late VGG layers above 100%).
        conv_shapes=((16, 64, 56), (16, 128, 28), (8, 256, 28), (32, 256, 8), (32, 256, 4), (32, 512, 4)),
        memory_sizes=_powers_of_two(16 * KiB, 512 * MiB),
        transfer_bytes=0,
        warmup_s=0.25,
        memory_warmup_s=0.05,
        compute_s=1.75,
        block_s=0.25,
        memory_s=0.9,
        memory_sweeps=4,
        transfer_s=0.0,
        dispatch_s=1.5,
        min_sample_s=0.02,
        min_repeats=5,
    ),
    ("cpu", True): _Plan(
        precisions=("float32", "bfloat16"),
        mm_sizes=(96, 192),
        conv_shapes=((2, 16, 16),),
        memory_sizes=(16 * KiB, 128 * KiB, 1 * MiB),
        transfer_bytes=0,
        warmup_s=0.01,
        memory_warmup_s=0.005,
        compute_s=0.04,
        block_s=0.01,
        memory_s=0.02,
        memory_sweeps=2,
        transfer_s=0.0,
        dispatch_s=0.03,
        min_sample_s=0.002,
        min_repeats=3,
    ),
    ("cuda", False): _Plan(
        precisions=PRECISIONS,
        mm_sizes=(2048, 4096, 8192),
        conv_shapes=((64, 128, 56), (64, 256, 28), (128, 256, 28)),
        memory_sizes=_powers_of_two(1 * MiB, 4 * GiB),
        transfer_bytes=256 * MiB,
        warmup_s=0.2,
        memory_warmup_s=0.05,
        compute_s=0.5,
        block_s=0.1,
        memory_s=0.3,
        memory_sweeps=2,
        transfer_s=1.0,
        dispatch_s=1.0,
        min_sample_s=0.01,
        min_repeats=5,
    ),
    ("cuda", True): _Plan(
        precisions=PRECISIONS,
        mm_sizes=(256, 512),
        conv_shapes=((4, 32, 16),),
        memory_sizes=(1 * MiB, 4 * MiB, 16 * MiB),
        transfer_bytes=16 * MiB,
        warmup_s=0.01,
        memory_warmup_s=0.005,
        compute_s=0.03,
        block_s=0.01,
        memory_s=0.02,
        memory_sweeps=2,
        transfer_s=0.03,
        dispatch_s=0.03,
        min_sample_s=0.002,
        min_repeats=3,
    ),
}


# ---------------------------------------------------------------------------------------------------
# Timing


def _time_samples(
    fn: Callable[[], object], device: torch.device, calls: int, repeats: int, host_only: bool = False
) -> list[float]:
    """Mean seconds per call of ``repeats`` samples of ``calls`` back-to-back calls, the device
    synchronised before and after each sample. ``host_only``: stop the clock before the final
    synchronisation, to time what the host spends issuing the calls (CUDA launch cost)."""
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if not host_only:
            synchronize(device)
        seconds.append((time.perf_counter() - start) / calls)
        if host_only:
            synchronize(device)
    return seconds


def _warm_up(fn: Callable[[], object], device: torch.device, warmup_s: float) -> float:
    """Call ``fn`` until ``warmup_s`` has passed (twice at least); the faster of its last two calls
    estimates the seconds per call."""
    start = time.perf_counter()
    recent: list[float] = []
    while len(recent) < 2 or time.perf_counter() - start < warmup_s:
        synchronize(device)
        call_start = time.perf_counter()
        fn()
        synchronize(device)
        recent = [*recent[-1:], time.perf_counter() - call_start]
    return max(min(recent), 1e-9)


def _calls_per_sample(per_call: float, plan: _Plan) -> int:
    return max(1, math.ceil(plan.min_sample_s / per_call))


def _measure(
    fn: Callable[[], object],
    device: torch.device,
    plan: _Plan,
    budget_s: float,
    warmup_s: float,
    host_only: bool = False,
    calls: int | None = None,
    min_repeats: int | None = None,
) -> tuple[int, list[float]]:
    """Warm up, then time as many samples as fit in ``budget_s`` (within the plan's bounds), each of
    ``calls`` calls (by default enough calls for the plan's shortest sample)."""
    per_call = _warm_up(fn, device, warmup_s)
    calls = calls or _calls_per_sample(per_call, plan)
    least = plan.min_repeats if min_repeats is None else min_repeats
    repeats = min(plan.max_repeats, max(least, int(budget_s / (calls * per_call))))
    return calls, _time_samples(fn, device, calls, repeats, host_only)


@dataclass(frozen=True)
class _Kernel:
    """A kernel configuration ready to time: inputs allocated, ``fn`` runs it once."""

    fn: Callable[[], object]
    label: str
    work: float
    unit: str
    params: dict[str, Any]


def _schedule(per_call: Sequence[float], plan: _Plan, budget_s: float) -> tuple[list[int], list[int], int]:
    """Calls per sample, samples per block and rounds for kernels timed in alternating blocks of about
    ``plan.block_s`` until ``budget_s`` is spent."""
    calls = [_calls_per_sample(t, plan) for t in per_call]
    sample_s = [c * t for c, t in zip(calls, per_call, strict=True)]
    blocks = [max(1, round(plan.block_s / s)) for s in sample_s]
    round_s = sum(b * s + t for b, s, t in zip(blocks, sample_s, per_call, strict=True))
    rounds = max(math.ceil(plan.min_repeats / min(blocks)), round(budget_s / round_s))
    rounds = max(1, min(rounds, plan.max_repeats // max(blocks)))
    return calls, blocks, rounds


def _measure_interleaved(
    kernels: Sequence[_Kernel],
    per_call: Sequence[float],
    device: torch.device,
    plan: _Plan,
    budget_s: float,
    step: Callable[[int, int], AbstractContextManager[None]],
) -> list[KernelTiming]:
    """Time warmed-up kernels in alternating blocks of samples (about ``plan.block_s`` each) until
    ``budget_s`` is spent. The machine's speed drifts (clock changes, other tenants of a virtual
    machine): alternating spreads a drift over every kernel instead of the one running at that
    moment, so the sizes compare fairly and the best of them is not just the luckiest. Each block
    starts with an untimed call that brings the kernel's data back into cache after the others ran."""
    calls, blocks, rounds = _schedule(per_call, plan, budget_s)
    seconds: list[list[float]] = [[] for _ in kernels]
    for index in range(rounds):
        with step(index, rounds):
            _one_round(kernels, seconds, calls, blocks, device)
    return [
        KernelTiming(k.label, k.work, k.unit, n, tuple(samples), k.params)
        for k, n, samples in zip(kernels, calls, seconds, strict=True)
    ]


def _one_round(
    kernels: Sequence[_Kernel],
    seconds: list[list[float]],
    calls: Sequence[int],
    blocks: Sequence[int],
    device: torch.device,
) -> None:
    """One block of samples of each kernel, each block after an untimed call."""
    for kernel, samples, n, block in zip(kernels, seconds, calls, blocks, strict=True):
        kernel.fn()
        samples += _time_samples(kernel.fn, device, n, block)


class _Tracker:
    """Reports (description, fraction done) to a progress callback; weights are estimated seconds."""

    def __init__(self, progress: Progress | None, total: float) -> None:
        self.progress = progress
        self.total = max(total, 1e-9)
        self.done = 0.0

    @contextmanager
    def step(self, description: str, weight: float) -> Iterator[None]:
        if self.progress is not None:
            self.progress(description, min(self.done / self.total, 1.0))
        try:
            yield
        finally:
            self.done += weight

    def skip(self, weight: float) -> None:
        """Count a planned step that will not run (a dropped precision, a size that does not fit)."""
        self.done += weight

    def finish(self) -> None:
        if self.progress is not None:
            self.progress("calibration done", 1.0)


def _fp32_precision_flags() -> list[Any]:
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
    newer = [(flags, flags.fp32_precision) for flags in _fp32_precision_flags()]
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


# ---------------------------------------------------------------------------------------------------
# The measurements


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _compute_kernel(op: str, shape: Any, precision: str, layout: str, device: torch.device) -> _Kernel:
    """A matrix product (shape: n) or a 3x3 convolution (shape: (batch, channels, pixels))."""
    dtype = _DTYPES[precision]
    if op == "matmul":
        n = shape
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        params: dict[str, Any] = {"n": n}
        return _Kernel(
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
    return _Kernel(
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
    kernels: list[_Kernel]
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


def _configs(op: str, plan: _Plan) -> list[tuple[Any, str]]:
    if op == "matmul":
        return [(n, "contiguous") for n in plan.mm_sizes]
    return [(shape, layout) for shape in plan.conv_shapes for layout in ("contiguous", "channels_last")]


def _prepare_compute(
    op: str,
    precision: str,
    device: torch.device,
    plan: _Plan,
    tracker: _Tracker,
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
    dtype_name = str(_DTYPES[precision]).removeprefix("torch.")
    with pending.context():
        for index, (shape, layout) in enumerate(configs):
            text = _shape_text(op, shape) + (f" {layout}" if op == "conv2d" else "")
            with tracker.step(f"{op} {precision} {text} warm-up", plan.warmup_s):
                try:
                    kernel = _compute_kernel(op, shape, precision, layout, device)
                    kernel = replace(kernel, params={**kernel.params, "dtype": dtype_name})
                    seconds = _warm_up(kernel.fn, device, plan.warmup_s)
                except (RuntimeError, MemoryError) as error:
                    reason = (
                        "out of memory" if is_out_of_memory(error) else str(error).strip().splitlines()[0]
                    )
                    pending.notes.append(f"{text} failed: {reason[:200]}")
                    _release(device)
                    continue
            pending.kernels.append(kernel)
            pending.per_call.append(seconds)
            if index == 0 and precision != "float32" and reference and kernel.label in reference:
                ratio = kernel.work / seconds / reference[kernel.label]
                if ratio < SANE_FRACTION:
                    # Timed briefly, kept in the profile to show why, never used as a peak.
                    calls = _calls_per_sample(seconds, plan)
                    samples = _time_samples(kernel.fn, device, calls, plan.min_repeats)
                    point = KernelTiming(
                        kernel.label, kernel.work, kernel.unit, calls, tuple(samples), kernel.params
                    )
                    tracker.skip(weight * len(configs) - plan.warmup_s)
                    note = (
                        f"not used: {point.rate.median / 1e9:.3g} GFLOP/s = {ratio:.0%} of float32 at "
                        f"{text}, below {SANE_FRACTION:.0%} (no fast {precision} path on this device)"
                    )
                    _release(device)
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


def _measure_compute(
    op: str,
    precision: str,
    device: torch.device,
    plan: _Plan,
    tracker: _Tracker,
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
        points = _measure_interleaved(pending.kernels, pending.per_call, device, plan, budget, step)
    _release(device)
    return _finish_compute(pending, points, reference)


def _measure_all_compute(
    device: torch.device, plan: _Plan, tracker: _Tracker, sweeps: _MemorySweeps
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
    schedules = [_schedule(p.per_call, plan, plan.compute_s * len(p.kernels)) for p in pending]
    seconds: list[list[list[float]]] = [[[] for _ in p.kernels] for p in pending]
    done = [0] * len(pending)
    total = max((rounds for _, _, rounds in schedules), default=0)
    weight = plan.compute_s * sum(len(_configs(p.op, plan)) for p in pending) / max(total, 1)
    for index in range(total):
        with tracker.step(f"compute round {index + 1}/{total}", weight):
            for i, (curve, (calls, blocks, rounds)) in enumerate(zip(pending, schedules, strict=True)):
                with curve.context():
                    while done[i] < (index + 1) * rounds // total:
                        _one_round(curve.kernels, seconds[i], calls, blocks, device)
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
    _release(device)
    return finished


def _shape_text(op: str, shape: Any) -> str:
    if op == "matmul":
        return f"n={shape}"
    batch, channels, pixels = shape
    return f"n={batch} c={channels} {pixels}px"


class _MemorySweeps:
    """Copy and triad at every size, in ``plan.memory_sweeps`` sweeps over the sizes (largest first,
    then smallest first, alternately), run one at a time by :meth:`sweep` so that the calibration can
    spread them between its compute curves: a neighbour's burst of memory traffic then lands on some
    of every size's samples, not on all of them. Within a sweep both kernels time the same float32
    tensors, allocated and touched once per size before any timing; a size keeps its calls per
    sample from its first sweep, and its samples from every sweep are pooled.

    :meth:`probe` adds one triad sample of the smallest size that counts as DRAM (working set at least
    DRAM_FACTOR x the last-level cache of ``caches``) whenever it is called: the calibration calls it
    between compute rounds, so the DRAM plateau, whose speed a neighbour's memory traffic moves by
    tens of percent for seconds at a time, is sampled all along the calibration."""

    def __init__(
        self, device: torch.device, plan: _Plan, tracker: _Tracker, caches: Sequence[CacheLevel] = ()
    ) -> None:
        self.device, self.plan, self.tracker = device, plan, tracker
        self.sweeps = max(1, plan.memory_sweeps)
        self.done = 0
        #: Progress weight of one kernel at one size in one sweep.
        self.weight = (plan.memory_s + self.sweeps * plan.memory_warmup_s) / self.sweeps
        limit = _free_memory(device) // 4  # leave room for everything else on the machine
        self.sizes = [n for n in plan.memory_sizes if max(TENSORS_TOUCHED.values()) * n <= limit]
        self.skipped = set(plan.memory_sizes) - set(self.sizes)
        tracker.skip(2 * len(self.skipped) * self.sweeps * self.weight)
        self.calls: dict[tuple[str, int], int] = {}
        self.seconds: dict[tuple[str, int], list[float]] = {}
        last_level = max((c.capacity for c in caches), default=0)
        dram = [
            n for n in self.sizes if last_level and TENSORS_TOUCHED["triad"] * n >= DRAM_FACTOR * last_level
        ]
        #: The size :meth:`probe` times, None when no size is known to be beyond the caches.
        self.probe_size: int | None = min(dram, default=None)
        self._probe: Callable[[], object] | None = None

    def probe(self) -> None:
        """One more triad sample at :attr:`probe_size` (its tensors allocated at the first call)."""
        if self.probe_size is None or self.probe_size in self.skipped:
            return
        key = ("triad", self.probe_size)
        if self._probe is None:
            numel = self.probe_size // 4
            try:
                a, b, c = (
                    torch.empty(numel, device=self.device, dtype=torch.float32).fill_(1.0) for _ in range(3)
                )
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                self.probe_size = None
                _release(self.device)
                return
            self._probe = partial(torch.add, b, c, alpha=0.5, out=a)
            per_call = _warm_up(self._probe, self.device, self.plan.memory_warmup_s)
            self.calls.setdefault(key, _calls_per_sample(per_call, self.plan))
        self._probe()  # untimed: brings the pages back into the TLB after the compute kernels
        samples = _time_samples(self._probe, self.device, self.calls[key], 1)
        self.seconds.setdefault(key, []).extend(samples)

    def release_probe(self) -> None:
        self._probe = None
        _release(self.device)

    def sweep(self) -> None:
        """The next sweep over every size."""
        plan, device, index = self.plan, self.device, self.done
        self.done += 1
        for nbytes in self.sizes[::-1] if index % 2 == 0 else self.sizes:
            if nbytes in self.skipped:
                self.tracker.skip(2 * self.weight)
                continue
            numel = nbytes // 4
            try:
                a, b, c = (
                    torch.empty(numel, device=device, dtype=torch.float32).fill_(1.0) for _ in range(3)
                )
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                self.skipped.add(nbytes)
                self.tracker.skip(2 * self.weight)
                _release(device)
                continue
            kernels = {
                "copy": partial(a.copy_, b),
                "triad": partial(torch.add, b, c, alpha=0.5, out=a),
            }
            for kernel, fn in kernels.items():
                key = (kernel, nbytes)
                text = f"memory {kernel} {_bytes_text(nbytes)} sweep {index + 1}/{self.sweeps}"
                with self.tracker.step(text, self.weight):
                    self.calls[key], samples = _measure(
                        fn,
                        device,
                        plan,
                        plan.memory_s / self.sweeps,
                        plan.memory_warmup_s,
                        calls=self.calls.get(key),
                        min_repeats=math.ceil(plan.min_repeats / self.sweeps),
                    )
                self.seconds.setdefault(key, []).extend(samples)
            del a, b, c, kernels
            _release(device)

    def curves(self, notes: list[str]) -> tuple[BandwidthCurve, ...]:
        """The curves of every sweep and probe (the sweeps not run yet run first)."""
        self.release_probe()
        while self.done < self.sweeps:
            self.sweep()
        if self.skipped:
            sizes = ", ".join(map(_bytes_text, sorted(self.skipped)))
            notes.append(f"memory sizes skipped for lack of free memory: {sizes}")
        curves = []
        for kernel in BYTES_MOVED_FACTOR:
            points = []
            for nbytes in self.plan.memory_sizes:
                key = (kernel, nbytes)
                if nbytes in self.skipped or key not in self.seconds:
                    continue
                params = {"nbytes": nbytes, "footprint": TENSORS_TOUCHED[kernel] * nbytes, "dtype": "float32"}
                moved = float(bytes_moved(kernel, nbytes))
                label = f"{kernel} {_bytes_text(nbytes)}"
                points.append(
                    KernelTiming(label, moved, "B", self.calls[key], tuple(self.seconds[key]), params)
                )
            curves.append(BandwidthCurve(kernel, tuple(points)))
        return tuple(curves)


def _bytes_text(nbytes: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def _measure_transfers(device: torch.device, plan: _Plan, tracker: _Tracker) -> dict[str, KernelTiming]:
    """Host<->device copies of one large buffer: pageable memory goes through a staging buffer in the
    driver, pinned memory is copied by DMA directly."""
    n = plan.transfer_bytes
    pageable = torch.empty(n, dtype=torch.uint8).fill_(1)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    on_device = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    copies = {
        "h2d_pageable": partial(on_device.copy_, pageable),
        "h2d_pinned": partial(on_device.copy_, pinned, non_blocking=True),
        "d2h_pageable": partial(pageable.copy_, on_device),
        "d2h_pinned": partial(pinned.copy_, on_device, non_blocking=True),
    }
    timings = {}
    for name, fn in copies.items():
        with tracker.step(f"host transfer {name} {_bytes_text(n)}", plan.transfer_s + plan.warmup_s):
            calls, seconds = _measure(fn, device, plan, plan.transfer_s, plan.warmup_s)
        timings[name] = KernelTiming(
            f"{name} {_bytes_text(n)}", float(n), "B", calls, tuple(seconds), {"nbytes": n}
        )
    del pageable, pinned, on_device
    _release(device)
    return timings


def _measure_dispatch(device: torch.device, plan: _Plan, tracker: _Tracker) -> KernelTiming:
    """A one-element add into a preallocated output, called back to back: what one operator costs
    beyond its arithmetic (Python binding, dispatcher, kernel selection; on CUDA the launch, timed on
    the host without waiting for the kernels)."""
    a, b, out = (torch.ones(1, device=device) for _ in range(3))
    with tracker.step("dispatch overhead", plan.dispatch_s + plan.warmup_s):
        fn = partial(torch.add, a, b, out=out)
        calls, seconds = _measure(fn, device, plan, plan.dispatch_s, plan.warmup_s, device.type == "cuda")
    return KernelTiming("torch.add 1 element", 1.0, "call", calls, tuple(seconds), {"numel": 1})


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": KiB, "M": MiB, "G": GiB}.get(text[-1:], 1)
    return int(text.rstrip("KMGB") or 0) * scale


def cpu_caches(threads: int) -> tuple[CacheLevel, ...]:
    """Data caches of the CPUs this process may run on, from Linux sysfs (empty elsewhere).

    A private cache counts once per measuring thread, up to the number of its instances."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    levels: dict[str, tuple[int, set[str]]] = {}
    for cpu in cpus:
        root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
        try:
            entries = sorted(root.glob("index*"))
            for entry in entries:
                kind = (entry / "type").read_text().strip()
                if kind == "Instruction":
                    continue
                level = int((entry / "level").read_text())
                name = f"L{level}d" if kind == "Data" else f"L{level}"
                size = _parse_size((entry / "size").read_text())
                shared = (entry / "shared_cpu_list").read_text().strip()
                if size > 0:
                    levels.setdefault(name, (size, set()))[1].add(shared)
        except (OSError, ValueError):
            return ()
    return tuple(
        CacheLevel(name, size, max(1, min(threads, len(instances))))
        for name, (size, instances) in sorted(levels.items(), key=lambda item: item[1][0])
    )


def _gpu_caches(device: torch.device) -> tuple[CacheLevel, ...]:
    size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return (CacheLevel("L2", size, 1),) if size > 0 else ()


def _check_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("cannot calibrate cuda: no CUDA GPU is available on this machine")
        index = _cuda_index(device)
        if index >= torch.cuda.device_count():
            raise UsageError(f"{device} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
        return torch.device("cuda", index)
    if device.type == "cpu":
        return torch.device("cpu")
    raise UsageError(f"cannot calibrate {device}: use cpu or cuda")


def _total_weight(plan: _Plan, device: torch.device) -> float:
    compute = len(plan.precisions) * (len(plan.mm_sizes) + 2 * len(plan.conv_shapes))
    weight = compute * (plan.compute_s + plan.warmup_s)
    weight += 2 * len(plan.memory_sizes) * (plan.memory_s + max(1, plan.memory_sweeps) * plan.memory_warmup_s)
    if device.type == "cuda":
        weight += len(TRANSFERS) * (plan.transfer_s + plan.warmup_s)
    return weight + plan.dispatch_s + plan.warmup_s


def calibrate(
    device: torch.device | str, progress: Progress | None = None, quick: bool = False
) -> HardwareProfile:
    """Measure ``device`` and return its profile (not saved: see :func:`save_profile`).

    ``progress(description, fraction_done)`` is called before each measurement and once with 1.0 at
    the end. ``quick`` runs tiny sizes and few repetitions (seconds; for tests, not for analyses)."""
    device = _check_device(device)
    plan = _PLANS[(device.type, quick)]
    tracker = _Tracker(progress, _total_weight(plan, device))
    started = time.perf_counter()
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    notes: list[str] = []
    threads = torch.get_num_threads()
    on_device = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
    with on_device, torch.no_grad():
        # The memory sweeps are spread between the compute rounds: a stretch of a neighbour's memory
        # traffic then slows one sweep, and the other sweeps still see the machine's bandwidth.
        caches = _gpu_caches(device) if device.type == "cuda" else cpu_caches(threads)
        sweeps = _MemorySweeps(device, plan, tracker, caches)
        compute = _measure_all_compute(device, plan, tracker, sweeps)
        memory = sweeps.curves(notes)
        if device.type == "cuda":
            transfers: dict[str, KernelTiming] | None = _measure_transfers(device, plan, tracker)
            transfer_reason = None
            name = torch.cuda.get_device_name(device)
        else:
            transfers = None
            transfer_reason = "not applicable: the CPU is the host, there is no host<->device copy"
            name = environment.cpu_model()
        dispatch = _measure_dispatch(device, plan, tracker)
    profile = HardwareProfile(
        device_key=device_key(device),
        device_type=device.type,
        device_index=device.index,
        device_name=name,
        threads=threads,
        quick=quick,
        created=created,
        duration_s=time.perf_counter() - started,
        environment=environment.describe(),
        caches=caches,
        compute=tuple(compute),
        memory=memory,
        dispatch=dispatch,
        host_transfer=transfers,
        host_transfer_reason=transfer_reason,
        notes=tuple(notes),
    )
    if not profile.dram_points()[1]:
        largest = max(p.params["footprint"] for p in profile.bandwidth_curve().points)
        profile = replace(
            profile,
            notes=(
                *profile.notes,
                f"DRAM plateau not confirmed: the largest working set ({_bytes_text(largest)}) is not "
                f"known to exceed {DRAM_FACTOR}x the last-level cache; memory_bandwidth may include "
                "cache effects",
            ),
        )
    tracker.finish()
    return profile
