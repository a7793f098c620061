"""Single-process validation of the performance model: predict, then run the same configurations.

Calibration is ``dnnperf hw``'s microbenchmarks only (the cached profile of this machine; run
``dnnperf hw`` first); the runs being predicted never feed the model. For each workload x batch size:
the predicted step (and its ablation variants), the measured median step of ``runner.bench``, and the
error. Prints a Markdown table for docs/validation.md; ``--json PATH`` keeps the raw numbers.

    .venv/bin/python benchmarks/model_validation.py [--preset small] [--steps 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import platform
import sys
from datetime import datetime, timezone

import pandas as pd
import torch

from dnnperf import environment
from dnnperf.hardware import load_profile, read_profile
from dnnperf.model.calibrate import measure_op_overhead, zoo_calibration
from dnnperf.model.compute import ComputeOptions, step_time
from dnnperf.model.graph import describe_workload
from dnnperf.model.machine import from_profile
from dnnperf.runner import BenchSettings, bench

WORKLOADS = (
    "basic_cnn",
    "alexnet",
    "vgg16",
    "resnet18",
    "resnet50",
    "inception_v3",
    "transformer",
    "gpt2",
    "seq2seq",
    "wgan_gp",
    "neumf",
)
BATCHES = (4, 8, 16)
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


def run(
    workloads: tuple[str, ...], batches: tuple[int, ...], preset: str, steps: int, profile_path: str | None
) -> pd.DataFrame:
    profile = read_profile(profile_path) if profile_path else load_profile("cpu")
    if profile is None:
        sys.exit("no hardware profile: run `dnnperf hw` first")
    if profile.threads != torch.get_num_threads():
        sys.exit(f"profile calibrated with {profile.threads} threads, this run has {torch.get_num_threads()}")
    overhead = measure_op_overhead()
    print(
        f"op overhead (microbenchmark): {overhead * 1e6:.2f} us per call; hw dispatch: "
        f"{profile.dispatch_overhead_us:.2f} us",
        file=sys.stderr,
    )
    efficiency, curves = zoo_calibration(from_profile(profile))
    print(f"layer zoo: efficiencies {efficiency}, curves {sorted(curves)}", file=sys.stderr)
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
    rows = []
    for name in workloads:
        for batch in batches:
            graph = describe_workload(name, preset, batch)
            predicted = {v: step_time(graph, machines[v], o).total_s for v, o in VARIANTS.items()}
            record = bench(
                BenchSettings(
                    workload=name, preset=preset, batch_sizes=(batch,), steps=steps, warmup=3, device="cpu"
                )
            )
            point = record.points[0]
            measured = point.step_time.median if point.step_s else float("nan")
            row = {
                "workload": name,
                "batch": batch,
                "measured_s": measured,
                "calls": graph.ops["calls"].sum(),
            }
            for variant, seconds in predicted.items():
                row[f"pred[{variant}]"] = seconds
                row[f"err[{variant}]"] = seconds / measured - 1
            rows.append(row)
            print(
                f"{name} b{batch}: measured {measured * 1e3:.2f} ms, predicted "
                f"{predicted['model'] * 1e3:.2f} ms",
                file=sys.stderr,
            )
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| workload | batch | measured ms | predicted ms | error |", "|---|---:|---:|---:|---:|"]
    for r in frame.itertuples(index=False):
        d = r._asdict()
        lines.append(
            f"| {d['workload']} | {d['batch']} | {d['measured_s'] * 1e3:.2f} | "
            f"{d['pred_max_overhead'] * 1e3:.2f} | {d['err_max_overhead']:+.1%} |"
        )
    return "\n".join(lines)


def ablation(frame: pd.DataFrame) -> str:
    lines = ["| variant | median abs error | max abs error |", "|---|---:|---:|"]
    for variant in VARIANTS:
        errors = frame[f"err[{variant}]"].abs()
        lines.append(f"| {variant} | {errors.median():.1%} | {errors.max():.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--json")
    parser.add_argument("--profile", help="hardware profile JSON (default: this machine's cached one)")
    args = parser.parse_args()
    frame = run(
        tuple(args.workloads.split(",")),
        tuple(int(b) for b in args.batches.split(",")),
        args.preset,
        args.steps,
        args.profile,
    )
    if args.json:
        frame.to_json(args.json, orient="records", indent=1)
    shown = frame.rename(columns={"pred[model]": "pred_max_overhead", "err[model]": "err_max_overhead"})
    print(
        f"machine: {environment.cpu_model()} ({platform.machine()}), {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n"
    )
    print(markdown(shown))
    print()
    print(ablation(frame))


if __name__ == "__main__":
    main()
