"""The hardware profile: what one device can do, as measured by :mod:`dnnperf.calibration`
(``dnnperf hw``), for roofline analyses.

:class:`HardwareProfile` holds each measured quantity's raw timed repetitions (compute curves per
operator and precision, memory bandwidth curves, host<->device transfers, dispatch overhead) and the
roofline derived from them (:meth:`~HardwareProfile.peak_flops`,
:attr:`~HardwareProfile.memory_bandwidth`, :meth:`~HardwareProfile.attainable_flops`). Profiles are
saved as JSON (schema ``dnnperf.hardware``) under the cache directory, one per host and device, and
validated when read. Also here: the work of the calibration's kernels (FLOPs, bytes moved) and the
data caches of this machine.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dnnperf.cache import cache_dir
from dnnperf.errors import UsageError
from dnnperf.jsonio import read_json_file, write_json_atomic
from dnnperf.stats import Samples

SCHEMA = "dnnperf.hardware"
SCHEMA_VERSION = 1

#: Bytes each kernel moves per byte of one of its tensors (STREAM's convention: reads plus writes,
#: not counting the read a write-allocate cache adds for the destination).
BYTES_MOVED_FACTOR = {"copy": 2, "triad": 3}
#: Tensors a kernel touches: its working set is this many times the tensor size.
TENSORS_TOUCHED = {"copy": 2, "triad": 3}
#: The kernel whose DRAM plateau is the roofline's memory bandwidth: two reads and a write is what
#: most memory-bound DNN operators (element-wise with two inputs, residual adds) look like.
ROOFLINE_KERNEL = "triad"
#: Working sets at least this many times the last-level cache count as DRAM.
DRAM_FACTOR = 4
#: At most this many of the largest qualifying sizes are pooled into the DRAM plateau.
DRAM_POINTS = 4

PRECISIONS = ("float32", "tf32", "float16", "bfloat16")
DTYPES = {
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
    #: Cores' worth of other processes' CPU time while this profile was measured (the machine's busy
    #: time less the calibration's own, over its wall time); None where it was not measured.
    background_cores: float | None = None

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
            "background_cores": self.background_cores,
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
            background_cores=(
                None
                if document.get("background_cores") is None
                else _number(document["background_cores"], "background_cores", nonnegative=True)
            ),
        )


def _precision(dtype: torch.dtype | str, tf32: bool = False) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
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


def _number(value: Any, where: str, positive: bool = False, nonnegative: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise HardwareProfileError(f"{where} is {value!r}, not a number")
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0) or (nonnegative and number < 0):
        kind = "positive " if positive else "non-negative " if nonnegative else ""
        raise HardwareProfileError(f"{where} is {value!r}, not a {kind}finite number")
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


def cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_key(device: torch.device | str) -> str:
    """Host plus device, safe as a file name: ``myhost-cpu``, ``myhost-cuda0-nvidia-h100-80gb-hbm3``."""
    device = torch.device(device)
    host = _slug(platform.node())
    if device.type == "cpu":
        return f"{host}-cpu"
    if device.type == "cuda":
        index = cuda_index(device)
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
    busy = busy_reason(profile)
    if busy:
        reasons.append(busy)
    return reasons


#: Other processes' load during a calibration above which its figures are flagged: half a core. A
#: neighbour that busy takes memory bandwidth and cache from every kernel timed, and a core from the
#: threads of a parallel one (one calibration beside other jobs measured convolutions 38% and
#: bandwidth 36% below an idle one's, and the performance model's predictions moved with them).
BUSY_CORES = 0.5


def busy_reason(profile: HardwareProfile) -> str | None:
    """Why a full calibration's figures may be low: other processes kept the machine busy while it
    ran (None when they did not, for a quick calibration, or where that was not measured)."""
    if profile.quick or profile.background_cores is None or profile.background_cores < BUSY_CORES:
        return None
    return (
        f"calibrated while other processes used {profile.background_cores:.1f} cores: its peaks may be "
        "low; calibrate again on an otherwise idle machine"
    )


# ---------------------------------------------------------------------------------------------------
# The machine's data caches


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


def gpu_caches(device: torch.device) -> tuple[CacheLevel, ...]:
    size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return (CacheLevel("L2", size, 1),) if size > 0 else ()
