"""``dnnperf validate``: predict each configuration, run it for real, and tabulate the errors.

Calibration comes from microbenchmarks only (``dnnperf hw``'s profile at this thread count, the
per-call overhead of :mod:`~dnnperf.model.calibrate`, its layer zoo), measured before any run; the
runs being predicted never feed the model. Besides the model, its ablation variants are predicted
for the same runs (docs/validation.md). Single process only for now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from dnnperf.errors import UsageError
from dnnperf.hardware import HardwareProfile
from dnnperf.model.calibrate import measure_op_overhead, zoo_calibration
from dnnperf.model.compute import ComputeOptions, step_time
from dnnperf.model.graph import describe_workload
from dnnperf.model.machine import Machine, from_profile

#: The model (first) and its ablation: roofline max or sum; per-call overhead from the training-step
#: microbenchmark, hw's bare dispatch, or none; per-family efficiencies from the layer zoo against
#: hw's curves, none, or the zoo's own convolution/matmul curves.
VARIANTS = {
    "model": ComputeOptions("max", True),
    "sum": ComputeOptions("sum", True),
    "hw dispatch": ComputeOptions("max", True),
    "no overhead": ComputeOptions("max", False),
    "no efficiency": ComputeOptions("max", True),
    "zoo curves": ComputeOptions("max", True),
}
ZOO_CURVE_FAMILIES = ("convolution", "matmul")


def calibrated_machines(profile: HardwareProfile) -> tuple[dict[str, Machine], dict[str, float]]:
    """One machine per variant, from fresh microbenchmarks; and the calibration's headline figures."""
    if profile.threads != torch.get_num_threads():
        raise UsageError(
            f"the hardware profile was calibrated with {profile.threads} threads and this process has "
            f"{torch.get_num_threads()}: run `dnnperf hw` with the same OMP_NUM_THREADS"
        )
    overhead = measure_op_overhead()
    efficiency, curves = zoo_calibration(from_profile(profile))
    gemm_free = {k: v for k, v in efficiency.items() if k.split("/")[0] not in ZOO_CURVE_FAMILIES}
    machines = {
        v: from_profile(
            profile,
            op_overhead_s=None if v == "hw dispatch" else overhead,
            efficiency={} if v == "no efficiency" else gemm_free if v == "zoo curves" else efficiency,
            zoo_curves=curves if v == "zoo curves" else None,
        )
        for v in VARIANTS
    }
    return machines, {"op_overhead_s": overhead, "dispatch_s": profile.dispatch_overhead_us * 1e-6}


def validate_single(
    workloads: Sequence[str],
    batches: Sequence[int],
    preset: str,
    steps: int,
    machines: dict[str, Machine],
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per workload x batch: measured median step, each variant's prediction and error."""
    from dnnperf.runner import BenchSettings, bench

    rows = []
    for name in workloads:
        for batch in batches:
            graph = describe_workload(name, preset, batch)
            predicted = {v: step_time(graph, machines[v], o).total_s for v, o in VARIANTS.items()}
            settings = BenchSettings(name, preset, (batch,), steps=steps, warmup=3, device="cpu")
            point = bench(settings).points[0]
            measured = point.step_time.median if point.step_s else float("nan")
            row = {"workload": name, "batch": batch, "measured_s": measured}
            for variant, seconds in predicted.items():
                row[f"pred[{variant}]"] = seconds
                row[f"err[{variant}]"] = seconds / measured - 1
            rows.append(row)
            if progress is not None:
                model_ms = predicted["model"] * 1e3
                progress(f"{name} b{batch}: measured {measured * 1e3:.2f} ms, predicted {model_ms:.2f} ms")
    return pd.DataFrame(rows)


def ablation(frame: pd.DataFrame) -> pd.DataFrame:
    """Median and max absolute error per variant."""
    return pd.DataFrame(
        [
            {
                "variant": v,
                "median_abs_error": frame[f"err[{v}]"].abs().median(),
                "max_abs_error": frame[f"err[{v}]"].abs().max(),
            }
            for v in VARIANTS
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
) -> pd.DataFrame:
    """One row per workload x global batch x strategy on 2 local ranks (gloo, one thread each): the
    median measured step of ``dnnperf profile --nproc 2`` (a fresh launch, as a user runs it) and the
    model's prediction on ``machine`` with 2 devices in one node."""
    import dataclasses
    import json
    import subprocess
    import sys
    import tempfile

    from dnnperf.model.predict import predict

    two = dataclasses.replace(machine, devices_per_node=2, nodes=1)
    rows = []
    for name in workloads:
        for batch in batches:
            for strategy in strategies:
                row: dict = {"workload": name, "batch": batch, "strategy": strategy}
                try:
                    p = predict(name, two, batch, strategy, preset=preset, micro_batches=micro_batches)
                except UsageError as error:
                    row["reason"] = str(error)
                    rows.append(row)
                    continue
                with tempfile.TemporaryDirectory(prefix="dnnperf-validate-") as runs:
                    argv = [sys.executable, "-m", "dnnperf", "profile", name, "--preset", preset]
                    argv += ["-b", str(batch), "--nproc", "2", "--strategy", strategy, "--steps", str(steps)]
                    argv += [
                        "--warmup",
                        "3",
                        "--microbatches",
                        str(micro_batches),
                        "--runs-dir",
                        runs,
                        "--json",
                    ]
                    done = subprocess.run(argv, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                    raise UsageError(f"{name} {strategy} batch {batch}: the 2-rank run failed: {last}")
                step_s = json.loads(done.stdout)["record"]["points"][0]["step_s"]
                measured = float(np.median(step_s))
                row.update(
                    measured_s=measured,
                    predicted_s=p.step_s,
                    error=p.step_s / measured - 1,
                    compute_s=p.compute_s,
                    communication_s=p.communication_s,
                    bubble_s=p.bubble_s,
                    reason=None,
                )
                rows.append(row)
                if progress is not None:
                    progress(
                        f"{name} {strategy} b{batch}: measured {measured * 1e3:.1f} ms, "
                        f"predicted {p.step_s * 1e3:.1f} ms"
                    )
    return pd.DataFrame(rows)


def ranking_agrees(frame: pd.DataFrame) -> pd.DataFrame:
    """Per workload and batch: the strategies fastest first, measured and predicted, and whether they
    agree."""
    rows = []
    ran = frame[frame["reason"].isna()] if "reason" in frame else frame
    for (name, batch), group in ran.groupby(["workload", "batch"], sort=False):
        measured = group.sort_values("measured_s")["strategy"].tolist()
        predicted = group.sort_values("predicted_s")["strategy"].tolist()
        rows.append(
            {
                "workload": name,
                "batch": batch,
                "measured": " < ".join(measured),
                "predicted": " < ".join(predicted),
                "agrees": measured == predicted,
            }
        )
    return pd.DataFrame(rows)


@dataclass
class ValidationResult:
    """``dnnperf validate`` as a record section: every run and collective, measured beside predicted."""

    #: workload, batch, strategy ("single" for one process), measured_s, predicted_s
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: op, bytes, measured_s (median of the slowest rank), predicted_s, held_out (the fit never saw it)
    collectives: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "collectives": self.collectives}

    @classmethod
    def from_dict(cls, data: Any) -> ValidationResult:
        """Validated: ValueError or TypeError says what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        for part, keys in (("runs", ("workload", "strategy")), ("collectives", ("op",))):
            rows = data.get(part, [])
            if not isinstance(rows, list):
                raise ValueError(f"{part} must be a list")
            for i, row in enumerate(rows):
                if not isinstance(row, dict) or any(not isinstance(row.get(k), str) for k in keys):
                    raise ValueError(f"{part}[{i}] lacks {', '.join(keys)}")
                for key in ("measured_s", "predicted_s"):
                    value = row.get(key)
                    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                        raise ValueError(f"{part}[{i}].{key} must be a positive number, got {value!r}")
        return cls(runs=list(data.get("runs", [])), collectives=list(data.get("collectives", [])))


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
    return [
        {
            "workload": r["workload"],
            "batch": int(r["batch"]),
            "strategy": r["strategy"],
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
