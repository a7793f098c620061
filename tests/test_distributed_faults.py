"""A rank that crashes or hangs stops the whole run within a bounded time, the message names it, no
process is left behind and the steps measured before are kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dnnperf.distributed.launch import STALE_BEAT_S, STARTUP_S, diagnose

pytestmark = pytest.mark.slow


def _start(runs: Path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "dnnperf", "profile", "basic_cnn", "--nproc", "2", "--strategy", "dp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DNNPERF_RUNS_DIR": str(runs)}
    return subprocess.Popen(
        [*command, "-b", "8", "--warmup", "0", "--steps", "100000", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _measured_steps(runs: Path) -> int:
    for path in runs.glob("*.json"):
        try:
            return len(json.loads(path.read_text())["points"][0]["step_s"])
        except (ValueError, KeyError, IndexError, OSError):
            return 0
    return 0


def _rank_process(cli: subprocess.Popen, rank: int, runs: Path, seen: dict[int, psutil.Process]):
    """Rank ``rank``'s process (found by its RANK environment variable), once steps are recorded;
    every descendant met on the way is remembered in ``seen``."""
    deadline = time.monotonic() + 120
    target = None
    while time.monotonic() < deadline:
        assert cli.poll() is None, cli.communicate()
        for child in psutil.Process(cli.pid).children(recursive=True):
            seen.setdefault(child.pid, child)
            try:
                if child.environ().get("RANK") == str(rank) and "dnnperf" in " ".join(child.cmdline()):
                    target = child
            except psutil.Error:
                continue
        if target is not None and _measured_steps(runs) >= 3:
            return target
        time.sleep(0.1)
    raise AssertionError("the run never reached three measured steps")


def _assert_nothing_left(seen: dict[int, psutil.Process]) -> None:
    alive = []
    for process in seen.values():
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append((process.pid, process.cmdline()))
        except psutil.NoSuchProcess:
            continue
    assert not alive, f"processes left behind: {alive}"


def _kept_record(runs: Path) -> dict:
    (path,) = runs.glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.concurrent  # what it bounds (a minute to stop) no busy host comes near
def test_killed_rank_stops_the_run_names_it_and_leaves_nothing(tmp_path):
    runs = tmp_path / "runs"
    cli = _start(runs)
    seen: dict[int, psutil.Process] = {}
    try:
        victim = _rank_process(cli, 1, runs, seen)
        killed = time.monotonic()
        victim.kill()
        _, stderr = cli.communicate(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 1 and elapsed < 60, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("dnnperf: error: rank 1 died"), lines[0]
    _assert_nothing_left(seen)
    record = _kept_record(runs)
    assert record["status"] == "failed" and "rank 1" in record["error"]
    assert len(record["points"][0]["step_s"]) >= 3  # what was measured before the kill is kept
    # every step but the one the kill interrupted reached rank 0 from both ranks
    gathered = len(record["points"][0]["ranks"]["per_rank"][1]["wall_s"])
    assert len(record["points"][0]["step_s"]) - 1 <= gathered <= len(record["points"][0]["step_s"])


def test_frozen_rank_is_named_after_the_timeout_and_everything_is_killed(tmp_path):
    runs = tmp_path / "runs"
    timeout = 4.0
    cli = _start(runs, "--timeout", str(timeout))
    seen: dict[int, psutil.Process] = {}
    try:
        victim = _rank_process(cli, 1, runs, seen)
        stopped = time.monotonic()
        victim.send_signal(signal.SIGSTOP)  # a true hang: the process never runs again
        _, stderr = cli.communicate(timeout=60)
        elapsed = time.monotonic() - stopped
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 1
    assert timeout <= elapsed < timeout + 20  # no earlier than the timeout, soon after it
    assert "dnnperf: error: rank 1 stopped responding" in stderr, stderr
    _assert_nothing_left(seen)
    assert "rank 1" in _kept_record(runs)["error"]


# --------------------------------------------------------------------------------------------------
# The diagnosis on hand-made heartbeats
# --------------------------------------------------------------------------------------------------

NOW = 1000.0


def beat(rank: int, state: str = "running", step: int = 5, progress_at: float = NOW, **extra) -> dict:
    return {
        "rank": rank, "pid": 100 + rank, "state": state, "step": step, "stage": "backward",
        "progress_at": progress_at, "beat": NOW, "error": None, "failed_at": None, **extra,
    }  # fmt: skip


def test_diagnosis_of_heartbeats():
    everyone = lambda pid: True  # noqa: E731
    fine = {0: beat(0), 1: beat(1)}
    assert diagnose(fine, 2, NOW, 10, 0.0, everyone) is None
    # a rank gone without a final state crashed, even if the other has already failed because of it
    states = {0: beat(0, "failed", failed_at=NOW - 1, error="RuntimeError: peer closed"), 1: beat(1)}
    fault = diagnose(states, 2, NOW, 10, 0.0, lambda pid: pid != 101)
    assert (fault.rank, fault.kind) == (1, "crashed")
    # otherwise the first rank to fail is the cause
    states = {
        0: beat(0, "failed", failed_at=NOW - 1, error="RuntimeError: peer closed"),
        1: beat(1, "failed", failed_at=NOW - 2, error="ValueError: bad"),
    }
    fault = diagnose(states, 2, NOW, 10, 0.0, everyone)
    assert (fault.rank, fault.kind) == (1, "failed") and "ValueError: bad" in fault.message
    # no progress anywhere for the timeout: the rank the others wait for (fewest steps) hung
    states = {0: beat(0, step=6, progress_at=NOW - 20), 1: beat(1, step=5, progress_at=NOW - 30)}
    fault = diagnose(states, 2, NOW, 10, 0.0, everyone)
    assert (fault.rank, fault.kind) == (1, "hung") and "made no progress" in fault.message
    assert diagnose(states, 2, NOW, 25, 0.0, everyone) is None  # rank 0 progressed 20 s ago
    starting = {0: beat(0, step=0, progress_at=NOW - 20), 1: beat(1, step=0, progress_at=NOW - 30)}
    assert diagnose(starting, 2, NOW, 10, 0.0, everyone) is None  # start-up gets STARTUP_S
    # a frozen process (stale heartbeat) is named before a merely waiting one
    states = {0: beat(0, step=4, progress_at=NOW - 20), 1: beat(1, step=5, progress_at=NOW - 20)}
    states[1]["beat"] = NOW - STALE_BEAT_S - 1
    fault = diagnose(states, 2, NOW, 10, 0.0, everyone)
    assert fault.rank == 1 and "frozen" in fault.message
    states[0].update(state="failed", failed_at=NOW - 1, error="RuntimeError: timed out")  # gave up waiting
    assert diagnose(states, 2, NOW, 10, 0.0, everyone).rank == 1
    # a rank that never wrote a heartbeat
    long_ago = NOW - STARTUP_S - 1
    fault = diagnose({0: beat(0, step=0, progress_at=long_ago)}, 2, NOW, 10, long_ago, everyone)
    assert (fault.rank, fault.kind) == (1, "hung") and "never started" in fault.message
    # bad input on a rank is reported as such
    fault = diagnose({0: beat(0, "usage", error="gpt2 has no split"), 1: beat(1)}, 2, NOW, 10, 0.0, everyone)
    assert (fault.kind, fault.message) == ("usage", "gpt2 has no split")
