"""The Python API: ``predict`` one configuration, ``sweep`` many (what-if tables).

``batch_size`` is the global batch of one step. Data parallel shards it over every device; pipeline
parallel cuts each device group's batch into micro-batches; tensor parallel gives every rank of a
group the whole batch. ``strategy="single"`` is one device. Multi-node pipeline and tensor
parallelism are modelled within ``devices`` ranks as one group over the slowest link they span.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dnnperf.distributed import SCHEDULES
from dnnperf.errors import UsageError
from dnnperf.perfmodel import collectives, strategies
from dnnperf.perfmodel.compute import (
    COMPUTE_FAMILIES,
    NO_KERNEL,
    ComputeOptions,
    data_seconds,
    fault_seconds,
    op_times,
    step_time,
)
from dnnperf.perfmodel.graph import BASE_BATCHES, ScalableGraph, StepGraph, workload_graph
from dnnperf.perfmodel.kernels import split_kernels
from dnnperf.perfmodel.machine import AXES, NOT_CALIBRATED, Machine, link_source
from dnnperf.perfmodel.subnormals import subnormal_share

STRATEGIES = ("single", "dp", "fsdp", "zero1", "zero2", "pp", "tp")
#: The collectives each strategy's prediction times between devices (besides allreduce, which every
#: calibrated link has: it is the machine's own link), what its link calibration must measure.
COLLECTIVES = {
    "single": (),
    "dp": (),
    "fsdp": ("allgather", "reduce_scatter"),
    "zero1": ("broadcast",),
    "zero2": ("reduce_scatter", "allgather"),
    "pp": ("send_recv", "broadcast"),
    "tp": ("allgather",),
}
#: Data parallelism that shards the training state over the ranks (the ZeRO stages; fsdp is ZeRO-3).
SHARDED = ("fsdp", "zero1", "zero2")
DEFAULT_OPTIONS = ComputeOptions()


@dataclass
class Prediction:
    """One configuration's predicted step on the slowest device, split so that the parts add up."""

    workload: str
    machine: str
    strategy: str
    devices: int
    batch_size: int
    compute_s: float  # forward + backward + update on the critical path (roofline + per-call overhead)
    communication_s: float  # exposed: not hidden behind compute
    bubble_s: float  # pipeline fill and drain
    other_s: float  # the data stage and the host's page faults
    memory_bytes: float  # per device, the peak: see MemoryEstimate
    memory_capacity: float
    detail: dict[str, Any] = field(default_factory=dict)
    #: The peak's parts (MemoryEstimate.to_dict): bytes per category at the predicted peak, and where.
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s + self.bubble_s + self.other_s

    @property
    def throughput(self) -> float:
        return self.batch_size / self.step_s

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_capacity

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "step_s": self.step_s, "throughput": self.throughput, "fits": self.fits}


def _pipeline_starts(graph: StepGraph, names: list[str], seconds: np.ndarray, stages: int) -> list[int]:
    """Each stage's first unit: where dnnperf's pipeline cuts a suite workload (its layers balanced by
    forward cost, ``distributed.pipeline.pipeline_task``), else (a user's model) the cut that balances
    the predicted seconds."""
    if not graph.pipeline_layers:
        return strategies.partition(seconds, stages)
    layers = graph.pipeline_layers
    starts = strategies.partition([layer["cost"] for layer in layers], stages)
    # A stage that starts at a layer made for the cut (no unit of its own) starts at the next unit.
    units = [next(x["unit"] for x in layers[i:] if x["unit"] is not None) for i in starts]
    return [names.index(unit) for unit in units]


def _graph_for(
    source: str | StepGraph | ScalableGraph,
    preset: str,
    batch: int,
    exact: bool,
    count_faults: bool = False,
    device: str = "cpu",
) -> StepGraph:
    if isinstance(source, ScalableGraph):
        return source.at(batch)
    if isinstance(source, StepGraph):
        if batch != source.batch_size:
            raise UsageError(
                f"a described model predicts at its example batch ({source.batch_size} per device), "
                f"not {batch}: describe it with an example batch of {batch}"
            )
        return source
    return workload_graph(source, preset, batch, exact=exact, count_faults=count_faults, device=device)


def _per_device(batch_size: int, ways: int, what: str) -> int:
    if batch_size % ways:
        raise UsageError(f"batch {batch_size} does not split evenly over {ways} {what}")
    return batch_size // ways


#: The categories of a memory estimate, as the memory profiler names them (probes/memory.py).
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "input", "temporaries")


@dataclass
class MemoryEstimate:
    """Bytes per category at the predicted peak of one device's step, and where the peak falls."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float
    input: float
    temporaries: float
    #: "backward" (activations still held while gradients grow) or "update" (every gradient, the
    #: optimizer's transient buffers).
    phase: str
    #: Where in backward: the module whose forward segment the walk was passing ("" at the update).
    module: str = ""

    @property
    def peak(self) -> float:
        return sum(getattr(self, c) for c in MEMORY_CATEGORIES)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "peak": self.peak}


def memory_estimate(
    graph: StepGraph,
    param_share: float = 1.0,
    activation_share: float = 1.0,
    segment_shares: Sequence[float] | None = None,
    sharded: strategies.ShardedMemory | None = None,
) -> MemoryEstimate:
    """The peak of one step's memory on one device, from the description alone (docs/performance-model.md).

    Parameters, optimizer state and the batch are held throughout. On top of them, the larger of:

    * **backward**, walked from the end of forward to its start over the graph's memory walk: at each
      forward segment, the activations saved up to it (not yet released), the parameter gradients
      backward has made from there to the end, the gradient flowing there (the output and input
      gradients of the latest leaf module) and the largest library workspace of an operator there
      (both temporaries);
    * **the update**: every gradient of the cycle and the optimizer's transient buffers
      (``graph.update_temp_bytes``, by optimizer type).

    ``param_share`` scales what belongs to parameters (parameters, gradients, optimizer state: a
    pipeline stage's or a tensor-parallel rank's share), ``activation_share`` the activations (the
    micro-batches a stage holds in flight), and ``segment_shares`` (one per segment of the memory walk)
    each segment's own activations (a tensor-parallel rank's share inside a split region). The
    transient terms are not scaled (one micro-batch's gradient flow; the largest parameter's update
    buffers): an upper side. ``sharded`` (a ZeRO stage) replaces ``param_share`` with its own shares
    per category and adds the unsharded parameters and gradients it holds at once.
    """
    grad_share, extra_grads = param_share, 0.0
    fixed = {
        "parameters": (graph.param_bytes + graph.frozen_param_bytes) * param_share,
        "optimizer_state": graph.optimizer_state_bytes * param_share,
        "input": float(graph.batch_bytes),
    }
    if sharded is not None:
        grad_share, extra_grads = sharded.gradient_share, sharded.gathered_gradients
        fixed["parameters"] = (
            graph.param_bytes + graph.frozen_param_bytes
        ) * sharded.param_share + sharded.gathered_params
        fixed["optimizer_state"] = graph.optimizer_state_bytes * sharded.state_share
    # fsdp: what is gathered depends on where backward is; the update holds shards alone.
    gathered = sharded.gathered_in_backward if sharded is not None and sharded.gathered_in_backward else None
    if gathered is not None:
        fixed["parameters"] -= sharded.gathered_params  # type: ignore[union-attr]
        extra_grads = 0.0
    cycles: dict[int, list[Any]] = {}
    shares: dict[int, list[float]] = {}
    held: dict[int, list[tuple[float, float]]] = {}
    own = segment_shares if segment_shares is not None else [1.0] * len(graph.memory_walk)
    for index, (segment, part) in enumerate(zip(graph.memory_walk, own, strict=True)):
        cycles.setdefault(segment.cycle, []).append(segment)
        shares.setdefault(segment.cycle, []).append(part)
        held.setdefault(segment.cycle, []).append(gathered[index] if gathered is not None else (0.0, 0.0))
    updated = max((sum(s.grads for s in c) for c in cycles.values()), default=graph.param_bytes)
    best = MemoryEstimate(
        **fixed,
        gradients=updated * grad_share + extra_grads,
        activations=0.0,
        temporaries=float(graph.update_temp_bytes),
        phase="update",
    )
    if not cycles:  # a description from before the walk: every activation beside every gradient
        walked = MemoryEstimate(
            **fixed,
            gradients=graph.param_bytes * grad_share + extra_grads,
            activations=graph.saved_bytes * activation_share,
            temporaries=0.0,
            phase="backward",
        )
        return walked if walked.peak > best.peak else best
    for cycle, segments in cycles.items():
        saved = np.cumsum([s.saved * part for s, part in zip(segments, shares[cycle], strict=True)])
        saved = saved * activation_share
        grads = np.cumsum([s.grads for s in segments][::-1])[::-1] * grad_share + extra_grads
        flow = np.array([s.flow + s.workspace for s in segments], dtype=float)
        extra_params, extra_grads_here = np.array(held[cycle], dtype=float).reshape(-1, 2).T
        grads = grads + extra_grads_here
        k = int(np.argmax(saved + grads + flow + extra_params))
        candidate = MemoryEstimate(
            **{**fixed, "parameters": fixed["parameters"] + float(extra_params[k])},
            gradients=float(grads[k]),
            activations=float(saved[k]),
            temporaries=float(flow[k]),
            phase="backward",
            module=segments[k].module,
        )
        if candidate.peak > best.peak:
            best = candidate
    return best


def require_link(machine: Machine, ranks: int, op: str) -> None:
    """Refuse ``op`` between ``ranks`` devices of a machine whose calibration skipped it."""
    if ranks <= 1:
        return
    if machine.sources.get("link") == NOT_CALIBRATED:
        raise UsageError(
            f"{machine.name} was calibrated without its link between devices: calibrate it for "
            f"{ranks} devices (calibrated_machine(collectives=...))"
        )
    if machine.sources.get(link_source(op)) == NOT_CALIBRATED:
        raise UsageError(
            f"{machine.name}'s link was calibrated without {op}: calibrate it with that collective "
            f"(calibrated_machine(collectives=...))"
        )


def link_for(machine: Machine, ranks: int, op: str = "allreduce", cpu: bool = False) -> collectives.Link:
    """The slowest link ``ranks`` consecutive devices span; inside a node, the backend's own fit of
    ``op`` where the machine was calibrated with one. ``cpu``: the fit's CPU cost, as on an unshaped
    link (Machine.comm_on_compute_cores). CPU ranks (gloo) pay the machine's page-fault cost for the
    buffers the backend allocates per call."""
    require_link(machine, ranks, op)
    inside = ranks <= machine.devices_per_node
    fit = machine.collectives.get(op) if inside else None
    fault_s = machine.page_fault_s if machine.comm_on_compute_cores else 0.0
    if fit is not None:
        alpha, bandwidth = fit.get("alpha", 0.0), fit["bandwidth"]
        if cpu:
            alpha, bandwidth = fit.get("cpu_alpha", alpha), fit.get("cpu_bandwidth", bandwidth)
        reduce = fit.get("reduce_bandwidth", 0.0)
        return collectives.Link.of(alpha, bandwidth, reduce, machine.segment_bytes, fault_s)
    return collectives.Link.of(
        machine.intra_latency if inside else machine.link_latency,
        machine.intra_bandwidth if inside else machine.link_bandwidth,
        machine.reduce_bandwidth,
        machine.segment_bytes,
        fault_s,
    )


def reduce_scatter_link(machine: Machine, ranks: int) -> collectives.Link:
    """The link a reduce-scatter runs over: the backend's own fit of it where the machine was calibrated
    with one (gloo's costs more than a ring's half of an allreduce), else the allreduce's."""
    require_link(machine, ranks, "reduce_scatter")
    op = "reduce_scatter" if "reduce_scatter" in machine.collectives else "allreduce"
    return link_for(machine, ranks, op)


def predict(
    source: str | StepGraph | ScalableGraph,
    machine: Machine,
    batch_size: int,
    strategy: str = "single",
    *,
    preset: str = "small",
    micro_batches: int | None = None,
    schedule: str = "1f1b",
    algorithm: str = "ring",
    options: ComputeOptions = DEFAULT_OPTIONS,
    exact: bool = True,
    reshard_after_forward: bool = True,
) -> Prediction:
    """Predict one step of ``source`` (a suite workload's name, a :class:`StepGraph` from
    ``describe_model`` or a :class:`ScalableGraph` of two) on ``machine`` (all its devices for
    dp/pp/tp, one for single)."""
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise UsageError(f"batch size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    devices = 1 if strategy == "single" else machine.devices
    faults = machine.page_fault_s > 0 and options.faults  # count them only where they are charged
    described_on = machine.stream_device or "cpu"  # this host's GPU runs its own operators
    name = source if isinstance(source, str) else source.name
    common = dict(
        workload=name,
        machine=machine.name,
        strategy=strategy,
        devices=devices,
        batch_size=batch_size,
        memory_capacity=machine.memory_bytes,
    )
    if strategy in ("single", "dp", *SHARDED):
        graph = _graph_for(
            source,
            preset,
            _per_device(batch_size, devices, "data-parallel ranks"),
            exact,
            faults,
            described_on,
        )
        times = op_times(graph, machine, options)
        # Forward, backward and update as compute.step_time prices them: on an asynchronous device
        # host and device overlap; on this host's CPU each phase also pays the model's own Python
        # between its calls. The batch's copy is "other".
        step = step_time(graph, machine, options, times)
        phases = {"forward": step.forward_s, "backward": step.backward_s, "update": step.update_s}
        compute = sum(phases.values())
        exposed, memory = 0.0, None
        # The device's own step by phase, before any strategy's additions (DDP's passes, sharding).
        detail: dict[str, Any] = {"phases_s": phases}
        if graph.subnormal_outputs:  # each phase's share of subnormal outputs, and what they cost it
            counts = graph.subnormal_outputs
            detail["subnormal_outputs"] = {p: subnormal_share(n, t) for p, (n, t) in counts.items()}
            detail["subnormal_slowdown"] = dict(graph.subnormal_slowdown)
            detail["subnormals_priced"] = options.subnormals
        if strategy == "fsdp" and devices > 1:
            compute, exposed, sharded, memory = _fully_sharded(
                graph, times, machine, devices, compute, _units(source, preset), reshard_after_forward
            )
            detail.update(sharded)
        elif devices > 1:
            link = link_for(machine, devices)
            ready, sizes, backward_s = strategies.gradient_buckets(times, graph.module_param_bytes)
            if machine.nodes > 1 and machine.devices_per_node > 1:
                intra = link_for(machine, 1)
                costs = [
                    collectives.hierarchical_allreduce(
                        n, machine.devices_per_node, machine.nodes, intra, link, algorithm
                    )
                    for n in sizes
                ]
            elif strategy == "zero2":  # each bucket reduce-scattered: a rank keeps its share's sum
                scatter_link = reduce_scatter_link(machine, devices)
                costs = [collectives.reduce_scatter(n, devices, scatter_link) for n in sizes]
            else:
                costs = [collectives.allreduce(n, devices, link, algorithm) for n in sizes]
            exposed = strategies.bucket_overlap(ready, costs, backward_s)
            detail.update(buckets=len(sizes), allreduce_s=sum(costs), backward_s=backward_s)
            # DDP's copies into and out of its buckets and its averaging (priced by their bytes), and
            # its hooks' and reducer's host work (calibrated per step and per parameter tensor).
            tensors = graph.param_tensors or len(graph.module_param_bytes)  # older descriptions
            ddp_s = (
                _streamed_s(strategies.ddp_pass_bytes(graph.param_bytes), machine)
                + machine.ddp_step_s
                + tensors * machine.ddp_param_s
            )
            compute += ddp_s
            detail["ddp_s"] = ddp_s
            if machine.comm_on_compute_cores and machine.nodes == 1:
                # gloo copies and reduces on the cores backward runs on: on a host the ranks fill,
                # that CPU time is added to the step, whatever the overlap would hide.
                cpu_link = link_for(machine, devices, cpu=True)
                cpu_s = sum(collectives.allreduce(n, devices, cpu_link, algorithm) for n in sizes)
                exposed = max(exposed, cpu_s)
                detail["allreduce_cpu_s"] = cpu_s
            if strategy in SHARDED:
                compute, tail, memory = _zero_update(graph, times, machine, devices, compute, strategy)
                exposed += tail
                detail["update_collective_s"] = tail
        if memory is None:
            memory = memory_estimate(graph)
        return Prediction(
            **common,
            compute_s=compute,
            communication_s=exposed,
            bubble_s=0.0,
            other_s=(step.data_s if machine.asynchronous else data_seconds(graph, machine))
            + fault_seconds(graph, machine, options),
            memory_bytes=memory.peak,
            detail=detail,
            memory=memory.to_dict(),
        )
    if strategy == "pp":
        stages = devices
        # Default: the most micro-batches up to 4 per stage that split the batch evenly.
        m = micro_batches or max(d for d in range(1, min(batch_size, 4 * stages) + 1) if batch_size % d == 0)
        graph = _graph_for(
            source, preset, _per_device(batch_size, m, "micro-batches"), exact, faults, described_on
        )
        times = op_times(graph, machine, options)
        names = [layer.name for layer in graph.layers]
        if stages < 2:
            raise UsageError("pipeline parallelism needs at least 2 devices (use --nodes or a larger node)")
        forward = strategies.layer_seconds(times[times["phase"] == "forward"], names)
        backward = strategies.layer_seconds(times[times["phase"] == "backward"], names)
        bounds = [*_pipeline_starts(graph, names, forward + backward, stages), len(names)]
        stage_forward = [float(forward[a:b].sum()) for a, b in itertools.pairwise(bounds)]
        stage_backward = [float(backward[a:b].sum()) for a, b in itertools.pairwise(bounds)]
        # What no layer owns: the model's top-level code in the first stage, the loss in the last.
        for phase, stage_times in (("forward", stage_forward), ("backward", stage_backward)):
            first, last = strategies.outside_layers(times[times["phase"] == phase], names)
            stage_times[0] += first
            stage_times[-1] += last
        # Micro-batches after the first accumulate their weight gradients (adds, and the pages their
        # fresh gradients map): spread over the stage's backward passes, m - 1 of them a step in all.
        adds = strategies.accumulation_ops(graph.module_param_bytes, m)
        accumulation = strategies.layer_seconds(
            op_times(dataclasses.replace(graph, ops=adds, kernels=[]), machine, options), names
        )
        accumulation_s = []
        for i, (a, b) in enumerate(itertools.pairwise(bounds)):
            held = sum(layer.param_bytes for layer in graph.layers[a:b])
            faults = strategies.accumulation_faults(held, m) * machine.page_fault_s if options.faults else 0.0
            accumulation_s.append(float(accumulation[a:b].sum()) + faults)
            stage_backward[i] += accumulation_s[-1] / m
        stage_s = [f + b for f, b in zip(stage_forward, stage_backward, strict=True)]
        boundary = max((graph.layers[b - 1].output_bytes for b in bounds[1:-1]), default=0)
        send = collectives.send_recv(boundary, link_for(machine, devices, "send_recv"))
        pipe = strategies.pipeline_time(stage_forward, stage_backward, m, send, schedule)
        # After the last backward: the loss broadcast from the last stage, then an all-reduce of each
        # parameter that several stages hold (tied weights), over those stages (pipeline.py).
        stage_of = {name: i for i, (a, b) in enumerate(itertools.pairwise(bounds)) for name in names[a:b]}
        tail = collectives.broadcast(8, stages, link_for(machine, stages, "broadcast"))
        for shared in graph.shared_params:
            holders = len({stage_of[name] for name in shared["layers"] if name in stage_of})
            if holders > 1:
                tail += collectives.allreduce(shared["bytes"], holders, link_for(machine, holders), algorithm)
        update = float(times.loc[times["phase"] == "update", "seconds"].sum())
        params = [
            sum(layer.param_bytes for layer in graph.layers[a:b]) for a, b in itertools.pairwise(bounds)
        ]
        share = max(params) / max(graph.param_bytes, 1)
        in_flight = m if schedule == "gpipe" else min(m, stages)
        heaviest = int(np.argmax(stage_s))
        stage_share = stage_s[heaviest] / max(sum(stage_s), 1e-30)
        memory = memory_estimate(graph, share, in_flight * stage_share)
        return Prediction(
            **common,
            compute_s=pipe.compute_s + update * share,
            communication_s=pipe.communication_s + tail,
            bubble_s=pipe.bubble_s,
            # Each micro-batch's faults, in the heaviest stage's share of them.
            other_s=(data_seconds(graph, machine) + fault_seconds(graph, machine, options) * stage_share) * m,
            memory_bytes=memory.peak,
            memory=memory.to_dict(),
            detail={
                "micro_batches": m,
                "schedule": schedule,
                "stage_s": stage_s,
                "stage_starts": bounds[:-1],
                "bubble_over_compute": (stages - 1) / m,  # (p-1)/m; of the whole step: (p-1)/(m+p-1)
                "collective_s": tail,  # the loss broadcast and the shared parameters' all-reduce
                # Per stage, a step: gradient accumulation's adds and page faults.
                "accumulation_s": accumulation_s,
            },
        )
    # tensor parallel
    ways = devices
    graph = _graph_for(source, preset, batch_size, exact, faults, described_on)
    times = op_times(graph, machine, options)
    gather_link, reduce_link = link_for(machine, ways, "allgather"), link_for(machine, ways, "allreduce")
    if graph.tp_regions:  # the split dnnperf's tensor parallelism makes (tensor_parallel.split_layout)
        split, regions = tp_regions(graph, times, ways, name)
    else:  # a description without it: every compute module by output channel, gathered
        split = set(strategies.split_modules(times))
        regions = [
            {"module": m, "kind": "column", "input_bytes": i, "output_bytes": o}
            for m in sorted(split)
            for i, o in [graph.module_io.get(m, [0, 0])]
        ]
    comm = tp_collectives(regions, ways, gather_link, reduce_link, algorithm)
    if not split:
        raise UsageError(
            f"{name} has no layer tensor parallelism can split (no matrix products or convolutions)"
        )
    # A split layer's kernels do 1/ways of the work on each rank; each rank still makes every call,
    # so the per-call overhead is not divided. On this host a split convolution is replayed at the
    # shapes a rank runs (half the output channels take more than half the time: resnet18 `small`,
    # 0.57 of the whole backward and 0.62 of the forward), its time taken as it is.
    at_split_shapes: set[tuple[str, str, str]] = set()
    if graph.kernels:
        kernels, at_split_shapes = split_kernels(graph.kernels, split, ways)
        times = op_times(dataclasses.replace(graph, kernels=kernels), machine, options)
    divided = times["module"].isin(split) & times["family"].isin(tuple(COMPUTE_FAMILIES))
    rows = zip(times["module"], times["phase"], times["op"], strict=True)
    at_shapes = pd.Series([r in at_split_shapes for r in rows], index=times.index)
    measured = divided & times["replayed"] & at_shapes
    # The split's own work around its collectives: its copies' bytes, and per region the host work of
    # its autograd Functions (calibrated as a whole, the copies' calls included).
    convolutions = set(times.loc[times["family"] == "convolution", "module"])
    copies = strategies.split_copy_ops(regions, ways, convolutions)
    copy_s = _streamed_s(float(copies["bytes"].sum()), machine)
    split_s = copy_s + len(regions) * machine.split_region_s
    compute = (
        float(times.loc[divided & ~measured, "compute_s"].sum()) / ways
        + float(times.loc[measured, "compute_s"].sum())
        + float(times.loc[divided, "overhead_s"].sum())
        + float(times.loc[~divided, "seconds"].sum())
        + split_s
    )
    split_params = sum(graph.module_param_bytes.get(m, 0) for m in split)
    share = (graph.param_bytes - split_params + split_params / ways) / max(graph.param_bytes, 1)
    memory = memory_estimate(graph, share, segment_shares=tp_activation_shares(graph, regions, ways))
    return Prediction(
        **common,
        compute_s=compute,
        communication_s=comm,
        bubble_s=0.0,
        other_s=data_seconds(graph, machine) + fault_seconds(graph, machine, options),
        memory_bytes=memory.peak,
        detail={"split_modules": len(split), "split_regions": len(regions), "split_overhead_s": split_s},
        memory=memory.to_dict(),
    )


def tp_regions(
    graph: StepGraph, times: pd.DataFrame, ways: int, name: str
) -> tuple[set[str], list[dict[str, Any]]]:
    """The modules split and the regions split, as the implementation splits: Megatron's attention
    and MLP blocks, or layers split by output channel; a layer whose channels do not divide stays
    whole."""
    modules = set(times["module"])
    split: set[str] = set()
    regions = []
    for region in graph.tp_regions:
        if region["count"] % ways:
            if region["kind"] != "column":
                by = "heads" if region["kind"] == "attention" else "hidden units"
                raise UsageError(
                    f"tp splits {name}'s {region['kind']} by {by}: {region['count']} {by} do not divide "
                    f"over {ways} devices"
                )
            continue
        prefix = region["module"] + "."
        split |= {m for m in modules if m == region["module"] or m.startswith(prefix)}
        regions.append(region)
    return split, regions


def tp_activation_shares(graph: StepGraph, regions: Sequence[Mapping[str, Any]], ways: int) -> list[float]:
    """Per segment of the memory walk, the share of its saved activations one tensor-parallel rank
    holds: inside a split attention or MLP block, after the block's first saving segment (its first
    layer saves the block's input, whole on every rank), the heads' or hidden units' share,
    ``1 / ways``; elsewhere, and in a layer split by output channel (its output is gathered), all."""
    shares = [1.0] * len(graph.memory_walk)
    for region in regions:
        if region["kind"] == "column":
            continue
        prefix = region["module"] + "."
        entered: set[int] = set()  # the cycles whose first saving segment of the block has passed
        for index, segment in enumerate(graph.memory_walk):
            if segment.module != region["module"] and not segment.module.startswith(prefix):
                continue
            if segment.cycle in entered:
                shares[index] = 1 / ways
            elif segment.saved > 0:
                entered.add(segment.cycle)
    return shares


def _streamed_s(nbytes: float, machine: Machine) -> float:
    """Seconds of a strategy's passes over whole tensors (copies, in-place divides: memory-bound),
    ``nbytes`` streamed at the machine's memory bandwidth. Not the operator families' calibrated
    efficiencies: the layer zoo fits "memory" on small copies whose call overhead dominates (0.08 to
    0.17 of the roofline here), which a pass over megabytes does not pay; their calls' host work is
    calibrated with the strategy's (split_region_s, ddp_param_s)."""
    return nbytes / machine.memory_bandwidth


def tp_collectives(
    regions: Sequence[Mapping[str, Any]],
    ways: int,
    gather_link: collectives.Link,
    reduce_link: collectives.Link,
    algorithm: str,
) -> float:
    """Seconds of the split regions' collectives: forward, a layer split by output channel gathers its
    output and a Megatron block all-reduces it; backward, each all-reduces its input gradient."""
    return sum(
        (
            collectives.allgather(r["output_bytes"], ways, gather_link)
            if r["kind"] == "column"
            else collectives.allreduce(r["output_bytes"], ways, reduce_link, algorithm)
        )
        + collectives.allreduce(r["input_bytes"], ways, reduce_link, algorithm)
        for r in regions
    )


def _units(source: str | StepGraph | ScalableGraph, preset: str) -> list[str]:
    """The units fsdp shards a suite workload by (``distributed.sharded.shard_units``); none for a
    described model (every parameter is then the root's: one all-gather of everything)."""
    if not isinstance(source, str):
        return []
    from dnnperf.distributed.sharded import shard_units
    from dnnperf.workloads import get_workload

    return shard_units(get_workload(source).build(preset, "meta").model)


def _update_share(times: pd.DataFrame, share: float) -> float:
    """Seconds the update no longer takes when a rank updates ``share`` of the parameters: its kernels'
    work shrinks, their calls do not (every parameter tensor keeps its shard)."""
    update = times[times["phase"] == "update"]
    work = update["compute_s"] if "compute_s" in update else update["seconds"]
    return float(work.sum()) * (1.0 - share)


def _zero_update(
    graph: StepGraph, times: pd.DataFrame, machine: Machine, ranks: int, compute: float, stage: str
) -> tuple[float, float, MemoryEstimate]:
    """zero1/zero2 on top of dp: the update on the heaviest rank's share, then the updated parameters
    sent to every rank (zero1: ``ZeroRedundancyOptimizer`` broadcasts each rank's share; zero2: one
    all-gather), exposed after the update. Returns compute, that collective's seconds and memory."""
    shares = strategies.zero_partition(list(graph.module_param_bytes.values()), ranks)
    heaviest = max(shares) / max(graph.param_bytes, 1)
    if stage == "zero1":
        link = link_for(machine, ranks, "broadcast")
        tail = sum(collectives.broadcast(n, ranks, link) for n in shares)
    else:
        heaviest = 1.0 / ranks
        tail = collectives.allgather(graph.param_bytes, ranks, link_for(machine, ranks, "allgather"))
    sharded = strategies.sharded_memory(stage, ranks, [], 0, graph.param_bytes, heaviest)
    return compute - _update_share(times, heaviest), tail, memory_estimate(graph, sharded=sharded)


def fsdp_host_seconds(graph: StepGraph, times: pd.DataFrame, machine: Machine, units: int) -> float:
    """FSDP's own host work in a step (calibrate.fsdp_cost): per step, per sharded group (``units``
    and the root), per parameter tensor, and per update call, each on a DTensor shard."""
    tensors = graph.param_tensors or len(graph.module_param_bytes)  # older descriptions
    update = times[(times["phase"] == "update") & ~times["family"].isin(NO_KERNEL)]
    return (
        machine.fsdp_step_s
        + (units + 1) * machine.fsdp_unit_s
        + tensors * machine.fsdp_param_s
        + float(update["calls"].sum()) * machine.fsdp_update_call_s
    )


def _fully_sharded(
    graph: StepGraph,
    times: pd.DataFrame,
    machine: Machine,
    ranks: int,
    compute: float,
    units: list[str],
    reshard_after_forward: bool = True,
) -> tuple[float, float, dict[str, Any], MemoryEstimate]:
    """fsdp (ZeRO-3): per unit an all-gather of its parameters before its forward and, when resharded
    after forward, again before its backward, a reduce-scatter of its gradients after its backward;
    the root's likewise, reduced at the end. Their copies in and out are
    memory passes added to compute, and FSDP's own host work (:func:`fsdp_host_seconds`) too; the
    update runs on 1/ranks of the parameters. On an asynchronous
    device the collectives overlap compute one unit ahead (:func:`strategies.shard_overlap`); on the
    CPU (gloo, no streams) FSDP waits for each where it issues it: all exposed.
    Returns compute, exposed communication, detail and memory."""
    if machine.sources.get("fsdp") == NOT_CALIBRATED:
        raise UsageError(
            f"{machine.name} was calibrated without FSDP's host work: calibrate it for fsdp "
            "(calibrated_machine(fsdp=True))"
        )
    unit_bytes, root_bytes = strategies.unit_param_bytes(graph.module_param_bytes, units)
    gather_link, reduce_link = link_for(machine, ranks, "allgather"), reduce_scatter_link(machine, ranks)

    def gather(n: int) -> float:
        return collectives.allgather(n, ranks, gather_link)

    def scatter(n: int) -> float:
        return collectives.reduce_scatter(n, ranks, reduce_link)

    phase = {p: times[times["phase"] == p] for p in ("forward", "backward")}
    forward = [float(phase["forward"]["seconds"].sum()), *strategies.layer_seconds(phase["forward"], units)]
    backward = [
        float(phase["backward"]["seconds"].sum()),
        *strategies.layer_seconds(phase["backward"], units),
    ]
    forward[0] -= sum(forward[1:])  # the root's own work: what no unit holds
    backward[0] -= sum(backward[1:])
    sizes = [root_bytes, *unit_bytes]
    gathers = [gather(n) for n in sizes]
    scatters = [scatter(n) for n in sizes]
    # Forward: the root first (its all-gather), then the units. Backward: the units in reverse, then
    # the root, whose reduce-scatter ends the step; every group is gathered again for backward, the
    # root too (dnnperf passes reshard_after_forward to every fully_shard call, so FSDP2 reshards the
    # root after forward as well: its parameters are shards alone at the loss, as measured).
    # Kept gathered after forward, no group is gathered again: its parameters stay whole until its
    # backward has run.
    backward_order = [*range(len(sizes) - 1, 0, -1), 0]
    regather = [gathers[i] if reshard_after_forward else 0.0 for i in backward_order]
    collective_s = sum(gathers) + sum(regather) + sum(scatters)
    if machine.asynchronous:
        exposed = strategies.shard_overlap(forward, gathers, [0.0] * len(sizes)) + strategies.shard_overlap(
            [backward[i] for i in backward_order], regather, [scatters[i] for i in backward_order]
        )
    else:
        exposed = collective_s
    # Copies: each all-gather copies the shard in (read and write n/ranks) and the result out (n); each
    # reduce-scatter copies the gradients in (n) and divides its output (n/ranks).
    gathered = (2 if reshard_after_forward else 1) * sum(sizes)
    copy_bytes = 2 * (gathered + sum(sizes)) * (1 + 1 / ranks)
    copy_s = _streamed_s(copy_bytes, machine)
    host_s = fsdp_host_seconds(graph, times, machine, len(units))
    sharded = dataclasses.replace(
        strategies.sharded_memory(
            "fsdp",
            ranks,
            unit_bytes,
            root_bytes,
            graph.param_bytes,
            reshard_after_forward=reshard_after_forward,
        ),
        gathered_in_backward=strategies.gathered_in_backward(
            [s.module for s in graph.memory_walk], units, unit_bytes, root_bytes, reshard_after_forward
        ),
    )
    detail = {
        "units": len(units),
        "reshard_after_forward": reshard_after_forward,
        "allgather_s": sum(gathers) + sum(regather),
        "reduce_scatter_s": sum(scatters),
        "fsdp_copy_s": copy_s,
        "fsdp_host_s": host_s,
    }
    compute = compute + copy_s + host_s - _update_share(times, 1.0 / ranks)
    return compute, exposed, detail, memory_estimate(graph, sharded=sharded)


def best_strategy(predictions: Sequence[Prediction]) -> Prediction | None:
    """The fastest prediction that fits in memory (None when none does)."""
    fitting = [p for p in predictions if p.fits]
    return min(fitting, key=lambda p: p.step_s, default=None)


def sweep(
    source: str | StepGraph,
    machine: Machine,
    batch_size: int,
    axes: Mapping[str, Sequence[float]],
    strategies_: Sequence[str] = ("dp", "pp", "tp"),
    progress: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> pd.DataFrame:
    """Every combination of the axes' values (``batch_size`` and machine.AXES) x strategy: one row each,
    with the split, throughput, memory and ``reason`` where the strategy cannot apply. Batch sizes
    between the counted ones are interpolated (FLOPs and bytes are affine in the batch), so a suite
    workload's points are the roofline's: no kernel is replayed (graph.workload_graph). ``progress``
    hears what is being done and the fraction done."""
    for axis in axes:
        if axis != "batch_size" and axis not in AXES:
            raise UsageError(f"unknown sweep axis {axis!r}: use batch_size or one of {', '.join(AXES)}")
    names = list(axes)
    rows = []
    configurations = list(itertools.product(*(axes[a] for a in names)))
    for done, values in enumerate(configurations):
        if progress is not None:
            what = (
                f"describing {source if isinstance(source, str) else source.name} at batch "
                f"{' and '.join(map(str, BASE_BATCHES))}: a counted step"
                + (", its page faults in fresh processes" if machine.page_fault_s > 0 else "")
                + " (cached afterwards)"
                if done == 0
                else f"predicting configuration {done + 1} of {len(configurations)}"
            )
            progress(what, done / len(configurations))
        config = dict(zip(names, values, strict=True))
        current, batch = machine, batch_size
        for axis, value in config.items():
            if axis == "batch_size":
                batch = int(value)
            else:
                current = current.with_axis(axis, value)
        for strategy in strategies_:
            row: dict[str, Any] = {**config, "strategy": strategy, "devices": current.devices}
            try:
                p = predict(source, current, batch, strategy, exact=False, **kwargs)
            except UsageError as error:
                row["reason"] = str(error)
            else:
                row.update(
                    step_s=p.step_s,
                    compute_s=p.compute_s,
                    communication_s=p.communication_s,
                    bubble_s=p.bubble_s,
                    other_s=p.other_s,
                    throughput=p.throughput,
                    memory_bytes=p.memory_bytes,
                    fits=p.fits,
                    reason=None,
                )
            rows.append(row)
    return pd.DataFrame(rows)
