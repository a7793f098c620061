"""``dnnperf watch [options] -- COMMAND ...``: run a command, sample its process tree and GPUs, keep a
record (``dnnperf.watch.recording``), then its HTML report and tables. Exits with the command's status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dnnperf.cli.options import common, positive_float
from dnnperf.cli.output import Output, command_line, write_html_report


def add_parsers(commands: Any) -> None:
    parser = commands.add_parser(
        "watch",
        help="run any command and sample its process tree and GPUs: CPU, memory, I/O, GPU, step marks",
        usage="dnnperf watch [options] -- COMMAND ...",
    )
    parser.add_argument("--interval", type=positive_float, default=0.1, help="seconds between samples (0.1)")
    parser.add_argument(
        "--grace",
        type=positive_float,
        default=30.0,
        help="seconds a command asked to stop (Ctrl-C, SIGTERM) gets before it is killed (30)",
    )
    parser.add_argument(
        "--leftover-grace",
        type=positive_float,
        default=5.0,
        help="seconds processes left behind by the command get to end before SIGTERM (5)",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="do not write the HTML report beside the record"
    )
    parser.add_argument(
        "watched", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run and watch"
    )
    common(parser, runs=True)
    parser.set_defaults(handler=cmd_watch)


def cmd_watch(args: argparse.Namespace, out: Output) -> int:
    return run(args, out, command_line())


def run(args: argparse.Namespace, out: Any, command: list[str]) -> int:
    """Watch the command, keep the record, report; the command's exit status."""
    from dnnperf.watch.recording import watch_and_record

    argv = list(args.watched)
    if argv and argv[0] == "--":
        argv = argv[1:]
    # With --json the command's own output goes to stderr: stdout carries the one JSON document.
    record, path, result = watch_and_record(
        argv,
        args.runs_dir,
        command,
        interval_s=args.interval,
        grace_s=args.grace,
        leftover_grace_s=args.leftover_grace,
        stdout=sys.stderr.fileno() if args.json else None,
    )
    finish(args, out, record, path)
    return result.shell_exit_code


def finish(args: argparse.Namespace, out: Any, record: Any, path: Path) -> None:
    """The HTML report beside the record (unless --no-report), then the JSON document or the summary."""
    from dnnperf.report.html import default_path

    html = None if args.no_report else write_html_report(record, default_path(path), out)
    if args.json:
        out.json(
            {"record_path": str(path), "record": record.to_dict(), "report_path": str(html) if html else None}
        )
        return
    from dnnperf.report.terminal import watch_tables

    for table in watch_tables(record):
        out.print(table)
    out.print(f"record: {path}")
    if html is not None:
        out.print(f"report: {html}")
