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
from dnnperf.perfmodel.validate import ablation, calibrated_machines, validate_single

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


def run(
    workloads: tuple[str, ...],
    batches: tuple[int, ...],
    preset: str,
    steps: int,
    profile_path: str | None,
    processes: int = 3,
) -> pd.DataFrame:
    profile = read_profile(profile_path) if profile_path else load_profile("cpu")
    if profile is None:
        sys.exit("no hardware profile: run `dnnperf hw` first")
    machines, figures = calibrated_machines(profile)
    model = machines["model"]
    print(
        f"calibration: {figures}; efficiencies {model.efficiency}; fixed cost per call {model.call_s}",
        file=sys.stderr,
    )
    return validate_single(
        workloads, batches, preset, steps, machines, lambda m: print(m, file=sys.stderr), processes
    )


def markdown(frame: pd.DataFrame) -> str:
    lines = [
        "| workload | batch | measured ms | runs' medians ms | predicted ms | error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in frame.itertuples(index=False):
        d = r._asdict()
        lines.append(
            f"| {d['workload']} | {d['batch']} | {d['measured_s'] * 1e3:.2f} | "
            f"{d['measured_min_s'] * 1e3:.2f}-{d['measured_max_s'] * 1e3:.2f} | "
            f"{d['pred_max_overhead'] * 1e3:.2f} | {d['err_max_overhead']:+.1%} |"
        )
    return "\n".join(lines)


def ablation_markdown(frame: pd.DataFrame) -> str:
    lines = ["| variant | median abs error | max abs error |", "|---|---:|---:|"]
    for r in ablation(frame).itertuples(index=False):
        lines.append(f"| {r.variant} | {r.median_abs_error:.1%} | {r.max_abs_error:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--processes", type=int, default=3, help="fresh runs per configuration (3)")
    parser.add_argument("--json")
    parser.add_argument("--profile", help="hardware profile JSON (default: this machine's cached one)")
    args = parser.parse_args()
    frame = run(
        tuple(args.workloads.split(",")),
        tuple(int(b) for b in args.batches.split(",")),
        args.preset,
        args.steps,
        args.profile,
        args.processes,
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
    print(ablation_markdown(frame))


if __name__ == "__main__":
    main()
