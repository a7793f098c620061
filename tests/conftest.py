"""Shared fixtures: every test gets its own runs and dataset directories, and a small thread count."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

# Two cores here and in CI: one intra-op thread per test process keeps timings stable and leaves a
# core for DataLoader workers and subprocesses.
torch.set_num_threads(1)

#: A test parametrized over these runs on the CPU everywhere and on the GPU where there is one.
_NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=_NO_GPU)]


#: The model's calibration cache (microbenchmarks of this host: the gloo link, the layer zoo, the
#: per-call overhead, the page-fault cost) carried from test to test, as a user's cache keeps it: each
#: is a fact about the machine, and measuring the gloo link alone takes ~10 s. Every other cache
#: (workload descriptions, FLOPs) stays per test.
_CALIBRATION = "model-calibration.json"
_shared_calibration: dict[str, str] = {}


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    runs, data = tmp_path / "runs", tmp_path / "datasets"
    cache = tmp_path.parent / f"{tmp_path.name}-cache"  # beside it: tests check that tmp_path stays empty
    monkeypatch.setenv("DNNPERF_RUNS_DIR", str(runs))
    monkeypatch.setenv("DNNPERF_DATA_DIR", str(data))
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(cache))
    # Counting a workload's page faults starts a fresh interpreter per description (perfmodel/faults.py):
    # seconds each, and the caches above are per test. tests/test_model_faults.py turns it back on.
    monkeypatch.setenv("DNNPERF_COUNT_FAULTS", "0")
    if "text" in _shared_calibration:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / _CALIBRATION).write_text(_shared_calibration["text"], encoding="utf-8")
    yield {"runs": runs, "data": data}
    with contextlib.suppress(OSError):  # no calibration made yet
        _shared_calibration["text"] = (cache / _CALIBRATION).read_text(encoding="utf-8")


def cli_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a CLI test's process: one intra-op thread, and tables at their piped width
    whatever $COLUMNS the shell running the tests has."""
    inherited = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return {**inherited, "OMP_NUM_THREADS": "1", **(env or {})}


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Run ``python -m dnnperf ARGS`` in a fresh process, as a user would, capturing both streams."""
    full_env = cli_env(env)
    return subprocess.run(
        [sys.executable, "-m", "dnnperf", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


_BATCH_DRIVER = """
import contextlib, io, json, sys, traceback
from dnnperf.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse's own exits (help, usage errors)
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:  # what python -m dnnperf would print, so a test sees the traceback
            traceback.print_exc()
            code = 1
    results.append([code, out.getvalue(), err.getvalue()])
sys.stdout.write(json.dumps(results))
"""


def run_cli_batch(
    argvs: list[list[str]], env: dict[str, str] | None = None, timeout: float = 240
) -> list[subprocess.CompletedProcess]:
    """Several ``dnnperf`` command lines in one fresh process, ``main`` called for each with its own
    streams captured: for what a command prints before it does any work (help, bad input), where a
    process each would spend two seconds importing torch."""
    full_env = cli_env(env)
    done = subprocess.run(
        [sys.executable, "-c", _BATCH_DRIVER, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=True,
    )
    return [
        subprocess.CompletedProcess(["dnnperf", *argv], code, out, err)
        for argv, (code, out, err) in zip(argvs, json.loads(done.stdout), strict=True)
    ]


class KnownDelay:
    """A busy wait of a nominal length that logs how long each call really took.

    The log is the truth an injected-delay test compares against: on a loaded machine the wait can
    be preempted and overrun, so the nominal length is not a truth. It spins rather than sleeps: a
    vCPU that sleeps 20 ms can come back descheduled or cold, adding milliseconds to the work after
    it that no log would show. The log is a file so calls made in DataLoader workers count too.

    With ``cpu=True`` it spins for that much of this thread's CPU time and logs the CPU time it
    took: a known amount of work, the truth for a calibration that times host work on the thread's
    CPU clock, which another process's preemption leaves alone. That log is a list in memory: the
    calibration's clock would count a file's open and write (0.5 ms a call on a busy machine) as
    part of the work, and a CPU-time delay is this process's own anyway.
    """

    def __init__(self, seconds: float, log: Path, spin: bool = True, cpu: bool = False):
        self.seconds, self.log, self.spin = seconds, log, spin
        self.clock = time.thread_time if cpu else time.perf_counter
        self.in_memory: list[float] | None = [] if cpu else None
        log.unlink(missing_ok=True)

    def __call__(self, *_args: object) -> None:
        start = self.clock()
        if self.spin:
            while self.clock() - start < self.seconds:
                pass
        else:  # for a DataLoader worker: a spinning worker would compete with training for a core
            time.sleep(self.seconds)
        elapsed = self.clock() - start
        if self.in_memory is not None:
            self.in_memory.append(elapsed)
            return
        with open(self.log, "a") as out:
            out.write(f"{elapsed!r}\n")

    def durations(self) -> list[float]:
        if self.in_memory is not None:
            return list(self.in_memory)
        return [float(line) for line in self.log.read_text().split()] if self.log.exists() else []

    def per_step(self, steps: int, calls_per_step: int = 1) -> list[float]:
        """The delay each of the last ``steps`` steps really had (calls are made in step order)."""
        durations = self.durations()
        assert len(durations) >= steps * calls_per_step, "the injected delay ran fewer times than asked"
        last = durations[len(durations) - steps * calls_per_step :]
        return [sum(last[i : i + calls_per_step]) for i in range(0, len(last), calls_per_step)]

    def median(self) -> float:
        durations = self.durations()
        assert durations, "the injected delay never ran"
        return statistics.median(durations)


@pytest.fixture
def known_delay(tmp_path: Path):
    """Make KnownDelay objects logging under this test's temporary directory."""
    counter = iter(range(1_000_000))
    return lambda seconds, spin=True, cpu=False: KnownDelay(
        seconds, tmp_path / f"delay-{next(counter)}.log", spin, cpu
    )


def open_files_in(directory: Path | str) -> dict[str, int]:
    """This process's open files under ``directory``, unlinked ones included (Linux: the links under
    /proc/self/fd): link target -> size in bytes."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)):
                found[target] = os.stat(f"/proc/self/fd/{fd}").st_size
    return found
