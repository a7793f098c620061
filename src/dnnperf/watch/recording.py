"""Watching a command with a record kept: ``dnnperf watch [options] -- COMMAND ...`` (its command
line is ``dnnperf.cli.watch``).

The record (kind "watch") is saved once the command has started, then while it runs (see
:class:`Saver`: the record grows with the run, and so does a save) and once at the end, atomically
each time: a watcher killed outright leaves a "running" record with its samples up to its last save,
which ``dnnperf runs`` shows as interrupted.

The record's status is about the measurement, not the command: "complete" when the command ended on
its own, whatever its exit code or signal (``watch.end``, ``watch.exit_code`` and ``watch.signal``
say how it ended); "partial" when the watcher was asked to stop (Ctrl-C, SIGTERM) and ended it;
"failed" when the watcher itself failed. ``dnnperf watch`` exits with the command's status.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dnnperf.errors import UsageError
from dnnperf.results.watch import WatchResult

if TYPE_CHECKING:
    from dnnperf.results.record import RunRecord

#: The most often a running watch rewrites its record.
SAVE_EVERY_S = 1.0
#: A running watch waits this many times its last save's duration before the next: the record grows
#: with the run, and saving it takes no more than about 1/SAVE_SPACING of the watcher's time.
SAVE_SPACING = 20.0
#: Interpreters whose first argument that is not an option is the program being run.
INTERPRETERS = ("python", "python3", "bash", "sh", "node", "ruby", "perl")


def program_name(argv: list[str]) -> str:
    """What a record calls the command: the program, or the script an interpreter runs
    (``python train.py`` -> ``train.py``, ``bash -c "..."`` -> ``bash``)."""
    program = os.path.basename(argv[0]) or argv[0]
    interpreter = program.rstrip("0123456789.") if program.startswith("python") else program
    if interpreter in INTERPRETERS or program.startswith("python"):
        for argument in argv[1:]:
            if argument == "-c" or argument == "-m":
                break
            if not argument.startswith("-"):
                return os.path.basename(argument) or argument
    return program


def new_record(argv: list[str], interval_s: float, command: list[str]) -> RunRecord:
    """The record of a watch that is about to start ("running", this process its writer)."""
    from dnnperf.results.record import RunRecord
    from dnnperf.results.settings import WatchSettings

    name = program_name(argv)
    return RunRecord.start(
        "watch",
        {"name": name, "preset": "watch"},
        WatchSettings(device="cpu", data="external", interval_s=interval_s),
        command=command,
    )


class Saver:
    """Saves a running watch's record at most every ``SAVE_EVERY_S`` seconds, and no sooner than
    ``SAVE_SPACING`` times the last save's duration after it."""

    def __init__(
        self,
        save: Callable[[], object],
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.save, self.clock, self.cpu_clock = save, clock, cpu_clock
        self.due = -math.inf

    def maybe_save(self) -> float:
        """Save if one is due; the CPU seconds the save took (0 when none was due)."""
        began = self.clock()
        if began < self.due:
            return 0.0
        cpu = self.cpu_clock()
        self.save()
        ended = self.clock()
        self.due = ended + max(SAVE_EVERY_S - (ended - began), SAVE_SPACING * (ended - began))
        return max(self.cpu_clock() - cpu, 0.0)


def record_status(result: WatchResult) -> str:
    """The measurement's status (see the module): partial when the watcher was asked to stop."""
    return "partial" if result.end == "interrupted" else "complete"


def watch_and_record(
    argv: list[str],
    runs_dir: Path | None,
    command: list[str],
    interval_s: float,
    grace_s: float,
    leftover_grace_s: float,
    stdout: int | None = None,
) -> tuple[RunRecord, Path, WatchResult]:
    """Watch ``argv``, its record saved in ``runs_dir`` (None: the default) as it grows (see the
    module) and at the end; the record, its path and the result. ``stdout``: where the command's own
    output goes (inherited when None)."""
    from dnnperf.results.record import utc_now
    from dnnperf.results.store import RunStore
    from dnnperf.watch.run import check_arguments, watch

    check_arguments(argv, interval_s)
    store = RunStore(runs_dir)
    record = new_record(argv, interval_s, command)
    saver = Saver(lambda: store.save(record))

    def update(result: WatchResult) -> None:
        record.watch = result
        if not result.ended and result.t:  # the wall time so far, for a record the watcher never ends
            result.wall_s = result.t[-1]
        if result.gpus:
            record.settings["device"] = "cuda"

    def keep(result: WatchResult) -> None:
        update(result)
        saved_cpu_s = saver.maybe_save()
        if result.cost.cpu_s:  # the save is the watcher's cost too: counted with the sample it follows
            result.cost.cpu_s[-1] += saved_cpu_s

    try:
        result = watch(
            argv,
            interval_s=interval_s,
            on_sample=keep,
            grace_s=grace_s,
            outlive_grace_s=leftover_grace_s,
            stdout=stdout,
        )
    except BaseException as error:
        if record.watch is None:  # the command never started (not found): nothing measured, no record
            raise
        record.watch.align()  # a sample the failure cut short is dropped: the record must load
        record.status, record.finished = "failed", utc_now()
        record.error = f"{type(error).__name__}: {error}"
        with contextlib.suppress(UsageError):  # a record that cannot be saved keeps its last save
            store.save(record)
        raise
    update(result)
    record.status, record.finished = record_status(result), utc_now()
    return record, store.save(record), result
