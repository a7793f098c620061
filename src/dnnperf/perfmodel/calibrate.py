"""Microbenchmarks the model calibrates from (besides ``dnnperf hw``), never the runs it predicts.

:func:`op_overhead` times eager training steps of a network whose operators do next to no arithmetic
(32 blocks of a 4x4 linear layer and a ReLU, batch 2, SGD with momentum): the step time divided by the
kernel calls it dispatches is what one operator call of a training step costs on the host (dispatch,
autograd bookkeeping, module calls). ``dnnperf hw``'s dispatch overhead times a bare ``torch.add``
without autograd and is several times smaller.

:func:`family_efficiency` runs a zoo of standard layers (convolutions from stem to late-stage shapes,
batch, layer and group norm, ReLU, GELU, max pooling, linear, softmax, dropout), forward and backward, each
operator timed (``OpCounter(timed=True)``), and compares the time with the machine's roofline for the
same operators: per family and phase, the achieved fraction (predicted / measured seconds, summed)
is the efficiency the model divides its roofline time by. On a GPU it also gives each family's host
seconds per call (:func:`host_issue_rows`, :func:`fit_host_costs`): what the zoo's layers take to
issue, as several calls in one step, beyond one call.

:func:`measure_page_fault_cost` times what a minor page fault adds to a write into fresh memory: the
model charges it per fault a step takes (``StepGraph.page_faults``, counted when it is described).

:func:`measure_zero_operand_cost` times each of ``model.zeros.CANDIDATES`` on zeros and on positive
values: what a zero input element adds, where it adds anything (the model charges it per zero the
description counted).

:func:`measure_ddp_cost` times the host work DistributedDataParallel adds to a step (its hooks, its
reducer's bookkeeping, its wrapper), per step and per parameter tensor, beside its gradient copies
(which the model prices by their bytes) and its collectives: the model charges it to data parallelism.

:func:`measure_split_region_cost` times the host work one region of tensor parallelism's split adds to
a training step (its two autograd Functions, the collectives' Python around them, the gathered
output's allocation), the collectives themselves left out: the model charges it per split region.

:func:`fsdp_cost` is FSDP's host work (``fsdp_calibration``: 2 gloo ranks of generic linear stacks),
cached like the others: the model charges it to fsdp per step, sharded group, parameter tensor and
update call.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from scipy import optimize
from torch import nn

from dnnperf.cache import JsonCache
from dnnperf.devices import current, synchronize
from dnnperf.hardware import device_key
from dnnperf.perfmodel.compute import (
    NO_KERNEL,
    PER_ELEMENT_NORMS,
    PER_ELEMENT_OPS,
    ComputeOptions,
    few_rows_class,
    large_copies,
    op_times,
)
from dnnperf.perfmodel.graph import StepGraph, operator_row
from dnnperf.perfmodel.issue import gap_seconds, issue_seconds
from dnnperf.perfmodel.kernels import device_lead
from dnnperf.perfmodel.machine import ZOO_DTYPE, Curve, Machine, dedupe
from dnnperf.perfmodel.zeros import CANDIDATES
from dnnperf.probes.opcount import NO_MODULE, PHASES, OpCall, OpCounter, minor_faults
from dnnperf.workloads.base import Stages, no_stages

BLOCKS = 32
#: Zoo operators shorter than this per call are left out of the efficiencies.
MIN_CALL_S = 20e-6


def tiny_step(device: torch.device | str = "cpu") -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(BLOCKS)]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(2, 4, device=device)

    def step(stages: Stages = no_stages) -> None:
        with stages("forward"):
            loss = model(x).sum()
        with stages("backward"):
            loss.backward()
        with stages("update"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return model, step


def tiny_step_calls(device: torch.device | str = "cpu") -> list[OpCall]:
    """The operator calls of one steady step of the tiny network on ``device``, by phase."""
    model, step = tiny_step(device)
    step()  # the optimizer's first step creates its state: count a later one
    counter = OpCounter(model, count=False)
    with counter:
        step(counter)
    return counter.table()


def step_calls(device: torch.device | str = "cpu") -> tuple[int, int]:
    """(kernel calls, calls that launch none: views and metadata) of one step of the tiny network on
    ``device``."""
    table = tiny_step_calls(device)
    views = sum(r.calls for r in table if r.family in NO_KERNEL)
    return sum(r.calls for r in table) - views, views


def kernel_calls(device: torch.device | str = "cpu") -> int:
    """Operator calls (views and metadata excluded) of one step of the tiny network on ``device``."""
    return step_calls(device)[0]


def dispatch_net_of_views(
    overhead_s: float, host_call_s: dict[str, float], device: torch.device | str
) -> float:
    """A GPU's host seconds per kernel call: the per-call overhead less the share of it that the
    microbenchmark's own views took (the asynchronous step charges each view its own host cost,
    ``host_call_s`` of the family that launches nothing)."""
    kernels, views = step_calls(device)
    view_s = [v for k, v in host_call_s.items() if k.split("/")[0] in NO_KERNEL]
    return (
        max(overhead_s - views / kernels * float(np.mean(view_s)), 0.0) if view_s and kernels else overhead_s
    )


def measure_op_overhead(repeats: int = 30, device: torch.device | str = "cpu") -> float:
    """Seconds per operator call: the median step of the tiny network over its kernel calls. On a
    GPU the step waits for its kernels, whose few microseconds each hide behind the host's issue of
    the next: the step's time is the host's, as the model's asynchronous device needs it."""
    device = torch.device(device)
    with current(device):
        calls = kernel_calls(device)
        _, step = tiny_step(device)
        for _ in range(5):
            step()
        samples = []
        for _ in range(repeats):
            synchronize(device)
            started = time.perf_counter()
            step()
            synchronize(device)
            samples.append(time.perf_counter() - started)
    return statistics.median(samples) / calls


def measure_phase_call_cost(
    repeats: int = 30, passes: int = 3, device: torch.device | str = "cpu"
) -> dict[str, float]:
    """Host seconds per kernel call in each phase of the tiny network's step ("forward", "backward",
    "update"): each phase's median seconds (``issue.PhaseClock``) over ``repeats`` steps, the least
    of ``passes`` passes (a shared host's slow spell of a few seconds falls in one), over the phase's
    kernel calls. A forward call carries its module's Python, a backward call the autograd engine's
    walk."""
    device = torch.device(device)
    with current(device):
        calls: dict[str, int] = {}
        for r in tiny_step_calls(device):
            if r.family not in NO_KERNEL:
                calls[r.phase] = calls.get(r.phase, 0) + r.calls
        _, step = tiny_step(device)
        found = [issue_seconds(step, device, warm=5, counted=repeats) for _ in range(passes)]
    seconds = {phase: min(f.get(phase, math.inf) for f in found) for phase in PHASES}
    return {
        phase: seconds[phase] / calls[phase]
        for phase in PHASES
        if calls.get(phase) and seconds[phase] < math.inf
    }


def phase_call_cost(refresh: bool = False) -> dict[str, float]:
    """:func:`measure_phase_call_cost` of this host's CPU at the current thread count, measured once and
    cached."""
    key = f"phase_call/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    found = _measured_once(
        key,
        measure_phase_call_cost,
        lambda cached: isinstance(cached, dict) and set(cached) == set(PHASES),
        refresh,
    )
    return {str(k): float(v) for k, v in found.items()}


def measure_gap_call_cost(passes: int = 3) -> dict[str, float]:
    """Host seconds between two operator calls of the tiny network's step, in its forward and its
    backward, as a description's gaps are measured (issue.gap_seconds): the least of ``passes``
    passes (a shared host's slow spell falls in one). The per-call costs (phase_call_cost) hold these
    gaps already; a model is charged only what its own exceed them by."""
    _, step = tiny_step("cpu")
    found = [gap_seconds(step, warm=5, counted=15) for _ in range(passes)]
    return {
        phase: min(f[phase][0] / f[phase][1] for f in found)
        for phase in ("forward", "backward")
        if all(f.get(phase, (0.0, 0.0))[1] > 0 for f in found)
    }


def gap_call_cost(refresh: bool = False) -> dict[str, float]:
    """:func:`measure_gap_call_cost` of this host's CPU at the current thread count, measured once and
    cached."""
    key = f"gap_call/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    found = _measured_once(
        key,
        measure_gap_call_cost,
        lambda cached: isinstance(cached, dict) and set(cached) == {"forward", "backward"},
        refresh,
    )
    return {str(k): float(v) for k, v in found.items()}


class _Scored(nn.Module):
    """A block that scores its input against its weight (``score``), then scales the input by the
    score: the forward of ``scored_forward``'s networks."""

    def __init__(self, score: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.score = score
        self.weight = nn.Parameter(torch.randn(2, 4))
        self.register_buffer("target", torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.score(x, self.weight, self.target)


#: Compiled losses of many kernels (generic, none a validated network's), and for each its twin: the
#: same Python, its last call one of one kernel. The networks differ only in the kernels the compiled
#: calls issue after their first.
COMPOSITE_SCORES = (
    lambda x, w, t: torch.cosine_embedding_loss(x, w, t, 0.0, 1),  # 1: the mean
    lambda x, w, t: torch.hinge_embedding_loss((x - w).sum(1), t, 1.0, 1),
)
TWIN_SCORES = (
    lambda x, w, t: torch.lerp(x, w, 0.5),
    lambda x, w, t: torch.dot((x - w).sum(1), t),
)


def scored_forward(scores: Sequence[Callable[..., torch.Tensor]]) -> tuple[nn.Module, torch.Tensor]:
    """A network of ``BLOCKS`` blocks scoring with ``scores`` in turn, and its input."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Scored(scores[i % len(scores)]) for i in range(BLOCKS)])
    return model, torch.randn(2, 4, requires_grad=True)


def forward_calls(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(kernel calls, of which issued inside a compiled function after its first) of one forward."""
    counter = OpCounter(model, count=False)
    with counter, counter("forward"):
        model(x).sum()
    kernels = [r for r in counter.table() if r.family not in NO_KERNEL]
    return sum(r.calls for r in kernels), sum(r.inner_calls for r in kernels)


def measure_inner_call_cost(repeats: int = 30, passes: int = 3) -> float:
    """Host seconds of a forward kernel call that a compiled function issues after its first, on this
    CPU: the forward of the network of ``COMPOSITE_SCORES`` less its twin's (``TWIN_SCORES``), over
    the inner calls it adds. Each forward the median of ``repeats`` (with grad, as a step's),
    interleaved, the least of ``passes`` passes. 0 where the difference is not positive."""
    (composite, x), (twin, y) = scored_forward(COMPOSITE_SCORES), scored_forward(TWIN_SCORES)
    added = forward_calls(composite, x)[1] - forward_calls(twin, y)[1]
    best = {"composite": math.inf, "twin": math.inf}
    for _ in range(passes):
        for name, model, tensor in (("composite", composite, x), ("twin", twin, y)):
            for _ in range(3):
                model(tensor).sum()
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                model(tensor).sum()
                samples.append(time.perf_counter() - started)
            best[name] = min(best[name], statistics.median(samples))
    return max((best["composite"] - best["twin"]) / added, 0.0) if added > 0 else 0.0


def inner_call_cost(refresh: bool = False) -> float:
    """:func:`measure_inner_call_cost` of this host's CPU at the current thread count, measured once
    and cached."""
    key = f"inner_call-2/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    found = _measured_once(
        key, measure_inner_call_cost, lambda cached: isinstance(cached, float) and cached >= 0, refresh
    )
    return float(found)


#: Parameter sets the update's calibration steps an optimizer over: (tensors, elements each), from
#: many tensors of a few elements (the per-call cost) to a few of millions (the bytes). Generic shapes:
#: no network's.
UPDATE_SETS = ((512, 64), (256, 1024), (64, 32768), (12, 1 << 20))
#: And sets of a few small tensors, for what a step costs whatever its size (update_step_fit).
STEP_SETS = ((2, 256), (8, 4096))


class UpdateSamples(NamedTuple):
    """The update's calibration steps (:func:`update_samples`), one entry per optimizer and parameter
    set: kernel calls, roofline seconds as the model prices the rows, measured seconds, and whether
    the set is one of ``STEP_SETS``."""

    calls: list[float]
    roofline: list[float]
    measured: list[float]
    step_set: list[bool]

    def fitted(self, step_sets: bool) -> tuple[list[float], list[float], list[float]]:
        """(calls, roofline, measured) of every set, or without ``STEP_SETS``' where not ``step_sets``."""
        kept = [step_sets or not s for s in self.step_set]

        def chosen(values: list[float]) -> list[float]:
            return [v for v, k in zip(values, kept, strict=True) if k]

        return chosen(self.calls), chosen(self.roofline), chosen(self.measured)


def update_optimizers(params: list[nn.Parameter]) -> dict[str, torch.optim.Optimizer]:
    """The optimizers the update's calibration steps, by name, over ``params``."""
    return {
        "sgd momentum": torch.optim.SGD(params, lr=1e-3, momentum=0.9),
        "adam": torch.optim.Adam(params, lr=1e-3),
        "adamw": torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
    }


def update_rows(optimizer: torch.optim.Optimizer) -> pd.DataFrame:
    """The operator rows of one ``optimizer.step()`` (phase "update"), as a description counts them."""
    counter = OpCounter(nn.Module())
    with counter, counter("update"):
        optimizer.step()
    return pd.DataFrame([operator_row(r) for r in counter.table()])


def lead_network() -> Callable[[], None]:
    """A backward of a small generic convolutional network (batch norms, a pool, a linear head; 8
    images of 64x64): what a training step runs right before its update. Its forward runs once and
    each call runs the backward again over the kept graph, at 27 ms on the Xeon of
    validation-heldout-third-host.md against 48 ms for a forward and backward each call: the
    calibration came to 0.71-0.73 of the update's bytes and 2.34-2.47 µs a call that way, against
    0.73-0.74 and 2.33-2.48 µs (three interleaved calibrations each), and 13-15 s against 20-22 s."""
    network = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    loss = network(torch.randn(8, 3, 64, 64)).sum()

    def lead() -> None:
        loss.backward(retain_graph=True)

    return lead


def update_samples(
    machine: Machine,
    repeats: int = 5,
    passes: int = 3,
    after_backward: bool = True,
    sets: Sequence[tuple[int, int]] = UPDATE_SETS + STEP_SETS,
) -> UpdateSamples:
    """Each of three optimizers (SGD with momentum, Adam, AdamW) stepped over each of ``sets``
    (tensors, elements each) on this CPU: the median of ``repeats`` steps, the fastest of ``passes``
    interleaved passes, beside the step's kernel calls and its roofline, ``machine``'s as the model
    prices the rows (compute.op_times without overhead or the share). ``after_backward``: each timed
    step right after a backward of a generic network (lead_network), as a training step runs its
    update; otherwise back to back. On the Xeon of validation-heldout-third-host.md an update after a
    backward took 1.1-1.5x its time back to back (hf:mobilenet_v2's 1.35-1.7x); neither reading 256
    MiB, nor writing it three times, nor 20 ms of sleep in between moved it as much, and a step of one
    tensor of 64 elements took 0.38 ms after a backward against 0.02 back to back. Judged by the
    twenty-third held-out set run again (each lead then a forward and backward), the update
    calibrated after a backward took the rows it changes from a median |error| of 4.9% to 3.0%, none
    grown by 5 points. The leads cost most of the calibration: one before each timed step (270).
    Medians of 5 steps rather than 9, in three interleaved calibrations each way on that Xeon, fitted
    alike (a step 628-768 µs against 603-773, a call 3.7-4.2 µs against 3.4-4.1, a share of the
    roofline 1.00-1.16 against 1.04-1.09) in 17-19 s rather than 30-31 s."""
    torch.manual_seed(0)
    lead = lead_network() if after_backward else None
    configs = []
    for tensors, elements in sets:
        params = [nn.Parameter(torch.randn(elements)) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        for name, optimizer in update_optimizers(params).items():
            optimizer.step()  # its state created: every later step is alike
            rows = update_rows(optimizer)
            graph = StepGraph(name, 1, rows, 0, {}, 0, 0, 0)
            options = ComputeOptions(
                overhead=False, update_share=False, replay_kernels=False, cold_products=False
            )
            roofline = float(op_times(graph, machine, options)["compute_s"].sum())
            calls = float(rows.loc[~rows["family"].isin(NO_KERNEL), "calls"].sum())
            configs.append((optimizer, calls, roofline, (tensors, elements) in STEP_SETS))
    best = [math.inf] * len(configs)
    for _ in range(passes):
        for i, (optimizer, *_) in enumerate(configs):
            samples = []
            for _ in range(repeats):
                if lead is not None:
                    lead()
                started = time.perf_counter()
                optimizer.step()
                samples.append(time.perf_counter() - started)
            best[i] = min(best[i], statistics.median(samples))
    return UpdateSamples([c[1] for c in configs], [c[2] for c in configs], best, [c[3] for c in configs])


def update_cost_fit(
    calls: Sequence[float], roofline: Sequence[float], measured: Sequence[float]
) -> tuple[float, float]:
    """(seconds per call, share of the roofline) with ``measured ~ calls * call_s + roofline * share``:
    non-negative least squares on the relative error (a step of a few tensors counts as much as one
    of millions of elements)."""
    call_s, share = _relative_nnls([calls, roofline], measured)
    return call_s, share


def update_step_fit(
    calls: Sequence[float], roofline: Sequence[float], measured: Sequence[float]
) -> tuple[float, float, float]:
    """(seconds a step, seconds per call, share of the roofline) with ``measured ~ step_s + calls *
    call_s + roofline * share``: :func:`update_cost_fit` with a fixed cost each optimizer step pays
    whatever its size."""
    step_s, call_s, share = _relative_nnls([[1.0] * len(measured), calls, roofline], measured)
    return step_s, call_s, share


def _relative_nnls(columns: Sequence[Sequence[float]], measured: Sequence[float]) -> list[float]:
    """Non-negative coefficients of ``columns`` that fit ``measured`` in least squares on the relative
    error."""
    y = np.asarray(measured, float)
    a = np.column_stack([np.asarray(c, float) for c in columns]) / y[:, None]
    found, _ = optimize.nnls(a, np.ones(len(y)))
    return [float(x) for x in found]


def cached_update_samples(machine: Machine, refresh: bool = False) -> UpdateSamples:
    """:func:`update_samples` of this host's CPU at the current thread count, measured once and
    cached."""
    key = f"update-4/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}/{machine.name}"
    entries = 3 * len(UPDATE_SETS + STEP_SETS)
    found = _measured_once(
        key,
        lambda: list(update_samples(machine)),
        lambda cached: (
            isinstance(cached, list)
            and len(cached) == 4
            and all(isinstance(c, list) and len(c) == entries for c in cached)
        ),
        refresh,
    )
    return UpdateSamples(*found)


def update_step_cost(machine: Machine, refresh: bool = False) -> tuple[float, float, float]:
    """:func:`update_step_fit` of :func:`cached_update_samples`: (seconds a step, seconds per call,
    share of the roofline)."""
    return update_step_fit(*cached_update_samples(machine, refresh).fitted(step_sets=True))


#: Generic matrix products (rows, inner, columns) for the cold-operand calibration: few to many rows,
#: narrow to wide layers; none taken from a validated network.
PRODUCT_SHAPES = tuple((m, k, n) for m in (16, 64, 256) for k in (64, 256, 1024) for n in (64, 256, 1024))
#: Bytes read to push operands out of cache at least: past the last-level cache of most hosts.
COLD_FLUSH_BYTES = 64 * 2**20


def _cold_flush_bytes() -> int:
    """Twice this CPU's last-level cache, at least COLD_FLUSH_BYTES."""
    from dnnperf.hardware import cpu_caches

    sizes = [c.size_bytes for c in cpu_caches(1)]
    return max(COLD_FLUSH_BYTES, 2 * max(sizes, default=0))


def measure_cold_product_cost(repeats: int = 15, passes: int = 2) -> tuple[float, float]:
    """(seconds per call, seconds per counted byte) that a matrix product takes on this CPU with its
    operands out of cache beyond its time in cache: each of ``PRODUCT_SHAPES`` timed in ``repeats``
    pairs, a call on the operands the call before used (hot) then a call on operands not read since a
    read of twice the last-level cache pushed them out (cold, as a step finds a layer's weights a step
    after their update). The read leaves clean lines: a flush by writing would leave dirty ones, whose
    write-back the cold calls would pay. One read a pass serves every shape: each shape's operands
    are made before it, and no call reads them until their own. The pairs put a slow spell of the
    shared host into both calls of a pair; per shape the median of the pairs' differences, the least
    of ``passes`` passes. Fitted by :func:`cold_product_fit`."""
    torch.manual_seed(0)
    flush = torch.ones(_cold_flush_bytes() // 4)
    counted = [4.0 * (m * k + k * n + m * n) for m, k, n in PRODUCT_SHAPES]
    operands = [
        (torch.randn(repeats + 1, m, k), torch.randn(repeats + 1, k, n)) for m, k, n in PRODUCT_SHAPES
    ]
    best_hot = [math.inf] * len(PRODUCT_SHAPES)
    best_excess = [math.inf] * len(PRODUCT_SHAPES)
    for _ in range(passes):
        flush.sum()
        for i, (a, b) in enumerate(operands):
            timed_product(a[0], b[0])
            hot, excess = [], []
            for j in range(1, repeats + 1):
                warm = timed_product(a[j - 1], b[j - 1])  # the operands of the call before: in cache
                cold = timed_product(a[j], b[j])  # not read since the flush
                hot.append(warm)
                excess.append(cold - warm)
            best_hot[i] = min(best_hot[i], statistics.median(hot))
            best_excess[i] = min(best_excess[i], statistics.median(excess))
    return cold_product_fit(counted, best_hot, [h + e for h, e in zip(best_hot, best_excess, strict=True)])


def cold_product_cost(refresh: bool = False) -> tuple[float, float]:
    """:func:`measure_cold_product_cost` of this host's CPU at the current thread count, measured once
    and cached."""
    key = f"cold_product/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    found = _measured_once(
        key,
        measure_cold_product_cost,
        lambda cached: isinstance(cached, list) and len(cached) == 2 and min(cached) >= 0,
        refresh,
    )
    return float(found[0]), float(found[1])


#: Smallest dimensions of the few-rows products (:func:`measure_product_rows_efficiency`), the
#: many-rows reference, and the (inner, outer) widths they are timed at: generic layer widths, none
#: taken from a validated network.
PRODUCT_ROWS = (1, 2, 4, 8, 16, 32)
MANY_PRODUCT_ROWS = 256
PRODUCT_ROWS_WIDTHS = ((256, 512), (512, 1024), (1024, 256))


def measure_product_rows_efficiency(repeats: int = 15, passes: int = 2) -> dict[str, float]:
    """Per smallest dimension r in ``PRODUCT_ROWS``, the rate of a matrix product with r rows against
    the same product with ``MANY_PRODUCT_ROWS`` rows, on this CPU, in (0, 1]: a linear layer's forward
    (r rows times a weight) and its weight gradient (the r rows as the inner dimension), at each of
    ``PRODUCT_ROWS_WIDTHS``. Each time the least of ``repeats`` calls with the operands in cache (the
    curve's own conditions), the least of ``passes`` passes; per r the median over the shapes."""
    torch.manual_seed(0)
    best: dict[tuple[int, int, int, str], float] = {}
    for _ in range(passes):
        for k, n in PRODUCT_ROWS_WIDTHS:
            for rows in (*PRODUCT_ROWS, MANY_PRODUCT_ROWS):
                forward = (torch.randn(rows, k), torch.randn(k, n))
                weight_gradient = (torch.randn(rows, k).t(), torch.randn(rows, n))
                for form, (a, b) in (("forward", forward), ("weight gradient", weight_gradient)):
                    timed_product(a, b)
                    fastest = min(timed_product(a, b) for _ in range(repeats))
                    key = (rows, k, n, form)
                    best[key] = min(best.get(key, math.inf), fastest)
    ratios: dict[str, float] = {}
    for rows in PRODUCT_ROWS:
        # Rate at r rows over the rate at many: equal shapes but for the rows, so FLOPs scale with them.
        each = [
            (best[(MANY_PRODUCT_ROWS, k, n, form)] / MANY_PRODUCT_ROWS) / (best[(rows, k, n, form)] / rows)
            for k, n in PRODUCT_ROWS_WIDTHS
            for form in ("forward", "weight gradient")
        ]
        ratios[str(rows)] = float(min(1.0, max(statistics.median(each), 1e-3)))
    return ratios


def product_rows_efficiency(refresh: bool = False) -> dict[str, float]:
    """:func:`measure_product_rows_efficiency` of this host's CPU at the current thread count, measured
    once and cached."""
    key = f"product_rows/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    found = _measured_once(
        key,
        measure_product_rows_efficiency,
        lambda cached: isinstance(cached, dict) and set(cached) == {str(r) for r in PRODUCT_ROWS},
        refresh,
    )
    return {str(k): float(v) for k, v in found.items()}


def timed_product(a: torch.Tensor, b: torch.Tensor) -> float:
    """Seconds of one call of a product (a function of its own so that a test can put known costs in
    its place)."""
    started = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - started


def cold_product_fit(
    counted_bytes: Sequence[float], hot: Sequence[float], cold: Sequence[float]
) -> tuple[float, float]:
    """(seconds per call, seconds per byte) with ``cold ~ hot + call_s + bytes * byte_s``:
    non-negative least squares on the relative error of the cold time (a small product counts as much
    as a large one)."""
    y = np.asarray(cold, float)
    excess = y - np.asarray(hot, float)
    a = np.column_stack([np.ones(len(y)), np.asarray(counted_bytes, float)]) / y[:, None]
    (call_s, byte_s), _ = optimize.nnls(a, excess / y)
    return float(call_s), float(byte_s)


def measure_kernel_floor(device: torch.device | str, kernels: int = 400, repeats: int = 7) -> float:
    """Device seconds per kernel of a stream of kernels that move next to nothing (a one-element add),
    issued while the device is busy with a long matrix product so that they run back to back: what a
    GPU spends on each kernel beyond its arithmetic and traffic (launch, scheduling, the smallest
    kernel's duration). The median of ``repeats`` samples."""
    device = torch.device(device)
    samples = []
    with current(device):
        tiny = torch.zeros(1, device=device)
        lead = device_lead(device, 0.02)  # queued work: the host issues the stream meanwhile
        for i in range(repeats + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            lead()
            start.record()
            for _ in range(kernels):
                tiny.add_(1.0)
            end.record()
            end.synchronize()
            if i > 0:
                samples.append(start.elapsed_time(end) * 1e-3 / kernels)
    return statistics.median(samples)


def _measured_once(key: str, measure: Callable[[], Any], usable: Callable[[Any], bool], refresh: bool) -> Any:
    """``measure()`` of this host, cached under ``key`` (a cached value ``usable`` rejects is measured
    again)."""
    store = JsonCache("model-calibration")
    cached = store.get(key)
    if usable(cached) and not refresh:
        return cached
    value = measure()
    store.put(key, value)
    return value


@contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread inside, the caller's count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def op_overhead(refresh: bool = False, device: str = "cpu") -> float:
    """The per-call overhead of this host at the current thread count (driving ``device``), measured
    once and cached."""
    key = f"op_overhead/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    key += "" if device == "cpu" else f"/{device_key(device)}"
    found = _measured_once(
        key,
        functools.partial(measure_op_overhead, device=device),
        lambda cached: isinstance(cached, (int, float)) and cached > 0,
        refresh,
    )
    return float(found)


def measure_page_fault_cost(nbytes: int = 64 << 20, repeats: int = 15) -> float:
    """Seconds per minor page fault: ``nbytes`` mapped anew from the OS, written through a tensor and
    unmapped, less the same write into a warm block, over the faults counted. 0 where the OS does not
    count faults, or none happened.

    The fresh block is a private anonymous ``mmap`` of its own (as glibc maps a large block; a shared
    one faults 40% slower), not a tensor from the allocator: glibc hands out even a 64 MiB block from
    a free hole in its heap, already resident, so in a process with a history (a notebook, a test
    session) a tensor's pages need not fault at all."""
    with _one_thread():
        warm = torch.empty(nbytes // 4)
        samples = []
        for i in range(repeats + 2):
            before = minor_faults()
            started = time.perf_counter()
            block = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as glibc's
            fresh = torch.frombuffer(block, dtype=torch.float32)
            fresh.fill_(1.0)
            del fresh  # releases the buffer, so that the mapping can close
            block.close()
            total = time.perf_counter() - started
            faults = minor_faults() - before
            started = time.perf_counter()
            warm.fill_(1.0)
            touched = time.perf_counter() - started
            if i >= 2 and faults > 0:
                samples.append(max(total - touched, 0.0) / faults)
    return statistics.median(samples) if samples else 0.0


def measure_zero_operand_cost(elements: int = 1 << 20, repeats: int = 11) -> dict[str, float]:
    """Per operator of ``CANDIDATES``: extra seconds per zero input element, the median over
    ``repeats`` interleaved pairs (zeros, then values in [0.5, 1.5)) after one warm-up pair, on one
    thread; operators whose zeros cost less than 20% more are left out (not slow on zeros here).
    Calls are timed on this thread's CPU clock: a preemption by another process lands in one call of
    a pair and not in the other, which on the wall clock can put an operator even on zeros past the
    20% (see :func:`measure_ddp_cost`)."""
    zeros = torch.zeros(elements)
    values = torch.rand(elements) + 0.5
    found: dict[str, float] = {}
    with _one_thread():
        for op, run in CANDIDATES.items():
            times: dict[int, list[float]] = {0: [], 1: []}
            for i in range(repeats + 1):
                for which, operand in enumerate((zeros, values)):
                    started = time.thread_time()
                    run(operand)
                    if i:
                        times[which].append(time.thread_time() - started)
            slow, fast = statistics.median(times[0]), statistics.median(times[1])
            if slow > 1.2 * fast:
                found[op] = (slow - fast) / elements
    return found


def zero_operand_cost(refresh: bool = False) -> dict[str, float]:
    """:func:`measure_zero_operand_cost` of this host, measured once and cached."""
    key = f"zero_operand/{platform.node()}/{torch.__version__}"
    found = _measured_once(key, measure_zero_operand_cost, lambda cached: isinstance(cached, dict), refresh)
    return {str(k): float(v) for k, v in found.items()}


def page_fault_cost(refresh: bool = False) -> float:
    """:func:`measure_page_fault_cost` of this host, measured once and cached."""
    key = f"page_fault/{platform.node()}/{torch.__version__}"
    return float(_measured_once(key, measure_page_fault_cost, lambda c: isinstance(c, (int, float)), refresh))


#: The two chains of tiny layers :func:`measure_ddp_cost` fits its line through.
DDP_CHAINS = (8, 64)


def measure_ddp_cost(repeats: int = 40) -> tuple[float, float]:
    """(seconds per step, seconds per trainable parameter tensor) that DistributedDataParallel adds to
    a training step's host work on this host: chains of 8 and 64 tiny linear layers (4 features,
    batch 2; 2 parameter tensors each) wrapped in DDP over a one-process gloo group, against the same
    chains bare, steps interleaved; the line through the two chains' median paired differences. The
    gradients are a few bytes, so their copies into and out of DDP's buckets cost only their calls,
    and the one-rank all-reduce returns at once: what is left is DDP's own work. (0, 0) where this
    process already belongs to a group of several ranks, which a calibration must not talk to.

    A step is timed on this thread's CPU clock, not the wall clock: the wrapped step hands its
    all-reduce to gloo's thread and waits for it, and on cores other processes keep busy that wait
    (and any preemption) is milliseconds in some steps and none in others. On the wall clock, under a
    one-core load beside it on 2 cores, repeated calibrations put 2 to 83 us on a parameter tensor
    (8 when the machine is quiet); on the CPU clock, 7 to 12. The work is the calling thread's: the
    one-rank all-reduce gloo's thread runs moves a few bytes."""
    import gc
    import os
    import tempfile
    from pathlib import Path

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if dist.is_initialized() and dist.get_world_size() > 1:
        return 0.0, 0.0
    owned = not dist.is_initialized()
    handle, path = tempfile.mkstemp(prefix="dnnperf-ddp-")  # the one-process group's store
    os.close(handle)
    try:
        if owned:
            dist.init_process_group("gloo", store=dist.FileStore(path, 1), rank=0, world_size=1)
        x = torch.randn(2, 4)
        differences = []
        for layers in DDP_CHAINS:
            torch.manual_seed(0)
            bare = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
            torch.manual_seed(0)
            wrapped = DistributedDataParallel(nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)]))

            def step(model: nn.Module) -> float:
                started = time.thread_time()
                model(x).sum().backward()
                for parameter in model.parameters():
                    parameter.grad = None
                return time.thread_time() - started

            for _ in range(5):
                step(bare), step(wrapped)
            differences.append(statistics.median(step(wrapped) - step(bare) for _ in range(repeats)))
            # DDP's reducer holds the group: freed here, before the group and its store go (a reducer
            # freed after them joins the group's threads in its destructor, and that can hang).
            del wrapped
            gc.collect()
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()
        Path(path).unlink(missing_ok=True)
    small, large = DDP_CHAINS
    per_param = max((differences[1] - differences[0]) / (2 * (large - small)), 0.0)
    per_step = max(differences[0] - 2 * small * per_param, 0.0)
    return per_step, per_param


def ddp_cost(refresh: bool = False) -> tuple[float, float]:
    """:func:`measure_ddp_cost` of this host, measured once and cached."""
    key = f"ddp/{platform.node()}/{torch.__version__}"
    found = _measured_once(
        key,
        lambda: list(measure_ddp_cost()),
        lambda c: isinstance(c, list) and len(c) == 2 and all(isinstance(v, (int, float)) for v in c),
        refresh,
    )
    return float(found[0]), float(found[1])


def fsdp_cost(refresh: bool = False) -> tuple[float, float, float, float]:
    """FSDP's host work on this host (``fsdp_calibration.measure_fsdp_cost``: per step, per sharded
    group, per parameter tensor, per update call), measured once and cached."""
    from dnnperf.perfmodel.fsdp_calibration import FsdpCost, measure_fsdp_cost

    key = f"fsdp/{platform.node()}/{torch.__version__}"
    found = _measured_once(
        key,
        lambda: list(measure_fsdp_cost()),
        lambda c: (
            isinstance(c, list)
            and len(c) == len(FsdpCost._fields)
            and all(isinstance(v, (int, float)) for v in c)
        ),
        refresh,
    )
    return FsdpCost(*(float(v) for v in found))


#: Split regions in the chain :func:`measure_split_region_cost` times.
SPLIT_REGIONS = 32


def measure_split_region_cost(repeats: int = 60) -> float:
    """Seconds one tensor-parallel split region adds to a training step's host work: a chain of
    ``SPLIT_REGIONS`` tiny linear layers (8 features, batch 2), each split by output feature as
    ``distributed.tensor_parallel`` splits it for 2 ranks but run by one process with the collectives
    left out (``LocalCommunicator``), against the same chain whole; forward and backward steps
    interleaved, the median paired difference per region, on this thread's CPU clock (which another
    process's preemption leaves alone, see :func:`measure_ddp_cost`; the steps' forward and backward
    run on the calling thread). The layers do next to no arithmetic and the copies move a few bytes,
    so what is left is the split's own calls."""
    from dnnperf.distributed.partition import DetailMeter
    from dnnperf.distributed.tensor_parallel import ColumnParallelLinear, LocalCommunicator
    from dnnperf.workloads.base import no_stages

    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(SPLIT_REGIONS)]
    whole = nn.Sequential(*layers)
    meter = DetailMeter(torch.device("cpu"))
    comm = LocalCommunicator(meter, rank=0, world=2)
    split = nn.Sequential(*[ColumnParallelLinear(layer, comm, gather=True) for layer in layers])
    x = torch.randn(2, 8, requires_grad=True)  # so that every region's input gradient is all-reduced

    def whole_step() -> None:
        whole(x).sum().backward()

    def split_step() -> None:
        meter.begin()
        comm.begin(no_stages)
        split(x).sum().backward()
        meter.end()

    try:
        for _ in range(5):
            whole_step()
            split_step()
        differences = []
        for _ in range(repeats):
            started = time.thread_time()
            whole_step()
            middle = time.thread_time()
            split_step()
            differences.append((time.thread_time() - middle) - (middle - started))
    finally:
        meter.close()
    return max(statistics.median(differences), 0.0) / SPLIT_REGIONS


def split_region_cost(refresh: bool = False) -> float:
    """:func:`measure_split_region_cost` of this host, measured once and cached."""
    key = f"split_region/{platform.node()}/{torch.__version__}"
    return float(
        _measured_once(key, measure_split_region_cost, lambda c: isinstance(c, (int, float)), refresh)
    )


class _Sequence(nn.Module):
    """A recurrent layer's output sequence alone (it also returns its final states)."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


class _CausalAttention(nn.Module):
    """Causal self-attention with dropout, as the suite's transformers call it: its softmax is
    ``_safe_softmax`` (6x softmax's time per element here), the one row the zoo keeps of it."""

    calibrates = ("aten._safe_softmax",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(x, x, x, dropout_p=0.1, is_causal=True)


#: The per-element functions the zoo runs, one layer each (their backward's functions come along).
POINTWISE = (
    torch.tanh,
    torch.sigmoid,
    nn.functional.silu,
    torch.exp,
    torch.log,
    torch.sin,
    torch.cos,
    torch.sqrt,
    torch.rsqrt,
    torch.erf,
)


class _Pointwise(nn.Module):
    """One per-element function (compute.PER_ELEMENT_OPS) of positive inputs (a logarithm or a root
    of the zoo's normal samples would be NaN): the function's own rows are the ones the zoo keeps,
    forward and backward (a sine's backward is a cosine)."""

    calibrates = tuple(PER_ELEMENT_OPS)

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x.abs() + 0.5)


class _Pad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(x, (1, 1, 1, 1))


class _Concat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x], dim=1)


class _Contiguous(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2).contiguous()


def host_zoo(device: torch.device) -> list[tuple[nn.Module, tuple[int, ...]]]:
    """The layers a GPU's host costs are fitted on: the zoo, layers of the operators that copy or make
    tensors (padding, concatenation, a transposed copy), which the zoo runs only beside a recurrent
    layer or attention, and a linear layer without bias, whose backward has no bias sum: without them
    the fit cannot tell those operators' host seconds from their neighbours' (it gave a pad the
    seconds of an LSTM's set-up)."""
    scale = GPU_BATCH_SCALE if device.type == "cuda" else 1
    return [
        *_zoo_on(device),
        (_Pad(), (8 * scale, 64, 16, 16)),
        (_Concat(), (8 * scale, 64, 16, 16)),
        (_Contiguous(), (8 * scale, 64, 16, 16)),
        (nn.Linear(256, 256, bias=False), (64 * scale, 256)),
    ]


def _zoo() -> list[tuple[nn.Module, tuple[int, ...]]]:
    """(layer, input shape): shapes of the small presets' early, middle and late layers."""
    return [
        (nn.Conv2d(3, 32, 3, padding=1), (8, 3, 64, 64)),
        (nn.Conv2d(32, 32, 3, padding=1), (8, 32, 32, 32)),
        (nn.Conv2d(64, 64, 3, padding=1), (8, 64, 16, 16)),
        (nn.Conv2d(128, 128, 3, padding=1), (8, 128, 8, 8)),
        (nn.Conv2d(256, 256, 3, padding=1), (8, 256, 4, 4)),
        (nn.Conv2d(64, 256, 1), (8, 64, 16, 16)),
        (nn.Conv2d(64, 64, 3, padding=1), (16, 64, 32, 32)),
        (nn.Conv2d(128, 128, 3, padding=1), (16, 128, 16, 16)),
        (nn.Conv2d(3, 64, 11, stride=4, padding=2), (8, 3, 128, 128)),
        (nn.Conv2d(64, 128, 3, stride=2, padding=1), (8, 64, 16, 16)),
        (nn.Conv2d(128, 128, (1, 7), padding=(0, 3)), (4, 128, 17, 17)),
        (nn.ConvTranspose2d(128, 64, 4, stride=2, padding=1), (8, 128, 8, 8)),
        # Small calls, which a convolution's fixed cost per call (reorders, primitive set-up) decides.
        (nn.Conv2d(8, 8, 3, padding=1), (4, 8, 4, 4)),
        (nn.Conv2d(16, 16, 4, stride=2, padding=1), (4, 16, 8, 8)),
        (nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1), (4, 8, 4, 4)),
        # Each convolution kind (opcount.CONVOLUTION_KINDS) its own efficiency: 1x1 (besides the one
        # above), depthwise 3x3 to 7x7, one strided, and grouped.
        (nn.Conv2d(256, 64, 1), (8, 256, 16, 16)),
        (nn.Conv2d(32, 128, 1), (8, 32, 32, 32)),
        (nn.Conv2d(512, 128, 1), (8, 512, 8, 8)),
        (nn.Conv2d(32, 32, 3, padding=1, groups=32), (8, 32, 32, 32)),
        (nn.Conv2d(128, 128, 3, padding=1, groups=128), (8, 128, 16, 16)),
        (nn.Conv2d(64, 64, 5, padding=2, groups=64), (8, 64, 16, 16)),
        (nn.Conv2d(256, 256, 7, padding=3, groups=256), (8, 256, 8, 8)),
        (nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64), (8, 64, 32, 32)),
        (nn.Conv2d(128, 128, 3, padding=1, groups=8), (8, 128, 16, 16)),
        (nn.Conv2d(256, 256, 3, padding=1, groups=32), (8, 256, 8, 8)),
        # Each kind with few output rows a call (compute.FEW_ROWS): wide layers on maps of 2x2 to 4x4.
        (nn.Conv2d(512, 512, 1), (4, 512, 4, 4)),
        (nn.Conv2d(1024, 256, 1), (8, 1024, 2, 2)),
        (nn.Conv2d(256, 1024, 1), (2, 256, 4, 4)),
        (nn.Conv2d(256, 256, 3, padding=1), (4, 256, 4, 4)),
        (nn.Conv2d(512, 512, 3, padding=1), (8, 512, 2, 2)),
        (nn.Conv2d(512, 512, 3, padding=1, groups=512), (4, 512, 4, 4)),
        (nn.Conv2d(1024, 1024, 7, padding=3, groups=1024), (8, 1024, 2, 2)),
        (nn.Conv2d(512, 512, 3, padding=1, groups=32), (4, 512, 4, 4)),
        (nn.BatchNorm2d(64), (8, 64, 32, 32)),
        (nn.GroupNorm(1, 64), (8, 64, 16, 16)),  # WGAN-GP's critic: layer norm over (C, H, W)
        (nn.ReLU(), (8, 64, 32, 32)),
        (nn.MaxPool2d(2), (8, 64, 32, 32)),
        (nn.AvgPool2d(3, stride=1, padding=1), (8, 64, 32, 32)),
        (nn.Linear(512, 512), (64, 512)),
        (nn.Linear(256, 1024), (256, 256)),
        (nn.Linear(1024, 1024), (512, 1024)),
        (nn.Linear(64, 64), (32, 64)),
        (nn.LayerNorm(256), (64, 32, 256)),
        (nn.GELU(), (64, 32, 256)),
        (nn.GELU(approximate="tanh"), (64, 32, 256)),  # GPT-2's
        (nn.Softmax(dim=-1), (64, 32, 256)),
        (nn.LogSoftmax(dim=-1), (64, 32, 256)),  # cross-entropy's
        (_CausalAttention(), (8, 4, 128, 64)),
        *[(_Pointwise(f), (64, 32, 256)) for f in POINTWISE],
        (nn.Dropout(0.1), (64, 32, 256)),
        (_Sequence(nn.LSTM(256, 256, batch_first=True)), (8, 24, 256)),
        (_Sequence(nn.GRU(128, 128, batch_first=True, bidirectional=True)), (8, 50, 128)),
    ]


class _BlockTranspose(nn.Module):
    """A copy that swaps two outer dimensions: its rows (the last dimension) move whole, as an
    attention's heads do."""

    calibrates = ("aten.clone", "aten.copy_")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()


class _GatedHalves(nn.Module):
    """A gated linear unit's split (GLU, a WaveNet's gate): its backward joins the halves' gradients
    by concatenation."""

    calibrates = ("aten.cat",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, 1)
        return a * b


class _Padded(nn.Module):
    """A padding (a causal convolution's): forward a fill and a copy, backward a copy out."""

    calibrates = ("aten.constant_pad_nd",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(x, (4, 0))


class _Joined(nn.Module):
    """A concatenation (a U-Net's skip, a DenseNet's features)."""

    calibrates = ("aten.cat",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x * 1.0], dim=1)


def _sized_zoo() -> list[tuple[nn.Module, tuple[int, ...]]]:
    """The zoo's normalization and pooling layers again at 8 MiB in (twice the side): beyond a core's
    L2, where ``ComputeOptions.norms_out_of_cache`` takes their rate from (zoo_fit); and copies the
    zoo runs only beside a recurrent layer (a pad, a concatenation, a block transpose), 1-4 MiB in,
    for ``ComputeOptions.copies_calibrated``. Generic shapes: no network's."""
    return [
        (nn.BatchNorm2d(64), (8, 64, 64, 64)),
        (nn.GroupNorm(1, 64), (8, 64, 64, 64)),
        (nn.MaxPool2d(2), (8, 64, 64, 64)),
        (nn.AvgPool2d(3, stride=1, padding=1), (8, 64, 64, 64)),
        (nn.LayerNorm(256), (256, 32, 256)),
        (_Padded(), (8, 64, 1024)),
        (_Joined(), (8, 64, 32, 32)),
        (_GatedHalves(), (8, 128, 1024)),
        (_BlockTranspose(), (8, 256, 4, 64)),
        (_BlockTranspose(), (8, 64, 16, 256)),
    ]


def _zoo_on(device: torch.device, sized: bool = False) -> list[tuple[nn.Module, tuple[int, ...]]]:
    """The zoo (``sized``: :func:`_sized_zoo`) at ``device``'s batches (``GPU_BATCH_SCALE`` times the
    CPU's on a GPU)."""
    layers = _sized_zoo() if sized else _zoo()
    if device.type != "cuda":
        return layers
    return [(layer, (shape[0] * GPU_BATCH_SCALE, *shape[1:])) for layer, shape in layers]


def timed_rows(
    layer: nn.Module, shape: tuple[int, ...], repeats: int, device: torch.device | None = None
) -> pd.DataFrame:
    """Per operator of one forward + backward of ``layer`` on ``device`` (default the CPU): counts and the
    median measured seconds (on a GPU, CUDA events around each call, made behind a lead from an empty
    queue so that they time its kernels)."""
    device = device or torch.device("cpu")
    layer = layer.to(device, getattr(torch, ZOO_DTYPE))
    x = torch.randn(shape, device=device, dtype=getattr(torch, ZOO_DTYPE), requires_grad=True)
    # A materialised output gradient, as a loss's backward hands a layer: ``.sum().backward()`` would
    # give every layer a stride-0 expanded gradient (4 bytes of storage), which kernels walk at a
    # different cost (a bias gradient's sum: 80 us for 4 bytes counted) or copy first.
    with torch.no_grad():
        grad = torch.randn_like(layer(x))
    for _ in range(2):  # the first calls pay for primitive creation and page faults: not counted
        layer(x).backward(grad)
    synchronize(device)
    counter = OpCounter(layer, timed=True, device=device, lead=device_lead(device))  # kernels, not launches
    tables = []
    with counter:
        for _ in range(repeats):
            layer(x).backward(grad)
            synchronize(device)  # the events resolve once the device has run them
            tables.append(counter.take_step())
    rows = [
        {**operator_row(r), "measured": r.seconds, "faults": float(r.faults or 0)}
        for table in tables
        for r in table
    ]
    frame = pd.DataFrame(rows)
    keys = ["phase", "module", "op", "family", "dtype", "kind"]
    return frame.groupby(keys, as_index=False, sort=False).median()


#: Families whose calls carry a fixed cost beyond dispatch, fitted with their efficiency: a 3x3
#: convolution of a (4, 8, 4, 4) batch took 68 us forward and 171 us backward here (oneDNN's reorders
#: and primitive set-up), against ~5 us for any call of the eager overhead microbenchmark.
FIXED_COST_FAMILIES = ("convolution",)


def fixed_cost_fit(roofline: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    """(fixed seconds per call, efficiency) with ``measured ~ fixed + roofline / efficiency`` per call,
    least squares on the relative error (small calls count as much as large ones); the fixed cost is
    at least 0 and the efficiency at most 1."""
    x, y = np.asarray(roofline, float), np.asarray(measured, float)
    keep = (x > 0) & (y > 0)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        return 0.0, 1.0
    u = 1 / y
    a = np.array([[np.sum(u * u), np.sum(x * u * u)], [np.sum(x * u * u), np.sum(x * x * u * u)]])
    b = np.array([np.sum(u), np.sum(x * u)])
    fixed, slope = np.linalg.lstsq(a, b, rcond=None)[0] if len(x) > 1 else (0.0, 0.0)
    if len(x) < 2 or fixed < 0:  # no fixed cost: the slope alone
        fixed, slope = 0.0, b[1] / a[1, 1]
    if slope < 1:  # faster than the roofline: efficiency 1, the rest is fixed
        slope = 1.0
        fixed = max(0.0, (b[0] - a[0, 1]) / a[0, 0])
    return float(fixed), float(1 / slope)


#: On a GPU the zoo's batches are this many times the CPU's: the CPU's shapes run in a few
#: microseconds there, under the timing's floor.
GPU_BATCH_SCALE = 32
#: On a GPU, zoo operators shorter than this per call (beyond the floor) are left out.
GPU_MIN_CALL_S = 5e-6


#: Passes over the whole zoo; each layer keeps its fastest pass. A shared host's slow spell (another
#: tenant, a migration) of a minute moved every efficiency of one calibration by 15-50% (matrix
#: products at 0.75 of the profile's peak against 0.94-1.0 in four calibrations around it); passes
#: that interleave the layers put such a spell in one pass of each layer at most.
ZOO_PASSES = 3


def fastest_passes(
    layers: Sequence[tuple[nn.Module, tuple[int, ...]]],
    time_layer: Callable[[nn.Module, tuple[int, ...]], pd.DataFrame],
    passes: int = ZOO_PASSES,
    progress: Callable[[str], None] | None = None,
) -> list[pd.DataFrame]:
    """``time_layer`` (a layer's timed rows) over every layer ``passes`` times, the layers interleaved;
    per layer the pass whose rows took the least measured time in all."""
    best: list[pd.DataFrame | None] = [None] * len(layers)
    for number in range(passes):
        for index, (layer, shape) in enumerate(layers):
            if progress is not None:
                progress(f"pass {number + 1}/{passes}: {type(layer).__name__} {shape}")
            frame = time_layer(layer, shape)
            kept = best[index]
            if kept is None or frame["measured"].sum() < kept["measured"].sum():
                best[index] = frame
    return [frame for frame in best if frame is not None]


def _zoo_rows(
    machine: Machine, repeats: int = 7, progress: Callable[[str], None] | None = None, sized: bool = False
) -> tuple[dict[str, float], dict[str, float], pd.DataFrame, float, dict[str, float]]:
    """The zoo on ``machine``'s device (its ``replay_device``, else the CPU): efficiencies, fixed costs
    per call (:func:`zoo_fit` with the model's default options), the timed rows the fit kept (each
    layer the fastest of ``ZOO_PASSES`` passes of ``repeats`` / ``ZOO_PASSES`` calls, rounded up;
    fewer repeats than passes: one call a pass), a GPU's kernel floor and host costs per call (both
    0/empty on a CPU). ``sized``: the layers of :func:`_sized_zoo` too, for the variants that use them
    (zoo_fit), which the model does not."""
    torch.manual_seed(0)
    device = torch.device(machine.replay_device or "cpu")
    gpu = device.type == "cuda"
    host_call: dict[str, float] = {}
    passes = min(ZOO_PASSES, repeats)
    per_pass = -(-repeats // passes)
    with current(device):
        base = _zoo_on(device)
        layers = base + (_zoo_on(device, sized=True) if sized else [])
        timed = fastest_passes(
            layers, lambda layer, shape: timed_rows(layer, shape, per_pass, device), passes, progress
        )
        frames = []
        for index, ((layer, _), frame) in enumerate(zip(layers, timed, strict=True)):
            calibrates = getattr(layer, "calibrates", None)  # a layer run for some of its operators only
            frame = frame if calibrates is None else frame[frame["op"].isin(calibrates)]
            frames.append(frame.assign(sized=index >= len(base)))  # for norms_out_of_cache alone
        if gpu:
            per_call = fit_host_costs(host_issue_rows(host_zoo(device), device, repeats))
            reference = dispatch_net_of_views(op_overhead(device=str(device)), per_call, device)
            host_call = host_call_costs(per_call, reference)
    rows = pd.concat(frames, ignore_index=True)
    # The timing mode's own cost per call: the median of the calls that move next to nothing. It is
    # taken off every call, and calls not clearly longer than it are left out (they measure overhead,
    # which the model counts separately). The harness's own operators (outside the layer) are left out too.
    per_call = rows["measured"] / rows["calls"]
    floor = float(per_call[((rows["bytes"] / rows["calls"]) <= 1024) & ~rows["sized"]].median())
    floor = floor if floor == floor else 0.0  # NaN when no such call ran
    rows = rows.assign(measured=rows["measured"] - floor * rows["calls"])
    # What the calls' page faults took (a fresh block from the OS faults on first touch, as glibc's
    # history of mappings has it), for ComputeOptions.zoo_faults_apart; none on a GPU's rows.
    fault_s = 0.0 if gpu else page_fault_cost()
    rows = rows.assign(fault_s=rows["faults"] * fault_s)
    # On a GPU, each kernel's own floor too (the model adds Machine.kernel_s per call back).
    kernel_floor = measure_kernel_floor(device) if gpu else 0.0
    if gpu:
        launched = ~rows["family"].isin(NO_KERNEL)
        rows.loc[launched, "measured"] = (rows["measured"] - kernel_floor * rows["calls"]).clip(lower=0.0)
    # The families with a fixed cost keep every call: their fit separates the fixed part itself. (A
    # tiny 1x1 convolution, 13 us forward and 26-29 us backward, sat on the cut: in the fit in one
    # calibration and out of it in the next, 178 against 34 us of fixed cost backward. 1x1
    # convolutions take another path with a small fixed cost; the zoo's tiny ones are 3x3, 4x4 and
    # transposed, the kinds most convolutions of the suite are.)
    long_enough = per_call.ge(2 * floor + (GPU_MIN_CALL_S if gpu else MIN_CALL_S)) | rows["family"].isin(
        FIXED_COST_FAMILIES
    )
    keep = ~rows["family"].isin(NO_KERNEL) & (rows["module"] != NO_MODULE) & long_enough
    rows = rows[keep].reset_index(drop=True)
    efficiency, fixed = zoo_fit(rows, machine)
    return efficiency, fixed, rows, kernel_floor, host_call


def zoo_fit(
    rows: pd.DataFrame, machine: Machine, options: ComputeOptions | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """Efficiencies and fixed costs per call (:func:`zoo_calibration`) from the zoo's timed rows
    (``ZooCalibration.timed``), each row priced as ``options`` price it: a variant of the model that
    prices a family another way (``ComputeOptions.norms_per_element``) needs the efficiencies that
    make the zoo's own calls come out as timed under that pricing. The rows of the layers timed again
    beyond the L2 (``sized``: :func:`_sized_zoo`) give normalization and pooling their efficiencies
    where ``options.norms_out_of_cache``, and nothing otherwise."""
    options = options or ComputeOptions()
    if options.zoo_faults_apart and "fault_s" in rows:
        rows = rows.assign(measured=(rows["measured"] - rows["fault_s"]).clip(lower=0.0))
    if "sized" in rows:
        sized = rows["sized"].astype(bool)
        norms = rows["family"].isin(PER_ELEMENT_NORMS)
        keep = (norms & sized) | (~norms & ~sized) if options.norms_out_of_cache else ~sized
        if options.copies_calibrated or options.large_copies_from_memory:
            keep = keep | (sized & (rows["family"] == "memory"))
        rows = rows[keep]
    unpriced = ["measured", "sized", "faults", "fault_s"]
    graph = StepGraph("zoo", 1, rows.drop(columns=unpriced, errors="ignore"), 0, {}, 0, 0, 0)
    # The zoo prices its rows as timed: in cache; every one of its operators is the zoo's.
    priced = dataclasses.replace(options, overhead=False, cold_products=False, norms_zoo_only=False)
    predicted = op_times(graph, machine, priced)["compute_s"].to_numpy()
    rows = rows.assign(predicted=predicted)
    fixed: dict[str, float] = {}
    fitted: dict[str, float] = {}
    if options.large_copies_from_memory:
        # The large copies' own efficiency per phase; the family's comes from the others.
        beyond = large_copies(rows["family"].to_numpy(str), (rows["bytes"] / rows["calls"]).to_numpy(float))
        for phase, group in rows[beyond].groupby("phase"):
            if group["measured"].sum() > 0:
                fitted[f"memory/{phase}/large"] = min(
                    1.0, float(group["predicted"].sum() / group["measured"].sum())
                )
        rows = rows[~beyond]
    dense = rows["kind"] == ""
    for (family, phase), group in rows[dense & rows["family"].isin(FIXED_COST_FAMILIES)].groupby(
        ["family", "phase"]
    ):
        key = f"{family}/{phase}"
        fixed[key], fitted[key] = fixed_cost_fit(
            group["predicted"] / group["calls"], group["measured"] / group["calls"]
        )
    # Each convolution kind, and each kind's calls of few output rows (compute.few_rows_class): its
    # efficiency over what the dense fit's fixed cost per call leaves.
    classes = [
        few_rows_class(k, r / max(c, 1.0)) if f == "convolution" else ""
        for f, k, r, c in zip(rows["family"], rows["kind"], rows["rows"], rows["calls"], strict=True)
    ]
    rows = rows.assign(size_class=classes)
    kinds = rows[~dense & (rows["size_class"] == "")].rename(columns={"kind": "group"})
    small = rows[rows["size_class"] != ""].rename(columns={"size_class": "group"})
    for (family, phase, group_name), group in pd.concat([kinds, small]).groupby(["family", "phase", "group"]):
        left = group["measured"] - fixed.get(f"{family}/{phase}", 0.0) * group["calls"]
        if left.sum() > 0:
            fitted[f"{family}/{phase}/{group_name}"] = min(1.0, float(group["predicted"].sum() / left.sum()))
    # A family's efficiency is that of its memory-bound operators: the per-element kernels (GELU,
    # softmax) take another bandwidth (compute.PER_ELEMENT_OPS) and always have their own.
    own = rows["op"].isin(PER_ELEMENT_OPS)
    sums = rows[~own].groupby(["family", "phase"])[["predicted", "measured"]].sum()
    efficiency = {f"{family}/{phase}": (p, m) for (family, phase), (p, m) in sums.iterrows()}
    # Where a family's phase ran several operators, each its own too: a 3x3 average pool's backward
    # ran at a tenth of a max pool's, batch norm's forward at a quarter of layer norm's. (Normalization's
    # and pooling's always: ComputeOptions.norms_zoo_only tells the zoo's operators by these keys.)
    by_op = rows.groupby(["family", "phase", "op"])[["predicted", "measured"]].sum()
    several = by_op.groupby(level=["family", "phase"]).size() > 1
    for (family, phase, op), (p, m) in by_op.iterrows():
        if several[(family, phase)] or op in PER_ELEMENT_OPS or family in PER_ELEMENT_NORMS:
            efficiency[f"{family}/{phase}/{op}"] = (p, m)
    ratios = {key: float(min(1.0, max(p / m, 1e-3))) for key, (p, m) in efficiency.items() if m > 0}
    return {**ratios, **{k: max(v, 1e-3) for k, v in fitted.items()}}, fixed


#: Copies of a zoo layer that one step of :func:`host_issue_rows` runs: the first call of each phase
#: pays for the step's start (the autograd engine's thread waking for backward, cold caches), which a
#: network pays once per step; the other copies cost what a call adds inside a network. (An H100
#: host's conv-BatchNorm-ReLU block took 343 us to issue forward alone and 144 us as one of 20.)
HOST_COPIES = 8


def host_issue_rows(
    layers: Sequence[tuple[nn.Module, tuple[int, ...]]], device: torch.device, repeats: int = 7
) -> pd.DataFrame:
    """Per layer, phase and family: the calls and the host seconds that ``HOST_COPIES`` calls of the
    layer in one step take to issue beyond one call (forward and backward each timed on the host
    clock with nothing synchronised inside; the median over ``repeats`` steps of each size, the two
    sizes alternating). Columns: layer, phase, family, calls, issue_s (the phase's, on each of its
    families' rows)."""
    rows = []
    for index, (layer, shape) in enumerate(layers):
        layer = layer.to(device)
        x = torch.randn(shape, device=device, requires_grad=True)
        with torch.no_grad():
            grad = torch.randn_like(layer(x))

        def step(copies: int, layer: nn.Module = layer, x: torch.Tensor = x, grad: torch.Tensor = grad):
            started = time.perf_counter()
            outs = [layer(x) for _ in range(copies)]
            middle = time.perf_counter()
            torch.autograd.backward(outs, [grad] * copies)
            ended = time.perf_counter()
            synchronize(device)
            return middle - started, ended - middle

        calls = {}
        for copies in (1, HOST_COPIES):
            for _ in range(3):
                step(copies)
            counter = OpCounter(layer, count=False)
            with counter:
                step(copies)
            found: dict[tuple[str, str], int] = {}
            for r in counter.table():
                found[(r.phase, r.family)] = found.get((r.phase, r.family), 0) + r.calls
            calls[copies] = found
        times: dict[int, list[tuple[float, float]]] = {1: [], HOST_COPIES: []}
        for _ in range(repeats):
            for copies in times:
                times[copies].append(step(copies))
        for number, phase in enumerate(("forward", "backward")):
            issue = statistics.median(t[number] for t in times[HOST_COPIES])
            issue -= statistics.median(t[number] for t in times[1])
            for (row_phase, family), count in calls[HOST_COPIES].items():
                added = count - calls[1].get((row_phase, family), 0)
                if row_phase == phase and added > 0:
                    rows.append((index, phase, family, added, issue))
    return pd.DataFrame(rows, columns=["layer", "phase", "family", "calls", "issue_s"])


def identified(rows: pd.DataFrame) -> set[str]:
    """The "family/phase" keys whose seconds per call the rows determine, by substitution: a family
    is known once some layer and phase runs it beside known families only (views, which every layer
    may run, are known where they run alone or beside known families, like any other)."""
    groups = [set(g["family"] + "/" + g["phase"]) for _, g in rows.groupby(["layer", "phase"])]
    known: set[str] = set()
    while found := {next(iter(g - known)) for g in groups if len(g - known) == 1}:
        known |= found
    return known


def fit_host_costs(rows: pd.DataFrame) -> dict[str, float]:
    """Host seconds per call of each "family/phase" that add up to every layer's and phase's issue
    seconds (:func:`host_issue_rows`): non-negative least squares on the relative error, so that a
    cheap layer counts as much as a costly one. Phases whose issue time came out at zero or below
    (lost in noise) are left out, and so are the families the rest does not determine
    (:func:`identified`): the fit would split their seconds with a neighbour's at random."""
    rows = rows[rows["issue_s"] > 0]
    if rows.empty:
        return {}
    keys = sorted(set(rows["family"] + "/" + rows["phase"]))
    column = {key: i for i, key in enumerate(keys)}
    groups = list(rows.groupby(["layer", "phase"]))
    a = np.zeros((len(groups), len(keys)))
    for i, (_, group) in enumerate(groups):
        issue = float(group["issue_s"].iloc[0])
        for family, phase, calls in zip(group["family"], group["phase"], group["calls"], strict=True):
            a[i, column[f"{family}/{phase}"]] += calls / issue
    solution, _ = optimize.nnls(a, np.ones(len(groups)))
    known = identified(rows)
    return {key: float(value) for key, value in zip(keys, solution, strict=True) if key in known}


def host_call_costs(per_call_s: dict[str, float], reference_s: float) -> dict[str, float]:
    """On a GPU, per "family/phase": what the model charges a call on the host beyond the per-call
    overhead ``reference_s`` it charges every kernel call (``dispatch_s``): a kernel family's host
    seconds per call (:func:`fit_host_costs`) less the reference, a call that launches nothing (a
    view) its own seconds (the model charges it those alone)."""
    return {
        key: value if key.split("/")[0] in NO_KERNEL else max(0.0, value - reference_s)
        for key, value in per_call_s.items()
    }


def family_efficiency(
    machine: Machine, repeats: int = 7, progress: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Achieved fraction of ``machine``'s roofline per "family/phase" over the layer zoo, in (0, 1], and
    per "family/phase/op" where the zoo ran several operators of the family in that phase."""
    return _zoo_rows(machine, repeats, progress)[0]


@dataclass(frozen=True)
class ZooCalibration:
    """What the layer zoo calibrates (see :func:`zoo_calibration`)."""

    #: Achieved fraction of the roofline per "family/phase" (and "family/phase/op").
    efficiency: dict[str, float]
    #: FLOPs per call -> FLOP/s of the zoo's convolutions and matrix products, per "family/phase".
    curves: dict[str, Curve]
    #: Fixed seconds per call of the families that have one, per "family/phase".
    call_s: dict[str, float]
    #: On a GPU, the device seconds of a kernel that moves next to nothing (:func:`measure_kernel_floor`;
    #: the zoo's times are taken net of it); 0 on a CPU, whose host runs each operator itself.
    kernel_s: float
    #: On a GPU, the host seconds per call beyond the per-call overhead, per "family/phase"
    #: (:func:`host_call_costs`); empty on a CPU, where ``call_s`` holds what the host adds.
    host_call_s: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The zoo's rows as timed (net of the timing floor), for :func:`zoo_fit` under other options;
    #: None where the calibration came from the cache, which keeps only what the model uses.
    timed: pd.DataFrame | None = None
    #: The operators the zoo timed: the others are replayed on this host (ComputeOptions.replay_untimed).
    ops: frozenset[str] = frozenset()


def zoo_calibration(machine: Machine, repeats: int = 7, sized: bool = False) -> ZooCalibration:
    """Efficiencies per family and phase (against the machine's hw curves), and rate curves (FLOPs per
    call -> FLOP/s) per phase of convolutions and matrix products measured on the zoo's shapes. The
    model uses the efficiencies with the hw curves; the zoo curves (to be used without the
    convolution/matmul efficiencies) are an ablation variant: a few noisy points, interpolated by FLOPs
    alone, they rank shapes of equal FLOPs (a 3-channel stem, a 512-channel late layer) as one. Third:
    the fixed seconds per call of the families that have one (``FIXED_COST_FAMILIES``), per phase;
    fourth, on a GPU, a kernel's device floor. Runs on ``machine``'s replay device (default the CPU).
    ``sized``: also time the layers only the variants' fits use (:func:`_zoo_rows`)."""
    efficiency, fixed, rows, kernel_floor, host_call = _zoo_rows(machine, repeats, sized=sized)
    curves: dict[str, Curve] = {}
    dense = rows[rows["family"].isin(("convolution", "matmul")) & (rows["kind"] == "") & ~rows["sized"]]
    for (family, phase), group in dense.groupby(["family", "phase"]):
        per_call = group["flops"] / group["calls"]
        rate = group["flops"] / group["measured"]
        points = [(float(x), float(r)) for x, r in zip(per_call, rate, strict=True) if r > 0]
        if points:
            curves[f"{family}/{phase}"] = Curve(*dedupe(points))  # shapes of equal FLOPs: their median
    return ZooCalibration(
        efficiency, curves, fixed, kernel_floor, host_call, rows, frozenset(map(str, rows["op"]))
    )


def calibrated(machine: Machine, refresh: bool = False) -> ZooCalibration:
    """:func:`zoo_calibration` of this host at the current thread count, measured once and cached."""
    store = JsonCache("model-calibration")
    key = f"zoo-14/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}/{machine.name}"
    cached = store.get(key)
    if isinstance(cached, dict) and not refresh:
        try:
            return ZooCalibration(
                efficiency={str(k): float(v) for k, v in cached["efficiency"].items()},
                curves={k: Curve(tuple(v[0]), tuple(v[1])) for k, v in cached["curves"].items()},
                call_s={str(k): float(v) for k, v in cached["call_s"].items()},
                kernel_s=float(cached["kernel_s"]),
                host_call_s={str(k): float(v) for k, v in cached["host_call_s"].items()},
                ops=frozenset(str(op) for op in cached["ops"]),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            pass
    found = zoo_calibration(machine)
    store.put(
        key,
        {
            "efficiency": found.efficiency,
            "curves": {k: [c.sizes, c.rates] for k, c in found.curves.items()},
            "call_s": found.call_s,
            "kernel_s": found.kernel_s,
            "host_call_s": found.host_call_s,
            "ops": sorted(found.ops),
        },
    )
    return found
