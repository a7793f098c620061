"""The on-disk dataset cache checked against its manifest.

``manifest.json`` lists every file of a dataset with its size, modification time and SHA-256, and
carries a SHA-256 of its own content, so a cache damaged after dnnperf wrote it (a file overwritten,
truncated or deleted; the manifest itself garbled) is found and named before a run reads from it.

What a check costs decides when each part runs. On the demo's dataset (resnet18 ``small``: 258 files,
1 MB), on a 2-core host with the files in the page cache, checking the manifest and a stat of every
file takes 1.3 ms, and hashing every file as well 5 ms; the ``full`` preset's 514 files (7 MB) take
2.8 ms against 23 ms, and from a cold page cache hashing would read the whole dataset from storage
before the run does. So opening a dataset compares sizes and modification times only, and a file is
hashed when its size matches but its time does not (a copy); every file is hashed when the dataset
is written, by ``verify_dataset(directory, full=True)``, and when a sample fails to load during a
run. SHA-256 rather than CRC32 (3.7 GB/s here against SHA-256's 0.9, with SHA instructions; BLAKE2b
0.5): on those rare occasions the difference is milliseconds (writing the demo's dataset takes
1.2 s), and no damage can plausibly keep a SHA-256.

Whoever writes, rebuilds or removes a dataset holds an exclusive lock on the cache directory
(:func:`writer_lock`); readers take no lock, because a dataset only ever appears complete, renamed
into place from a temporary sibling.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from stat import S_ISREG
from typing import Any

from dnnperf.errors import UsageError
from dnnperf.jsonio import write_json_atomic

MANIFEST = "manifest.json"
#: Temporary siblings of the datasets in a cache directory: one being written, one being removed.
WRITING_PREFIX, REMOVING_PREFIX = ".writing-", ".removing-"
_CHUNK = 1 << 20


class CorruptDataset(UsageError):
    """A cached dataset whose files no longer match its manifest, and could not be rebuilt."""


class SampleError(RuntimeError):
    """A sample of an on-disk dataset that could not be read or preprocessed (in whichever process)."""


def sha256_of(path: Path | str) -> str:
    """The SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _self_checksum(manifest: dict[str, Any]) -> str:
    content = {key: value for key, value in manifest.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(directory: Path, description: dict[str, Any]) -> None:
    """Describe every file under ``directory`` (size, modification time, SHA-256) in its manifest."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        stat = path.stat()
        files[path.relative_to(directory).as_posix()] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": sha256_of(path),
        }
    _save_manifest(directory, {**description, "files": files})


def _save_manifest(directory: Path, manifest: dict[str, Any]) -> None:

    write_json_atomic(directory / MANIFEST, {**manifest, "checksum": _self_checksum(manifest)})


def _read_manifest(directory: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest, or None and what is wrong with it."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{MANIFEST} is missing"
    except OSError as error:
        return None, f"{MANIFEST} cannot be read ({error.strerror or error})"
    except ValueError:  # also a UnicodeDecodeError
        return None, f"{MANIFEST} is not valid JSON"
    if not isinstance(manifest, dict) or "checksum" not in manifest:
        return None, f"{MANIFEST} has no checksum (it is not one dnnperf wrote, or an older dnnperf did)"
    if manifest["checksum"] != _self_checksum(manifest):
        return None, f"{MANIFEST} does not match its own checksum (it was edited)"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return None, f"{MANIFEST} lists no files"
    return manifest, None


def verify_dataset(
    directory: Path, description: dict[str, Any] | None = None, full: bool = False
) -> list[str]:
    """What is wrong with a cached dataset, one phrase per problem naming the file ([] when intact).

    Every file's size and modification time are compared with the manifest; a file is hashed when its
    size matches but its time does not, and with ``full`` every file is. A ``description`` (the
    format's parameters, count and seed) must match the manifest's. Files whose content was confirmed
    under a new modification time (a copied cache) get it recorded, where the manifest is writable,
    so the next check need not hash them again.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return [f"{directory.name} is not a directory"]
    manifest, problem = _read_manifest(directory)
    if manifest is None:
        return [problem or MANIFEST]
    if description is not None:
        expected = json.loads(json.dumps(description))  # as JSON stores it: tuples become lists
        if {key: manifest.get(key) for key in expected} != expected:
            return [f"{MANIFEST} describes another dataset"]
    problems: list[str] = []
    retimed = False
    base = str(directory)
    for name, entry in manifest["files"].items():
        if not _inside(name):  # a forged manifest must not make us read /dev/zero or ../../elsewhere
            problems.append(f"{MANIFEST} names {name!r}, which is not a file inside the dataset")
            continue
        path = os.path.join(base, name)  # plain strings: a Path per file would triple the cost of stats
        try:
            stat = os.lstat(path)
            if not S_ISREG(stat.st_mode):
                problems.append(f"{name} is not a regular file")
            elif stat.st_size != entry["size"]:
                problems.append(f"{name} has {stat.st_size} bytes, the manifest says {entry['size']}")
            elif full or stat.st_mtime_ns != entry["mtime_ns"]:
                if sha256_of(path) != entry["sha256"]:
                    problems.append(f"{name} does not match its SHA-256 (its bytes changed)")
                elif stat.st_mtime_ns != entry["mtime_ns"]:
                    entry["mtime_ns"], retimed = stat.st_mtime_ns, True
        except FileNotFoundError:
            problems.append(f"{name} is missing")
        except OSError as error:
            problems.append(f"{name} cannot be read ({error.strerror or error})")
        except (TypeError, KeyError):  # an entry of the wrong shape under a valid checksum: forged
            problems.append(f"{MANIFEST} has no valid entry for {name}")
    if retimed and not problems:
        # A read-only cache keeps the old times: its files are confirmed, and hashed again next time.
        with suppress(OSError):
            _save_manifest(directory, manifest)
    return problems


def _inside(name: object) -> bool:
    """A relative path with no ``..``: a file under the dataset's directory."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts


def summary(problems: list[str]) -> str:
    """The first problem, and how many more there are."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else "")


@contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """An exclusive lock on the cache directory ``root`` (which must exist) for writing, rebuilding or
    removing a dataset in it. The kernel releases it when the process ends, even by SIGKILL; any
    temporary sibling found while holding it belongs to a writer that died, and is removed."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for leftover in root.iterdir():
            if leftover.name.startswith((WRITING_PREFIX, REMOVING_PREFIX)):
                shutil.rmtree(leftover, ignore_errors=True)
        yield
    finally:
        os.close(fd)  # releases the lock


def put_in_place(staging: Path, directory: Path) -> None:
    """Rename the complete dataset ``staging`` to ``directory``, replacing what is there (under the
    writer lock): readers see the old dataset or the new one, or briefly none, never a mix."""
    removing = _move_aside(directory)
    os.rename(staging, directory)
    if removing is not None:
        shutil.rmtree(removing, ignore_errors=True)


def remove_dataset(directory: Path) -> bool:
    """Remove a damaged dataset so that the next run writes a fresh copy; False if it cannot be."""
    try:
        with writer_lock(directory.parent):
            removing = _move_aside(directory)
    except OSError:
        return False
    if removing is not None:
        shutil.rmtree(removing, ignore_errors=True)
    return True


def _move_aside(directory: Path) -> Path | None:
    """Rename ``directory`` (if it exists) to a temporary sibling, which is returned for removal."""
    if not os.path.lexists(directory):
        return None
    removing = Path(tempfile.mkdtemp(prefix=REMOVING_PREFIX, dir=directory.parent))
    os.rename(directory, removing / directory.name)
    return removing
