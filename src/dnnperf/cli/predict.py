"""``dnnperf predict WORKLOAD`` and ``dnnperf validate``: the command line of the performance model
(docs/performance-model.md, docs/validation.md).

One configuration (every applicable strategy when there is more than one device) or, with
``--sweep axis=v1,v2,...`` (repeatable), a what-if table over the combinations. ``--machine``: ``hw``
(this machine as ``dnnperf hw`` calibrated it, with the per-call overhead microbenchmark), a preset
name, or a JSON file describing a machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dnnperf.cli.options import common, positive_int, preset_and_batch
from dnnperf.cli.output import Output
from dnnperf.errors import UsageError
from dnnperf.paths import path_argument
from dnnperf.perfmodel.machine import AXES, PRESETS, Machine


def add_parsers(commands: Any) -> None:
    predict = commands.add_parser(
        "predict", help="predict step time, throughput and memory: one device, dp, pp, tp; what-if sweeps"
    )
    add_arguments(predict)
    common(predict, runs=True)
    predict.set_defaults(handler=run)

    validate = commands.add_parser(
        "validate", help="predict single-process steps, run them for real, and print the errors"
    )
    add_validate_arguments(validate)
    common(validate, runs=True)
    validate.set_defaults(handler=run_validate)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="a workload of the suite (see `dnnperf list`)")
    preset_and_batch(parser, preset="small", batch="global batch")
    parser.add_argument(
        "--machine", default="hw", help=f"hw (calibrated), a JSON file, or one of {', '.join(PRESETS)} (hw)"
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="with --machine hw: the device whose `dnnperf hw` profile to calibrate from (auto, cpu, cuda, "
        "cuda:N; auto)",
    )
    parser.add_argument("--nodes", type=positive_int, help="nodes (default: the machine's, 1 for presets)")
    parser.add_argument(
        "--devices-per-node", type=positive_int, help="devices per node (default: the machine's)"
    )
    parser.add_argument(
        "--strategy",
        default="auto",
        type=_strategy_list,
        metavar="auto|STRATEGY[,STRATEGY...]",
        help=(
            "single, dp, fsdp, zero1, zero2, pp or tp, several side by side with commas "
            "(auto: single on one device, else dp,pp,tp)"
        ),
    )
    parser.add_argument(
        "--micro-batches", type=positive_int, help="pipeline micro-batches (default: up to 4 per stage)"
    )
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), help="pipeline schedule (1f1b)")
    parser.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        help="fsdp: each block's parameters freed after its forward and gathered again for backward (yes)",
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
    parser.add_argument(
        "--no-report",
        action="store_true",
        help="a sweep: no HTML report (throughput along each axis, crossovers) beside its record",
    )


def _strategy_list(text: str) -> str:
    """``auto`` or strategies of the performance model separated by commas (checked here)."""
    from dnnperf.perfmodel.predict import STRATEGIES

    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in STRATEGIES]
    if text != "auto" and (unknown or not names):
        raise argparse.ArgumentTypeError(
            f"unknown strategy {', '.join(unknown) or text!r}: use auto or {', '.join(STRATEGIES)}"
        )
    return text


def parse_sweep(items: list[str]) -> dict[str, list[float]]:
    """``["nodes=1,2,4", "link_gbps=10,100"]`` -> {"nodes": [1, 2, 4], "link_gbps": [10.0, 100.0]}."""
    axes: dict[str, list[float]] = {}
    for item in items:
        axis, sep, values = item.partition("=")
        if not sep or not values:
            raise UsageError(f"--sweep expects AXIS=V1,V2,..., got {item!r}")
        if axis != "batch_size" and axis not in AXES:
            raise UsageError(f"unknown sweep axis {axis!r}: use batch_size or one of {', '.join(AXES)}")
        if axis in axes:  # the second would silently replace the first
            raise UsageError(f"--sweep {axis} is given twice: give all its values in one, {axis}=V1,V2,...")
        try:
            numbers = [float(v) for v in values.split(",")]
        except ValueError:
            raise UsageError(f"--sweep {axis}: values must be numbers, got {values!r}") from None
        if any(not v > 0 for v in numbers):
            raise UsageError(f"--sweep {axis}: values must be positive, got {values!r}")
        if axis in ("batch_size", "nodes", "devices_per_node") and any(v != int(v) for v in numbers):
            raise UsageError(f"--sweep {axis}: values must be integers, got {values!r}")
        if len(set(numbers)) < len(numbers):
            raise UsageError(f"--sweep {axis}: a value is repeated in {values!r}")
        axes[axis] = [int(v) if axis in ("batch_size", "nodes", "devices_per_node") else v for v in numbers]
    return axes


def warn_if_drifted(profile: Any, machine: Any, device: str, out: Output) -> None:
    """Say so when ``device``'s speed now is far from the speed ``profile`` recorded (a shared host
    runs faster or slower by the hour): the predictions of ``machine``, calibrated from it, follow
    the profile."""
    from dnnperf.calibration.speed import PROBE_SIDE, drift_warning
    from dnnperf.hardware import matmul_flops

    curve = machine.compute_curves.get("matmul")
    if curve is not None:
        profiled = float(curve(matmul_flops(PROBE_SIDE, PROBE_SIDE, PROBE_SIDE)))
        text = drift_warning(profiled, device, profile.created)
        if text:
            out.warn(text)


def warn_if_busy(profile: Any, out: Output) -> None:
    """Say so when ``profile`` (a HardwareProfile) was calibrated beside other work: its figures, and
    the predictions made from them, then run low."""
    from dnnperf import hardware

    busy = hardware.busy_reason(profile)
    if busy:
        out.warn(f"hardware profile of {profile.device_name}: {busy}")


def load_machine(
    spec: str,
    device: str = "cpu",
    strategies: Sequence[str] | None = None,
    several: bool = True,
    progress: Callable[[str, float], None] | None = None,
) -> Machine:
    """``hw`` (``device`` as `dnnperf hw` profiled it; calibrated for ``strategies``: the collectives
    they time where there are ``several`` devices, and FSDP's host work where fsdp is one of them;
    None: every strategy), a preset name, or a JSON file."""
    from dnnperf.perfmodel import machine as machines

    if spec == "hw":
        from dnnperf.perfmodel.predict import COLLECTIVES, STRATEGIES
        from dnnperf.perfmodel.validate import calibrated_machine

        strategies = STRATEGIES if strategies is None else strategies
        unknown = sorted(set(strategies) - set(STRATEGIES))
        if unknown:
            raise UsageError(f"unknown strategy {', '.join(unknown)}: use {', '.join(STRATEGIES)}")
        needed = [op for s in strategies for op in COLLECTIVES[s]]
        return calibrated_machine(
            device,
            collectives=("allreduce", *needed) if several else (),
            fsdp="fsdp" in strategies,
            progress=progress,
        )
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


def chosen_strategies(strategy: str, devices: int, axes: dict[str, list[float]]) -> tuple[str, ...]:
    """The strategies ``--strategy`` names; auto: single on one device, else dp, pp and tp."""
    if strategy != "auto":
        return tuple(dict.fromkeys(n.strip() for n in strategy.split(",")))
    return ("single",) if devices == 1 and not axes else ("dp", "pp", "tp")


def run(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.perfmodel.predict import best_strategy, predict, sweep
    from dnnperf.perfmodel.whatif import crossovers
    from dnnperf.report.terminal import crossover_table, prediction_table, sweep_table
    from dnnperf.workloads import get_workload

    axes = parse_sweep(args.sweep)
    workload = get_workload(args.workload)
    if args.preset not in workload.presets:
        raise UsageError(
            f"{workload.name} has no preset {args.preset!r} (presets: {', '.join(workload.presets)})"
        )
    from dnnperf.devices import resolve_device

    resolve_device(args.device)  # a device that is not there is an error, whichever machine is asked for
    calibrating = "calibrating the model's costs on this machine (cached afterwards)"
    devices = (args.nodes or 1) * (args.devices_per_node or 1)
    several = devices > 1 or bool({"nodes", "devices_per_node"} & set(axes))
    with out.progress_fraction(
        calibrating if args.machine == "hw" else f"loading machine {args.machine}"
    ) as progress:
        machine = load_machine(
            args.machine,
            args.device,
            strategies=chosen_strategies(args.strategy, devices, axes),
            several=several,
            progress=progress,
        )
    if args.machine == "hw":
        from dnnperf import hardware

        profile = hardware.load_profile(resolve_device(args.device))
        if profile is not None:
            warn_if_busy(profile, out)
            warn_if_drifted(profile, machine, str(resolve_device(args.device)), out)
    changes = {k: v for k, v in (("nodes", args.nodes), ("devices_per_node", args.devices_per_node)) if v}
    machine = dataclasses.replace(machine, **changes)
    several = machine.devices > 1 or {"nodes", "devices_per_node"} & set(axes)
    if machine.asynchronous and machine.sources.get("link") == "default" and several:
        raise UsageError(
            "--machine hw on a GPU has measured no link between devices: predict several devices on a "
            "preset or a described machine (a JSON file)"
        )
    batch = workload.batch_size(args.preset, args.batch_size)
    options = {
        "preset": args.preset,
        "micro_batches": args.micro_batches,
        "schedule": args.schedule or "1f1b",
        "algorithm": args.algorithm,
        "reshard_after_forward": args.reshard_after_forward is not False,
    }
    chosen = chosen_strategies(args.strategy, machine.devices, axes)
    if "pp" not in chosen and (args.micro_batches is not None or args.schedule is not None):
        raise UsageError(f"--micro-batches and --schedule are pp's: the strategies are {', '.join(chosen)}")
    if "fsdp" not in chosen and args.reshard_after_forward is not None:
        raise UsageError(f"--reshard-after-forward is fsdp's: the strategies are {', '.join(chosen)}")
    if axes:
        with out.progress_fraction("predicting") as update:
            frame = sweep(workload.name, machine, batch, axes, strategies_=chosen, progress=update, **options)
        record_path, report_path = save_sweep(args, workload, machine.name, batch, axes, chosen, frame)
        if args.json:
            out.json(
                {
                    "workload": workload.name,
                    "machine": machine.name,
                    "batch_size": batch,
                    "rows": frame.to_dict(orient="records"),
                    "crossovers": crossovers(frame, list(axes)).to_dict(orient="records"),
                    "record_path": str(record_path),
                    "report_path": str(report_path) if report_path else None,
                }
            )
        else:
            out.print(sweep_table(frame, list(axes), f"{workload.name}/{args.preset} on {machine.name}"))
            out.print(crossover_table(crossovers(frame, list(axes))))
            out.print(f"record: {record_path}")
            if report_path is not None:
                out.print(f"report: {report_path}")
        return 0
    predictions, refused = [], {}
    with out.progress_fraction("predicting") as update:
        for done, strategy in enumerate(chosen):
            faults = ", its page faults in fresh processes" if machine.page_fault_s > 0 else ""
            what = f"{strategy}: describing {workload.name} at batch {batch}{faults} (cached afterwards)"
            update(what, done / len(chosen))
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
    if predictions:  # every strategy's description is the same model's: the first one's counts
        from dnnperf.perfmodel.subnormals import warnings_of

        for text in warnings_of(predictions[0].detail):
            out.warn(text)
    return 0


def save_sweep(
    args: argparse.Namespace,
    workload: Any,
    machine: str,
    batch: int,
    axes: dict[str, list[float]],
    strategies: tuple[str, ...],
    frame: Any,
) -> tuple[Path, Path | None]:
    """The sweep as a record of kind ``predict`` (its ``prediction`` section) and, unless
    ``--no-report``, its HTML report beside it."""
    from dnnperf.report.html import default_path, write_report
    from dnnperf.results.prediction import SweepResult
    from dnnperf.results.record import RunRecord, json_safe, utc_now
    from dnnperf.results.settings import PredictSettings
    from dnnperf.results.store import RunStore
    from dnnperf.runner import workload_section

    result = SweepResult(
        workload=workload.name,
        preset=args.preset,
        machine=machine,
        batch_size=batch,
        axes={k: list(v) for k, v in axes.items()},
        strategies=list(strategies),
        rows=json_safe(frame.astype(object).where(frame.notna(), None).to_dict(orient="records")),
    )
    settings = PredictSettings(
        workload=workload.name,
        preset=args.preset,
        batch_sizes=[batch],
        device=f"predicted: {machine}",
        data="none",
        machine=args.machine,
        strategies=list(strategies),
        sweep=list(args.sweep),
    )
    record = RunRecord.start(
        "predict", workload_section(workload, args.preset), settings, command=["dnnperf", *args.argv]
    )
    record.status, record.prediction = "complete", result
    record.finished = utc_now()
    store = RunStore(args.runs_dir)
    path = store.save(record)
    report = None if args.no_report else write_report(record, default_path(path))
    return path, report


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workloads", nargs="*", help="suite workloads to predict and run single-process (see `dnnperf list`)"
    )
    parser.add_argument(
        "--collectives",
        action="store_true",
        help="time gloo's collectives on 2 local ranks (1 KiB-64 MiB), fit alpha/beta per operation on every "
        "other size, and print measured vs predicted for all (the fit is cached for --machine hw)",
    )
    parser.add_argument("--preset", default="small", help="tiny, small or full (default: small)")
    parser.add_argument(
        "--batch-sizes", default="4,8,16", help="comma-separated batch sizes, each predicted and run (4,8,16)"
    )
    parser.add_argument("--steps", type=positive_int, default=10, help="measured steps per run (10)")
    parser.add_argument(
        "--processes",
        type=positive_int,
        default=3,
        help="fresh runs per configuration (single process, or 2-rank launches with --distributed), in "
        "rounds over the configurations; their median steps' median is the measured figure (3: two "
        "processes of one job differ by up to 15%% on a small CPU step)",
    )
    parser.add_argument(
        "--hw", type=path_argument, help="hardware profile (default: this machine's saved one)"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda[:N]: the device the single-process runs train on and whose `dnnperf hw` profile "
        "calibrates the model (cpu)",
    )
    parser.add_argument(
        "--distributed",
        metavar="dp,fsdp,zero1,pp,tp",
        help="instead of single-process runs, these strategies on 2 local ranks (gloo, one thread each: "
        "the profile must be calibrated at one thread, OMP_NUM_THREADS=1 dnnperf hw)",
    )
    parser.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        help="with --distributed fsdp: run and predict fsdp with each block's parameters freed after its "
        "forward (yes) or kept gathered until its backward (--no-reshard-after-forward)",
    )
    parser.add_argument(
        "--link-mbit",
        metavar="100,1000,unshaped",
        help="with --distributed: every configuration once per rate, the 2 ranks in their own network "
        "namespaces joined by a veth pair shaped with tc to that many Mbit/s (`unshaped`: the veth as it "
        "is), the model's link capped at the same rate (root only)",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="instead of timed runs, the predicted peak memory of one device against the memory "
        "profiler's peak of one tracked step of each configuration on this CPU (as `dnnperf profile "
        "--memory` measures it; with --distributed, the heaviest of 2 ranks); needs no hardware profile",
    )
    parser.add_argument(
        "--no-report",
        action="store_true",
        help="no HTML report (predicted against measured) beside the record",
    )


def run_validate(args: argparse.Namespace, out: Output) -> int:
    """Single process: calibrate from microbenchmarks, then predict and run every configuration."""
    import pandas as pd

    from dnnperf import hardware
    from dnnperf.devices import resolve_device
    from dnnperf.perfmodel.validate import (
        ablation,
        calibrated_machines,
        collective_rows,
        distributed_rows,
        memory_rows,
        memory_summary,
        single_rows,
        validate_memory,
        validate_memory_distributed,
        validate_single,
    )
    from dnnperf.report.terminal import distributed_memory_table, memory_validation_table, validation_tables
    from dnnperf.results.validation import ValidationResult
    from dnnperf.workloads import get_workload

    if not args.workloads and not args.collectives:
        raise UsageError("validate needs workloads to run, --collectives, or both")
    names = [get_workload(name).name for name in args.workloads]  # unknown names: UsageError first
    for name in names:
        if args.preset not in get_workload(name).presets:
            raise UsageError(f"{name} has no preset {args.preset!r}")
    from dnnperf.results.store import RunStore

    RunStore(args.runs_dir)  # a runs directory it cannot write in: refused before any run
    try:
        batches = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise UsageError(
            f"--batch-sizes expects comma-separated integers, got {args.batch_sizes!r}"
        ) from None
    if any(b <= 0 for b in batches):
        raise UsageError(f"--batch-sizes must be positive, got {args.batch_sizes!r}")
    if args.hw is not None and not args.hw.exists():
        raise UsageError(f"--hw {args.hw}: no such file")
    device = resolve_device(args.device)
    if device.type != "cpu" and (args.memory or args.distributed or args.collectives):
        raise UsageError(
            "--device cuda validates single-process step times; --memory, --distributed and --collectives "
            "run on the CPU"
        )
    document: dict[str, Any] = {}
    result = ValidationResult()
    if args.collectives:
        document["collectives"] = _validate_collectives(out, args.json)
        result.collectives = collective_rows(pd.DataFrame(document["collectives"]["rows"]))
    strategies = _strategies(args.distributed)
    links = _links(args.link_mbit)
    if links is not None and not strategies:
        raise UsageError("--link-mbit shapes the link between 2 ranks: add --distributed dp,pp,tp")
    if args.reshard_after_forward is not None and "fsdp" not in strategies:
        raise UsageError("--reshard-after-forward is fsdp's: add --distributed fsdp")
    reshard = args.reshard_after_forward is not False
    if links is not None and os.geteuid() != 0:
        raise UsageError("--link-mbit needs root (it creates network namespaces and shapes links with tc)")
    if names and args.memory and strategies:
        frame = validate_memory_distributed(
            names,
            batches,
            strategies,
            args.preset,
            out.error if not args.json else None,
            reshard_after_forward=reshard,
        )
        summary = memory_summary(frame)
        result.memory = [
            {**r, "workload": f"{r['workload']} {r['strategy']}"}
            for r in frame.to_dict("records")
            if r["measured_bytes"] == r["measured_bytes"] and r["predicted_bytes"] == r["predicted_bytes"]
        ]
        document["memory"] = {
            "rows": frame.to_dict(orient="records"),
            "summary": summary,
            "reshard_after_forward": reshard,
        }
        if not args.json:
            out.print(distributed_memory_table(frame, summary))
    elif names and args.memory:
        frame = validate_memory(names, batches, args.preset, out.error if not args.json else None)
        summary = memory_summary(frame)
        result.memory = memory_rows(frame)
        document["memory"] = {"rows": frame.to_dict(orient="records"), "summary": summary}
        if not args.json:
            out.print(memory_validation_table(frame, summary))
    elif names and strategies:
        document["distributed"] = _validate_distributed(args, names, batches, strategies, out)
        result.runs = distributed_rows(pd.DataFrame(document["distributed"]["rows"]))
    elif names:
        profile = hardware.load_profile(device, args.hw)
        if profile is None:
            raise UsageError(
                f"validate needs a calibrated profile: run `dnnperf hw --device {device.type}` first"
            )
        warn_if_busy(profile, out)
        machines, figures = calibrated_machines(profile)
        frame = validate_single(
            names,
            batches,
            args.preset,
            args.steps,
            machines,
            out.error if not args.json else None,
            processes=args.processes,
        )
        summary = ablation(frame)
        result.runs = single_rows(frame)
        document.update(
            calibration=figures,
            efficiency=machines["model"].efficiency,
            call_s=machines["model"].call_s,
            zero_operand_s=machines["model"].zero_operand_s,
            rows=frame.to_dict(orient="records"),
            ablation=summary.to_dict(orient="records"),
        )
        if not args.json:
            for table in validation_tables(frame, summary):
                out.print(table)
    record_path, report_path = _save_validation(args, result)
    document.update(record_path=str(record_path), report_path=str(report_path) if report_path else None)
    if args.json:
        out.json(document)
    else:
        out.print(f"record: {record_path}")
        if report_path is not None:
            out.print(f"report: {report_path}")
    return 0


def _save_validation(args: argparse.Namespace, result: Any) -> tuple[Path, Path | None]:
    """The validation as a record of kind ``validate`` and, unless ``--no-report``, its HTML report."""

    from dnnperf.report.html import default_path, write_report
    from dnnperf.results.record import RunRecord, utc_now
    from dnnperf.results.settings import ValidateSettings
    from dnnperf.results.store import RunStore

    names = sorted({r["workload"] for r in [*result.runs, *result.memory]}) or ["collectives"]
    settings = ValidateSettings(
        device=args.device,
        data="memory",
        batch_sizes=sorted({r["batch"] for r in [*result.runs, *result.memory]}),
        steps=args.steps,
        distributed=args.distributed,
        memory=args.memory,
        collectives=args.collectives,
        hw=str(args.hw) if args.hw else None,
    )
    record = RunRecord.start(
        "validate",
        {"name": ", ".join(names), "preset": args.preset},
        settings,
        command=["dnnperf", *args.argv],
        name="+".join(names)[:40],
    )
    record.status, record.validation = "complete", result
    record.finished = utc_now()
    path = RunStore(args.runs_dir).save(record)
    report = None if args.no_report else write_report(record, default_path(path))
    return path, report


def _links(text: str | None) -> list[float | None] | None:
    """``100,1000,unshaped`` -> [100.0, 1000.0, None]; None without the option."""
    if text is None:
        return None
    links: list[float | None] = []
    for item in (i.strip() for i in text.split(",")):
        if item == "unshaped":
            links.append(None)
            continue
        try:
            rate = float(item)
        except ValueError:
            rate = -1.0
        if not rate > 0 or rate == float("inf"):
            raise UsageError(f"--link-mbit takes positive rates in Mbit/s or `unshaped`, got {item!r}")
        links.append(rate)
    return links


def _strategies(text: str | None) -> list[str]:
    if text is None:
        return []
    known = ("dp", "pp", "tp", "fsdp", "zero1")  # what `dnnperf profile --nproc 2` measures
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(known))
    if not chosen or unknown:
        raise UsageError(f"--distributed takes strategies among {', '.join(known)}, got {text!r}")
    return chosen


def _validate_distributed(
    args: argparse.Namespace, names: list[str], batches: list[int], strategies: list[str], out: Any
) -> dict[str, Any]:
    """2 local ranks per configuration against the model calibrated at one thread per rank."""
    import torch

    from dnnperf import hardware
    from dnnperf.perfmodel.collective_calibration import link_calibration
    from dnnperf.perfmodel.machine import with_link
    from dnnperf.perfmodel.validate import calibrated_machines, ranking_agrees, validate_distributed
    from dnnperf.report.terminal import distributed_validation_table

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each rank runs with: the calibration must match it
    try:
        profile = hardware.load_profile("cpu", args.hw)
        if profile is None:
            raise UsageError("validate needs a calibrated profile: run `OMP_NUM_THREADS=1 dnnperf hw` first")
        warn_if_busy(profile, out)
        machines, figures = calibrated_machines(profile, fsdp="fsdp" in strategies)
    finally:
        torch.set_num_threads(threads)
    # The calibrated model machine, every term of it (split regions and DDP's host work included: the
    # 2-rank steps need them, and a machine rebuilt from some of its parts would lack them), with this
    # host's fitted gloo link.
    machine = with_link(machines["model"], link_calibration())
    frame = validate_distributed(
        names,
        batches,
        strategies,
        args.preset,
        args.steps,
        machine,
        out.error if not args.json else None,
        links=_links(args.link_mbit),
        processes=args.processes,
        reshard_after_forward=args.reshard_after_forward is not False,
    )
    ranking = ranking_agrees(frame)
    if not args.json:
        out.print(distributed_validation_table(frame, ranking))
    return {
        "calibration": figures,
        # The whole calibration, so that two validations can be compared term by term.
        "efficiency": machine.efficiency,
        "call_s": machine.call_s,
        "link": machine.collectives,
        "rows": frame.to_dict(orient="records"),
        "ranking": ranking.to_dict(orient="records"),
        "reshard_after_forward": args.reshard_after_forward is not False,
    }


def _validate_collectives(out: Any, as_json: bool) -> dict[str, Any]:
    """Measure, fit, compare; the fit replaces the cached one that ``--machine hw`` uses."""
    from dnnperf.perfmodel import collective_calibration as cc
    from dnnperf.report.terminal import collectives_table

    with out.progress_fraction("timing gloo collectives on 2 ranks (about 30 s)"):
        link, table = cc.calibrate()
    cc.store_link(link)
    summary = cc.summary(table)
    if not as_json:
        out.print(collectives_table(table, summary))
    return {"link": link, "rows": table.to_dict(orient="records"), "summary": summary}
