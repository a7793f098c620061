"""Ctrl-C and SIGTERM that stop a run even when the first KeyboardInterrupt is swallowed; children that
die with the process that started them (:func:`die_with_this_process`); a quick exit (:func:`exit_now`).

Python raises a signal's exception in whatever Python code runs when the handler fires. If that is a
garbage-collector callback, a weakref callback or a ``__del__`` (the stage clock and the disk tier
have such code), the interpreter prints "Exception ignored" and carries on: a 100,000-step run would
not stop. The handler here also records the request, and the runner checks it before every step.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, NoReturn

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
    If this process is killed outright, the child gets SIGKILL (:func:`die_with_this_process`)."""
    return run_children([argv], env, parallel=1, grace_s=grace_s, timeout_s=timeout_s)[0]


def run_children(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None = None,
    parallel: int = 1,
    grace_s: float = 30.0,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
) -> list[subprocess.CompletedProcess]:
    """:func:`run_child` for several commands, at most ``parallel`` at a time, started in the order
    given; their results in that order. A stop of this process, one child's overrun of ``timeout_s``
    or ``cancel`` set (from another thread) stops every running child the same way (SIGTERM,
    ``grace_s``, SIGKILL) and the rest never start. Output goes to unlinked temporary files, which the
    OS removes however this process ends."""
    pending = list(enumerate(commands))
    running: dict[int, tuple[subprocess.Popen, Any, Any, float]] = {}
    results: list[subprocess.CompletedProcess | None] = [None] * len(commands)
    with ExitStack() as files:
        try:
            while pending or running:
                while pending and len(running) < max(1, parallel):
                    index, argv = pending.pop(0)
                    out = files.enter_context(tempfile.TemporaryFile())
                    err = files.enter_context(tempfile.TemporaryFile())
                    process = subprocess.Popen(
                        list(argv),
                        stdout=out,
                        stderr=err,
                        env=None if env is None else dict(env),
                        preexec_fn=die_with_this_process(),
                    )
                    running[index] = (process, out, err, time.monotonic())
                for index, (process, out, err, started) in list(running.items()):
                    if process.poll() is not None:
                        del running[index]
                        results[index] = subprocess.CompletedProcess(
                            process.args, process.returncode, _read(out), _read(err)
                        )
                    elif timeout_s is not None and time.monotonic() - started > timeout_s:
                        raise subprocess.TimeoutExpired(process.args, timeout_s)
                if cancel is not None and cancel.is_set():
                    raise Cancelled("stopped with the work beside it")
                if running:
                    time.sleep(0.05)
        except BaseException:
            _stop([process for process, *_ in running.values()], grace_s)
            raise
    return [r for r in results if r is not None]


class Cancelled(Exception):
    """:func:`run_children` was cancelled from another thread."""


@contextmanager
def children_beside(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None = None,
    parallel: int = 1,
    timeout_s: float | None = None,
) -> Iterator[Callable[[], list[subprocess.CompletedProcess]]]:
    """:func:`run_children` in a thread while the caller does other work; yields the function that
    waits for their results (and raises what stopped them). Leaving the block before that, by an
    error or a stop, stops the children and the thread."""
    cancel = threading.Event()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["done"] = run_children(commands, env, parallel, timeout_s=timeout_s, cancel=cancel)
        except BaseException as error:  # handed to the caller's thread by wait()
            outcome["error"] = error

    thread = threading.Thread(target=work, name="dnnperf-children", daemon=True)
    thread.start()

    def wait() -> list[subprocess.CompletedProcess]:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["done"]

    try:
        yield wait
    finally:
        cancel.set()
        thread.join()


def _read(file: Any) -> str:
    """What a child wrote to ``file``, as text."""
    file.seek(0)
    return file.read().decode(errors="replace")


def _stop(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to each of ``processes``, ``grace_s`` for all of them to end, then SIGKILL."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


def exit_now(code: int = 0) -> NoReturn:
    """Exit with ``code``, the objects alive now kept out of the interpreter's last garbage
    collections (``gc.freeze``): after torch is imported those walk every object its import made,
    0.6-0.7 s of CPU a process on the 2-core host. atexit handlers, and finalizers registered with
    ``weakref.finalize`` (temporary directories, dnnperf's own files), still run; the ``__del__`` of an
    object alive only through a reference cycle does not. For entry points only."""
    gc.freeze()
    raise SystemExit(code)
