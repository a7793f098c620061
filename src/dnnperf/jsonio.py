"""Files written atomically and read without trusting them: the I/O every layer above shares (records,
caches, the hardware profile, heartbeats, reports)."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from dnnperf.errors import UsageError


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file so that readers see the old file or the new one, never a torn one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, document: object) -> None:
    """Write JSON so that readers see the old file or the new one, never a torn one (NaN refused)."""
    write_text_atomic(path, json.dumps(document, indent=1, allow_nan=False) + "\n")


def read_regular_file(path: Path) -> str:
    """A regular file's text; anything else (a FIFO, a device, a directory) is an OSError saying so.
    Opened without blocking and checked on the open descriptor: opening a FIFO with no writer would
    wait forever, and checking the path first would leave a window to swap the file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8") as file:
            fd = -1  # the file object closes it
            return file.read()
    finally:
        if fd >= 0:
            os.close(fd)


def read_json_file(path: Path | str, what: str) -> Any:
    """Parse a JSON file (nothing is executed); any problem reading or parsing it is a one-line
    UsageError naming the file and ``what`` it should have been."""
    path = Path(path)
    try:
        text = read_regular_file(path)
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a text file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:
        raise UsageError(f"{path} is not a {what}: nested too deeply") from None
