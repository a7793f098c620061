"""``dnnperf runs``, ``show``, ``report``, ``export`` and ``compare``: reading the run records."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dnnperf.cli.options import common, positive_int
from dnnperf.cli.output import Output, print_record, write_html_report
from dnnperf.errors import UsageError
from dnnperf.paths import output_directory, output_file, path_argument

#: The argument naming one run.
RUN_HELP = "run id, unique id prefix, or path to a record file"


def add_parsers(commands: Any) -> None:
    runs = commands.add_parser("runs", help="list the run records in the runs directory")
    common(runs, runs=True)
    runs.set_defaults(handler=cmd_runs)

    show = commands.add_parser("show", help="show one run record's results")
    show.add_argument("run", help=RUN_HELP)
    common(show, runs=True)
    show.set_defaults(handler=cmd_show)

    report = commands.add_parser("report", help="write a run's self-contained HTML report (charts, tables)")
    report.add_argument("run", help=RUN_HELP)
    report.add_argument(
        "-o", "--output", type=path_argument, help="the HTML file (default: beside the record)"
    )
    common(report, runs=True)
    report.set_defaults(handler=cmd_report)

    export = commands.add_parser("export", help="a run as a Chrome/Perfetto trace and as CSV tables")
    export.add_argument("run", help=RUN_HELP)
    export.add_argument("--trace", type=path_argument, help="write the trace (Trace Event Format JSON) here")
    export.add_argument(
        "--csv",
        type=path_argument,
        help="write stages.csv and layers.csv (a watch: samples.csv, processes.csv) into this directory",
    )
    common(export, runs=True)
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
    common(compare, runs=True)
    compare.set_defaults(handler=cmd_compare)


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


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    record = existing_store(args).load(args.run)
    if args.json:
        out.json(record.to_dict())
    else:
        print_record(record, out)
    return 0


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
