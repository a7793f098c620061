"""The lifeline: a small process that ends a job when the process that started it (a launch of ranks,
``dnnperf watch``) dies without ending it.

The starter starts it before anything else and holds the write end of a pipe that is the lifeline's
standard input; it tells the lifeline, line by line, what the job owns (``dir PATH``, ``log PATH``,
``netns NAME``, ``env NAME=VALUE``) before creating it. A starter that ends normally writes ``done``
and closes the pipe: the lifeline exits at once. A starter that dies (SIGKILL, the OOM killer) closes
the pipe without ``done``: the lifeline kills every process of the job, then removes the rank
directory, the ranks log if nothing was written to it, and the network namespaces.

The job's processes are found by a variable in their environment: the rank directory
(``DNNPERF_RANK_DIR``, for a ``dir``) or the one an ``env`` line names. torchrun, the ranks, a
watched command and all their children (a shell's, data loader workers) inherit it, whatever session
or namespace they run in, and an unrelated process that reuses a pid does not carry it.

The lifeline runs as a script (``python -I lifeline.py``) and imports neither torch nor dnnperf, so
it starts in a fraction of a second and costs little memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil

from dnnperf.errors import DnnperfError
from dnnperf.interrupts import die_with_this_process

#: The environment variable that marks a job's processes (also set by ``launch.rank_environment``).
ENV_RANK_DIR = "DNNPERF_RANK_DIR"
#: How long the lifeline keeps killing the job's processes before it gives up on the stragglers.
END_S = 60.0
DONE = "done"


class Lifeline:
    """The launcher's side: start the lifeline, announce what the job owns, release it at the end."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C at the terminal reaches the launcher, which ends the job itself.
            start_new_session=True,
        )

    def announce(self, kind: str, value: str | Path) -> None:
        """Tell the lifeline about something the job is about to own (dir, log, netns, or env: the
        ``NAME=VALUE`` in the environment of every process of the job)."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{kind} {value}\n".encode())
        self.process.stdin.flush()

    def release(self) -> None:
        """The job is over and cleaned up: the lifeline exits without touching anything."""
        with contextlib.suppress(OSError):  # a lifeline that died has nothing left to release
            assert self.process.stdin is not None
            self.process.stdin.write(f"{DONE}\n".encode())
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Lifeline:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, trace: TracebackType | None) -> None:
        self.release()


def job_processes(variable: str, value: str) -> list[psutil.Process]:
    """The live processes (this one aside) whose environment sets ``variable`` to ``value``."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get(variable) == value:
                found.append(process)
        except psutil.Error:  # gone, or another user's: not ours either way
            continue
    return found


def kill_job(variable: str, value: str, within: float = END_S) -> None:
    """SIGKILL the processes whose environment sets ``variable`` to ``value`` until none is left (a
    dying torchrun or shell may still be starting one)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        processes = job_processes(variable, value)
        if not processes:
            return
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        # Not psutil.wait_procs: a killed rank stays a zombie until init reaps it, which it may not
        # hurry to do; job_processes already leaves zombies out.
        time.sleep(0.1)


def remove_namespaces(namespaces: Sequence[str]) -> None:
    """Kill what still runs inside each network namespace, then delete it (and its veth end)."""
    for namespace in namespaces:
        listing = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
        for pid in listing.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def end_job(owned: dict[str, list[str]]) -> None:
    """Everything the starter would have removed: processes, namespaces, rank directory, empty log."""
    for rank_dir in owned.get("dir", []):
        kill_job(ENV_RANK_DIR, rank_dir)
    for assignment in owned.get("env", []):
        variable, _, value = assignment.partition("=")
        kill_job(variable, value)
    remove_namespaces(owned.get("netns", []))
    for rank_dir in owned.get("dir", []):
        shutil.rmtree(rank_dir, ignore_errors=True)
    for log in owned.get("log", []):
        with contextlib.suppress(OSError):
            if os.path.getsize(log) == 0:  # a log with output in it is the only trace of what happened
                os.unlink(log)


def main() -> int:
    # The starter's Ctrl-C and SIGTERM are the starter's to handle; this process waits for the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    owned: dict[str, list[str]] = {}
    for line in sys.stdin:
        kind, _, value = line.rstrip("\n").partition(" ")
        if kind == DONE:
            return 0
        owned.setdefault(kind, []).append(value)
    end_job(owned)  # end of file without "done": the starter is gone
    return 0


def wait_for_ranks(ranks: Sequence[subprocess.Popen], timeout_s: float, what: str) -> None:
    """Wait for every rank of a microbenchmark (``what``) started with stderr piped; one that fails
    or overruns raises DnnperfError with its last line."""
    deadline = time.monotonic() + timeout_s
    for rank, process in enumerate(ranks):
        try:
            _, stderr = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise DnnperfError(f"{what}: rank {rank} did not finish in {timeout_s:g} s") from None
        if process.returncode != 0:
            last = (stderr.strip().splitlines() or ["no message"])[-1]
            raise DnnperfError(f"{what}: rank {rank} failed: {last}")


def run_ranks(
    commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], timeout_s: float, what: str
) -> None:
    """Start one local rank per (argv, environment), each dying with this process (parent-death
    signal), and wait for them all as :func:`wait_for_ranks` does; a rank still running on the way out
    (an error, a timeout, an interrupt) is killed."""
    ranks: list[subprocess.Popen] = []
    try:
        for argv, environment in commands:
            ranks.append(
                subprocess.Popen(
                    list(argv),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=dict(environment),
                    preexec_fn=die_with_this_process(),
                )
            )
        wait_for_ranks(ranks, timeout_s, what)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()


@contextlib.contextmanager
def scratch_directory(lifeline: Lifeline, prefix: str) -> Iterator[Path]:
    """A temporary directory for a job's ranks, announced to ``lifeline`` (removed even if this process
    is killed) and removed when the block ends."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    lifeline.announce("dir", scratch)
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
