"""Paths given on the command line, checked before any work: a run that measures for minutes must not
find out at its end that it cannot write its output."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from dnnperf.errors import UsageError


def path_argument(text: str) -> Path:
    """argparse ``type`` for a path: an empty one (``Path("")`` is the current directory) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


def _probe(directory: Path, option: str, path: Path) -> None:
    """Make and remove a file in ``directory``: permissions, a read-only mount and a full inode table
    all show here, as they would to the atomic write at the end."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".dnnperf-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise UsageError(f"{option} {path}: cannot write in {directory}: {error.strerror}") from None


def output_file(path: Path, option: str, parents: bool = False) -> Path:
    """A file dnnperf will write: not a directory, in an existing directory it can write in
    (``parents``: the writer makes missing directories, so the nearest existing one is checked)."""
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory, not a file")
    if parents:
        output_directory(path.parent, option)
        return path
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: no directory {path.parent}")
    _probe(path.parent, option, path)
    return path


def output_directory(path: Path, option: str) -> Path:
    """A directory dnnperf will write files in (made if missing): not a file, under a writable one."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: not a directory")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a directory")
    _probe(existing, option, path)
    return path
