"""``dnnperf predict WORKLOAD``: the CLI side of the performance model (docs/performance-model.md).

One configuration (every applicable strategy when there is more than one device) or, with
``--sweep axis=v1,v2,...`` (repeatable), a what-if table over the combinations. ``--machine``: ``hw``
(this machine as ``dnnperf hw`` calibrated it, with the per-call overhead microbenchmark), a preset
name, or a JSON file describing a machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnperf.errors import UsageError
from dnnperf.model.machine import AXES, PRESETS, Machine


def add_arguments(parser: argparse.ArgumentParser, positive_int: Callable[[str], int]) -> None:
    parser.add_argument("workload", help="a workload of the suite (see `dnnperf list`)")
    parser.add_argument("--preset", default="small", help="tiny, small or full (default: small)")
    parser.add_argument("-b", "--batch-size", type=positive_int, help="global batch (default: the preset's)")
    parser.add_argument(
        "--machine", default="hw", help=f"hw (calibrated), a JSON file, or one of {', '.join(PRESETS)} (hw)"
    )
    parser.add_argument("--nodes", type=positive_int, help="nodes (default: the machine's, 1 for presets)")
    parser.add_argument(
        "--devices-per-node", type=positive_int, help="devices per node (default: the machine's)"
    )
    parser.add_argument(
        "--strategy",
        default="auto",
        choices=("auto", "single", "dp", "pp", "tp"),
        help="auto: single on one device, else dp, pp and tp side by side",
    )
    parser.add_argument(
        "--micro-batches", type=positive_int, help="pipeline micro-batches (default: up to 4 per stage)"
    )
    parser.add_argument(
        "--schedule", default="1f1b", choices=("gpipe", "1f1b"), help="pipeline schedule (1f1b)"
    )
    parser.add_argument(
        "--algorithm",
        default="ring",
        choices=("ring", "rabenseifner", "recursive_doubling", "tree"),
        help="allreduce algorithm (ring)",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="AXIS=V1,V2,...",
        help=f"what-if axis (repeatable): batch_size or {', '.join(AXES)}",
    )


def parse_sweep(items: list[str]) -> dict[str, list[float]]:
    """``["nodes=1,2,4", "link_gbps=10,100"]`` -> {"nodes": [1, 2, 4], "link_gbps": [10.0, 100.0]}."""
    axes: dict[str, list[float]] = {}
    for item in items:
        axis, sep, values = item.partition("=")
        if not sep or not values:
            raise UsageError(f"--sweep expects AXIS=V1,V2,..., got {item!r}")
        if axis != "batch_size" and axis not in AXES:
            raise UsageError(f"unknown sweep axis {axis!r}: use batch_size or one of {', '.join(AXES)}")
        try:
            numbers = [float(v) for v in values.split(",")]
        except ValueError:
            raise UsageError(f"--sweep {axis}: values must be numbers, got {values!r}") from None
        if any(not v > 0 for v in numbers):
            raise UsageError(f"--sweep {axis}: values must be positive, got {values!r}")
        if axis in ("batch_size", "nodes", "devices_per_node") and any(v != int(v) for v in numbers):
            raise UsageError(f"--sweep {axis}: values must be integers, got {values!r}")
        axes[axis] = [int(v) if axis in ("batch_size", "nodes", "devices_per_node") else v for v in numbers]
    return axes


def load_machine(spec: str) -> Machine:
    """``hw``, a preset name, or a JSON file."""
    from dnnperf.model import machine as machines

    if spec == "hw":
        from dnnperf import hardware
        from dnnperf.model.calibrate import calibrated, op_overhead

        profile = hardware.load_profile("cpu")
        if profile is None:
            raise UsageError("--machine hw needs a calibrated profile: run `dnnperf hw` first")
        efficiency, _ = calibrated(machines.from_profile(profile))
        return machines.from_profile(profile, op_overhead_s=op_overhead(), efficiency=efficiency)
    if spec in PRESETS:
        return machines.preset(spec)
    path = Path(spec)
    if not path.exists():
        raise UsageError(f"--machine {spec!r} is not hw, a preset ({', '.join(PRESETS)}) or an existing file")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UsageError(f"--machine {spec}: not readable JSON ({error})") from None
    return machines.from_dict(document)


def run(args: argparse.Namespace, out: Any) -> int:
    from dnnperf.model.predict import best_strategy, predict, sweep
    from dnnperf.report.terminal import prediction_table, sweep_table
    from dnnperf.workloads import get_workload

    axes = parse_sweep(args.sweep)
    workload = get_workload(args.workload)
    if args.preset not in workload.presets:
        raise UsageError(
            f"{workload.name} has no preset {args.preset!r} (presets: {', '.join(workload.presets)})"
        )
    machine = load_machine(args.machine)
    changes = {k: v for k, v in (("nodes", args.nodes), ("devices_per_node", args.devices_per_node)) if v}
    machine = dataclasses.replace(machine, **changes)
    batch = args.batch_size or workload.default_batch_size[args.preset]
    options = {
        "preset": args.preset,
        "micro_batches": args.micro_batches,
        "schedule": args.schedule,
        "algorithm": args.algorithm,
    }
    if args.strategy != "auto":
        chosen: tuple[str, ...] = (args.strategy,)
    else:
        chosen = ("single",) if machine.devices == 1 and not axes else ("dp", "pp", "tp")
    if axes:
        frame = sweep(workload.name, machine, batch, axes, strategies_=chosen, **options)
        if args.json:
            out.json(
                {
                    "workload": workload.name,
                    "machine": machine.name,
                    "batch_size": batch,
                    "rows": frame.to_dict(orient="records"),
                }
            )
        else:
            out.print(sweep_table(frame, list(axes), f"{workload.name}/{args.preset} on {machine.name}"))
        return 0
    predictions, refused = [], {}
    for strategy in chosen:
        try:
            predictions.append(predict(workload.name, machine, batch, strategy, **options))
        except UsageError as error:
            if len(chosen) == 1:
                raise
            refused[strategy] = str(error)
    best = best_strategy(predictions)
    if args.json:
        out.json(
            {
                "predictions": [p.to_dict() for p in predictions],
                "refused": refused,
                "best": best.strategy if best else None,
            }
        )
    else:
        out.print(prediction_table(predictions, refused, best))
    return 0
