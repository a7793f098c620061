"""``dnnperf list``, ``dnnperf bench`` and ``dnnperf profile``: the suite, and training a workload
timed (bench) or broken down by stage, layer and memory (profile)."""

from __future__ import annotations

import argparse
from typing import Any

from dnnperf.cli import distributed, frameworks
from dnnperf.cli.hw import hardware_for
from dnnperf.cli.options import (
    EXIT_FAILED,
    batch_size_list,
    common,
    hw_argument,
    non_negative_int,
    positive_int,
)
from dnnperf.cli.output import Output, command_line, finish_run
from dnnperf.errors import UsageError
from dnnperf.interrupts import interrupted_exit_code
from dnnperf.paths import path_argument


def add_parsers(commands: Any) -> None:
    listing = commands.add_parser("list", help="the workload suite: domains, parameters, FLOPs per sample")
    listing.add_argument("--preset", action="append", dest="presets", help="only these presets (repeatable)")
    common(listing)
    listing.set_defaults(handler=cmd_list)

    bench = commands.add_parser(
        "bench", help="train a workload and time its steps, at one or more batch sizes"
    )
    _training_arguments(bench)
    frameworks.add_arguments(bench)
    bench.set_defaults(handler=cmd_bench)

    profile = commands.add_parser(
        "profile", help="train a workload and break each step down by stage (read ... update, other)"
    )
    _training_arguments(profile)
    profile.add_argument("--stages", action="store_true", help="the stage breakdown (always included)")
    profile.add_argument(
        "--layers",
        action="store_true",
        help="per layer, forward and backward: time, FLOPs, efficiency, roofline, library (more steps)",
    )
    hw_argument(profile)
    profile.add_argument("--top", type=positive_int, default=15, help="layers shown in the table (15)")
    profile.add_argument(
        "--memory",
        action="store_true",
        help="peak memory by data structure, timeline, per layer, and its fit against batch size",
    )
    profile.add_argument(
        "--memory-limit",
        help="predict the largest batch within this size (e.g. 8GiB) and run it to check (--sweep)",
    )
    profile.add_argument(
        "--no-report", action="store_true", help="do not write the HTML report beside the record"
    )
    distributed.add_arguments(profile)
    profile.set_defaults(handler=cmd_profile)


def _training_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of every command that trains a workload (bench, profile)."""
    from dnnperf.data.sources import DATA_KINDS
    from dnnperf.devices import DEVICE_CHOICES

    parser.add_argument("workload", help="a workload of the suite (see `dnnperf list`)")
    parser.add_argument("--preset", default="tiny", help="tiny, small or full (default: tiny)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("-b", "--batch-size", type=positive_int, help="batch size (default: the preset's)")
    sizes.add_argument("--sweep", type=batch_size_list, help="several batch sizes, e.g. 1,2,4,8")
    parser.add_argument("--steps", type=positive_int, default=20, help="measured steps per batch size (20)")
    parser.add_argument("--warmup", type=non_negative_int, default=5, help="unmeasured warm-up steps (5)")
    parser.add_argument("--device", default="auto", help=f"{', '.join(DEVICE_CHOICES)} or cuda:N (auto)")
    parser.add_argument(
        "--data", default="memory", choices=DATA_KINDS, help="synthetic data in memory or on disk"
    )
    parser.add_argument("--workers", type=non_negative_int, help="DataLoader workers for --data disk")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of model and data (0)")
    parser.add_argument(
        "--data-dir", type=path_argument, help="dataset cache (default: $DNNPERF_DATA_DIR or ~/.cache)"
    )
    common(parser, runs=True)


def cmd_list(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.analysis.flops import training_flops_per_sample
    from dnnperf.workloads import all_workloads
    from dnnperf.workloads.base import PRESET_NAMES, count_parameters

    presets = tuple(args.presets or PRESET_NAMES)
    for preset in presets:
        if preset not in PRESET_NAMES:
            raise UsageError(f"unknown preset {preset!r}: choose one of {', '.join(PRESET_NAMES)}")
    rows = []
    workloads = all_workloads()
    with out.progress("counting parameters and FLOPs", total=len(workloads) * len(presets)) as advance:
        for workload in workloads:
            row: dict[str, Any] = {
                "name": workload.name,
                "domain": workload.domain,
                "summary": workload.summary,
                "sample_unit": workload.sample_unit,
                "presets": {},
            }
            for preset in presets:
                row["presets"][preset] = {
                    "parameters": count_parameters(workload.build(preset, "meta").model),
                    "train_flops_per_sample": training_flops_per_sample(workload.name, preset),
                    "default_batch_size": workload.batch_size(preset),
                }
                advance()
            rows.append(row)
    if args.json:
        out.json({"workloads": rows})
    else:
        from dnnperf.report.terminal import suite_table

        out.print(suite_table(rows, presets))
        out.print("Third-party networks: hf:MODEL_TYPE (transformers) and timm:NAME (docs/workloads.md).")
    return 0


def cmd_profile(args: argparse.Namespace, out: Output) -> int:
    return cmd_bench(args, out, stages=True)


def cmd_bench(args: argparse.Namespace, out: Output, stages: bool = False) -> int:
    from dnnperf.results.store import RunStore
    from dnnperf.runner import BenchSettings, Interrupted, RunFailed, bench
    from dnnperf.workloads import get_workload

    workload = get_workload(args.workload)
    workload.config(args.preset)  # validates the preset before anything else happens
    if getattr(args, "framework", None) is not None:  # one child process per framework, under watch
        return frameworks.run(args, out, RunStore(args.runs_dir))
    if distributed.wanted(args):
        distributed.settings_from(args)  # refuse bad distributed options before anything else
    else:
        distributed.refuse_without_nproc(args)
    layers = getattr(args, "layers", False)
    if getattr(args, "hw", None) is not None and not layers:
        raise UsageError("--hw gives the layer analysis its peaks: add --layers")
    if args.data != "disk" and (args.workers is not None or args.data_dir is not None):
        raise UsageError("--workers and --data-dir apply to --data disk")
    memory = getattr(args, "memory", False) or getattr(args, "memory_limit", None) is not None
    limit = None
    if getattr(args, "memory_limit", None) is not None:
        from dnnperf.analysis.memory import parse_bytes

        limit = parse_bytes(args.memory_limit)
        if not args.sweep or len(args.sweep) < 2:
            raise UsageError("--memory-limit needs --sweep with at least two batch sizes to fit")
    hardware = hardware_for(args.device, args.hw, out) if layers else None
    batch_sizes = args.sweep or ((args.batch_size,) if args.batch_size else None)
    settings = BenchSettings(
        workload=workload.name,
        preset=args.preset,
        batch_sizes=batch_sizes,
        steps=args.steps,
        warmup=args.warmup,
        device=args.device,
        data=args.data,
        workers=args.workers,
        seed=args.seed,
        data_dir=args.data_dir,
        stages=stages,
        layers=layers,
        hardware=hardware.to_dict() if hardware is not None else None,
        memory=memory,
    )
    store = RunStore(args.runs_dir)
    wants_report = stages and not getattr(args, "no_report", False)  # profile: HTML beside the record
    if distributed.wanted(args):  # several ranks: launched here, or this process is one of them
        return distributed.run(args, out, settings, store, report=wants_report)
    sizes = batch_sizes or (workload.batch_size(args.preset),)
    total = len(sizes) * settings.steps_per_point
    with out.progress(f"{workload.name} ({args.preset})", total=total) as advance:
        try:
            record = bench(settings, store, command=command_line(), on_step=lambda *_: advance())
        except RunFailed as failure:
            path = store.path(failure.record.id)
            measured = sum(len(p.step_s) for p in failure.record.points)
            out.error(f"error: the run failed: {failure} ({measured} measured steps kept in {path})")
            if args.json:
                out.json({"record_path": str(path), "record": failure.record.to_dict()})
            return EXIT_FAILED
        except Interrupted as interrupt:
            record = interrupt.record
            measured = sum(len(p.step_s) for p in record.points)
            path = store.path(record.id)
            out.error(f"interrupted: {measured} measured steps saved as a partial record: {path}")
            if args.json:
                out.json({"record_path": str(store.path(record.id)), "record": record.to_dict()})
            return interrupted_exit_code()
    path = store.path(record.id)
    scaling = (
        _memory_scaling(record, settings, limit, store, out) if memory and len(record.points) > 1 else None
    )
    finish_run(args, out, record, path, wants_report, scaling, limit_asked=limit is not None)
    return 0


def _device_capacity(device_name: str) -> int:
    import psutil
    import torch

    from dnnperf.devices import resolve_device

    device = resolve_device(device_name)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(psutil.virtual_memory().total)


def _memory_scaling(record: Any, settings: Any, limit: int | None, store: Any, out: Output) -> dict | None:
    """Fit memory against batch size over the sweep; with a limit, predict the largest batch that fits
    it and run that batch size to check (its record is saved beside the sweep's)."""
    import dataclasses

    from dnnperf.analysis.memory import predict_max_batch, scaling_fit
    from dnnperf.runner import bench

    points = [(p.batch_size, p.memory) for p in record.points if p.memory is not None]
    if len(points) < 2:
        return None
    fit = scaling_fit(points)
    result: dict[str, Any] = {
        "fit": fit.to_dict("records"),
        "limit": limit,
        "predicted": None,
        "checked_peak": None,
    }
    if limit is None:  # the device's capacity: predicted, not run (pass --memory-limit to check a limit)
        result["limit"] = _device_capacity(settings.device)
        result["predicted"] = predict_max_batch(points, result["limit"])
        return result
    # Extrapolating far beyond the sweep, a straight line can be off by a little: each check that
    # lands above the limit joins the fit and the prediction is made again (at most three runs).
    result["checks"] = []
    for _ in range(3):
        predicted = predict_max_batch(points, limit)
        result["predicted"] = predicted
        if predicted is None or any(b == predicted for b, _ in points[len(record.points) :]):
            break
        check = dataclasses.replace(settings, batch_sizes=(predicted,), layers=False)
        with out.progress(f"checking batch {predicted}", total=check.steps_per_point) as advance:
            checked = bench(check, store, command=command_line(), on_step=lambda *_: advance())
        memory = checked.points[0].memory
        if memory is None:
            break
        peak = memory.measured_peak or memory.tracked_peak
        result["checked_peak"] = peak
        result["checks"].append(
            {"batch_size": predicted, "peak": peak, "record": str(store.path(checked.id))}
        )
        if peak <= limit:
            break
        points.append((predicted, memory))
    return result
