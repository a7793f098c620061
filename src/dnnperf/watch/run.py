"""Run a command and sample its process tree until it ends: :func:`watch`.

The command runs in the watcher's own process group, as a shell would run it without ``watch``: it
keeps the terminal (it can read from it, Ctrl-Z stops it) and a Ctrl-C at the terminal reaches it
and its whole group directly, once. The watcher forwards what reaches only itself: SIGTERM always,
and SIGINT when it did not come from the terminal (the watcher's group is not the terminal's
foreground group, e.g. ``kill -INT``). Either way the watcher keeps sampling until the command
ends, so the result holds everything sampled, and ends "interrupted". A command that outlives
``grace_s`` after the request gets SIGKILL, and so does its tree.

Processes the command leaves behind (those of its tree still running, and any other carrying this
watch's DNNPERF_WATCH_ID: a daemon re-parented to init before a sample saw it) are reported, then
given ``outlive_grace_s`` to end on their own (sampled meanwhile), then SIGTERM, then SIGKILL:
``watch`` leaves nothing running. If the
watcher dies (SIGKILL, the OOM killer), the command gets SIGKILL (the parent-death signal) and a
lifeline process (``dnnperf.distributed.lifeline``) kills every other process that carries this
watch's DNNPERF_WATCH_ID in its environment: the command's whole tree, grandchildren of a shell
too. The marks file is an anonymous memory file where Linux offers one, so a killed watcher leaves
no file either.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import secrets
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil

from dnnperf.distributed.lifeline import Lifeline, job_processes
from dnnperf.errors import UsageError
from dnnperf.interrupts import die_with_this_process
from dnnperf.results.watch import SERIES_KINDS, OutlivedProcess, StepMarks, WatchConfig, WatchResult
from dnnperf.watch.gpu import GpuSampler, open_gpus
from dnnperf.watch.marks import ENV_MARKS
from dnnperf.watch.sampler import TreeSampler

#: Seconds a leftover process gets after SIGTERM before SIGKILL.
TERMINATE_S = 5.0
#: The environment variable, unique to one watch, that marks every process of the command's tree.
ENV_WATCH_ID = "DNNPERF_WATCH_ID"
#: Further scans for processes carrying the watch's id once the command has ended, and the pause
#: before each.
RESCANS = 1
RESCAN_S = 0.1


class MarksFile:
    """Where the command's ``mark_step`` calls append: an anonymous memory file the command opens
    through /proc (nothing to remove, even after SIGKILL), else a temporary file removed by close."""

    def __init__(self) -> None:
        self.temporary: str | None = None
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            self.fd = os.memfd_create("dnnperf-watch-marks", os.MFD_CLOEXEC)
            self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        else:
            self.fd, self.temporary = tempfile.mkstemp(prefix="dnnperf-watch-marks-")
            self.path = self.temporary

    def read(self) -> bytes:
        chunks, offset = [], 0
        while chunk := os.pread(self.fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self.fd)
        if self.temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temporary)


def parse_marks(text: bytes, started_at: float) -> StepMarks:
    """The marks in ``text`` (lines ``TIME`` or ``TIME STEP``), times made relative to the start."""
    marks = StepMarks()
    for line in text.decode(errors="replace").splitlines():
        parts = line.split()
        try:
            at = float(parts[0])
            step = int(parts[1]) if len(parts) == 2 else None
        except (IndexError, ValueError):
            marks.ignored += 1
            continue
        if len(parts) > 2 or not math.isfinite(at) or (step is not None and step < 0):
            marks.ignored += 1
            continue
        marks.t.append(at - started_at)
        marks.step.append(step)
    return marks


def terminal_sent_it() -> bool:
    """Whether a SIGINT here most likely came from the terminal: this process's group is the
    foreground group of its controlling terminal (the command, in the same group, got it too)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal: nothing but a process could have sent it
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


class StopRequests:
    """SIGINT and SIGTERM while the command runs: remembered and passed to it as the module says."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.reaped = False
        self.signal: int | None = None
        self.at: float | None = None

    def handle(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal, self.at = signum, time.monotonic()
        if self.reaped:  # the pid may already name another process
            return
        if signum == signal.SIGTERM or not terminal_sent_it():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, on the main thread only (elsewhere Python allows none: signals keep their
        usual effect there)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


def check_arguments(argv: Sequence[str], interval_s: float) -> None:
    if not argv or not argv[0] or not all(isinstance(a, str) for a in argv):
        raise UsageError("watch needs a command to run (dnnperf watch -- COMMAND ...)")
    number = isinstance(interval_s, (int, float)) and math.isfinite(interval_s)
    if not (number and 0.001 <= interval_s <= 3600):
        raise UsageError(f"the sampling interval must be between 0.001 and 3600 seconds, not {interval_s!r}")


def start(
    argv: Sequence[str],
    marks: MarksFile,
    env: dict[str, str] | None,
    lifeline: Lifeline,
    stdout: int | None = None,
) -> tuple[subprocess.Popen, str]:
    """The command, started with the marks file and a watch id in its environment (announced to the
    lifeline first: the command's tree may outlive a killed watcher only until the lifeline sees it),
    and that id."""
    watch_id = secrets.token_hex(8)
    lifeline.announce("env", f"{ENV_WATCH_ID}={watch_id}")
    environment = {**(os.environ if env is None else env), ENV_MARKS: marks.path, ENV_WATCH_ID: watch_id}
    try:
        process = subprocess.Popen(
            list(argv), env=environment, stdout=stdout, preexec_fn=die_with_this_process()
        )
    except OSError as error:  # not found, not executable
        raise UsageError(f"cannot run {argv[0]!r}: {error.strerror or error}") from None
    return process, watch_id


def watch(
    argv: Sequence[str],
    interval_s: float = 0.1,
    on_sample: Callable[[WatchResult], None] | None = None,
    grace_s: float = 30.0,
    outlive_grace_s: float = 5.0,
    env: dict[str, str] | None = None,
    stdout: int | None = None,
) -> WatchResult:
    """Run ``argv`` and sample its process tree (and NVIDIA GPUs) every ``interval_s`` seconds until
    it ends; ``on_sample`` sees the result so far after each sample. Stops as the module says;
    leftover processes get ``outlive_grace_s``, a command asked to stop gets ``grace_s``. ``stdout``:
    a descriptor for the command's standard output (default: this process's)."""
    check_arguments(argv, interval_s)
    marks = MarksFile()
    gpus, gpu_note = open_gpus()
    lifeline = Lifeline()
    try:
        process, watch_id = start(argv, marks, env, lifeline, stdout)
        sampler: TreeSampler | None = None
        try:
            # Everything after the start is protected: an error or a signal here ends the command.
            result = WatchResult(config=WatchConfig(list(argv), float(interval_s)), started_at=time.time())
            result.gpu_note = gpu_note
            stop = StopRequests(process.pid)
            sampler = TreeSampler(process.pid, float(interval_s))
            result.total = sampler.total
            with stop.installed():
                status, usage = sample_until_exit(process, sampler, gpus, result, stop, grace_s, on_sample)
                process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
                stop.reaped = True
                conclude(result, status, usage, stop)
                sampler.forget(process.pid)
                reaped = final_counters(usage)
                take_sample(sampler, gpus, result, reaped)
                end_leftovers(sampler, gpus, result, reaped, outlive_grace_s, on_sample, watch_id)
        finally:
            # An error in the watcher (or in on_sample): nothing it started may outlive it.
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            if sampler is not None:
                kill_tree(list(sampler.followed.values()))
            kill_tree(job_processes(ENV_WATCH_ID, watch_id))
            if process.returncode is None:
                process.wait()
        result.marks = parse_marks(marks.read(), result.started_at)
        result.processes = sampler.process_series()
        return result
    finally:
        lifeline.release()  # the tree is ended (or never started): nothing left for it to kill
        marks.close()
        if gpus is not None:
            gpus.close()


def sample_until_exit(
    process: subprocess.Popen,
    sampler: TreeSampler,
    gpus: GpuSampler | None,
    result: WatchResult,
    stop: StopRequests,
    grace_s: float,
    on_sample: Callable[[WatchResult], None] | None,
) -> tuple[int, resource.struct_rusage]:
    """Sample at the interval until the command ends; its wait status and resource usage."""
    waiter = pid_waiter(process.pid)
    try:
        due = time.monotonic()
        while True:
            take_sample(sampler, gpus, result, None)
            if on_sample is not None:
                result.processes = sampler.process_series()
                on_sample(result)
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                return status, usage
            if stop.at is not None and time.monotonic() - stop.at > grace_s:
                # The root is SIGKILLed but not reaped here (not Popen.kill: its poll may reap it): the
                # os.wait4 above reaps it at the next sample.
                os.kill(process.pid, signal.SIGKILL)
                kill_tree([p for pid, p in sampler.followed.items() if pid != process.pid])
            due = max(due + result.config.interval_s, time.monotonic())
            wait_until(due, waiter)
    finally:
        if waiter is not None:
            os.close(waiter)


def pid_waiter(pid: int) -> int | None:
    """A descriptor readable when the process ends (Linux 5.3+), to stop waiting for the next
    sample at once; None elsewhere (the end is then seen at the next sample)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_until(due: float, waiter: int | None) -> None:
    remaining = due - time.monotonic()
    if remaining <= 0:
        return
    if waiter is None:
        time.sleep(remaining)
    else:
        select.select([waiter], [], [], remaining)


def take_sample(
    sampler: TreeSampler, gpus: GpuSampler | None, result: WatchResult, extra: dict[str, Any] | None
) -> None:
    """One sample of the tree and the GPUs, and the sampler's own CPU time for it."""
    began = time.thread_time()
    at = time.time() - result.started_at
    sampler.sample(extra)
    if gpus is not None:
        gpus.sample()
        result.gpus = gpus.series
    result.t.append(at)
    result.cost.cpu_s.append(max(time.thread_time() - began, 0.0))


def final_counters(usage: resource.struct_rusage) -> dict[str, Any]:
    """What the reaped command and the descendants it reaped add to the tree's totals, from the
    kernel's resource usage (its memory and threads are gone)."""
    return dict.fromkeys(SERIES_KINDS, 0) | {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "minor_faults": usage.ru_minflt,
        "major_faults": usage.ru_majflt,
        "read_bytes": usage.ru_inblock * 512,  # counted in 512-byte blocks, as /proc/PID/io's bytes
        "write_bytes": usage.ru_oublock * 512,
    }


def conclude(result: WatchResult, status: int, usage: resource.struct_rusage, stop: StopRequests) -> None:
    """How the command ended, from its wait status, and the kernel's account of it."""
    result.wall_s = time.time() - result.started_at
    code = os.waitstatus_to_exitcode(status)
    result.exit_code, result.signal = (code, None) if code >= 0 else (None, -code)
    result.stop_signal = stop.signal
    result.end = "interrupted" if stop.signal is not None else ("signalled" if code < 0 else "exited")
    result.kernel_cpu_s = usage.ru_utime + usage.ru_stime
    result.kernel_peak_rss_bytes = usage.ru_maxrss * 1024  # Linux reports KiB


def end_leftovers(
    sampler: TreeSampler,
    gpus: GpuSampler | None,
    result: WatchResult,
    reaped: dict[str, Any],
    grace_s: float,
    on_sample: Callable[[WatchResult], None] | None,
    watch_id: str,
) -> None:
    """Report the processes that outlived the command; sample them for ``grace_s`` while they end on
    their own, then SIGTERM and SIGKILL what is left. ``reaped``: the command's own final counters.
    Leftovers are the tree's followed processes and any other process carrying ``watch_id`` in its
    environment (a daemon re-parented to init before a sample saw it)."""
    for scan in range(RESCANS + 1):
        if scan:  # a process caught in its exec may read with no environment: look again, later
            time.sleep(RESCAN_S)
        for process in job_processes(ENV_WATCH_ID, watch_id):
            sampler.follow(process)
    leftovers = sampler.alive()
    if not leftovers:
        return
    described = {p.pid: describe(p) for p in leftovers}
    deadline = time.monotonic() + grace_s
    while sampler.alive() and time.monotonic() < deadline:
        time.sleep(min(result.config.interval_s, max(deadline - time.monotonic(), 0)))
        take_sample(sampler, gpus, result, reaped)
        if on_sample is not None:
            on_sample(result)
    remaining = sampler.alive()
    # Named again now: one found between its fork and its exec carried its parent's name then.
    described |= {p.pid: now for p in remaining if (now := describe(p))[0]}
    for process in remaining:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, killed = psutil.wait_procs(remaining, timeout=TERMINATE_S)
    for process in killed:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(killed, timeout=TERMINATE_S)
    fates = {p.pid: "terminated" for p in remaining} | {p.pid: "killed" for p in killed}
    result.outlived = [
        OutlivedProcess(pid=pid, name=name, cmdline=cmdline, fate=fates.get(pid, "exited"))
        for pid, (name, cmdline) in described.items()
    ]


def describe(process: psutil.Process) -> tuple[str, list[str]]:
    """The program a process runs now (psutil caches a handle's first name; a new handle reads it
    afresh), or ("", []) once it is gone or another process has its pid."""
    try:
        fresh = psutil.Process(process.pid)
        if fresh.create_time() != process.create_time():
            return "", []
        return fresh.name(), fresh.cmdline()
    except psutil.Error:
        return "", []


def kill_tree(processes: Sequence[psutil.Process]) -> None:
    """SIGKILL the processes (psutil refuses a pid reused by another process) and wait for them."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=TERMINATE_S)
