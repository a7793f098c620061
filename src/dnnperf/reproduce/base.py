"""What a reproduction is: a paper's claims set beside what dnnperf's public commands measured.

A reproduction runs ``dnnperf`` commands in a fresh process each (as a user would), into one runs
directory, reads their records and turns them into claims: the paper's finding, the figures measured
here, a verdict (``holds`` or ``differs``) and why, and the commands that produced the figures.
Rendering (markdown, terminal) is separate from measuring.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from dnnperf.errors import DnnperfError
from dnnperf.interrupts import run_child
from dnnperf.results.record import RunRecord
from dnnperf.results.store import read_record

SIZES = ("smoke", "default")
HOLDS, DIFFERS = "holds", "differs"


@dataclass
class Claim:
    """One finding of a paper and what was measured here."""

    claim: str
    measured: str
    verdict: str  # holds | differs
    why: str
    commands: list[str]


@dataclass
class Reproduction:
    """One paper's experiment, re-run: claims, the tables behind them, where and when."""

    key: str
    seed: str
    title: str
    size: str
    claims: list[Claim] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    commit: str = ""
    #: The host's load average over 1, 5 and 15 minutes when the reproduction ended (others' work).
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class Session:
    """Runs dnnperf's public commands, each in a fresh process, into one runs directory."""

    def __init__(self, runs_dir: Path, on_command: Callable[[str], None] | None = None) -> None:
        self.runs_dir = Path(runs_dir)
        self.on_command = on_command
        self.commands: list[str] = []

    def run(self, *args: str, env: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
        """``dnnperf ARGS --json``: (the command as a user types it, its JSON document); ``env`` adds
        environment variables (the command shown does not carry them: the caller says them)."""
        shown = shlex.join(["dnnperf", *args])
        if self.on_command is not None:
            self.on_command(shown)
        full = [sys.executable, "-m", "dnnperf", *args, "--json", "--runs-dir", str(self.runs_dir)]
        if args[0] in ("libcompare", "hw"):  # commands that write no run record
            full = [sys.executable, "-m", "dnnperf", *args, "--json"]
        done = run_child(full, {**os.environ, **(env or {})})
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise DnnperfError(f"`{shown}` failed (exit {done.returncode}): {last}")
        self.commands.append(shown)
        return shown, json.loads(done.stdout)

    def hardware(self, quick: bool) -> tuple[str, str]:
        """The calibrated profile efficiencies are computed against: (the command that made or showed
        it, its path). The one ``dnnperf hw`` saved is reused; else the machine is calibrated (quickly
        for a smoke run, into the runs directory, so a saved full profile is never replaced)."""
        try:
            shown, document = self.run("hw", "--show")
        except DnnperfError:
            if quick:
                quick_profile = self.runs_dir / "hardware" / "hw-quick.json"  # not among the records
                quick_profile.parent.mkdir(parents=True, exist_ok=True)
                shown, document = self.run("hw", "--quick", "--output", str(quick_profile))
            else:
                shown, document = self.run("hw")
        return shown, document["profile_path"]

    def profile(self, *args: str) -> tuple[str, RunRecord, dict[str, Any]]:
        """``dnnperf profile ARGS`` without its HTML report: (command, record, the JSON document)."""
        shown, document = self.run("profile", *args, "--no-report")
        shown = shown.replace(" --no-report", "")
        return shown, read_record(Path(document["record_path"])), document


def started() -> float:
    return time.perf_counter()


def finish(reproduction: Reproduction, start: float) -> Reproduction:
    """Stamp the machine, software, date and duration."""
    from dnnperf import environment

    reproduction.machine = environment.machine()
    reproduction.software = environment.software()
    reproduction.commit = environment.source_commit()
    reproduction.load = os.getloadavg()
    reproduction.date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    reproduction.seconds = time.perf_counter() - start
    return reproduction


def verdict(ok: bool) -> str:
    return HOLDS if ok else DIFFERS


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def commands_of(*groups: Sequence[str] | str) -> list[str]:
    """Commands in the order given, each once."""
    seen: list[str] = []
    for group in groups:
        for command in [group] if isinstance(group, str) else group:
            if command not in seen:
                seen.append(command)
    return seen
