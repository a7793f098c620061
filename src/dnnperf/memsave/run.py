"""Plan, run and measure: ``dnnperf memsave``.

One profiled step gives each unit's saved bytes, inputs and gradients (the memory profiler) and
forward time (module hooks); the baselines (no saving; offload everything: dnnperf's disk tier on
the CPU, and also torch's ``save_on_cpu`` on CUDA; sqrt(n) checkpointing) and the planner's plan then
each run: a tracked step for the measured peak, and paired plain/variant steps, interleaved, for the
overhead (ratio of medians). The offload-everything run also calibrates the planner's cost of an
offloaded byte.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from dnnperf.devices import synchronize
from dnnperf.errors import UsageError
from dnnperf.memsave.budget import Budget
from dnnperf.memsave.disk import measure_bandwidth
from dnnperf.memsave.planner import (
    MeasuredPlan,
    PlanResult,
    UnitCost,
    plan_budget,
    read_ahead_window,
    sqrt_checkpointing,
)
from dnnperf.memsave.policy import Unit, find_units
from dnnperf.memsave.saver import MemorySaver
from dnnperf.memsave.state import StateSaver, check_fusable
from dnnperf.memsave.storages import profile_storages
from dnnperf.probes.memory import MemoryTracker
from dnnperf.results.memory import CATEGORIES, StepMemory
from dnnperf.results.memsave import KEEP, OFFLOAD, RECOMPUTE, MemsaveResult, Plan, Variant
from dnnperf.stats import Samples
from dnnperf.workloads.base import Batch, Task

_TIMELINE_POINTS = 300
#: Plans measured before a budget the model calls feasible is called infeasible.
_PLAN_ATTEMPTS = 3


# -- measuring ----------------------------------------------------------------------------------------


#: The recompute factor is kept within these bounds: a baseline measured at a noisy moment must not
#: make recomputation look free, or five times dearer than a forward pass.
RECOMPUTE_FACTOR_BOUNDS = (0.25, 2.0)


def recompute_factor(costs: Sequence[UnitCost], plan: Plan, measured_s: float) -> float:
    """Measured / predicted seconds of a recompute-only plan (the sqrt(n) baseline): what recomputing
    a unit costs against its forward time in a plain step. Below 1 where the plain forward pays what a
    recomputation does not (page faults on fresh activations: recomputed ones reuse freed memory);
    the planner scales every recomputation by it, as it prices an offloaded byte from the
    offload-everything baseline."""
    predicted = sum(c.forward_s for c in costs if plan.policies.get(c.name) == RECOMPUTE)
    if predicted <= 0:
        return 1.0
    low, high = RECOMPUTE_FACTOR_BOUNDS
    return min(max(measured_s / predicted, low), high)


def unit_forward_times(task: Task, batch: Batch, units: list[Unit], device: torch.device, steps: int = 2):
    """Median forward seconds per unit over ``steps`` steps (hooks; the device synchronised in them)."""
    modules = dict(task.model.named_modules())
    times: dict[str, list[float]] = {u.name: [] for u in units}
    starts: dict[str, float] = {}
    handles = []

    def pre(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            synchronize(device)
            starts[name] = time.perf_counter()

        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            synchronize(device)
            times[name].append(time.perf_counter() - starts.pop(name, time.perf_counter()))

        return hook

    try:
        for unit in units:
            handles.append(modules[unit.name].register_forward_pre_hook(pre(unit.name)))
            handles.append(modules[unit.name].register_forward_hook(post(unit.name), always_call=True))
        per_step: dict[str, list[float]] = {u.name: [] for u in units}
        for _ in range(steps):
            for name in times:
                times[name].clear()
            task.step(batch)
            for name, values in times.items():
                per_step[name].append(sum(values))
    finally:
        for handle in handles:
            handle.remove()
    return {name: Samples.of(values).median for name, values in per_step.items()}


def tracked_step(
    task: Task,
    batch: Batch,
    device: torch.device,
    context: Callable[[], Any],
    outer: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> StepMemory:
    """One step under the memory tracker, inside ``context``; ``outer`` is entered before the tracker
    starts (the training state's saver, which a training loop enters once: the state it moves off the
    device at its start is not part of any step)."""
    # No resident cross-check: the variants are compared by the allocator's peak, and its heap trim
    # would slow the tracked step (docs/memory.md).
    with outer():
        tracker = MemoryTracker(task.model, task.optimizers(), batch, device=device, resident=False)
        with tracker, context():
            task.step(batch, tracker)
        return tracker.result()


def unit_costs(memory: StepMemory, units: list[Unit], forward_s: dict[str, float]) -> list[UnitCost]:
    """Per unit: saved and gradient bytes (its modules summed), checkpoint input (the previous unit's
    output), forward time, the most bytes alive during its backward and its forward (its modules'
    highest)."""

    def of_unit(unit: str, key: str) -> list[int]:
        prefix = unit + "."
        return [d.get(key, 0) for m, d in memory.layers.items() if m == unit or m.startswith(prefix)]

    def total(unit: str, key: str) -> int:
        return sum(of_unit(unit, key))

    costs = []
    previous_output = 0
    for unit in units:
        costs.append(
            UnitCost(
                unit.name,
                total(unit.name, "saved"),
                previous_output,
                forward_s.get(unit.name, 0.0),
                total(unit.name, "gradients"),
                max(of_unit(unit.name, "backward_peak"), default=0),
                max(of_unit(unit.name, "forward_peak"), default=0),
            )
        )
        previous_output = memory.layers.get(unit.name, {}).get("outputs", 0)
    return costs


def forward_held(memory: StepMemory) -> int | None:
    """Bytes allocated when the first backward starts, less those at the step's start."""
    start = next((t for t, stage in memory.stages if stage == "backward"), None)
    if start is None or not memory.timeline:
        return None

    def total(by: dict[str, int]) -> int:
        return sum(v for k, v in by.items() if k in CATEGORIES)

    at = [total(by) for t, by in memory.timeline if t <= start]
    return at[-1] - total(memory.timeline[0][1])


def _timeline(memory: StepMemory) -> list[list[float]]:
    """Total bytes over the step, at most _TIMELINE_POINTS points (each bucket's largest kept)."""
    points = [(t, sum(v for k, v in by.items() if k in CATEGORIES)) for t, by in memory.timeline]
    if len(points) <= _TIMELINE_POINTS:
        return [[t, float(b)] for t, b in points]
    bucket = len(points) / _TIMELINE_POINTS
    out = []
    for i in range(_TIMELINE_POINTS):
        chunk = points[int(i * bucket) : int((i + 1) * bucket)] or [points[-1]]
        t, b = max(chunk, key=lambda p: p[1])
        out.append([t, float(b)])
    return out


def paired_times(
    task: Task,
    batch: Batch,
    device: torch.device,
    context: Callable[[], Any],
    pairs: int,
    outer: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[list[float], list[float]]:
    """Plain and variant steps interleaved (order alternating each pair): their step seconds. A variant
    step runs inside ``context`` (timed) inside ``outer`` (entered and left outside the clock: what a
    training loop enters once, the training state's saver)."""

    def timed(ctx: Callable[[], Any], around: Callable[[], AbstractContextManager[Any]]) -> float:
        with around():
            synchronize(device)
            start = time.perf_counter()
            with ctx():
                task.step(batch)
            synchronize(device)
            return time.perf_counter() - start

    with outer(), context():  # warm-up: first use of the variant (threads, files, the pinned pool)
        task.step(batch)
    plain, variant = [], []
    for i in range(pairs):
        if i % 2 == 0:
            plain.append(timed(nullcontext, nullcontext))
            variant.append(timed(context, outer))
        else:
            variant.append(timed(context, outer))
            plain.append(timed(nullcontext, nullcontext))
    return plain, variant


@contextmanager
def _blocks(
    saver: MemorySaver | StateSaver, stats: dict[str, int], key: str
) -> Iterator[Callable[[], AbstractContextManager[None]]]:
    """One saver for a whole variant, as a training loop keeps one (its files last from step to step),
    entered by each step's block (its bytes written then in ``stats[key]``); closed at the end."""

    @contextmanager
    def block() -> Iterator[None]:
        with saver:
            yield
        stats[key] = saver.bytes_written

    try:
        yield block
    finally:
        saver.close()


def _saver(
    task: Task, plan: Plan, offload_dir: Path | None, stats: dict[str, int], pool_bytes: int | None = None
) -> AbstractContextManager[Callable[[], AbstractContextManager[None]]]:
    """The activations' saver for a variant (``_blocks``)."""
    saver = MemorySaver(task.model, plan, offload_dir=offload_dir, pool_bytes=pool_bytes)
    return _blocks(saver, stats, "bytes_written")


def _state_saver(
    task: Task, offload_dir: Path | None, stats: dict[str, int]
) -> AbstractContextManager[Callable[[], AbstractContextManager[None]]]:
    """The training state's saver for a variant (``_blocks``), entered around each step outside the
    clock."""
    return _blocks(StateSaver(task.optimizers(), offload_dir=offload_dir), stats, "state_bytes_written")


def measure_variant(
    name: str,
    task: Task,
    batch: Batch,
    device: torch.device,
    context: Callable[[], AbstractContextManager[Any]],
    pairs: int,
    stats: dict[str, int] | None = None,
    outer: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Variant:
    plain, steps = paired_times(task, batch, device, context, pairs, outer)
    memory = tracked_step(task, batch, device, context, outer)
    written = (stats or {}).get("bytes_written", 0) + (stats or {}).get("state_bytes_written", 0)
    return Variant(
        name,
        memory.measured_peak,
        steps,
        plain,
        written,
        timeline=_timeline(memory),
        forward_held=forward_held(memory),
    )


def memsave(
    task: Task,
    batch: Batch,
    device: torch.device,
    budget: Budget | int | str,
    pairs: int = 6,
    offload_dir: Path | None = None,
    min_bytes: int = 64 * 1024,
    on_plan: Callable[[PlanResult, int], None] | None = None,
    training_state: str = "auto",
) -> MemsaveResult:
    """Profile, run the baselines, plan for the budget, run the plan; every figure measured here.

    ``budget``: a :class:`Budget`, a number of bytes, or its text ("50%" of the no-saving peak, "2GiB").

    ``training_state``: "auto" (the planner may fuse each update into backward and move the optimizer
    state off the device, where the task's update can be fused: ``state.check_fusable``), "keep"
    (never) or "offload" (always; a task whose update cannot be fused is an error)."""
    wanted = Budget.of(budget)  # bad text is refused before anything runs
    if training_state not in ("auto", KEEP, OFFLOAD):
        raise UsageError(f"unknown training-state choice {training_state!r}: choose auto, keep or offload")
    units = find_units(task.model)
    for _ in range(2):  # warm-up: the optimizer's state exists, the allocator is warm
        task.step(batch)
    baseline_memory = tracked_step(task, batch, device, nullcontext)
    baseline_peak = baseline_memory.measured_peak
    if baseline_peak <= 0:
        raise UsageError("the unoptimised step's peak could not be measured on this device")
    budget = wanted.bytes_for(baseline_peak)
    costs = unit_costs(baseline_memory, units, unit_forward_times(task, batch, units, device))
    profile = profile_storages(task.model, units, lambda: task.step(batch), batch)
    bandwidth = measure_bandwidth(offload_dir) if device.type == "cpu" else {}
    # CUDA: every measured step's pinned pool at the size of all a step can offload (what forward
    # holds when backward starts, or all that is saved for it, with room for alignment), so that no
    # timed step pins memory.
    held = max(sum(c.saved for c in costs), forward_held(baseline_memory) or 0)
    pool = held + held // 4 + 2**20 if device.type == "cuda" else None

    variants = [
        measure_variant("none", task, batch, device, nullcontext, pairs),
    ]
    variants[0].peak = baseline_peak
    variants[0].timeline = _timeline(baseline_memory)
    variants[0].forward_held = forward_held(baseline_memory)
    if device.type == "cuda":
        variants.append(
            measure_variant(
                "save_on_cpu",
                task,
                batch,
                device,
                lambda: torch.autograd.graph.save_on_cpu(pin_memory=True),
                pairs,
            )
        )
    # Read ahead by one unit's worth (planner.read_ahead_window): the same window here, where the cost
    # of an offloaded byte is measured, as in the planner's plans and its model of them.
    prefetch = read_ahead_window(profile, min_bytes)
    everything = Plan(policies={u.name: OFFLOAD for u in units}, min_bytes=min_bytes, prefetch_bytes=prefetch)
    stats: dict[str, int] = {}
    with _saver(task, everything, offload_dir, stats, pool) as blocks:
        offload_all = measure_variant("offload-all", task, batch, device, blocks, pairs, stats)
    variants.append(offload_all)
    sqrt_plan = sqrt_checkpointing(units)
    with _saver(task, sqrt_plan, offload_dir, {}, pool) as blocks:
        variants.append(measure_variant("sqrt(n)", task, batch, device, blocks, pairs))
    # The training state off the device: alone, and with every activation offloaded (the least memory
    # a plan can reach), where the task's update can be fused into backward.
    state_baseline: MeasuredPlan | None = None
    state_plans: list[tuple[Variant, Plan]] = []
    unfusable = ""
    if training_state != KEEP:
        try:
            check_fusable(task, batch)
        except UsageError as error:
            if training_state == OFFLOAD:
                raise
            unfusable = str(error)
        else:
            state_stats: dict[str, int] = {}
            alone = Plan(min_bytes=min_bytes, prefetch_bytes=prefetch, training_state=OFFLOAD)
            both = dataclasses.replace(everything, training_state=OFFLOAD)
            both_stats: dict[str, int] = {}
            with _state_saver(task, offload_dir, state_stats) as state_blocks:
                alone_variant = measure_variant(
                    "offload-state", task, batch, device, nullcontext, pairs, state_stats, state_blocks
                )
            with (
                _saver(task, everything, offload_dir, both_stats, pool) as both_blocks,
                _state_saver(task, offload_dir, both_stats) as both_state_blocks,
            ):
                both_variant = measure_variant(
                    "offload-all+state",
                    task,
                    batch,
                    device,
                    both_blocks,
                    pairs,
                    both_stats,
                    both_state_blocks,
                )
            state_plans = [(alone_variant, alone), (both_variant, both)]
            variants.extend(v for v, _ in state_plans)
    # The exposed cost of an offloaded byte, from the offload-everything run (never below zero).
    plain_median = Samples.of(offload_all.plain_s).median
    exposed = Samples.of(offload_all.step_s).median - plain_median
    offloaded = max(1, offload_all.bytes_written or sum(c.saved for c in costs))
    offload_s_per_byte = max(exposed, 0.0) / offloaded
    # The same with the training state off the device: offload-all+state over offload-state, per
    # activation byte (the state's reads and writes share the cores with the disk tier's).
    state_offload_s_per_byte = None
    if state_plans:
        (alone_variant, _), (both_variant, _) = state_plans
        beside = (both_variant.overhead - alone_variant.overhead) * plain_median
        state_offload_s_per_byte = max(beside, 0.0) / offloaded
    # The baselines as plans the planner may choose at their measured cost (never below zero), and
    # as its calibration. Feasible means measured within the budget: a plan that measures above it
    # joins the calibration (the model's ``rest`` rises to cover it) and the planner plans again.
    # offload-state is offered as the planner's ``state`` (the base of its second mode), not among these.
    sqrt_variant = next(v for v in variants if v.name == "sqrt(n)")
    measured = [
        MeasuredPlan(v.name, plan, v.peak, max(v.overhead, 0.0) * plain_median)
        for v, plan in ((offload_all, everything), (sqrt_variant, sqrt_plan), *state_plans)
    ]
    if state_plans:
        state_baseline = measured.pop(2)
    baselines = measured
    calibration = [(b.plan, b.peak) for b in baselines]
    factor = recompute_factor(costs, sqrt_plan, measured[1].overhead_s)  # sqrt(n)'s measured cost
    missed: list[str] = []
    for attempt in range(1, _PLAN_ATTEMPTS + 1):
        result = plan_budget(
            units,
            costs,
            baseline_peak,
            budget,
            offload_s_per_byte,
            prefetch,
            min_bytes,
            profile=profile,
            recompute_factor=factor,
            calibration=calibration,
            measured=baselines,
            state=state_baseline,
            state_only=training_state == OFFLOAD,
            state_offload_s_per_byte=state_offload_s_per_byte,
        )
        if unfusable and not result.feasible:
            result.reason += f"; the training state stays on the device: {unfusable}"
        if on_plan is not None:
            on_plan(result, baseline_peak)
        if not result.feasible:
            if missed:
                result.reason += "; earlier plans measured above the budget: " + ", ".join(missed)
            break
        plan_stats: dict[str, int] = {}
        with ExitStack() as stack:
            blocks = stack.enter_context(_saver(task, result.plan, offload_dir, plan_stats, pool))
            outer = (
                stack.enter_context(_state_saver(task, offload_dir, plan_stats))
                if result.plan.training_state == OFFLOAD
                else nullcontext
            )
            planned = measure_variant("planner", task, batch, device, blocks, pairs, plan_stats, outer)
        planned.predicted_peak = result.predicted_peak
        planned.predicted_overhead = result.predicted_overhead_s / plain_median
        if planned.peak <= budget:
            variants.append(planned)
            if missed:
                earlier = f"plan {attempt}: earlier plans measured above the budget: {', '.join(missed)}"
                result.reason = f"{result.reason}; {earlier}" if result.reason else earlier
            break
        missed.append(f"{planned.peak:,} bytes (predicted {result.predicted_peak:,})")
        calibration.append((result.plan, planned.peak))
        baselines = [b for b in baselines if b.plan is not result.plan]  # measured over this time
        if state_baseline is not None and result.plan is state_baseline.plan:
            state_baseline = dataclasses.replace(state_baseline, peak=max(state_baseline.peak, planned.peak))
    else:
        result.feasible = False
        result.reason = (
            f"infeasible: {_PLAN_ATTEMPTS} plans predicted within the budget ({budget:,} bytes) measured "
            "above it: " + ", ".join(missed)
        )
    return MemsaveResult(
        budget=budget,
        budget_text=str(wanted),
        baseline_peak=baseline_peak,
        feasible=result.feasible,
        reason=result.reason,
        plan=result.plan,
        plan_table=result.table.to_dict("records"),
        variants=variants,
        offload_s_per_byte=offload_s_per_byte,
        bandwidth=bandwidth,
        recompute_factor=factor,
        state_offload_s_per_byte=state_offload_s_per_byte,
    )
