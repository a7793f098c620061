"""``dnnperf validate``: predict each configuration, run it for real, and tabulate the errors.

Calibration comes from microbenchmarks only (``dnnperf hw``'s profile at this thread count, the
per-call overhead of :mod:`~dnnperf.perfmodel.calibrate`, its layer zoo), measured before any run; the
runs being predicted never feed the model. Besides the model, its ablation variants are predicted
for the same runs (docs/validation.md). ``validate_memory`` sets the predicted peak memory of one
device beside the memory profiler's measurement of a tracked step of the same configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from dnnperf.errors import UsageError
from dnnperf.hardware import HardwareProfile
from dnnperf.interrupts import run_child
from dnnperf.perfmodel.calibrate import (
    dispatch_net_of_views,
    measure_cold_product_cost,
    measure_ddp_cost,
    measure_gap_call_cost,
    measure_inner_call_cost,
    measure_op_overhead,
    measure_page_fault_cost,
    measure_phase_call_cost,
    measure_product_rows_efficiency,
    measure_split_region_cost,
    measure_zero_operand_cost,
    update_cost_fit,
    update_samples,
    update_step_fit,
    zoo_calibration,
    zoo_fit,
)
from dnnperf.perfmodel.collectives import OPERATIONS, operations
from dnnperf.perfmodel.compute import ComputeOptions, step_time
from dnnperf.perfmodel.fsdp_calibration import NONE as NO_FSDP_COST
from dnnperf.perfmodel.fsdp_calibration import measure_fsdp_cost
from dnnperf.perfmodel.graph import describe_workload
from dnnperf.perfmodel.kernels import remeasured
from dnnperf.perfmodel.machine import NOT_CALIBRATED, Machine, from_profile

#: The model (first) and its ablation: the two roofline terms summed or their max; per-call overhead
#: from the training-step microbenchmark, hw's bare dispatch, or none; page faults or none; the
#: update's bandwidth from memory or in cache; convolutions' fixed cost per call or none; per-family
#: efficiencies from the layer zoo against hw's curves, none, or the zoo's own convolution/matmul
#: curves; normalization and pooling per element (at the zoo's sizes' rate or beyond the L2) or
#: through the cache's curve. Every variant shares one calibration (fitted against the model's sum;
#: the normalization and pooling variants' efficiencies fitted under their own pricing).
VARIANTS = {
    "model": ComputeOptions("sum", True),
    "max": ComputeOptions("max", True),
    "hw dispatch": ComputeOptions("sum", True),
    "no overhead": ComputeOptions("sum", False),
    "no page faults": ComputeOptions(faults=False),
    "update in cache": ComputeOptions(update_from_memory=False),
    "update as counted": ComputeOptions(update_share=False),
    "one call cost": ComputeOptions(phase_calls=False),
    "products in cache": ComputeOptions(cold_products=False),
    "no fixed call cost": ComputeOptions("sum", True),
    "no efficiency": ComputeOptions("sum", True),
    "zoo curves": ComputeOptions("sum", True),
    "no zero operands": ComputeOptions(zero_operands=False),
    "per-element ops in cache": ComputeOptions(per_element=False),
    "no replayed kernels": ComputeOptions(replay_kernels=False),
    "normalization and pooling per element": ComputeOptions(norms_per_element=True),
    "normalization and pooling in cache": ComputeOptions(norms_per_element=False),
    "normalization and pooling out of cache": ComputeOptions(norms_out_of_cache=True),
    "the zoo's normalization and pooling out of cache": ComputeOptions(
        norms_out_of_cache=True, norms_zoo_only=True
    ),
    "elementwise from memory": ComputeOptions(elementwise_from_memory=True),
    "memory operators calibrated on copies": ComputeOptions(copies_calibrated=True),
    "copies calibrated and host gaps": ComputeOptions(copies_calibrated=True, fixed_gaps=False),
    "no host gaps": ComputeOptions(host_gaps=False),
    "data movement replayed": ComputeOptions(replay_data_movement=True),
    "data movement replayed, elementwise from memory": ComputeOptions(
        replay_data_movement=True, elementwise_from_memory=True
    ),
    "untimed operators replayed": ComputeOptions(replay_untimed=True),
    "untimed operators by their family": ComputeOptions(replay_untimed=False),
    "untimed operators and dtypes replayed": ComputeOptions(replay_untimed=True, replay_other_dtypes=True),
    "zoo net of its page faults": ComputeOptions(zoo_faults_apart=True),
    "memory operators from memory": ComputeOptions(copies_from_memory=True),
    "large copies from memory": ComputeOptions(large_copies_from_memory=True),
    "untimed dtypes replayed, zoo net of its page faults": ComputeOptions(
        replay_untimed=True, replay_other_dtypes=True, zoo_faults_apart=True
    ),
}
ZOO_CURVE_FAMILIES = ("convolution", "matmul")
#: The variant whose update cost is calibrated back to back, where the model's is right after a
#: backward (calibrate.update_samples): its own machine, the model's options.
UPDATE_BACK_TO_BACK = "update calibrated back to back"
#: The variant whose update is priced by its calls and bytes alone (calibrate.update_cost_fit), where
#: the model's optimizer steps each pay a fixed cost besides (calibrate.update_step_fit,
#: Machine.update_step_s): its own machine, the model's options.
UPDATE_CALLS_AND_BYTES = "update by its calls and bytes"
#: The variants that price normalization and pooling per element (at the zoo's sizes' rate or beyond
#: the L2) or through the cache's curve (ComputeOptions.norms_per_element, norms_out_of_cache):
#: :func:`calibrated_machines` fits each its own efficiencies.
NORM_PRICINGS = (
    "normalization and pooling per element",
    "normalization and pooling in cache",
    "normalization and pooling out of cache",
    "the zoo's normalization and pooling out of cache",
)
#: The variant that prices the elementwise family at the bandwidth from memory
#: (ComputeOptions.elementwise_from_memory), its efficiencies fitted that way too.
ELEMENTWISE_FROM_MEMORY = "elementwise from memory"
#: The variant whose memory family's efficiencies come from the zoo's copies too
#: (ComputeOptions.copies_calibrated).
COPIES_CALIBRATED = "memory operators calibrated on copies"
#: And the model's host seconds between its calls charged too, whole (ComputeOptions.fixed_gaps off).
COPIES_AND_GAPS = "copies calibrated and host gaps"
#: The variant that replays each distinct call of data movement and of the operators with no formula
#: (ComputeOptions.replay_data_movement): the model's machine.
DATA_MOVEMENT_REPLAYED = "data movement replayed"
#: And the elementwise family from memory, its efficiencies fitted that way.
REPLAYED_AND_FROM_MEMORY = "data movement replayed, elementwise from memory"
#: The variant that replays each distinct call of an operator the layer zoo never timed
#: (ComputeOptions.replay_untimed): the model's machine, which knows the zoo's operators.
UNTIMED_REPLAYED = "untimed operators replayed"
#: The model without those replays (the model's: the thirty-sixth held-out set failed them).
UNTIMED_BY_FAMILY = "untimed operators by their family"
#: The variant that also replays the zoo's operators in a dtype it did not time them in
#: (ComputeOptions.replay_other_dtypes): the model's machine.
OTHER_DTYPES_REPLAYED = "untimed operators and dtypes replayed"
#: The variant whose zoo's timings are taken net of their page faults before its efficiencies are
#: fitted (ComputeOptions.zoo_faults_apart), and that with the dtypes replayed too.
FAULTS_APART = "zoo net of its page faults"
DTYPES_AND_FAULTS_APART = "untimed dtypes replayed, zoo net of its page faults"
#: The variant that prices the memory family at the bandwidth from memory
#: (ComputeOptions.copies_from_memory), its efficiencies fitted that way too.
COPIES_FROM_MEMORY = "memory operators from memory"
#: Only the large copies so (ComputeOptions.large_copies_from_memory), at their own efficiency.
LARGE_COPIES_FROM_MEMORY = "large copies from memory"


def gpu_of_this_host(profile: HardwareProfile) -> str:
    """The torch device a GPU's ``profile`` measured, when it is a GPU of this host; else UsageError
    (a GPU's model calibrates on the GPU itself)."""
    device = from_profile(profile).replay_device
    if not device:
        raise UsageError(
            f"the profile of {profile.device_name} ({profile.device_key}) is not of a GPU of this host: "
            "calibrate this one with `dnnperf hw --device cuda`"
        )
    return device


def calibrated_machines(
    profile: HardwareProfile, fsdp: bool = False
) -> tuple[dict[str, Machine], dict[str, float]]:
    """One machine per variant, from fresh microbenchmarks; and the calibration's headline figures.
    On a GPU's profile the host's own costs (page faults, zero operands, DDP, FSDP and split regions, which
    the CPU's kernels pay) are left out, and a "synchronous" variant adds host and device instead of
    overlapping them. FSDP's host work, the one calibration of 2 ranks (12 s of a 60 s calibration on
    2 cores), is measured only where ``fsdp``, as :func:`calibrated_machine` does; without it a CPU's
    machines refuse to predict fsdp."""
    if profile.threads != torch.get_num_threads():
        raise UsageError(
            f"the hardware profile was calibrated with {profile.threads} threads and this process has "
            f"{torch.get_num_threads()}: run `dnnperf hw` with the same OMP_NUM_THREADS"
        )
    gpu = profile.device_type == "cuda"
    device = gpu_of_this_host(profile) if gpu else "cpu"
    overhead = measure_op_overhead(device=device)
    fault = 0.0 if gpu else measure_page_fault_cost()
    zero_operand = {} if gpu else measure_zero_operand_cost()
    split_region = 0.0 if gpu else measure_split_region_cost()
    ddp = (0.0, 0.0) if gpu else measure_ddp_cost()
    fsdp_cost = measure_fsdp_cost() if fsdp and not gpu else NO_FSDP_COST
    zoo = zoo_calibration(from_profile(profile), sized=True)  # for the variants' fits (NORM_PRICINGS)
    efficiency, curves, call_s = zoo.efficiency, zoo.curves, zoo.call_s
    # A CPU's host costs by phase, and the update's per-call cost and share of its counted bytes
    # (priced on the zoo's efficiencies, as the model prices it); a GPU's host issues asynchronously
    # and is calibrated by its own zoo (host_call_s).
    phase_call = {} if gpu else measure_phase_call_cost()
    # The update's steps right after a backward (the model's) and back to back (a variant), priced on
    # the zoo's efficiencies; the model's fit without the sets of a few small tensors, and so without a
    # fixed cost a step, is another variant (update by its calls and bytes).
    priced_on_zoo = from_profile(profile, efficiency=efficiency, call_s=call_s)
    after = None if gpu else update_samples(priced_on_zoo)
    back = None if gpu else update_samples(priced_on_zoo, after_backward=False)
    update_step_s, update_call, update_share = (
        (0.0, 0.0, 1.0) if after is None else update_step_fit(*after.fitted(step_sets=True))
    )
    calls_and_bytes = (0.0, 1.0) if after is None else update_cost_fit(*after.fitted(step_sets=False))
    back_to_back = (0.0, 0.0, 1.0) if back is None else update_step_fit(*back.fitted(step_sets=True))
    if not gpu:
        phase_call["update"] = update_call
    cold_product = (0.0, 0.0) if gpu else measure_cold_product_cost()
    product_rows = {} if gpu else measure_product_rows_efficiency()
    inner_call = 0.0 if gpu else measure_inner_call_cost()
    gap_call = {} if gpu else measure_gap_call_cost()
    gemm_free = {k: v for k, v in efficiency.items() if k.split("/")[0] not in ZOO_CURVE_FAMILIES}
    machines = {
        v: from_profile(
            profile,
            op_overhead_s=None if v == "hw dispatch" else overhead,
            efficiency={} if v == "no efficiency" else gemm_free if v == "zoo curves" else efficiency,
            zoo_curves=curves if v == "zoo curves" else None,
            page_fault_s=fault,
            call_s={} if v in ("no fixed call cost", "no efficiency", "zoo curves") else call_s,
            zero_operand_s=zero_operand,
            split_region_s=split_region,
            ddp_s=ddp,
            fsdp_s=fsdp_cost,
            kernel_s=zoo.kernel_s,
            host_call_s=zoo.host_call_s,
            phase_call_s={} if v == "hw dispatch" else phase_call,
            update_byte_share=update_share,
            update_step_s=update_step_s,
            cold_product_s=cold_product,
            product_rows_efficiency=product_rows,
            inner_call_s=inner_call,
            gap_call_s=gap_call,
            zoo_ops=zoo.ops,  # the others are replayed (ComputeOptions.replay_untimed)
        )
        for v in VARIANTS
    }
    if not gpu:
        machines[UPDATE_CALLS_AND_BYTES] = dataclasses.replace(
            machines["model"],
            phase_call_s={**machines["model"].phase_call_s, "update": calls_and_bytes[0]},
            update_byte_share=calls_and_bytes[1],
            update_step_s=0.0,
        )
        machines[UPDATE_BACK_TO_BACK] = dataclasses.replace(
            machines["model"],
            phase_call_s={**machines["model"].phase_call_s, "update": back_to_back[1]},
            update_byte_share=back_to_back[2],
            update_step_s=back_to_back[0],
        )
    # The model with normalization and pooling priced each way (ComputeOptions.norms_per_element),
    # with the elementwise family from memory, and with the memory family fitted on copies too, each
    # with the efficiencies the zoo's own calls come out at under that pricing. (A zoo read from the
    # cache has no timed rows: its variants keep the model's efficiencies.)
    timed = zoo.timed
    refitted = (
        *NORM_PRICINGS,
        ELEMENTWISE_FROM_MEMORY,
        COPIES_CALIBRATED,
        COPIES_AND_GAPS,
        REPLAYED_AND_FROM_MEMORY,
        FAULTS_APART,
        DTYPES_AND_FAULTS_APART,
        COPIES_FROM_MEMORY,
        LARGE_COPIES_FROM_MEMORY,
    )
    for variant in refitted if timed is not None else ():
        fitted, fixed_s = zoo_fit(timed, from_profile(profile), VARIANTS[variant])
        machines[variant] = dataclasses.replace(machines["model"], efficiency=fitted, call_s=fixed_s)
    if gpu:
        # Views are charged their own host cost on a GPU: the overhead's share of them comes off.
        dispatch = dispatch_net_of_views(overhead, zoo.host_call_s, device)
        machines = {
            v: m if v == "hw dispatch" else dataclasses.replace(m, dispatch_s=dispatch)
            for v, m in machines.items()
        }
        machines["synchronous"] = dataclasses.replace(machines["model"], asynchronous=False)
    elif not fsdp:
        machines = {
            v: dataclasses.replace(m, sources={**m.sources, "fsdp": NOT_CALIBRATED})
            for v, m in machines.items()
        }
    return machines, {
        "op_overhead_s": overhead,
        "dispatch_s": profile.dispatch_overhead_us * 1e-6,
        "page_fault_s": fault,
        "split_region_s": split_region,
        "ddp_step_s": ddp[0],
        "ddp_param_s": ddp[1],
        **({f"fsdp_{name}": cost for name, cost in fsdp_cost._asdict().items()} if fsdp else {}),
        "kernel_s": zoo.kernel_s,
        "update_byte_share": update_share,
        "update_step_s_back_to_back": back_to_back[0],
        "update_call_s_back_to_back": back_to_back[1],
        "update_step_s": update_step_s,
        "update_call_s_by_calls_and_bytes": calls_and_bytes[0],
        "update_byte_share_by_calls_and_bytes": calls_and_bytes[1],
        "update_byte_share_back_to_back": back_to_back[2],
        "cold_product_call_s": cold_product[0],
        "cold_product_byte_s": cold_product[1],
        **{f"phase_call_s[{phase}]": cost for phase, cost in phase_call.items()},
        **{f"gap_call_s[{phase}]": cost for phase, cost in gap_call.items()},
        **{f"product_rows_efficiency[{rows}]": share for rows, share in product_rows.items()},
        "inner_call_s": inner_call,
        **{f"host_call_s[{key}]": cost for key, cost in zoo.host_call_s.items()},
        **{f"zero_operand_s[{op}]": cost for op, cost in zero_operand.items()},
    }


def validate_single(
    workloads: Sequence[str],
    batches: Sequence[int],
    preset: str,
    steps: int,
    machines: dict[str, Machine],
    progress: Callable[[str], None] | None = None,
    processes: int = 3,
) -> pd.DataFrame:
    """One row per workload x batch: measured median step, each variant's prediction and error.

    Each configuration is measured by ``processes`` fresh ``dnnperf bench`` runs (3 warm-up steps, data
    in memory, this process's thread count): a training job is a process of its own, and two processes
    of the same job differ (their allocators map memory differently: basic_cnn `small` batch 4 took 0
    or 992 page faults a step, 3.7 to 5.0 ms, perfmodel/faults.py). The runs go in rounds, every
    configuration once per round, so that a slow spell of a shared host lands in one run of several
    configurations rather than in every run of one. ``measured_s`` is the median of the runs' median
    steps; ``measured_min_s`` and ``measured_max_s`` their range. The predictions are made once per
    round too (a calibrated machine of this host replays its convolutions anew each round) and each
    variant's is the median of its rounds'."""
    import os
    import sys
    import tempfile

    configurations = [(name, batch) for name in workloads for batch in batches]
    device = machines["model"].stream_device or "cpu"
    graphs = {(n, b): describe_workload(n, preset, b, device, count_faults=True) for n, b in configurations}
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the descriptions' blocks: the runs are processes of their own
    predictions: dict[tuple[str, int], dict[str, list[float]]] = {
        c: {v: [] for v in machines} for c in configurations
    }
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    medians: dict[tuple[str, int], list[float]] = {c: [] for c in configurations}
    for round_ in range(processes):
        with remeasured():  # each round's own replays (perfmodel/kernels.py), like its own runs
            for c in configurations:
                for v, machine in machines.items():
                    options = VARIANTS.get(v, ComputeOptions())
                    predictions[c][v].append(step_time(graphs[c], machine, options).total_s)
        for name, batch in configurations:
            argv = [sys.executable, "-m", "dnnperf", "bench", name, "--preset", preset, "-b", str(batch)]
            argv += ["--steps", str(steps), "--warmup", "3", "--device", device, "--json"]
            with tempfile.TemporaryDirectory(prefix="dnnperf-validate-") as runs:
                done = run_child([*argv, "--runs-dir", runs], env)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise UsageError(f"{name} batch {batch}: the run failed: {last}")
            medians[name, batch].append(_median_step(done.stdout))
            if progress is not None:
                model_ms = predictions[name, batch]["model"][-1] * 1e3
                progress(
                    f"run {round_ + 1}/{processes}, {name} b{batch}: measured "
                    f"{medians[name, batch][-1] * 1e3:.2f} ms, predicted {model_ms:.2f} ms"
                )
    predicted = {c: {v: float(np.median(p)) for v, p in by.items()} for c, by in predictions.items()}
    rows = []
    for name, batch in configurations:
        runs = medians[name, batch]
        measured = float(np.median(runs))
        row = {
            "workload": name,
            "batch": batch,
            "measured_s": measured,
            "measured_min_s": min(runs),
            "measured_max_s": max(runs),
        }
        for variant, seconds in predicted[name, batch].items():
            row[f"pred[{variant}]"] = seconds
            row[f"err[{variant}]"] = seconds / measured - 1
        rows.append(row)
    return pd.DataFrame(rows)


#: Measured categories that the prediction has no counterpart for (the profiler's own residuals).
MEASURED_ONLY = ("other", "unattributed")


def validate_memory(
    workloads: Sequence[str],
    batches: Sequence[int],
    preset: str,
    progress: Callable[[str], None] | None = None,
    warmup: int = 1,
) -> pd.DataFrame:
    """One row per workload x batch: the memory profiler's measured peak of one tracked training step
    on this CPU (``dnnperf profile --memory``: the runner's tracked step after ``warmup`` + 1 plain
    ones) and the model's predicted peak for one device (``predict.memory_estimate`` over the counted
    description, as ``predict(..., strategy="single")`` gives it), with the error and both sides'
    bytes per category at their peaks: ``measured[c]`` and ``predicted[c]``, which add up to each
    side's peak (the measured side also has ``other`` and ``unattributed``). A configuration that did
    not run (out of memory, failed) has no measured figures and says why in ``reason``."""
    from dnnperf.perfmodel.predict import MEMORY_CATEGORIES, memory_estimate
    from dnnperf.runner import BenchSettings, bench

    rows = []
    for name in workloads:
        for batch in batches:
            estimate = memory_estimate(describe_workload(name, preset, batch))
            settings = BenchSettings(
                name, preset, (batch,), steps=1, warmup=warmup, device="cpu", memory=True
            )
            point = bench(settings).points[0]
            row: dict[str, Any] = {
                "workload": name,
                "batch": batch,
                "measured_bytes": float("nan"),
                "predicted_bytes": estimate.peak,
                "error": float("nan"),
                "measured_phase": None,
                "predicted_phase": estimate.phase,
                "measured_module": None,
                "predicted_module": estimate.module,
                "reason": None,
            }
            memory = point.memory
            if memory is None or memory.measured_peak <= 0:
                row["reason"] = point.error or f"no memory measured (status {point.status})"
            else:
                row.update(
                    measured_bytes=float(memory.measured_peak),
                    error=estimate.peak / memory.measured_peak - 1,
                    measured_phase=memory.peak_phase,
                    measured_module=memory.peak_module,
                )
            for category in MEMORY_CATEGORIES:
                row[f"measured[{category}]"] = float(memory.peak.get(category, 0)) if memory else None
                row[f"predicted[{category}]"] = float(getattr(estimate, category))
            for category in MEASURED_ONLY:
                row[f"measured[{category}]"] = float(memory.peak.get(category, 0)) if memory else None
            rows.append(row)
            if progress is not None:
                progress(
                    f"{name} b{batch}: measured peak {row['measured_bytes'] / 2**20:.2f} MiB, "
                    f"predicted {estimate.peak / 2**20:.2f} MiB"
                )
    return pd.DataFrame(rows)


def _predictor(
    name: str, machine: Machine, batch: int, strategy: str, preset: str, micro_batches: int, reshard: bool
) -> Callable[[], Any]:
    """The prediction of one 2-rank configuration, to be made (again) when called."""
    from dnnperf.perfmodel.predict import predict

    return functools.partial(
        predict,
        name,
        machine,
        batch,
        strategy,
        preset=preset,
        micro_batches=micro_batches,
        reshard_after_forward=reshard,
    )


def _reshard_argument(strategy: str, reshard_after_forward: bool) -> list[str]:
    """The launch's flag for fsdp kept gathered after forward (resharding is FSDP's default here)."""
    return ["--no-reshard-after-forward"] if strategy == "fsdp" and not reshard_after_forward else []


def validate_memory_distributed(
    workloads: Sequence[str],
    batches: Sequence[int],
    strategies: Sequence[str],
    preset: str,
    progress: Callable[[str], None] | None = None,
    micro_batches: int = 4,
    reshard_after_forward: bool = True,
) -> pd.DataFrame:
    """One row per workload x global batch x strategy on 2 local ranks: the model's predicted peak
    memory of one device (``predict(...).memory_bytes``, the heaviest device's) against the memory
    profiler's measured peak of the heaviest rank's tracked step in a fresh 2-rank launch (``dnnperf
    profile --nproc 2 --memory``), with every rank's measured peak (``measured_ranks``). A strategy
    that cannot apply, or a launch that failed, is a row with its ``reason``."""
    import json
    import sys
    import tempfile

    from dnnperf.perfmodel.machine import preset as machine_preset

    # Memory does not depend on the machine's speed: any machine of 2 devices in one node.
    two = dataclasses.replace(machine_preset("a100-ib"), devices_per_node=2, nodes=1)
    rows = []
    for name in workloads:
        for batch in batches:
            for strategy in strategies:
                row: dict[str, Any] = {"workload": name, "batch": batch, "strategy": strategy}
                row.update(measured_bytes=float("nan"), predicted_bytes=float("nan"), error=float("nan"))
                rows.append(row)
                try:
                    made = _predictor(
                        name, two, batch, strategy, preset, micro_batches, reshard_after_forward
                    )()
                except UsageError as error:
                    row["reason"] = str(error)
                    continue
                row["predicted_bytes"] = float(made.memory_bytes)
                argv = [
                    sys.executable,
                    "-m",
                    "dnnperf",
                    "profile",
                    name,
                    "--preset",
                    preset,
                    "-b",
                    str(batch),
                ]
                argv += ["--nproc", "2", "--strategy", strategy, "--microbatches", str(micro_batches)]
                argv += ["--steps", "1", "--warmup", "1", "--memory", "--json"]
                argv += _reshard_argument(strategy, reshard_after_forward)
                with tempfile.TemporaryDirectory(prefix="dnnperf-validate-") as scratch:
                    done = run_child([*argv, "--runs-dir", scratch])
                if done.returncode != 0:
                    row["reason"] = (done.stderr.strip().splitlines() or ["the 2-rank run failed"])[-1]
                    continue
                point = json.loads(done.stdout)["record"]["points"][0]
                peaks = [rank["memory"]["measured_peak"] for rank in point["ranks"]["per_rank"]]
                row["measured_ranks"] = peaks
                row["measured_bytes"] = float(max(peaks))
                row["error"] = row["predicted_bytes"] / row["measured_bytes"] - 1
                if progress is not None:
                    progress(
                        f"{name} {strategy} b{batch}: measured peak {row['measured_bytes'] / 2**20:.2f} MiB "
                        f"(ranks {', '.join(f'{p / 2**20:.2f}' for p in peaks)}), predicted "
                        f"{row['predicted_bytes'] / 2**20:.2f} MiB"
                    )
    return pd.DataFrame(rows)


def memory_summary(frame: pd.DataFrame) -> dict[str, float]:
    """Median and max absolute error of the predicted peak, and how many runs are within 10%."""
    errors = frame["error"].dropna().abs()
    return {
        "runs": len(errors),
        "median_abs_error": float(errors.median()) if len(errors) else float("nan"),
        "max_abs_error": float(errors.max()) if len(errors) else float("nan"),
        "within_10_percent": int((errors <= 0.10).sum()),
    }


def ablation(frame: pd.DataFrame) -> pd.DataFrame:
    """Median and max absolute error per variant."""
    return pd.DataFrame(
        [
            {
                "variant": v,
                "median_abs_error": frame[f"err[{v}]"].abs().median(),
                "max_abs_error": frame[f"err[{v}]"].abs().max(),
            }
            for v in [c.removeprefix("err[").removesuffix("]") for c in frame if c.startswith("err[")]
        ]
    )


def validate_distributed(
    workloads: Sequence[str],
    batches: Sequence[int],
    strategies: Sequence[str],
    preset: str,
    steps: int,
    machine: Machine,
    progress: Callable[[str], None] | None = None,
    micro_batches: int = 4,
    links: Sequence[float | None] | None = None,
    processes: int = 1,
    reshard_after_forward: bool = True,
) -> pd.DataFrame:
    """One row per workload x global batch x strategy on 2 local ranks (gloo, one thread each): the
    median measured step of ``dnnperf profile --nproc 2`` (a fresh launch, as a user runs it) and the
    model's prediction on ``machine`` with 2 devices in one node.

    ``links``: instead of loopback, the ranks in two network namespaces joined by a veth pair, once per
    rate given (Mbit/s; None: unshaped); the model's collectives calibrated over that link first
    (``collective_calibration.shaped_fits``: microbenchmarks, not the runs) and capped at the rate
    (``shaped_link``). Root only (``dnnperf profile --netns``).

    ``processes``: fresh launches per configuration, in rounds over all of them (as
    ``validate_single``): the same 2-rank job launched twice in a row differs by up to 10% on a shared
    host (gpt2 `small` pp: 447-495 ms over five launches), and rounds put a slow spell in one launch
    of several configurations rather than in every launch of one. ``measured_s`` is the median of the
    launches' median steps, ``measured_min_s`` and ``measured_max_s`` their range. Each round predicts
    every configuration again with its own kernel replays (as ``validate_single``; a replay of the
    same convolution varies by up to 2x between processes here) and a row takes the round whose
    predicted step is the median."""
    import sys
    import tempfile

    from dnnperf.perfmodel.collective_calibration import shaped_fits

    calibrated: dict[float | None, dict[str, dict[str, float]]] = {}

    def fits_over(link: float | None) -> dict[str, dict[str, float]]:
        if link not in calibrated:
            if progress is not None:
                progress(f"timing gloo's collectives over the {link_label(link)} link")
            calibrated[link] = shaped_fits(link)
            if progress is not None:
                for op, fit in calibrated[link].items():
                    progress(f"  {op}: alpha {fit['alpha'] * 1e6:.0f} us, {fit['bandwidth'] / 1e6:.2f} MB/s")
        return calibrated[link]

    # Every configuration planned first (each shaped link's collectives timed once), then predicted and
    # run once in each of ``processes`` rounds over all of them.
    planned: list[tuple[dict, Callable[[], Any] | None, list[str]]] = []
    for link in [LOOPBACK] if links is None else links:
        if link == LOOPBACK:
            two = shaped_link(machine, link)
        else:  # the CPU's part of a collective: the veth's own cost, unshaped (same frames, MTU)
            two = shaped_link(machine, link, fits_over(link), cpu_fits=fits_over(None))
        for name in workloads:
            for batch in batches:
                for strategy in strategies:
                    row: dict = {"workload": name, "batch": batch, "strategy": strategy}
                    row["link"] = link_label(link)
                    again = _predictor(
                        name, two, batch, strategy, preset, micro_batches, reshard_after_forward
                    )
                    argv = [sys.executable, "-m", "dnnperf", "profile", name, "--preset", preset]
                    argv += ["-b", str(batch), "--nproc", "2", "--strategy", strategy]
                    argv += ["--steps", str(steps), "--warmup", "3", "--microbatches", str(micro_batches)]
                    argv += ["--runs-dir", "{runs}", "--json"]
                    argv += _reshard_argument(strategy, reshard_after_forward)
                    if link != LOOPBACK:
                        argv += ["--netns"] + ([] if link is None else ["--link-mbit", f"{link:g}"])
                    planned.append((row, again, argv))
    medians: list[list[float]] = [[] for _ in planned]
    predictions: list[list[Any]] = [[] for _ in planned]
    for round_ in range(processes):
        with remeasured():  # this round's own replays, before any of its runs
            for i, ((row, again, _), made) in enumerate(zip(planned, predictions, strict=True)):
                if again is None:
                    continue
                try:
                    made.append(again())
                except UsageError as error:  # a strategy that cannot apply: said, never run
                    row["reason"] = str(error)
                    planned[i] = (row, None, [])
        for (row, again, argv), runs, made in zip(planned, medians, predictions, strict=True):
            if again is None:
                continue
            with tempfile.TemporaryDirectory(prefix="dnnperf-validate-") as scratch:
                done = run_child([scratch if a == "{runs}" else a for a in argv])
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise UsageError(
                    f"{row['workload']} {row['strategy']} batch {row['batch']} ({row['link']}): "
                    f"the 2-rank run failed: {last}"
                )
            runs.append(_median_step(done.stdout))
            if progress is not None:
                progress(
                    f"run {round_ + 1}/{processes}, {row['workload']} {row['strategy']} b{row['batch']} "
                    f"({row['link']}): measured {runs[-1] * 1e3:.1f} ms, "
                    f"predicted {made[-1].step_s * 1e3:.1f} ms"
                )
    rows = []
    for (row, again, _), runs, made in zip(planned, medians, predictions, strict=True):
        if again is not None:
            _measured_row(row, runs, median_prediction(made))
        rows.append(row)
    return pd.DataFrame(rows)


def median_prediction(predictions: Sequence[Any]) -> Any:
    """The prediction whose step is the median of ``predictions`` (the lower of the middle two)."""
    ordered = sorted(predictions, key=lambda p: p.step_s)
    return ordered[(len(ordered) - 1) // 2]


#: ``links`` entry for ranks on loopback, without network namespaces.
LOOPBACK = -1.0


def link_label(link: float | None) -> str:
    if link == LOOPBACK:
        return "loopback"
    return "unshaped veth" if link is None else f"{link:g} Mbit/s"


def shaped_link(
    machine: Machine,
    mbit: float | None,
    fits: dict[str, dict[str, float]] | None = None,
    cpu_fits: dict[str, dict[str, float]] | None = None,
) -> Machine:
    """``machine`` as 2 devices in one node whose link between them carries at most ``mbit`` Mbit/s
    (None or LOOPBACK: as calibrated): every collective's fitted bandwidth, and the intra-node one,
    capped at the shaped rate; latencies as calibrated. ``fits``: the collectives' own fits over that
    link (``shaped_fits``), in place of the machine's. ``cpu_fits``: what each costs the CPU
    (Machine.comm_on_compute_cores; default: the machine's own fits, unshaped)."""
    import dataclasses

    two = dataclasses.replace(machine, devices_per_node=2, nodes=1)
    cpu = {
        op: {"cpu_alpha": fit.get("alpha", 0.0), "cpu_bandwidth": fit["bandwidth"]}
        for op, fit in (cpu_fits or machine.collectives).items()
    }
    merged = {op: {**fit, **cpu.get(op, {})} for op, fit in two.collectives.items()}
    merged.update({op: {**fit, **cpu.get(op, {})} for op, fit in (fits or {}).items()})
    two = dataclasses.replace(two, collectives=merged)
    if mbit is None or mbit == LOOPBACK:
        return two
    rate = mbit * 1e6 / 8
    fits = {op: {**fit, "bandwidth": min(fit["bandwidth"], rate)} for op, fit in two.collectives.items()}
    return dataclasses.replace(
        two,
        intra_bandwidth=min(two.intra_bandwidth, rate),
        link_bandwidth=min(two.link_bandwidth, rate),
        collectives=fits,
    )


def _median_step(stdout: str) -> float:
    """The median step of a child ``dnnperf bench``/``profile --json`` run (NaN when none ran)."""
    import json

    step_s = json.loads(stdout)["record"]["points"][0]["step_s"]
    return float(np.median(step_s)) if step_s else float("nan")


def _measured_row(row: dict, runs: Sequence[float], p: Any) -> None:
    """``row`` with the median of the runs' median steps (and their range) beside the prediction."""
    measured = float(np.median(runs))
    row.update(
        measured_s=measured,
        measured_min_s=min(runs),
        measured_max_s=max(runs),
        predicted_s=p.step_s,
        error=p.step_s / measured - 1,
        compute_s=p.compute_s,
        communication_s=p.communication_s,
        bubble_s=p.bubble_s,
        reason=None,
    )


def ranking_agrees(frame: pd.DataFrame) -> pd.DataFrame:
    """Per workload, batch (and link, where the runs name one): the strategies fastest first, measured
    and predicted, and whether they agree (``agrees``: the whole order). Beside it, the pairs of
    strategies whose launches' ranges (``measured_min_s`` to ``measured_max_s``; one launch: its
    step) do not overlap, ``separated``, and whether the prediction orders every one of them as
    measured, ``agrees_where_separated``: two strategies whose launches overlap are not ordered by
    the measurement, so no prediction can be right or wrong about them."""
    rows = []
    ran = frame[frame["reason"].isna()] if "reason" in frame else frame
    keys = ["workload", "batch", "link"] if "link" in ran else ["workload", "batch"]
    for values, group in ran.groupby(keys, sort=False):
        measured = group.sort_values("measured_s")["strategy"].tolist()
        predicted = group.sort_values("predicted_s")["strategy"].tolist()
        low = group["measured_min_s"] if "measured_min_s" in group else group["measured_s"]
        high = group["measured_max_s"] if "measured_max_s" in group else group["measured_s"]
        spans = list(zip(group["strategy"], low, high, group["predicted_s"], strict=True))
        separated = wrong = 0
        for i, (_, low_a, high_a, predicted_a) in enumerate(spans):
            for _, low_b, high_b, predicted_b in spans[i + 1 :]:
                if high_a < low_b or high_b < low_a:
                    separated += 1
                    wrong += (high_a < low_b) != (predicted_a < predicted_b)
        rows.append(
            {
                **dict(zip(keys, values, strict=True)),
                "measured": " < ".join(measured),
                "predicted": " < ".join(predicted),
                "agrees": measured == predicted,
                "separated": separated,
                "agrees_where_separated": wrong == 0,
            }
        )
    return pd.DataFrame(rows)


def single_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """validate_single's table as ValidationResult rows (the model's variant)."""
    return [
        {
            "workload": r["workload"],
            "batch": int(r["batch"]),
            "strategy": "single",
            "measured_s": float(r["measured_s"]),
            "predicted_s": float(r["pred[model]"]),
        }
        for r in frame.to_dict("records")
        if math.isfinite(r["measured_s"])
    ]


def distributed_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """validate_distributed's runs (those that ran) as ValidationResult rows."""
    ran = frame[frame["reason"].isna()] if "reason" in frame else frame

    def strategy(r: dict[str, Any]) -> str:  # with its link where not loopback: a point per link
        link = r.get("link")
        return r["strategy"] if not isinstance(link, str) or link == "loopback" else f"{r['strategy']} {link}"

    return [
        {
            "workload": r["workload"],
            "batch": int(r["batch"]),
            "strategy": strategy(r),
            "measured_s": float(r["measured_s"]),
            "predicted_s": float(r["predicted_s"]),
        }
        for r in ran.to_dict("records")
    ]


def collective_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """collective_calibration.compare's table as ValidationResult rows."""
    return [
        {
            "op": r["op"],
            "bytes": int(r["bytes"]),
            "measured_s": float(r["median_s"]),
            "predicted_s": float(r["predicted_s"]),
            "held_out": bool(r["held_out"]),
        }
        for r in table.to_dict("records")
        if math.isfinite(r["predicted_s"])  # an operation the fit could not describe
    ]


def memory_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """validate_memory's table (the configurations that ran) as ValidationResult rows."""
    rows = []
    for r in frame.to_dict("records"):
        if not (isinstance(r["measured_bytes"], float) and math.isfinite(r["measured_bytes"])):
            continue
        row = {
            "workload": r["workload"],
            "batch": int(r["batch"]),
            "measured_bytes": float(r["measured_bytes"]),
            "predicted_bytes": float(r["predicted_bytes"]),
            "measured_phase": r["measured_phase"],
            "predicted_phase": r["predicted_phase"],
        }
        row.update({k: float(v) for k, v in r.items() if k.startswith(("measured[", "predicted["))})
        rows.append(row)
    return rows


def calibrated_machine(
    device: str,
    collectives: Sequence[str] = OPERATIONS,
    fsdp: bool = True,
    progress: Callable[[str, float], None] | None = None,
) -> Machine:
    """This host's ``device`` as `dnnperf hw` profiled it, with the model's own calibrations (measured
    once each and cached). A GPU's takes its per-call host overhead and its kernels' floor measured on
    the GPU, and none of the CPU host's own costs (page faults, zero operands, DDP, FSDP, split regions).
    The link between devices is calibrated for ``collectives`` (2-rank runs of each operation with
    allreduce, ~2-3 s each on a 2-core host; predict.COLLECTIVES says which a strategy needs; none: no
    link), FSDP's host work where ``fsdp`` (~10 s); the machine refuses to predict with what was
    skipped (its ``sources`` say "not calibrated"). ``progress`` hears what is being measured and the
    fraction done."""
    from dnnperf import hardware
    from dnnperf.devices import resolve_device
    from dnnperf.perfmodel import machine as machines
    from dnnperf.perfmodel.calibrate import (
        calibrated,
        cold_product_cost,
        ddp_cost,
        dispatch_net_of_views,
        fsdp_cost,
        gap_call_cost,
        inner_call_cost,
        op_overhead,
        page_fault_cost,
        phase_call_cost,
        product_rows_efficiency,
        split_region_cost,
        update_step_cost,
        zero_operand_cost,
    )

    def step(what: str, fraction: float) -> None:
        if progress is not None:
            progress(f"calibrating {what} (cached afterwards)", fraction)

    resolved = resolve_device(device)
    profile = hardware.load_profile(resolved)
    if profile is None:
        raise UsageError(
            f"no calibrated profile of this host's {resolved.type} (--machine hw, or machine=None in "
            f"Python, predicts with it): run `dnnperf hw --device {resolved.type}` first"
        )
    base = machines.from_profile(profile)
    if profile.device_type == "cuda":
        device = gpu_of_this_host(profile)
        step("the layer zoo", 0.0)
        zoo = calibrated(base)
        step("the per-call overhead", 0.9)
        return machines.from_profile(
            profile,
            op_overhead_s=dispatch_net_of_views(op_overhead(device=device), zoo.host_call_s, device),
            efficiency=zoo.efficiency,
            call_s=zoo.call_s,
            kernel_s=zoo.kernel_s,
            host_call_s=zoo.host_call_s,
        )
    from dnnperf.perfmodel.collective_calibration import link_calibration

    step("the layer zoo", 0.0)
    zoo = calibrated(base)
    step("the optimizer update", 0.3)
    update_step_s, update_call, update_share = update_step_cost(
        machines.from_profile(profile, efficiency=zoo.efficiency, call_s=zoo.call_s)
    )
    step("host costs: per call, inside compiled calls, page faults, zero operands, products", 0.4)
    costs = {
        "op_overhead_s": op_overhead(),
        "page_fault_s": page_fault_cost(),
        "phase_call_s": {**phase_call_cost(), "update": update_call},
        "zero_operand_s": zero_operand_cost(),
        "split_region_s": split_region_cost(),
        "ddp_s": ddp_cost(),
        "cold_product_s": cold_product_cost(),
        "product_rows_efficiency": product_rows_efficiency(),
        "inner_call_s": inner_call_cost(),
        "gap_call_s": gap_call_cost(),
    }
    skipped = {}
    if fsdp:
        step("FSDP's host work on 2 ranks", 0.5)
        costs["fsdp_s"] = fsdp_cost()
    else:
        skipped["fsdp"] = NOT_CALIBRATED
    found = None
    asked = operations(["allreduce", *operations(collectives)]) if collectives else []
    if asked:
        step(f"the gloo link on 2 ranks ({', '.join(asked)})", 0.7)
        found = link_calibration(asked)
    else:
        skipped["link"] = NOT_CALIBRATED
    machine = machines.from_profile(
        profile,
        link=found,
        efficiency=zoo.efficiency,
        call_s=zoo.call_s,
        update_byte_share=update_share,
        update_step_s=update_step_s,
        zoo_ops=zoo.ops,
        **costs,
    )
    return dataclasses.replace(machine, sources={**machine.sources, **skipped})
