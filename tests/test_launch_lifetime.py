"""The launcher's lifetime rules: the ranks' own final heartbeats decide a run's outcome (a slow or
signalled exit after every rank said "done" is no failure), nothing the launch starts outlives a
SIGKILLed dnnperf, and pp's bad micro-batch counts are refused before any rank starts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dnnperf import cli
from dnnperf.distributed import launch
from dnnperf.distributed.heartbeat import Heartbeat, heartbeat_path
from dnnperf.jsonio import write_json_atomic
from dnnperf.results.record import RunRecord

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

# --------------------------------------------------------------------------------------------------
# The outcome, decided on heartbeats written by the ranks' own writer and a job of fake processes
# --------------------------------------------------------------------------------------------------


class FakeJob:
    """Processes that exit by themselves with ``code`` after ``exits_after`` seconds of the fake clock
    (never, when None); stopping them ends them with ``stop_code`` (SIGTERM, then SIGKILL)."""

    def __init__(self, clock: FakeClock, exits_after: float | None, code: int, stop_code: int = -15) -> None:
        self.clock, self.exits_after, self.code, self.stop_code = clock, exits_after, code, stop_code
        self.stopped_while_running = False
        self.ended: int | None = None

    def refresh(self) -> None:
        pass

    def poll(self) -> int | None:
        if self.ended is None and self.exits_after is not None and self.clock.now >= self.exits_after:
            self.ended = self.code
        return self.ended

    def stop(self, grace: float) -> None:
        if self.poll() is None:
            self.stopped_while_running = True
            self.ended = self.stop_code


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def finished(directory: Path, rank: int, state: str, error: str | None = None) -> None:
    """Rank ``rank``'s final heartbeat, written by the heartbeat's own writer."""
    Heartbeat(directory, rank, interval=60.0).start().finish(state, error)


def running_in_a_dead_process(directory: Path, rank: int) -> None:
    """A "running" heartbeat whose process has exited (a rank killed before it could report)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state = {**Heartbeat(directory, rank).state, "pid": gone.pid, "state": "running", "beat": time.time()}
    write_json_atomic(heartbeat_path(directory, rank), state)


def supervise(job: FakeJob, directory: Path, clock: FakeClock):
    return launch.supervise(job, directory, 2, 300.0, clock.time(), clock=clock.time, sleep=clock.sleep)


@pytest.mark.parametrize("code", [-15, -9, 1])
def test_ranks_that_finished_and_exit_slowly_by_a_signal_are_a_success(tmp_path, code):
    """Every rank said "done"; the processes take 4 grace periods to go, then end by a signal (or a
    failing teardown): the run is a success, and nobody was stopped while still going."""
    clock = FakeClock()
    for rank in range(2):
        finished(tmp_path, rank, "done")
    job = FakeJob(clock, exits_after=4 * launch.GRACE_S, code=code)
    assert supervise(job, tmp_path, clock) == (None, 0)
    assert not job.stopped_while_running
    assert clock.now >= 4 * launch.GRACE_S  # it waited for them (fake clock)


def test_finished_ranks_that_never_exit_are_killed_after_the_teardown_time_and_still_a_success(tmp_path):
    clock = FakeClock()
    for rank in range(2):
        finished(tmp_path, rank, "done")
    job = FakeJob(clock, exits_after=None, code=0, stop_code=-9)
    assert supervise(job, tmp_path, clock) == (None, 0)
    assert job.stopped_while_running and clock.now >= launch.TEARDOWN_S


def test_a_rank_that_failed_or_died_is_still_a_failure(tmp_path):
    """The ranks' word decides both ways: one "failed" (or one gone while "running") is a fault."""
    clock = FakeClock()
    finished(tmp_path, 0, "done")
    finished(tmp_path, 1, "failed", "ValueError: bad")
    fault, code = supervise(FakeJob(clock, exits_after=1.0, code=1), tmp_path, clock)
    assert (fault.rank, fault.kind, code) == (1, "failed", 1) and "ValueError: bad" in fault.message
    running_in_a_dead_process(tmp_path, 1)
    fault, code = supervise(FakeJob(clock, exits_after=clock.now + 1.0, code=-9), tmp_path, clock)
    assert (fault.rank, fault.kind, code) == (1, "crashed", -9)


def test_ranks_stopped_from_outside_are_interrupted(tmp_path):
    clock = FakeClock()
    finished(tmp_path, 0, "interrupted")
    finished(tmp_path, 1, "done")
    fault, _ = supervise(FakeJob(clock, exits_after=1.0, code=-15), tmp_path, clock)
    assert fault.kind == "interrupted"


# --------------------------------------------------------------------------------------------------
# pp's micro-batches are checked before anything starts
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("gpt2", "--microbatches", "8", "-b", "4"), "cannot be cut into 8 micro-batches"),
        (("basic_cnn", "--microbatches", "2", "--sweep", "2,8,1"), "a batch of 1 cannot be cut into 2"),
        (("basic_cnn", "--nproc", "11", "-b", "16"), "cannot cut 10 layers into 11 pipeline stages"),
        (("neumf", "-b", "4"), "--strategy pp cannot cut 'neumf' into stages"),
    ],
)
def test_pp_refuses_bad_micro_batches_before_any_rank_starts(args, needle, monkeypatch, capsys):
    """One line, exit 2, and the launcher (the only starter of torchrun and ranks) never called."""
    workload, *rest = args
    started: list[object] = []
    monkeypatch.setattr(launch, "launch", lambda *a, **k: started.append(a))
    nproc = [] if "--nproc" in rest else ["--nproc", "2"]
    code = cli.main(["profile", workload, *nproc, "--strategy", "pp", *rest, "--steps", "1"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and started == []
    assert len(captured.err.strip().splitlines()) == 1 and needle in captured.err, captured.err
    runs = Path(os.environ["DNNPERF_RUNS_DIR"])
    assert not runs.exists() or not list(runs.glob("*.ranks.log"))


@pytest.mark.parametrize(("device", "gpus"), [("cuda", 1), ("cuda", 0)])
def test_more_ranks_than_gpus_are_refused_before_any_rank_starts(device, gpus, monkeypatch, capsys):
    """Rank r trains on cuda:r: with fewer GPUs than ranks the extra ranks would fail after starting."""
    import torch

    started: list[object] = []
    monkeypatch.setattr(launch, "launch", lambda *a, **k: started.append(a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    code = cli.main(["profile", "basic_cnn", "--nproc", "2", "--device", device, "-b", "4", "--steps", "1"])
    captured = capsys.readouterr()
    assert code == 2 and started == [] and len(captured.err.strip().splitlines()) == 1, captured.err
    assert ("needs 2 GPUs" if gpus else "no CUDA GPU") in captured.err


def test_auto_with_more_ranks_than_gpus_trains_the_ranks_on_the_cpu(monkeypatch, capsys):
    """``--device auto`` picks what works: the ranks are told to use the CPU, and the user is told."""
    import torch

    launched: list[list[str]] = []
    monkeypatch.setattr(launch, "launch", lambda argv, *a, **k: launched.append(list(argv)) or None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with contextlib.suppress(AttributeError):  # the fake launch returns no outcome to report
        cli.main(["profile", "basic_cnn", "--nproc", "2", "-b", "4", "--steps", "1"])
    (argv,) = launched
    assert argv[-2:] == ["--device", "cpu"] and "train on the CPU" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# SIGKILL of dnnperf: its ranks, torchrun and the lifeline go with it, and so do its temporary files
# --------------------------------------------------------------------------------------------------


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = "dnnperf-probe-lifetime"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode:
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


def _steps_done(rank_dir: str | None) -> int:
    """Rank 0's steps done, as its heartbeat says (0 until it has one)."""
    try:
        return int(json.loads(heartbeat_path(Path(rank_dir or ""), 0).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _carrying(run_id: str) -> list[psutil.Process]:
    """Every live process on the machine whose environment carries the run's id."""
    found = []
    for process in psutil.process_iter():
        try:
            if _alive(process) and process.environ().get("DNNPERF_RUN_ID") == run_id:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _namespace_of(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    ["torchrun", pytest.param("netns", marks=pytest.mark.skipif(not _netns_usable(), reason="no netns"))],
)
def test_sigkill_of_dnnperf_leaves_no_process_directory_or_empty_log(tmp_path, mode):
    runs, scratch = tmp_path / "runs", tmp_path / "scratch"  # scratch: the run's temporary directory
    scratch.mkdir()
    command = [sys.executable, "-m", "dnnperf", "profile", "basic_cnn", "--nproc", "2", "--strategy", "dp",
               "-b", "8", "--warmup", "0", "--steps", "100000"]  # fmt: skip
    command += ["--netns"] if mode == "netns" else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DNNPERF_RUNS_DIR": str(runs), "TMPDIR": str(scratch)}
    cli_process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, psutil.Process] = {}  # every descendant met while the run goes
    run_id, rank_dir, namespaces = None, None, set()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (run_id and _steps_done(rank_dir) >= 1):
            assert cli_process.poll() is None, "dnnperf ended before its first measured step"
            for child in psutil.Process(cli_process.pid).children(recursive=True):
                seen.setdefault(child.pid, child)
                try:
                    run_id = child.environ().get("DNNPERF_RUN_ID") or run_id
                    rank_dir = child.environ().get("DNNPERF_RANK_DIR") or rank_dir
                    # A rank's `ip netns exec` carries RANK before it enters the namespace: only
                    # the rank itself, once exec'd, must be inside one.
                    is_rank = child.cmdline()[:1] != ["ip"]
                    if mode == "netns" and child.environ().get("RANK") is not None and is_rank:
                        namespaces.add(_namespace_of(child.pid))
                except psutil.Error:
                    continue
            time.sleep(0.1)
        assert run_id and _steps_done(rank_dir) >= 1, "no measured step within the deadline"
        assert list(runs.glob("*.json"))  # rank 0's record, saved as the run goes
        ranks = [p for p in seen.values() if _alive(p) and "dnnperf" in " ".join(p.cmdline())]
        assert len(ranks) >= 2  # the ranks (and torchrun) were there to be left behind
    finally:
        cli_process.kill()  # SIGKILL: dnnperf itself gets no chance to clean up
        cli_process.wait()

    def record() -> RunRecord:
        (path,) = runs.glob("*.json")
        return RunRecord.from_dict(json.loads(path.read_text()))

    # Generous: a loaded machine is slow to end processes, and a killed rank whose parent died too
    # stays a zombie (its pid taken, its record "running") until init reaps it.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        left = [p for p in seen.values() if _alive(p)] + _carrying(run_id)
        if (
            not left
            and not list(scratch.glob("dnnperf-ranks-*"))
            and record().effective_status() != "running"
        ):
            break
        time.sleep(0.2)
    left = {p.pid: p.cmdline() for p in [*seen.values(), *_carrying(run_id)] if _alive(p)}
    assert not left, f"processes left behind: {left}"
    assert not list(scratch.glob("dnnperf-ranks-*"))
    assert [p for p in runs.glob("*.ranks.log") if p.stat().st_size == 0] == []
    assert record().id == run_id and record().status == "running"  # nobody could mark it
    assert record().effective_status() == "interrupted"
    if mode == "netns":
        assert namespaces and all(namespaces)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [name for name in namespaces if name in listed]


def test_a_lifeline_released_by_a_finished_launch_touches_nothing_and_exits(tmp_path):
    """The normal end: "done" on the pipe; the lifeline exits and leaves the (empty) log and the
    directory it was told about as they are."""
    from dnnperf.distributed.lifeline import Lifeline

    directory, log = tmp_path / "ranks", tmp_path / "run.ranks.log"
    directory.mkdir()
    log.touch()
    lifeline = Lifeline()
    lifeline.announce("dir", directory)
    lifeline.announce("log", log)
    lifeline.release()
    assert lifeline.process.returncode == 0
    assert directory.is_dir() and log.exists()


def test_a_lifeline_whose_launcher_is_gone_ends_the_job(tmp_path):
    """End of file without "done" (what the launcher's death looks like): the process carrying the
    rank directory in its environment is killed, the directory and the empty log removed, a log with
    output kept."""
    from dnnperf.distributed.lifeline import ENV_RANK_DIR, Lifeline

    directory, empty, written = tmp_path / "ranks", tmp_path / "a.ranks.log", tmp_path / "b.ranks.log"
    directory.mkdir()
    empty.touch()
    written.write_text("rank 1: something\n")
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, ENV_RANK_DIR: str(directory)},
        start_new_session=True,
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lifeline = Lifeline()
        for kind, value in (("dir", directory), ("log", empty), ("log", written)):
            lifeline.announce(kind, value)
        assert lifeline.process.stdin is not None
        lifeline.process.stdin.close()  # as the kernel does when the launcher dies
        lifeline.process.wait(timeout=120)
        assert rank.wait(timeout=120) == -signal.SIGKILL
        assert bystander.poll() is None  # not the job's
        assert not directory.exists() and not empty.exists() and written.exists()
    finally:
        for process in (rank, bystander):
            process.kill()
            process.wait()


def test_a_record_whose_writer_is_a_zombie_reads_interrupted():
    """A killed rank 0 stays a zombie until its parent reaps it: psutil.pid_exists says it exists,
    but nothing will ever write the record again."""
    import platform

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        assert psutil.pid_exists(child.pid)
        record = RunRecord(
            id="r1",
            kind="bench",
            workload={"name": "basic_cnn", "preset": "tiny"},
            settings={"device": "cpu", "data": "memory"},
            environment={"machine": {"hostname": platform.node()}, "software": {}},
            status="running",
            pid=child.pid,
        )
        assert record.effective_status() == "interrupted"
        record.pid = os.getpid()
        assert record.effective_status() == "running"
    finally:
        child.wait()


def test_sigkill_of_a_collective_calibration_leaves_no_rank_or_scratch_directory(tmp_path):
    """The gloo microbenchmark's ranks are dnnperf's processes too: they and their scratch directory go
    with the process that started them, however it dies."""
    import glob
    import tempfile

    scratch = f"{tempfile.gettempdir()}/dnnperf-collectives-*"
    before = set(glob.glob(scratch))
    code = (
        "from dnnperf.perfmodel.collective_calibration import measure; measure(rounds=100000, timeout_s=600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 120
        ranks: list[psutil.Process] = []
        while len(ranks) < 2 or set(glob.glob(scratch)) == before:  # both ranks started, scratch made
            assert time.monotonic() < deadline and parent.poll() is None, "the ranks never started"
            time.sleep(0.1)
            children = psutil.Process(parent.pid).children(recursive=True)
            marker = "dnnperf.perfmodel.collective_calibration"
            ranks = [p for p in children if marker in " ".join(_cmdline(p))]
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 120
    while any(_alive(p) for p in ranks) or set(glob.glob(scratch)) - before:
        assert time.monotonic() < deadline, ([p.pid for p in ranks if _alive(p)], glob.glob(scratch))
        time.sleep(0.2)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
