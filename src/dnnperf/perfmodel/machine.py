"""What the model predicts on: a machine described by its peaks (presets with sources) or calibrated.

A :class:`Machine` is a node type times a count: per device, compute peaks per dtype, memory bandwidth
and capacity, per-operator overhead; between devices, the link inside a node and the link between
nodes (alpha: latency in seconds, bandwidth in bytes/s), and the reduction rate of collectives.
:func:`from_profile` builds one from ``dnnperf hw``'s calibration, keeping its curves: a matrix
product's rate then depends on its size and a memory-bound operator's bandwidth on its working set.
Sources of every preset number: docs/performance-model.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import torch

from dnnperf.errors import UsageError
from dnnperf.hardware import HardwareProfile, NotMeasuredError, device_key
from dnnperf.perfmodel.collectives import OPERATIONS

#: The dtype the layer zoo times its layers in (calibrate.zoo_calibration): its operators in another
#: dtype (a complex exponential, a double-precision product) run other kernels, which it never timed.
ZOO_DTYPE = "float32"

GB = 1e9
#: Fields that must be positive numbers.
_POSITIVE = (
    "memory_bandwidth",
    "memory_bytes",
    "link_bandwidth",
    "intra_bandwidth",
    "reduce_bandwidth",
    "update_byte_share",
)
_NON_NEGATIVE = (
    "inner_call_s",
    "update_step_s",
    "cold_product_call_s",
    "cold_product_byte_s",
    "link_latency",
    "intra_latency",
    "dispatch_s",
    "page_fault_s",
    "split_region_s",
    "ddp_step_s",
    "ddp_param_s",
    "fsdp_step_s",
    "fsdp_unit_s",
    "fsdp_param_s",
    "fsdp_update_call_s",
    "kernel_s",
    "host_bandwidth",
)


@dataclass(frozen=True)
class Curve:
    """A rate measured at a few sizes, interpolated in log(size), flat beyond the ends."""

    sizes: tuple[float, ...]
    rates: tuple[float, ...]

    def __call__(self, size: np.ndarray) -> np.ndarray:
        return np.interp(np.log(np.maximum(size, 1.0)), np.log(self.sizes), self.rates)


@dataclass(frozen=True)
class Machine:
    """A node type (per device) and how many: validated on construction."""

    name: str
    #: dtype -> peak FLOP/s of matrix products and convolutions on one device.
    peak_flops: dict[str, float]
    memory_bandwidth: float  # bytes/s, one device
    memory_bytes: float  # capacity of one device
    link_bandwidth: float  # bytes/s per device between nodes
    link_latency: float  # seconds, between nodes
    intra_bandwidth: float  # bytes/s between devices of one node
    intra_latency: float  # seconds
    devices_per_node: int = 1
    nodes: int = 1
    #: Host overhead per operator call (eager dispatch, kernel launch), seconds.
    dispatch_s: float = 5e-6
    #: Seconds one minor page fault costs the host: the first touch of a page the allocator took fresh
    #: from the OS (CPU training: glibc returns large freed blocks and maps them again). 0: not modelled
    #: (GPU presets: the caching allocator keeps its memory). Calibrated: calibrate.page_fault_cost.
    page_fault_s: float = 0.0
    #: Host seconds one region of tensor parallelism's split adds to a step beyond its kernels and its
    #: collectives (two autograd Functions and the collectives' Python around them). 0: not modelled
    #: (described machines). Calibrated: calibrate.split_region_cost.
    split_region_s: float = 0.0
    #: Host seconds DistributedDataParallel adds to a data-parallel step beyond its gradient copies and
    #: its collectives: per step, and per trainable parameter tensor (hooks, reducer bookkeeping). 0:
    #: not modelled (described machines). Calibrated: calibrate.ddp_cost.
    ddp_step_s: float = 0.0
    ddp_param_s: float = 0.0
    #: Host seconds FSDP (``fully_shard``) adds to a step beyond its collectives and its copies' bytes:
    #: per step, per sharded group (each unit and the root: its hooks, all-gather and reduce-scatter
    #: bookkeeping), per parameter tensor (DTensor wrapping, the copies' calls), and per optimizer call
    #: on a DTensor shard. 0: not modelled (described machines). Calibrated: calibrate.fsdp_cost.
    fsdp_step_s: float = 0.0
    fsdp_unit_s: float = 0.0
    fsdp_param_s: float = 0.0
    fsdp_update_call_s: float = 0.0
    #: Bytes/s at which a collective reduces (its gamma is 1/this); default: memory bandwidth / 3.
    reduce_bandwidth: float = 0.0
    #: Fraction of the roofline an operator family ("convolution", or "convolution/backward" for one
    #: phase) achieves; absent: 1.0 (pure roofline). Calibrated: calibrate.family_efficiency.
    efficiency: dict[str, float] = field(default_factory=dict)
    #: Host seconds per kernel call in each phase ("forward", "backward", "update"), in place of
    #: ``dispatch_s`` for that phase's calls: a forward call carries its module's Python, a backward
    #: call the autograd engine's walk, an update call the optimizer's loop, and they differ (6.2-8.2,
    #: 4.9-5.8 and 2.2-2.6 us here). Absent: ``dispatch_s``. Calibrated: calibrate.phase_call_cost (a CPU's).
    phase_call_s: dict[str, float] = field(default_factory=dict)
    #: Host seconds between two operator calls of the calibration's network, per phase ("forward",
    #: "backward"), as a description's gaps are measured (perfmodel/issue.gap_seconds): a model whose
    #: calls are further apart (its modules' Python) is charged the excess of its own (StepGraph.gaps).
    #: Absent: not charged. Calibrated: calibrate.gap_call_cost (a CPU's).
    gap_call_s: dict[str, float] = field(default_factory=dict)
    #: Host seconds of a forward kernel call that a compiled function issues after its first
    #: (OpRecord.inner_calls: a ``GRUCell``'s dozen kernels come from one Python call), in place of
    #: the forward's ``phase_call_s``, which carries a module's Python with each call. Charged with
    #: ComputeOptions.composite_calls; 0: not calibrated. Calibrated: calibrate.inner_call_cost (a
    #: CPU's).
    inner_call_s: float = 0.0
    #: The share of the optimizer update's counted bytes (each kernel's operands, read and written)
    #: that the update moves at its bandwidth: a parameter's kernels run back to back on the same few
    #: tensors, so later ones find them in cache. 1.0: as counted. Calibrated: calibrate.update_step_cost.
    update_byte_share: float = 1.0
    #: Host seconds each optimizer step costs whatever its size, beyond its calls and bytes: on the
    #: Xeon of validation-heldout-third-host.md a step of one tensor took 0.38 ms right after a
    #: backward and 0.02 ms back to back. 0: not modelled (presets). Calibrated:
    #: calibrate.update_step_cost.
    update_step_s: float = 0.0
    #: The operators the layer zoo timed (calibrate.ZooCalibration.timed's), in :data:`ZOO_DTYPE`:
    #: with ComputeOptions.replay_untimed, the others, and these in any other dtype, are replayed on
    #: this host. Empty: not known.
    zoo_ops: frozenset[str] = frozenset()
    #: What a matrix product in a training step costs beyond its price from the calibrated curves,
    #: which are timed with the operands in cache: in a step each layer's weights were last touched a
    #: whole step before, and its inputs a layer or more before, so they come from memory. Seconds per
    #: call and per counted byte (calibrate.measure_cold_product_cost: generic products timed with their
    #: operands pushed out of cache, less the same products timed hot, in pairs). Charged with
    #: ComputeOptions.cold_products (on by default); 0: not modelled (presets).
    cold_product_call_s: float = 0.0
    cold_product_byte_s: float = 0.0
    #: A matrix product (``aten.mm``, ``aten.addmm``) whose smallest dimension is a few rows runs at a
    #: fraction of the rate its FLOPs give on the curve: per smallest dimension ("1", "2", ... "32"), that
    #: fraction, the rate of products of those rows against the same products of many rows (a
    #: linear layer at batch 4 ran at a third here), which the hw curve, flat below its first size,
    #: prices alike. Between two calibrated dimensions log-linear, up to 1 at twice the largest.
    #: Absent: 1. Calibrated: calibrate.product_rows_efficiency (a CPU's).
    product_rows_efficiency: dict[str, float] = field(default_factory=dict)
    #: Fixed seconds per kernel call beyond ``dispatch_s``, per "family/phase" (a convolution's reorders
    #: and primitive set-up); absent: 0. Calibrated: calibrate.zoo_calibration.
    call_s: dict[str, float] = field(default_factory=dict)
    #: Extra seconds per element equal to zero in an operator's input, per operator ("aten.sqrt"), where
    #: this host's kernel takes a slow path on zeros (Adam's square root of untouched embedding rows'
    #: second moments); absent: 0. Calibrated: calibrate.zero_operand_cost.
    zero_operand_s: dict[str, float] = field(default_factory=dict)
    #: Calibrated curves (from_profile): FLOPs per call -> FLOP/s per family; bytes per call -> bytes/s.
    compute_curves: dict[str, Curve] = field(default_factory=dict)
    bandwidth_curve: Curve | None = None
    #: Largest message the backend sends in one piece (gloo: 1 MiB segments); 0 = no segmentation.
    segment_bytes: int = 0
    #: Collectives run on the cores that compute (CPU ranks that fill a host: gloo copies and reduces
    #: on them), so their CPU time cannot hide behind backward. Their CPU time is the cost at the
    #: collective's fit on an unshaped link (``cpu_alpha``/``cpu_bandwidth`` in a fit, where a shaped
    #: link slowed the wire; else the fit itself). False: communication overlaps (GPUs, NCCL).
    comm_on_compute_cores: bool = False
    #: Per collective ("allreduce", "allgather", "reduce_scatter", "broadcast", "send_recv"), the
    #: backend's own fit inside a node: {"alpha": s, "bandwidth": bytes/s, "reduce_bandwidth": bytes/s}
    #: (collective_calibration);
    #: a collective without one uses intra_latency / intra_bandwidth.
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The torch device of this host that this machine is ("cpu", "cuda:0"), where a description's
    #: convolutions can be replayed for their time (perfmodel/kernels.py); "" for a described machine and
    #: for a what-if that changes its speed. Set by from_profile for a profile of this host.
    replay_device: str = ""
    #: The torch device whose operator stream describes a step on this machine ("cuda:0" for a GPU of
    #: this host, whose kernels differ from the CPU's: foreach updates, fused attention, cuDNN's RNNs);
    #: kept by what-ifs, which clear ``replay_device``. "": the CPU's.
    stream_device: str = ""
    #: The device runs behind its host (a GPU: the host queues kernels and goes on): a step takes the
    #: later of the host's dispatch and the device's kernels, simulated in order (compute.step_time).
    #: False: the host runs every operator itself (a CPU), and dispatch adds to the kernels.
    asynchronous: bool = False
    #: Device seconds per kernel beyond its roofline on an asynchronous device (launch and the
    #: smallest kernel's time; calibrate.zoo_calibration's timing floor); 0: not modelled.
    kernel_s: float = 0.0
    #: On an asynchronous device, host seconds per call beyond ``dispatch_s``, per "family/phase" (a
    #: cuDNN convolution's set-up); for calls that launch no kernel (views), their whole host cost
    #: (``dispatch_s`` then net of views). Absent: 0. Calibrated: calibrate.zoo_calibration on the GPU.
    host_call_s: dict[str, float] = field(default_factory=dict)
    #: Bytes/s of the copy that brings a batch from pinned host memory to the device; 0: the batch is
    #: on the host already (a CPU), and placing it is one copy through memory.
    host_bandwidth: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reduce_bandwidth == 0.0 and _finite_positive(self.memory_bandwidth):
            object.__setattr__(self, "reduce_bandwidth", self.memory_bandwidth / 3)
        validate(self)

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``, float32's when the dtype has none of its own."""
        return self.peak_flops.get(dtype, self.peak_flops["float32"])

    def with_axis(self, axis: str, value: float) -> Machine:
        """This machine with one what-if axis changed (see AXES)."""
        if axis not in AXES:
            raise UsageError(f"unknown sweep axis {axis!r}: use one of {', '.join(AXES)}")
        if axis == "nodes":
            return dataclasses.replace(self, nodes=int(value))
        if axis == "devices_per_node":
            return dataclasses.replace(self, devices_per_node=int(value))
        if axis == "link_gbps":
            return dataclasses.replace(self, link_bandwidth=value * GB / 8)
        if axis == "memory_gbs":
            scale = value * GB / self.memory_bandwidth
            curve = self.bandwidth_curve
            if curve is not None:
                curve = Curve(curve.sizes, tuple(r * scale for r in curve.rates))
            return dataclasses.replace(
                self, memory_bandwidth=value * GB, bandwidth_curve=curve, replay_device=""
            )
        if axis == "tflops":  # node FLOP/s: every dtype's peak (and calibrated curve) scaled alike
            scale = value * 1e12 / self.peak("float32")
            curves = {
                k: Curve(c.sizes, tuple(r * scale for r in c.rates)) for k, c in self.compute_curves.items()
            }
            peaks = {k: v * scale for k, v in self.peak_flops.items()}
            return dataclasses.replace(self, peak_flops=peaks, compute_curves=curves, replay_device="")
        raise AssertionError(axis)  # pragma: no cover


#: ``Machine.sources`` of a part a calibrated machine was built without (validate.calibrated_machine):
#: a prediction that needs it is refused rather than made with the part left at 0.
NOT_CALIBRATED = "not calibrated"


def link_source(op: str) -> str:
    """The ``Machine.sources`` key of the link's calibration of the collective ``op``."""
    return f"link {op}"


#: What-if axes of ``sweep`` besides batch_size: node count, devices per node, link Gbit/s, memory
#: GB/s and float32 TFLOP/s per device.
AXES = ("nodes", "devices_per_node", "link_gbps", "memory_gbs", "tflops")


def _finite_positive(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def validate(machine: Machine) -> None:
    """UsageError naming the first missing, mistyped or out-of-range field."""
    if not isinstance(machine.name, str) or not machine.name.strip():
        raise UsageError(f"a machine's name must be a non-empty string, got {machine.name!r}")
    where = f"machine {machine.name!r}"
    for name in (
        "efficiency",
        "call_s",
        "phase_call_s",
        "gap_call_s",
        "zero_operand_s",
        "host_call_s",
        "product_rows_efficiency",
        "collectives",
        "sources",
    ):
        if not isinstance(getattr(machine, name), dict):
            raise UsageError(f"{where}: {name} must be an object, got {getattr(machine, name)!r}")
    for key, text in machine.sources.items():
        if not isinstance(text, str):
            raise UsageError(f"{where}: sources[{key!r}] must be a string, got {text!r}")
    segment = machine.segment_bytes
    if not isinstance(segment, int) or isinstance(segment, bool) or segment < 0:
        raise UsageError(f"{where}: segment_bytes must be zero or a positive integer, got {segment!r}")
    if not isinstance(machine.peak_flops, dict) or not _finite_positive(machine.peak_flops.get("float32")):
        raise UsageError(f"{where}: peak_flops needs a positive float32 entry (FLOP/s)")
    for dtype, value in machine.peak_flops.items():
        if not _finite_positive(value):
            raise UsageError(f"{where}: peak_flops[{dtype!r}] must be a positive number, got {value!r}")
    for name in _POSITIVE:
        value = getattr(machine, name)
        if not _finite_positive(value):
            raise UsageError(f"{where}: {name} must be a positive number, got {value!r}")
    for name in _NON_NEGATIVE:
        value = getattr(machine, name)
        if not (_finite_positive(value) or value == 0):
            raise UsageError(f"{where}: {name} must be zero or a positive number, got {value!r}")
    for name in ("asynchronous", "comm_on_compute_cores"):
        if not isinstance(getattr(machine, name), bool):
            raise UsageError(f"{where}: {name} must be true or false, got {getattr(machine, name)!r}")
    for name in ("devices_per_node", "nodes"):
        value = getattr(machine, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{where}: {name} must be a positive integer, got {value!r}")
    for op, fit in machine.collectives.items():
        if not isinstance(fit, dict) or not _finite_positive(fit.get("bandwidth")):
            raise UsageError(f"{where}: collectives[{op!r}] needs a positive bandwidth")
        for key in ("alpha", "reduce_bandwidth"):
            value = fit.get(key, 0.0)
            if not (_finite_positive(value) or value == 0):
                raise UsageError(
                    f"{where}: collectives[{op!r}].{key} must be zero or positive, got {value!r}"
                )
    for family, value in machine.efficiency.items():
        if not (_finite_positive(value) and value <= 1):
            raise UsageError(f"{where}: efficiency[{family!r}] must be in (0, 1], got {value!r}")
    for rows, value in machine.product_rows_efficiency.items():
        whole = isinstance(rows, str) and rows.isdigit() and int(rows) > 0 and rows == str(int(rows))
        if not (whole and _finite_positive(value) and value <= 1):
            raise UsageError(
                f"{where}: product_rows_efficiency[{rows!r}] needs a positive whole number of rows and a "
                f"value in (0, 1], got {value!r}"
            )
    for family, value in machine.call_s.items():
        if not (_finite_positive(value) or value == 0):
            raise UsageError(f"{where}: call_s[{family!r}] must be zero or positive, got {value!r}")
    for phase, value in machine.phase_call_s.items():
        if not (_finite_positive(value) or value == 0):
            raise UsageError(f"{where}: phase_call_s[{phase!r}] must be zero or positive, got {value!r}")
    for phase, value in machine.gap_call_s.items():
        if not (_finite_positive(value) or value == 0):
            raise UsageError(f"{where}: gap_call_s[{phase!r}] must be zero or positive, got {value!r}")
    for family, value in machine.host_call_s.items():
        if not (_finite_positive(value) or value == 0):
            raise UsageError(f"{where}: host_call_s[{family!r}] must be zero or positive, got {value!r}")
    for op, value in machine.zero_operand_s.items():
        if not (_finite_positive(value) or value == 0):
            raise UsageError(f"{where}: zero_operand_s[{op!r}] must be zero or positive, got {value!r}")


def from_dict(document: Any) -> Machine:
    """A described machine (e.g. parsed JSON): every field of Machine but the curves; UsageError if a
    field is missing, unknown or not a positive number."""
    if not isinstance(document, dict):
        raise UsageError("a machine description must be a JSON object")
    required = {
        "name",
        "peak_flops",
        "memory_bandwidth",
        "memory_bytes",
        "link_bandwidth",
        "link_latency",
        "intra_bandwidth",
        "intra_latency",
    }
    missing = sorted(required - set(document))
    if missing:
        raise UsageError(f"machine description lacks {', '.join(missing)}")
    # A description is not this host: its kernels are never replayed.
    not_described = {"compute_curves", "bandwidth_curve", "replay_device", "stream_device", "zoo_ops"}
    allowed = {f.name for f in dataclasses.fields(Machine)} - not_described
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise UsageError(f"machine description has unknown fields {', '.join(unknown)}")
    return Machine(**document)


def from_profile(
    profile: HardwareProfile,
    link: dict[str, float] | None = None,
    op_overhead_s: float | None = None,
    efficiency: dict[str, float] | None = None,
    zoo_curves: dict[str, Curve] | None = None,
    page_fault_s: float = 0.0,
    call_s: dict[str, float] | None = None,
    zero_operand_s: dict[str, float] | None = None,
    split_region_s: float = 0.0,
    ddp_s: tuple[float, float] = (0.0, 0.0),
    fsdp_s: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    kernel_s: float = 0.0,
    host_call_s: dict[str, float] | None = None,
    phase_call_s: dict[str, float] | None = None,
    gap_call_s: dict[str, float] | None = None,
    update_byte_share: float = 1.0,
    update_step_s: float = 0.0,
    cold_product_s: tuple[float, float] = (0.0, 0.0),
    product_rows_efficiency: dict[str, float] | None = None,
    inner_call_s: float = 0.0,
    zoo_ops: frozenset[str] = frozenset(),
) -> Machine:
    """This machine as ``dnnperf hw`` measured it: its curves, peaks, bandwidth and dispatch overhead.

    ``op_overhead_s``: the per-call overhead of an eager training step (calibrate.op_overhead); default
    the profile's bare dispatch overhead, which leaves autograd and module calls out.

    ``page_fault_s``: the cost of one page fault (calibrate.page_fault_cost); default 0 (not modelled).
    ``zero_operand_s``: operators' extra cost per zero input element (calibrate.zero_operand_cost).
    ``split_region_s``: a tensor-parallel split region's host work (calibrate.split_region_cost);
    default 0 (not modelled). ``ddp_s``: DistributedDataParallel's host work per step and per
    parameter tensor (calibrate.ddp_cost); default none. ``fsdp_s``: FSDP's host work per step, per
    sharded group, per parameter tensor and per optimizer call on a shard (calibrate.fsdp_cost);
    default none. ``kernel_s``: a GPU's device seconds per
    kernel beyond its roofline, and ``host_call_s`` its host's seconds per call beyond the overhead, per
    family and phase (calibrate.zoo_calibration); default 0 and none. ``phase_call_s``: host seconds
    per kernel call by phase (calibrate.phase_call_cost) and ``update_byte_share``: the share of the
    update's counted bytes it moves (calibrate.update_step_cost); default none and 1.0. ``update_step_s``:
    host seconds a step of the optimizer costs whatever its size (calibrate.update_step_fit); default 0.
    ``gap_call_s``: host
    seconds between two calls of the calibration's network by phase (calibrate.gap_call_cost); default
    none.
    ``cold_product_s``: a matrix product's cost with its operands out of cache beyond its price, per
    call and per counted byte (calibrate.measure_cold_product_cost); default none.
    ``product_rows_efficiency``: the rate of products of few rows against many, per smallest dimension
    (calibrate.product_rows_efficiency); default none. ``inner_call_s``: host seconds of a forward
    kernel call a compiled function issues after its first (calibrate.inner_call_cost); default 0.

    A GPU's profile gives an asynchronous machine (``Machine.asynchronous``) with the GPU's memory and
    its pinned host-to-device bandwidth for the batch's copy.

    ``link``: alpha/beta from the collective calibration (collectives.calibrate); default the gloo
    loopback figures measured on the project's 2-core machine (docs/performance-model.md).
    ``zoo_ops``: the operators the layer zoo timed (calibrate.ZooCalibration.ops); default none.
    """
    curves: dict[str, Curve] = {}
    peaks: dict[str, float] = {}
    for op, family in (("matmul", "matmul"), ("conv2d", "convolution")):
        for curve in profile.curves(op, "float32"):
            if curve.usable and curve.points:
                points = sorted((p.work, p.rate.median) for p in curve.points)
                sizes, rates = dedupe(points)
                curves[family] = Curve(sizes, rates)
    for dtype in ("float32", "bfloat16", "float16"):
        try:
            peaks[dtype] = profile.peak_flops(dtype)
        except NotMeasuredError:
            continue
    curves.update(zoo_curves or {})  # per-phase curves of calibrate.zoo_calibration
    bandwidth = profile.bandwidth_curve()
    sizes, rates = dedupe(sorted((p.params["footprint"], p.rate.median) for p in bandwidth.points))
    gpu = profile.device_type == "cuda"
    machine = Machine(
        name=f"hw:{profile.device_key}",
        peak_flops=peaks,
        memory_bandwidth=profile.memory_bandwidth,
        memory_bytes=_device_memory(profile) if gpu else float(psutil.virtual_memory().total),
        link_bandwidth=LOOPBACK_BANDWIDTH,  # with_link puts the calibrated link in place
        link_latency=LOOPBACK_ALPHA,
        intra_bandwidth=LOOPBACK_BANDWIDTH,
        intra_latency=LOOPBACK_ALPHA,
        dispatch_s=op_overhead_s if op_overhead_s is not None else profile.dispatch_overhead_us * 1e-6,
        page_fault_s=page_fault_s,
        split_region_s=split_region_s,
        ddp_step_s=ddp_s[0],
        ddp_param_s=ddp_s[1],
        fsdp_step_s=fsdp_s[0],
        fsdp_unit_s=fsdp_s[1],
        fsdp_param_s=fsdp_s[2],
        fsdp_update_call_s=fsdp_s[3],
        compute_curves=curves,
        bandwidth_curve=Curve(sizes, rates),
        segment_bytes=0 if gpu else GLOO_SEGMENT,  # gloo's; NCCL's channels are not modelled
        efficiency=dict(efficiency or {}),
        call_s=dict(call_s or {}),
        zero_operand_s=dict(zero_operand_s or {}),
        replay_device=host_device(profile),
        stream_device=host_device(profile),
        asynchronous=gpu,
        kernel_s=kernel_s,
        host_call_s=dict(host_call_s or {}),
        phase_call_s=dict(phase_call_s or {}),
        gap_call_s=dict(gap_call_s or {}),
        update_byte_share=update_byte_share,
        update_step_s=update_step_s,
        cold_product_call_s=cold_product_s[0],
        cold_product_byte_s=cold_product_s[1],
        product_rows_efficiency=dict(product_rows_efficiency or {}),
        inner_call_s=inner_call_s,
        zoo_ops=frozenset(zoo_ops),
        host_bandwidth=(profile.host_bandwidth("h2d") or 0.0) if gpu else 0.0,
        # A GPU's collectives run on its own engines (NCCL), not on the host's cores.
        comm_on_compute_cores=not gpu,
        sources={"all": f"dnnperf hw calibration of {profile.created}"},
    )
    return with_link(machine, link)


def _device_memory(profile: HardwareProfile) -> float:
    """The profiled GPU's memory, as its environment recorded it (the device itself when absent)."""
    for gpu in profile.environment.get("machine", {}).get("gpus", []):
        if gpu.get("index", profile.device_index or 0) == (profile.device_index or 0) and gpu.get(
            "memory_bytes"
        ):
            return float(gpu["memory_bytes"])
    if torch.cuda.is_available():
        return float(torch.cuda.get_device_properties(profile.device_index or 0).total_memory)
    raise UsageError(f"the profile of {profile.device_key} records no memory size for its GPU")


def with_link(machine: Machine, link: dict[str, Any] | None) -> Machine:
    """``machine`` with the collective calibration's ``link`` (collective_calibration.calibrate: alpha,
    bandwidth, reduce bandwidth and each operation's own fit under ``ops``) as its link between
    devices, everything else kept; None: the gloo loopback defaults measured on the project's 2-core
    machine (docs/performance-model.md)."""
    link = link or {}
    alpha = link.get("alpha", LOOPBACK_ALPHA)
    bandwidth = link.get("bandwidth", LOOPBACK_BANDWIDTH)
    # A calibration that measured some operations only: the others are refused, not defaulted.
    measured = link.get("calibrated", OPERATIONS)
    skipped = {link_source(op): NOT_CALIBRATED for op in OPERATIONS if op not in measured}
    kept = {k: v for k, v in machine.sources.items() if k not in {link_source(op) for op in OPERATIONS}}
    return dataclasses.replace(
        machine,
        link_bandwidth=bandwidth,
        link_latency=alpha,
        intra_bandwidth=bandwidth,
        intra_latency=alpha,
        reduce_bandwidth=link.get("reduce_bandwidth", 0.0),
        collectives=dict(link.get("ops", {})),
        sources={**kept, "link": link.get("source", "default"), **skipped},
    )


def host_device(profile: HardwareProfile) -> str:
    """The torch device ``profile`` measured when it was measured on this host, else ""."""
    if profile.device_type == "cpu":
        device = "cpu"
    elif profile.device_type == "cuda" and torch.cuda.is_available():
        device = f"cuda:{profile.device_index or 0}"
    else:
        return ""
    return device if device_key(device) == profile.device_key else ""


def dedupe(points: list[tuple[float, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """One rate per size (the median of the configurations of that size: a typical operator, not the
    calibration's best case), sizes increasing."""
    rates: dict[float, list[float]] = {}
    for size, rate in points:
        rates.setdefault(size, []).append(rate)
    sizes = tuple(sorted(rates))
    return sizes, tuple(float(np.median(rates[s])) for s in sizes)


#: gloo over loopback on the project's 2-core machine (background.md: ~1.6 ms for 1 KiB, 0.66 GB/s at
#: 16 MiB), used until collectives.calibrate has measured this machine.
LOOPBACK_ALPHA = 1.6e-3 / 2
LOOPBACK_BANDWIDTH = 0.66 * GB
GLOO_SEGMENT = 1 << 20

_A100 = {
    "peak_flops": {"float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12},
    "memory_bandwidth": 2039 * GB,
    "memory_bytes": 80 * GB,
    "intra_bandwidth": 300 * GB,  # NVLink 3: 600 GB/s bidirectional
    "intra_latency": 2e-6,
    "devices_per_node": 8,
}
_H100 = {
    "peak_flops": {"float32": 67e12, "tf32": 494.5e12, "bfloat16": 989.5e12, "float16": 989.5e12},
    "memory_bandwidth": 3350 * GB,
    "memory_bytes": 80 * GB,
    "intra_bandwidth": 450 * GB,  # NVLink 4: 900 GB/s bidirectional
    "intra_latency": 2e-6,
    "devices_per_node": 8,
}
#: Per-GPU network: DGX A100 has one 200 Gb/s HDR port per GPU, DGX H100 one 400 Gb/s NDR port per GPU;
#: Ethernet: one 100 GbE port per node shared by its 8 GPUs. Latencies: IB ~ 5 us end to end (NCCL
#: small-message figures), TCP over Ethernet ~ 25 us.
PRESETS: dict[str, dict[str, Any]] = {
    "a100-ib": {**_A100, "link_bandwidth": 25 * GB, "link_latency": 5e-6},
    "a100-eth": {**_A100, "link_bandwidth": 12.5 * GB / 8, "link_latency": 25e-6},
    "h100-ib": {**_H100, "link_bandwidth": 50 * GB, "link_latency": 5e-6},
    "h100-eth": {**_H100, "link_bandwidth": 12.5 * GB / 8, "link_latency": 25e-6},
    # Seed 002's simulator defaults: 4 TFLOP/s, 50 GB/s memory, 1 Gb/s links, 0.5 us latency.
    "seed002": {
        "peak_flops": {"float32": 4e12},
        "memory_bandwidth": 50 * GB,
        "memory_bytes": 16 * GB,
        "intra_bandwidth": 1 * GB / 8,
        "intra_latency": 0.5e-6,
        "link_bandwidth": 1 * GB / 8,
        "link_latency": 0.5e-6,
        "devices_per_node": 1,
    },
}


def preset(name: str, nodes: int = 1) -> Machine:
    """A documented preset machine with ``nodes`` nodes."""
    if name not in PRESETS:
        raise UsageError(f"unknown machine {name!r}: use hw, a JSON file or one of {', '.join(PRESETS)}")
    return Machine(
        name=name, nodes=nodes, sources={"all": "docs/performance-model.md#presets"}, **PRESETS[name]
    )
