"""Ctrl-C and SIGTERM that stop a run even when the first KeyboardInterrupt is swallowed; children that
die with the process that started them (:func:`die_with_this_process`).

Python raises a signal's exception in whatever Python code runs when the handler fires. If that is a
garbage-collector callback, a weakref callback or a ``__del__`` (the stage clock and the disk tier
have such code), the interpreter prints "Exception ignored" and carries on: a 100,000-step run would
not stop. The handler here also records the request, and the runner checks it before every step.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

#: prctl(2) options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_requested = threading.Event()
#: The stop signal that arrived last (Ctrl-C where none did: a KeyboardInterrupt of Python's own).
_received = [signal.SIGINT]


def _request_stop(signum: int, frame: Any) -> None:
    _requested.set()
    _received[0] = signal.Signals(signum)
    raise KeyboardInterrupt


def interrupted_exit_code() -> int:
    """128 + the stop signal's number (130 for Ctrl-C, 143 for SIGTERM): how a shell reports a
    process that signal ended, for a process that stopped cleanly after it."""
    return 128 + int(_received[0])


def stop_if_requested() -> None:
    """Raise KeyboardInterrupt if a stop signal arrived whose own KeyboardInterrupt was swallowed."""
    if _requested.is_set():
        raise KeyboardInterrupt


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt and are remembered; the previous handlers come back."""
    previous = {s: signal.signal(s, _request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    _requested.clear()
    _received[0] = signal.SIGINT
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _requested.clear()


def run_child(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    grace_s: float = 30.0,
    timeout_s: float | None = None,
) -> subprocess.CompletedProcess:
    """Run a child command and capture its output, like ``subprocess.run``, except when this process
    is stopped (Ctrl-C, SIGTERM) or the child overruns ``timeout_s``: the child is sent SIGTERM and
    given ``grace_s`` to remove what it started (ranks, network namespaces, temporary files) before
    it is killed. ``subprocess.run`` kills at once, which leaves a dnnperf child's own children behind.
    """
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except BaseException:
        process.terminate()
        try:
            process.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)


def libc_prctl() -> Callable[..., int] | None:
    """libc's prctl (Linux), or None where there is none."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_this_process() -> Callable[[], None]:
    """A ``preexec_fn`` for the processes we start: the child gets SIGKILL when this process dies,
    however it dies (the parent-death signal, kept across exec). Linux only; elsewhere a no-op."""
    prctl, parent = libc_prctl(), os.getpid()  # looked up before the fork: the child only calls it

    def arm() -> None:
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm
