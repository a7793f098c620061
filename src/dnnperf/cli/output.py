"""What the commands print: stdout carries results only (a single JSON document with --json); logs,
progress and errors go to stderr. Also the run's tables and HTML report, which several commands end
with (bench, profile, its distributed ranks, show, watch)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnnperf.errors import one_line

if TYPE_CHECKING:
    from rich.progress import Progress


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


def write_html_report(record: Any, path: Path, out: Output) -> Path:
    from dnnperf.report.html import SECTIONS, write_report

    with out.progress("writing the report", total=len(SECTIONS)) as advance:
        return write_report(record, path, advance=advance)


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

            for table in ranks_tables(point.batch_size, point.ranks, record.settings.get("distributed")):
                out.print(table)
