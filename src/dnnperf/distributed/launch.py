"""Launching N ranks on this machine and watching them until they end.

``dnnperf profile W --nproc N`` starts ``torchrun --standalone`` (or, with ``--netns``, one process
per network namespace) running the same command as N ranks, then watches:

- the ranks' heartbeats (``heartbeat.py``): a rank whose process is gone without a final state
  crashed; a rank that reported an error failed; when no rank has made progress (a new step or
  stage) for ``timeout_s``, the run hangs and the rank the others wait for is named;
- after a fault, the job gets a few seconds to stop on its own (torchrun tears the ranks down), then
  every process it started is killed (SIGKILL, by process id, also processes in other sessions:
  torchrun starts each rank in its own), and the launcher waits for them;
- once every rank has reported a final state, the ranks' own word decides the outcome: their
  processes get ``TEARDOWN_S`` to exit (closing the process group, torchrun's teardown) and are
  killed after it, and a run whose ranks all finished is a success whatever exit code that leaves.

Nothing the launch starts outlives it, also when the launcher is SIGKILLed: the processes it starts
get SIGKILL when it dies (the parent-death signal), and the lifeline (``lifeline.py``) kills whatever
else of the job is left and removes its rank directory, empty ranks log and network namespaces.

Rank 0 saves the record as it goes; the launcher marks it failed with the fault's message. A record
whose ranks were killed with the launcher stays "running" with rank 0's pid gone: "interrupted".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from dnnperf.distributed import DistributedSettings
from dnnperf.distributed.heartbeat import FINAL_STATES, RUNNING_STATES, heartbeat_path
from dnnperf.distributed.lifeline import ENV_RANK_DIR, Lifeline
from dnnperf.distributed.worker import ENV_LAUNCHED, ENV_RUN_ID
from dnnperf.errors import UsageError
from dnnperf.interrupts import (
    PR_SET_CHILD_SUBREAPER,
    die_with_this_process,
    interrupted_exit_code,
    libc_prctl,
)
from dnnperf.results.record import RunRecord, utc_now
from dnnperf.results.store import RunStore

POLL_S = 0.1
#: After a crash or failure, how long torchrun gets to tear the other ranks down before we kill them.
GRACE_S = 5.0
#: Once every rank has reported a final state, how long its processes get to exit before they are
#: killed; a slow exit (a loaded machine, torchrun's teardown) does not change the outcome.
TEARDOWN_S = 60.0
#: A heartbeat older than this means the rank's process is frozen (its heartbeat thread stopped).
STALE_BEAT_S = 3.0
#: Before every rank has finished a step (imports, rendezvous, building the model) the timeout is
#: at least this long.
STARTUP_S = 60.0


@dataclass(frozen=True)
class Fault:
    """Why a run stopped early: the rank at fault and a one-line explanation."""

    rank: int
    kind: str  # crashed | failed | hung | usage
    message: str


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def read_states(directory: Path, world: int) -> dict[int, dict[str, Any]]:
    """The ranks' latest heartbeats (ranks without a readable one are left out)."""
    states = {}
    for rank in range(world):
        try:
            states[rank] = json.loads(heartbeat_path(directory, rank).read_text())
        except (OSError, ValueError):
            continue
    return states


def diagnose(
    states: dict[int, dict[str, Any]],
    world: int,
    now: float,
    timeout_s: float,
    started: float,
    alive: Callable[[int], bool] = _alive,
) -> Fault | None:
    """The fault in a set of heartbeats, if any: a usage error, a rank that died without reporting,
    the rank that failed first, or, when nobody has made progress for ``timeout_s``, the hung rank."""
    for rank, state in sorted(states.items()):
        if state["state"] == "usage":
            return Fault(rank, "usage", state.get("error") or "bad input")
    for rank, state in sorted(states.items()):
        if state["state"] in RUNNING_STATES and not alive(state["pid"]):
            return Fault(
                rank,
                "crashed",
                f"rank {rank} died without reporting (killed by a signal or crashed hard) "
                f"at step {state['step'] + 1}, in {state['stage']}",
            )
    failed = [(s["failed_at"], r) for r, s in states.items() if s["state"] == "failed"]
    frozen = [r for r, s in states.items() if s["state"] in RUNNING_STATES and now - s["beat"] > STALE_BEAT_S]
    if failed and frozen:  # the others' collectives timed out waiting for a frozen rank
        rank = frozen[0]
        return Fault(
            rank,
            "hung",
            f"rank {rank} stopped responding (its process is frozen) at step {states[rank]['step'] + 1}; "
            "the other ranks' collectives timed out waiting for it",
        )
    if failed:
        rank = min(failed)[1]
        state = states[rank]
        return Fault(rank, "failed", f"rank {rank} failed at step {state['step'] + 1}: {state['error']}")
    running = {r: s for r, s in states.items() if s["state"] in RUNNING_STATES}
    missing = [r for r in range(world) if r not in states]
    if not running and not missing:
        return None
    last = max([s["progress_at"] for s in running.values()] + ([started] if missing else []))
    starting = missing or any(s["step"] == 0 for s in running.values())
    if now - last < (max(timeout_s, STARTUP_S) if starting else timeout_s):
        return None
    if missing:
        rank = missing[0]
        return Fault(rank, "hung", f"rank {rank} never started (no heartbeat after {now - started:.0f} s)")
    rank = (
        frozen[0] if frozen else min(running, key=lambda r: (running[r]["step"], running[r]["progress_at"]))
    )
    state = running[rank]
    how = "stopped responding (its process is frozen)" if frozen else "made no progress"
    return Fault(
        rank,
        "hung",
        f"rank {rank} {how} for {now - state['progress_at']:.0f} s at step {state['step'] + 1}, "
        f"in {state['stage']}; the other ranks were waiting for it (timeout {timeout_s:g} s)",
    )


class Job:
    """The processes of a launch: the ones we started, and every process they start in turn."""

    def __init__(self, processes: Sequence[subprocess.Popen]) -> None:
        self.processes = list(processes)
        self.known: dict[int, psutil.Process] = {}
        self.refresh()

    def refresh(self) -> None:
        """Remember every descendant now alive, so it can be killed even after its parent is gone."""
        for popen in self.processes:
            try:
                root = psutil.Process(popen.pid)
                for process in [root, *root.children(recursive=True)]:
                    self.known.setdefault(process.pid, process)
            except psutil.Error:
                continue

    def poll(self) -> int | None:
        """None while any started process runs; then the first non-zero exit code, or 0."""
        codes = [popen.poll() for popen in self.processes]
        if any(code is None for code in codes):
            return None
        return next((code for code in codes if code), 0)

    def stop(self, grace: float) -> None:
        """SIGTERM the started processes, wait up to ``grace`` s, then SIGKILL everything left."""
        self.refresh()
        for popen in self.processes:
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    popen.terminate()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.poll() is None:
            time.sleep(POLL_S)
        self.refresh()
        survivors = [p for p in self.known.values() if _running(p)]
        for process in survivors:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(survivors, timeout=10)
        for popen in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=10)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def become_subreaper() -> None:
    """Orphaned descendants (a rank whose torchrun died) are re-parented to us, not to init, so they
    stay in the tree we watch and kill. Linux only; elsewhere the remembered pids must do."""
    prctl = libc_prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def rank_environment(run_id: str, rank_dir: Path, threads: int) -> dict[str, str]:
    return {
        **os.environ,
        ENV_RUN_ID: run_id,
        ENV_RANK_DIR: str(rank_dir),
        ENV_LAUNCHED: "1",
        "OMP_NUM_THREADS": str(threads),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # an NCCL timeout tears the rank down instead of hanging
        "PYTHONUNBUFFERED": "1",
        # torchrun leaves a torchelastic_* directory in the temporary directory after each job: it and
        # whatever else the ranks put there go in the rank directory, removed at the end.
        "TMPDIR": str(rank_dir / "tmp"),
    }


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "-m",
        "--",  # the end of torchrun's options: ours (--nproc...) must not be read as abbreviations of its
        "dnnperf",
        *argv,
    ]


@dataclass
class Outcome:
    """How a launch ended: the exit code the command should give, the record (if rank 0 saved one)
    and the fault that stopped it, if any."""

    exit_code: int
    record: RunRecord | None
    fault: Fault | None
    log: Path | None


@contextlib.contextmanager
def _rank_dir(lifeline: Lifeline) -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="dnnperf-ranks-"))
    try:
        lifeline.announce("dir", directory)
        (directory / "tmp").mkdir()
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def launch(
    argv: Sequence[str],
    config: DistributedSettings,
    store: RunStore,
    run_id: str,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> Outcome:
    """Run ``dnnperf ARGV`` as ``config.nproc`` ranks on this machine and wait for the end."""
    nproc = int(config.nproc or 1)
    threads = config.rank_threads or 1
    log = store.root / f"{run_id}.ranks.log"
    become_subreaper()
    with Lifeline() as lifeline:  # released once the rank directory is gone and the log dealt with
        try:
            return _launch(argv, config, store, run_id, nproc, threads, log, lifeline, on_progress)
        except UsageError:
            log.unlink(missing_ok=True)  # refused before any rank ran: nothing to read
            raise


def _launch(
    argv: Sequence[str],
    config: DistributedSettings,
    store: RunStore,
    run_id: str,
    nproc: int,
    threads: int,
    log: Path,
    lifeline: Lifeline,
    on_progress: Callable[[int], None] | None,
) -> Outcome:
    lifeline.announce("log", log)
    with _rank_dir(lifeline) as rank_dir, open(log, "wb") as output, contextlib.ExitStack() as stack:
        env = rank_environment(run_id, rank_dir, threads)
        if config.netns:
            from dnnperf.distributed.netns import LinkShape, NetnsPair

            pair = NetnsPair(LinkShape(config.link_mbit, config.link_delay_ms))
            for namespace in pair.namespaces:
                lifeline.announce("netns", namespace)
            stack.enter_context(pair)
            commands = [
                pair.rank_command(rank, [sys.executable, "-m", "dnnperf", *argv]) for rank in range(2)
            ]
            envs = [{**env, **pair.rank_environment(rank)} for rank in range(2)]
        else:
            commands, envs = [torchrun_command(nproc, argv)], [env]
        started = time.time()
        streams = {"stdout": output, "stderr": subprocess.STDOUT}
        arm = die_with_this_process()
        job = Job(
            [
                subprocess.Popen(cmd, env=e, start_new_session=True, preexec_fn=arm, **streams)
                for cmd, e in zip(commands, envs, strict=True)
            ]
        )
        fault, code = supervise(job, rank_dir, nproc, config.timeout_s, started, on_progress)
    return _conclude(store, run_id, code, fault, log)


def supervise(
    job: Job,
    rank_dir: Path,
    world: int,
    timeout_s: float,
    started: float,
    on_progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Fault | None, int]:
    """Watch the job to its end, stop whatever of it is left, and say how it ended: the fault (None
    when the run went well) and the exit code. The ranks' final heartbeats decide: when every rank
    reported "done", the run went well even if its processes then exited by a signal or late."""
    fault = None
    try:
        fault = _watch(job, rank_dir, world, timeout_s, started, on_progress, clock, sleep)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the ranks, keep what rank 0 saved
        fault = Fault(-1, "interrupted", "interrupted")
    finally:
        job.stop(grace=0.0 if fault is not None and fault.kind == "hung" else GRACE_S)
    code = job.poll() or 0
    if fault is not None:
        return fault, code
    states = read_states(rank_dir, world)
    said = {s["state"] for s in states.values()} if _all_final(states, world) else set()
    if said == {"done"}:
        return None, 0
    if "interrupted" in said and said <= {"done", "interrupted"}:  # stopped from outside, rank by rank
        return Fault(-1, "interrupted", "interrupted"), code
    if code:
        fault = diagnose(states, world, clock(), timeout_s, started)
    return fault, code


def _all_final(states: dict[int, dict[str, Any]], world: int) -> bool:
    return len(states) == world and all(s["state"] in FINAL_STATES for s in states.values())


def _watch(
    job: Job,
    rank_dir: Path,
    world: int,
    timeout_s: float,
    started: float,
    on_progress: Callable[[int], None] | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Fault | None:
    """Poll until the job ends, a fault's grace period is over, or the ranks, all finished, have had
    ``TEARDOWN_S`` to exit; the fault, if any."""
    fault: Fault | None = None
    deadline = None
    while True:
        job.refresh()
        states = read_states(rank_dir, world)
        if on_progress is not None and 0 in states:
            on_progress(int(states[0]["step"]))
        if job.poll() is not None:
            return fault
        now = clock()
        if fault is None:
            fault = diagnose(states, world, now, timeout_s, started)
            if fault is not None:
                deadline = now + (0.0 if fault.kind == "hung" else GRACE_S)
        if deadline is None and _all_final(states, world):
            deadline = now + TEARDOWN_S  # every rank has finished: its processes are winding down
        if deadline is not None and now >= deadline:
            return fault
        sleep(POLL_S)


def _conclude(store: RunStore, run_id: str, code: int, fault: Fault | None, log: Path) -> Outcome:
    """Load rank 0's record; after a fault, mark it failed with the fault's message (atomically)."""
    record = None
    if store.path(run_id).is_file():
        record = store.load(run_id)
    if fault is not None and fault.kind == "usage":
        log.unlink(missing_ok=True)
        if record is not None:
            store.path(run_id).unlink(missing_ok=True)  # nothing was measured: bad input, not a run
        raise UsageError(fault.message)
    if fault is None and code == 0:
        log.unlink(missing_ok=True)
        return Outcome(0, record, None, None)
    if fault is None:
        fault = Fault(-1, "failed", f"the ranks exited with code {code}")
    interrupted = fault.kind == "interrupted"
    if record is not None:
        record.status, record.error = ("partial", None) if interrupted else ("failed", fault.message)
        record.finished = record.finished or utc_now()
        for point in record.points:
            if point.status == "running":
                point.status = "partial"
        store.save(record)
    return Outcome(interrupted_exit_code() if interrupted else 1, record, fault, log)
