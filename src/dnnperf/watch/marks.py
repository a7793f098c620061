"""Step marks: ``mark_step()`` in the watched program appends one line to the file ``dnnperf watch``
names in DNNPERF_WATCH_MARKS. Outside ``watch`` the variable is unset and a mark does nothing.

A line is ``TIME`` or ``TIME STEP``: ``time.time()`` (the clock the watcher records its samples on)
and the step index when given. This module imports nothing but the standard library: any framework's
program can call it, and a mark costs one ``write`` (the file is opened once per process).
"""

from __future__ import annotations

import os
import time

#: The environment variable that names the marks file.
ENV_MARKS = "DNNPERF_WATCH_MARKS"

#: The open marks file of this process: (pid, descriptor, path). A fork gets its own on first mark.
_opened: tuple[int, int, str] | None = None


def mark_step(step: int | None = None) -> None:
    """Mark the end of a training step (``step``: its index, when the program counts them)."""
    path = os.environ.get(ENV_MARKS)
    if not path:
        return
    fd = _descriptor(path)
    if fd < 0:
        return
    line = f"{time.time():.6f}\n" if step is None else f"{time.time():.6f} {int(step)}\n"
    try:
        os.write(fd, line.encode())
    except OSError:  # the watcher went away: a mark must never stop the training it marks
        _forget(path)


def _descriptor(path: str) -> int:
    """The marks file opened for appending (one small append is one atomic write), -1 when it
    cannot be (marking then does nothing rather than fail the program)."""
    global _opened
    if _opened is not None and _opened[0] == os.getpid() and _opened[2] == path:
        return _opened[1]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        fd = -1
    _opened = (os.getpid(), fd, path)
    return fd


def _forget(path: str) -> None:
    global _opened
    _opened = (os.getpid(), -1, path)
