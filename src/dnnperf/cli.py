"""The ``dnnperf`` command line. Results go to stdout (a single JSON document with --json);
logs, progress and errors go to stderr. Bad input: one line on stderr and exit code 2.

This module imports nothing heavy at its top (rich, numpy and torch load inside ``main``), so the
console script reaches ``main``'s signal handling at once: Ctrl-C or SIGTERM while torch loads is the
one line "interrupted" and exit code 130 or 143, not a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from dnnperf.errors import DnnperfError, UsageError, one_line
from dnnperf.interrupts import interrupted_exit_code, stop_on_signals
from dnnperf.paths import output_directory, output_file, path_argument
from dnnperf.version import __version__

if TYPE_CHECKING:
    from rich.progress import Progress

EXIT_FAILED = 1
EXIT_USAGE = 2
#: Ctrl-C's; a run stopped by SIGTERM exits with 143 (``interrupted_exit_code``).
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exits with code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def batch_size_list(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("expects comma-separated positive integers, e.g. 1,2,4,8")
    try:
        sizes = tuple(positive_int(p) for p in parts)  # an empty item ("1,,2") is not a size either
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expects comma-separated positive integers (batch sizes), got {text!r}"
        ) from None
    if len(set(sizes)) < len(sizes):
        raise argparse.ArgumentTypeError(f"a batch size is repeated in {text!r}")
    return sizes


def _common(parser: argparse.ArgumentParser, runs: bool = False) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout and nothing else"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or tables on the terminal")
    if runs:
        parser.add_argument(
            "--runs-dir",
            type=path_argument,
            default=None,
            help="where run records live (default: $DNNPERF_RUNS_DIR or ./dnnperf-runs)",
        )


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
    _common(parser, runs=True)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dnnperf",
        description="Measure, explain, predict and reduce the cost of training deep neural networks.",
    )
    parser.add_argument("--version", action="version", version=f"dnnperf {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    listing = commands.add_parser("list", help="the workload suite: domains, parameters, FLOPs per sample")
    listing.add_argument("--preset", action="append", dest="presets", help="only these presets (repeatable)")
    _common(listing)
    listing.set_defaults(handler=cmd_list)

    bench = commands.add_parser(
        "bench", help="train a workload and time its steps, at one or more batch sizes"
    )
    _training_arguments(bench)
    from dnnperf.frameworks.command import add_arguments as framework_arguments

    framework_arguments(bench)
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
    profile.add_argument(
        "--hw",
        type=path_argument,
        help="hardware profile for efficiencies (default: the one `dnnperf hw` saved)",
    )
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
    from dnnperf.distributed.command import add_arguments as distributed_arguments

    distributed_arguments(profile, positive_int)
    profile.set_defaults(handler=cmd_profile)

    libcompare = commands.add_parser(
        "libcompare",
        help="each convolution layer through the default library and through explicit im2col + GEMM",
    )
    libcompare.add_argument("workload", help="a workload of the suite (see `dnnperf list`)")
    libcompare.add_argument("--preset", default="tiny", help="tiny, small or full (default: tiny)")
    libcompare.add_argument(
        "-b", "--batch-size", type=positive_int, help="batch size (default: the preset's)"
    )
    libcompare.add_argument("--repeats", type=positive_int, default=10, help="timed samples per layer (10)")
    libcompare.add_argument("--warmup", type=non_negative_int, default=2, help="warm-up calls per layer (2)")
    libcompare.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (auto)")
    libcompare.add_argument(
        "--hw",
        type=path_argument,
        help="hardware profile for efficiencies (default: the one `dnnperf hw` saved)",
    )
    _common(libcompare)
    libcompare.set_defaults(handler=cmd_libcompare)

    hw = commands.add_parser(
        "hw", help="calibrate this machine: peak FLOP/s, memory and host-device bandwidth, dispatch overhead"
    )
    hw.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (auto)")
    hw.add_argument("--quick", action="store_true", help="seconds instead of minutes: rough numbers")
    hw.add_argument(
        "--output", type=path_argument, help="where to save the profile (default: dnnperf's cache)"
    )
    hw.add_argument("--show", action="store_true", help="show the saved profile instead of calibrating")
    _common(hw)
    hw.set_defaults(handler=cmd_hw)

    runs = commands.add_parser("runs", help="list the run records in the runs directory")
    _common(runs, runs=True)
    runs.set_defaults(handler=cmd_runs)

    show = commands.add_parser("show", help="show one run record's results")
    show.add_argument("run", help="run id, unique id prefix, or path to a record file")
    _common(show, runs=True)
    show.set_defaults(handler=cmd_show)

    reproduce = commands.add_parser(
        "reproduce", help="re-run a seed paper's experiment with dnnperf's commands; claims against results"
    )
    reproduce.add_argument(
        "paper",
        help="tbd (004), training-phase (001), memory-subsystem (000), parallelism (002), offload (003), "
        "or all",
    )
    reproduce.add_argument(
        "--size", default="default", help="smoke (seconds, a check) or default (minutes: the experiment)"
    )
    reproduce.add_argument(
        "--output",
        type=path_argument,
        default=Path("docs/reproductions.md"),
        help="the markdown summary to update",
    )
    _common(reproduce, runs=True)
    reproduce.set_defaults(handler=cmd_reproduce)

    report = commands.add_parser("report", help="write a run's self-contained HTML report (charts, tables)")
    report.add_argument("run", help="run id, unique id prefix, or path to a record file")
    report.add_argument(
        "-o", "--output", type=path_argument, help="the HTML file (default: beside the record)"
    )
    _common(report, runs=True)
    report.set_defaults(handler=cmd_report)

    export = commands.add_parser("export", help="a run as a Chrome/Perfetto trace and as CSV tables")
    export.add_argument("run", help="run id, unique id prefix, or path to a record file")
    export.add_argument("--trace", type=path_argument, help="write the trace (Trace Event Format JSON) here")
    export.add_argument(
        "--csv",
        type=path_argument,
        help="write stages.csv and layers.csv (a watch: samples.csv, processes.csv) into this directory",
    )
    _common(export, runs=True)
    export.set_defaults(handler=cmd_export)

    compare = commands.add_parser(
        "compare", help="two runs' step, stages and layers, flagging changes beyond the runs' noise"
    )
    compare.add_argument("run_a", metavar="RUN_A", help="the run before (id, id prefix or record path)")
    compare.add_argument("run_b", metavar="RUN_B", help="the run after")
    compare.add_argument("--top", type=positive_int, default=10, help="layers shown per batch size (10)")
    compare.add_argument(
        "--min-change", type=float, default=0.15, help="smallest flagged change of a stage or layer (0.15)"
    )
    compare.add_argument(
        "--min-run-change",
        type=float,
        default=0.50,
        help="smallest flagged change of the whole step (0.50: a loaded machine drifts between runs)",
    )
    _common(compare, runs=True)
    compare.set_defaults(handler=cmd_compare)

    memsave = commands.add_parser(
        "memsave", help="plan offload/recompute per layer for a peak-memory budget, run it and the baselines"
    )
    from dnnperf.memsave.command import add_arguments as memsave_arguments

    memsave_arguments(memsave, positive_int)
    _common(memsave, runs=True)
    memsave.set_defaults(handler=cmd_memsave)

    predict = commands.add_parser(
        "predict", help="predict step time, throughput and memory: one device, dp, pp, tp; what-if sweeps"
    )
    from dnnperf.perfmodel.command import add_arguments as predict_arguments

    predict_arguments(predict, positive_int)
    _common(predict, runs=True)
    predict.set_defaults(handler=cmd_predict)

    validate = commands.add_parser(
        "validate", help="predict single-process steps, run them for real, and print the errors"
    )
    from dnnperf.perfmodel.command import add_validate_arguments

    add_validate_arguments(validate, positive_int)
    _common(validate, runs=True)
    validate.set_defaults(handler=cmd_validate)

    watch = commands.add_parser(
        "watch",
        help="run any command and sample its process tree and GPUs: CPU, memory, I/O, GPU, step marks",
        usage="dnnperf watch [options] -- COMMAND ...",
    )
    from dnnperf.watch.command import add_arguments as watch_arguments

    watch_arguments(watch)
    _common(watch, runs=True)
    watch.set_defaults(handler=cmd_watch)
    return parser


# --------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------


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
                    "default_batch_size": workload.default_batch_size[preset],
                }
                advance()
            rows.append(row)
    if args.json:
        out.json({"workloads": rows})
    else:
        from dnnperf.report.terminal import suite_table

        out.print(suite_table(rows, presets))
    return 0


def cmd_profile(args: argparse.Namespace, out: Output) -> int:
    return cmd_bench(args, out, stages=True)


def _hardware_for(device_name: str, path: Path | None, out: Output) -> Any:
    """The hardware profile efficiencies are computed against: ``path``, else the saved one for the
    device (with a warning when it may not describe this process); None, with a note, when none."""
    from dnnperf import hardware
    from dnnperf.devices import resolve_device

    device = resolve_device(device_name)
    if path is not None and not path.exists():
        raise UsageError(f"--hw {path}: no such file")
    profile = hardware.load_profile(device, path)
    if profile is None:
        out.warn(f"no hardware profile for {device}: efficiencies and roofline need `dnnperf hw` first")
        return None
    reasons = hardware.stale_reasons(profile)
    if reasons:
        out.warn(f"hardware profile {path or hardware.profile_path(device)}: {'; '.join(reasons)}")
    return profile


def cmd_bench(args: argparse.Namespace, out: Output, stages: bool = False) -> int:
    from dnnperf.results.store import RunStore
    from dnnperf.runner import BenchSettings, Interrupted, RunFailed, bench
    from dnnperf.workloads import get_workload

    workload = get_workload(args.workload)
    workload.config(args.preset)  # validates the preset before anything else happens
    if getattr(args, "framework", None) is not None:  # one child process per framework, under watch
        from dnnperf.frameworks import command as frameworks

        return frameworks.run(args, out, RunStore(args.runs_dir))
    from dnnperf.distributed import command as distributed

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
    hardware = _hardware_for(args.device, args.hw, out) if layers else None
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
    sizes = batch_sizes or (workload.default_batch_size[args.preset],)
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


def finish_run(
    args: argparse.Namespace,
    out: Output,
    record: Any,
    path: Path,
    report: bool,
    scaling: dict | None = None,
    limit_asked: bool = False,
) -> None:
    """A profile or bench that ended well, one process or several ranks: its HTML report beside the
    record (``report``), then the JSON document or the tables (with the memory fit, if any)."""
    from dnnperf.report.html import default_path

    html = write_html_report(record, default_path(path), out) if report else None
    if args.json:
        out.json(
            {
                "record_path": str(path),
                "record": record.to_dict(),
                "memory_scaling": scaling,
                "report_path": str(html) if html else None,
            }
        )
        return
    print_record(record, out, top=getattr(args, "top", 15))
    if scaling is not None:
        import pandas as pd

        from dnnperf.report.terminal import memory_scaling_table

        fit = pd.DataFrame(scaling["fit"])
        out.print(
            memory_scaling_table(
                fit, scaling["limit"], scaling["predicted"], scaling["checked_peak"], asked=limit_asked
            )
        )
    out.print(f"record: {path}")
    if html is not None:
        out.print(f"report: {html}")


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


def print_record(record: Any, out: Output, top: int = 15) -> None:
    """The terminal tables of a run: steps, then per batch size its stages and layers."""
    from dnnperf.report.terminal import layers_tables, memory_tables, points_table, stages_table

    if record.watch is not None:
        from dnnperf.report.terminal import watch_tables

        if record.kind != "watch":  # bench --framework: its steps first, then its process tree
            out.print(points_table(record))
        for table in watch_tables(record):
            out.print(table)
        return
    if record.prediction is not None:
        from dnnperf.perfmodel.whatif import crossovers
        from dnnperf.report.terminal import crossover_table, sweep_table

        p = record.prediction
        out.print(sweep_table(p.frame(), list(p.axes), f"{p.workload}/{p.preset} on {p.machine}"))
        out.print(crossover_table(crossovers(p.frame(), list(p.axes))))
    if record.validation is not None:
        from dnnperf.report.terminal import validation_record_tables

        for table in validation_record_tables(record.validation):
            out.print(table)
    if record.points:
        out.print(points_table(record))
    elif record.prediction is None and record.memsave is None and record.validation is None:
        error = f": {record.error}" if record.error else ""
        name = record.workload["name"]
        out.print(f"{record.id}: {record.kind} of {name}, {record.status}, no measured point{error}")
    if record.memsave is not None:
        from dnnperf.report.terminal import memsave_tables

        for table in memsave_tables(record.memsave):
            out.print(table)
    for point in record.points:
        stage_s = None
        if point.stages is not None and point.stages.wall_s:
            out.print(stages_table(point.batch_size, point.stages))
            stage_s = {k: v["median"] for k, v in point.stages.summary()["stages"].items()}
        if point.layers is not None and point.layers.steps:
            for table in layers_tables(point.batch_size, point.layers, stage_s, top=top):
                out.print(table)
        if point.memory is not None:
            for table in memory_tables(point.batch_size, point.memory):
                out.print(table)
        if point.ranks is not None and point.ranks.steps:
            from dnnperf.report.terminal import ranks_tables

            for table in ranks_tables(point.batch_size, point.ranks):
                out.print(table)


def cmd_libcompare(args: argparse.Namespace, out: Output) -> int:
    import torch

    from dnnperf.analysis.libcompare import compare_convolutions, comparison_table
    from dnnperf.devices import resolve_device, to_device
    from dnnperf.workloads import get_workload

    workload = get_workload(args.workload)
    workload.config(args.preset)
    device = resolve_device(args.device)
    hardware = _hardware_for(args.device, args.hw, out)
    batch_size = args.batch_size or workload.default_batch_size[args.preset]
    torch.manual_seed(0)
    task = workload.build(args.preset, device)
    batch = to_device(workload.data(args.preset).synthesize(batch_size, 0), device)
    peak = hardware.peak_flops() if hardware is not None else None
    with out.progress_fraction(f"{workload.name}: convolutions both ways") as progress:
        comparisons = compare_convolutions(
            task.model,
            lambda: task.step(batch),
            device,
            repeats=args.repeats,
            warmup=args.warmup,
            peak_flops=peak,
            progress=progress,
        )
    rows = comparison_table(comparisons)
    if args.json:
        out.json(
            {
                "workload": workload.name,
                "preset": args.preset,
                "batch_size": batch_size,
                "device": str(device),
                "peak_flops": peak,
                "layers": [c.to_dict() for c in comparisons],
            }
        )
    else:
        from dnnperf.report.terminal import libcompare_table

        out.print(libcompare_table(workload.name, batch_size, rows, peak))
    return 0


def cmd_hw(args: argparse.Namespace, out: Output) -> int:
    from dnnperf import calibration, hardware
    from dnnperf.devices import resolve_device

    device = resolve_device(args.device)
    if args.show and args.quick:
        raise UsageError("--quick calibrates quickly; --show calibrates nothing: give one of them")
    if args.show:
        profile = hardware.load_profile(device, args.output)  # a bad file is a UsageError naming it
        if profile is None:
            raise UsageError(f"no saved hardware profile for {device}: run `dnnperf hw` first")
        path = args.output or hardware.profile_path(device)
    else:
        if args.output is not None:
            output_file(args.output, "--output", parents=True)  # before minutes of calibration
        with out.progress_fraction("calibrating") as progress:
            profile = calibration.calibrate(device, progress=progress, quick=args.quick)
        path = hardware.save_profile(profile, args.output)
    if args.json:
        out.json({"profile_path": str(path), "profile": profile.to_dict()})
    else:
        from dnnperf.report.terminal import hardware_table

        out.print(hardware_table(profile))
        out.print(f"profile: {path}")
    return 0


def existing_store(args: argparse.Namespace) -> Any:
    """The run store to read: a ``--runs-dir`` given that does not exist is a typo to name, not an
    empty store (the default directory, before any run made it, is one)."""
    from dnnperf.results.store import RunStore

    if args.runs_dir is not None and not args.runs_dir.exists():
        raise UsageError(f"--runs-dir {args.runs_dir}: no such directory")
    return RunStore(args.runs_dir, create=False)


def cmd_runs(args: argparse.Namespace, out: Output) -> int:
    store = existing_store(args)
    records, skipped = store.scan()
    for item in skipped:
        out.warn(f"skipped {item.path.name}: {item.reason}")
    if args.json:
        out.json(
            {
                "runs_dir": str(store.root),
                "runs": [
                    {
                        "id": r.id,
                        "path": str(store.path(r.id)),
                        "workload": r.workload.get("name"),
                        "preset": r.workload.get("preset"),
                        "status": r.effective_status(),
                        "created": r.created,
                        "device": r.settings.get("device"),
                        "points": [
                            {"batch_size": p.batch_size, "status": p.status, **p.summary()} for p in r.points
                        ],
                    }
                    for r in records
                ],
                "skipped": [{"path": str(s.path), "reason": s.reason} for s in skipped],
            }
        )
    else:
        from dnnperf.report.terminal import runs_table

        if not records:
            out.print(f"no runs in {store.root}")
        else:
            out.print(runs_table(records))
    return 0


def cmd_reproduce(args: argparse.Namespace, out: Output) -> int:
    from dnnperf import reproduce
    from dnnperf.reproduce.base import SIZES
    from dnnperf.results.store import default_runs_dir

    modules = list(reproduce.PAPERS.values()) if args.paper == "all" else [reproduce.paper(args.paper)]
    if args.size not in SIZES:
        raise UsageError(f"unknown size {args.size!r}: choose one of {', '.join(SIZES)}")
    output_file(args.output, "--output")  # before any paper runs
    runs_dir = args.runs_dir or default_runs_dir()
    runs_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for module in modules:
        total = module.planned(args.size)
        with out.progress(f"seed {module.SEED} ({module.KEY})", total=total) as advance:
            session = reproduce.Session(runs_dir)
            results.append(module.run(session, args.size, progress=lambda _: advance()))
        reproduce.update_document(args.output, results[-1:])  # each paper kept as soon as it is done
    if args.json:
        out.json(
            {
                "output": str(args.output),
                "reproductions": [
                    {
                        "paper": r.key,
                        "seed": r.seed,
                        "size": r.size,
                        "claims": [vars(c) for c in r.claims],
                        "tables": {title: frame.to_dict("records") for title, frame in r.tables},
                    }
                    for r in results
                ],
            }
        )
        return 0
    from dnnperf.report.terminal import reproduction_table

    for result in results:
        out.print(reproduction_table(result))
    out.print(f"summary: {args.output}")
    return 0


def cmd_memsave(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.memsave.command import run

    return run(args, out, command_line())


def cmd_predict(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.perfmodel.command import run

    return run(args, out)


def cmd_validate(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.perfmodel.command import run_validate

    return run_validate(args, out)


def cmd_watch(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.watch.command import run

    return run(args, out, command_line())


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    record = existing_store(args).load(args.run)
    if args.json:
        out.json(record.to_dict())
    else:
        print_record(record, out)
    return 0


def write_html_report(record: Any, path: Path, out: Output) -> Path:
    from dnnperf.report.html import SECTIONS, write_report

    with out.progress("writing the report", total=len(SECTIONS)) as advance:
        return write_report(record, path, advance=advance)


def cmd_report(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.report.html import default_path

    if args.output is not None:
        output_file(args.output, "--output")
    store = existing_store(args)
    record = store.load(args.run)
    # Beside the record: the file given, else the record's file in the store.
    source = Path(args.run) if os.sep in args.run or args.run.endswith(".json") else store.path(record.id)
    path = write_html_report(record, args.output or default_path(source), out)
    if args.json:
        out.json({"report_path": str(path)})
    else:
        out.print(f"report: {path}")
    return 0


def cmd_export(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.report.export import csv_tables, write_csv
    from dnnperf.report.trace import write_trace

    if args.trace is None and args.csv is None:
        raise UsageError("export needs --trace PATH and/or --csv DIR")
    # Both checked before either is written: a bad --csv must not leave a trace behind.
    if args.trace is not None:
        output_file(args.trace, "--trace")
    if args.csv is not None:
        output_directory(args.csv, "--csv")
    if args.trace is not None and args.csv is not None and args.trace.resolve() == args.csv.resolve():
        raise UsageError(f"--trace and --csv are one path, {args.trace}: a file and a directory")
    record = existing_store(args).load(args.run)
    # Nothing written where there is nothing to write: an empty trace or CSV directory is no answer.
    if args.trace is not None and record.watch is None and not any(p.step_s for p in record.points):
        raise UsageError(f"--trace: {record.id} has no measured step to trace")
    tables = csv_tables(record) if args.csv is not None else {}
    if args.csv is not None and not tables:
        raise UsageError(f"--csv: {record.id} has no stages or layers (dnnperf profile measures them)")
    written = []
    if args.trace is not None:
        written.append(write_trace(record, args.trace))
    if args.csv is not None:
        written += write_csv(tables, args.csv)
    if args.json:
        out.json({"written": [str(p) for p in written]})
    else:
        for path in written:
            out.print(f"wrote {path}")
    return 0


def cmd_compare(args: argparse.Namespace, out: Output) -> int:
    from dnnperf.analysis.compare import CompareSettings, comparable, compare_runs

    for name in ("min_change", "min_run_change"):
        if not 0 <= getattr(args, name) < 10:
            raise UsageError(f"--{name.replace('_', '-')} must be a fraction between 0 and 10")
    store = existing_store(args)
    a, b = store.load(args.run_a), store.load(args.run_b)
    if not comparable(a, b):
        raise UsageError(
            f"runs {a.id} ({a.kind}) and {b.id} ({b.kind}) measured their steps differently: "
            "compare two bench or profile runs, or two runs of one other kind"
        )
    settings = CompareSettings(min_relative=args.min_change, min_run_relative=args.min_run_change)
    if a.kind == "watch":  # B too (comparable); a bench --framework record compares per batch size
        return compare_watch_runs(a, b, settings, args, out)
    frame = compare_runs(a, b, settings)
    if frame.empty:
        raise UsageError(f"runs {a.id} and {b.id} have no measured steps to compare")
    if args.json:
        out.json({"a": a.id, "b": b.id, "settings": settings.to_dict(), "rows": frame.to_dict("records")})
    else:
        from dnnperf.report.terminal import compare_table

        out.print(compare_table(frame, a.id, b.id, top=args.top))
        flagged = int(frame["flagged"].sum())
        starved = frame["change"].astype(str).str.startswith("inconclusive")
        if starved.all():  # nothing could be told from noise: say why instead of "no change"
            out.print(f"{frame['change'].iloc[0]}: no change can be told from the runs' noise")
        else:
            summary = f"{flagged} change(s)" if flagged else "no change"
            unjudged = f" ({int(starved.sum())} rows inconclusive)" if starved.any() else ""
            out.print(f"{summary} beyond the runs' noise{unjudged}")
    return 0


def compare_watch_runs(a: Any, b: Any, settings: Any, args: argparse.Namespace, out: Output) -> int:
    from dnnperf.analysis.compare import compare_watches
    from dnnperf.report.terminal import watch_compare_table

    frame = compare_watches(a, b, settings)
    if args.json:
        out.json({"a": a.id, "b": b.id, "settings": settings.to_dict(), "rows": frame.to_dict("records")})
    else:
        out.print(watch_compare_table(frame, a.id, b.id))
    return 0


# --------------------------------------------------------------------------------------------------
# Output discipline and entry point
# --------------------------------------------------------------------------------------------------


def _piped_width() -> int:
    """Columns for tables written to a pipe or file: 140, or $COLUMNS where it asks for more. (Rich
    assumes 80 off a terminal, and so do tools that set COLUMNS=80 for their workers, pytest-xdist's
    among them; tables of results need more, and a pipe has no edge to keep to.)"""
    columns = os.environ.get("COLUMNS", "")
    return max(140, int(columns)) if columns.isdigit() else 140


class Output:
    """stdout carries results only; everything else goes to stderr (and --quiet/--json silence it)."""

    def __init__(self, json_mode: bool, quiet: bool) -> None:
        from rich.console import Console

        self.json_mode, self.quiet = json_mode, quiet
        self.stdout = Console(soft_wrap=False, width=None if sys.stdout.isatty() else _piped_width())
        self.stderr = Console(stderr=True)

    def print(self, renderable: Any) -> None:
        """A table, or a line of text shown as it is (never read as markup: it may hold names from a
        record or paths from the command line)."""
        if not self.json_mode and not self.quiet:
            if isinstance(renderable, str):
                from dnnperf.report.terminal import plain

                renderable = plain(renderable, limit=len(renderable))
            self.stdout.print(renderable)

    def json(self, document: Any) -> None:
        from dnnperf.results.record import json_safe

        sys.stdout.write(json.dumps(json_safe(document), indent=1, allow_nan=False) + "\n")
        sys.stdout.flush()

    def warn(self, message: str) -> None:
        self.error(f"warning: {message}")

    def error(self, message: str) -> None:
        # Plain write: a rich console would wrap a long message onto a second line.
        sys.stderr.write(f"dnnperf: {one_line(message)}\n")
        sys.stderr.flush()

    def _bar(self, *counters: Any) -> Progress:
        """A transient progress bar on stderr, silent with --quiet, --json or no terminal."""
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            *counters,
            TimeElapsedColumn(),
            console=self.stderr,
            transient=True,
            disable=self.quiet or self.json_mode or not self.stderr.is_terminal,
        )

    @contextmanager
    def progress(self, description: str, total: int):
        """A progress bar counting steps; yields the function that advances it by one."""
        from rich.progress import MofNCompleteColumn

        with self._bar(MofNCompleteColumn()) as progress:
            task = progress.add_task(description, total=total)
            yield lambda: progress.advance(task)

    @contextmanager
    def progress_fraction(self, description: str):
        """A progress bar driven by (what is being done, fraction done) callbacks."""
        with self._bar() as progress:
            task = progress.add_task(description, total=1.0)
            yield lambda what, fraction: progress.update(task, description=what, completed=fraction)


def command_line() -> list[str]:
    """How this run was invoked, as a user would type it."""
    return ["dnnperf", *sys.argv[1:]]


def main(argv: Sequence[str] | None = None) -> int:
    # The stop signals are handled from here on, before the parser imports torch: a Ctrl-C or SIGTERM
    # while it loads is one line and 130 or 143, as later (SIGTERM saves partial results like Ctrl-C).
    with stop_on_signals():
        try:
            return run_command(argv)
        except KeyboardInterrupt:
            sys.stderr.write("dnnperf: interrupted\n")
            sys.stderr.flush()
            return interrupted_exit_code()


def run_command(argv: Sequence[str] | None) -> int:
    """Parse the command line and run its command; every error a user can fix is one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what ranks of a distributed run re-run
    handler: Callable[[argparse.Namespace, Output], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    out = Output(args.json, args.quiet)
    try:
        return handler(args, out)
    except DnnperfError as error:
        out.error(f"error: {error}")
        return EXIT_USAGE
    except MemoryError as error:  # asked for more than the host has (a batch of 10^13 samples)
        out.error(f"error: more memory than this host has was asked for ({error}): try a smaller batch")
        return EXIT_USAGE
    except Exception as error:  # a bug in dnnperf or the workload: say so in one line unless debugging
        if os.environ.get("DNNPERF_DEBUG"):
            raise
        out.error(f"internal error: {type(error).__name__}: {error} (set DNNPERF_DEBUG=1 for the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
