"""The run store: a directory of JSON run records, written atomically, listed without trusting them."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnnperf.errors import UsageError
from dnnperf.jsonio import read_json_file, write_json_atomic
from dnnperf.results.record import RecordError, RunRecord

RUNS_DIR_ENV = "DNNPERF_RUNS_DIR"
DEFAULT_RUNS_DIR = "dnnperf-runs"


def default_runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR)


@dataclass(frozen=True)
class SkippedRecord:
    """A file in the runs directory that could not be read as a record, and why."""

    path: Path
    reason: str


class RunStore:
    """Run records under one directory, one ``<id>.json`` file each."""

    def __init__(self, root: Path | str | None = None, *, create: bool = True) -> None:
        self.root = Path(root) if root is not None else default_runs_dir()
        if create:
            self._check_writable()

    def _check_writable(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"runs directory {self.root} is not a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root):
                pass
        except OSError as error:
            reason = error.strerror or str(error)
            raise UsageError(
                f"runs directory {self.root} is not writable: cannot make a file in it ({reason})"
            ) from None

    def path(self, record_id: str) -> Path:
        return self.root / f"{record_id}.json"

    def save(self, record: RunRecord) -> Path:
        """Write ``record`` atomically, checked first as ``load`` checks it: a record built by hand (a
        user's own loop) that ``load`` would refuse is refused here, with the same reason."""
        path = self.path(record.id)
        document = record.to_dict()
        try:
            checked_record(document)
        except RecordError as error:
            raise UsageError(f"record {record.id} cannot be saved: {error}") from None
        write_json_atomic(path, document)
        return path

    def load(self, ref: str) -> RunRecord:
        """A record by file path, id, or unique id prefix."""
        if not ref.strip():
            raise UsageError("give a run id, id prefix or record path")
        if os.sep in ref or ref.endswith(".json"):  # a path, not an id
            if not Path(ref).exists():
                raise UsageError(f"no record file {ref}")
            return read_record(Path(ref))
        if self.path(ref).is_file():
            return read_record(self.path(ref))
        matches = sorted(p for p in self._files() if p.name.startswith(ref))
        if len(matches) == 1:
            return read_record(matches[0])
        if not matches:
            raise UsageError(f"no run {ref!r} in {self.root}")
        raise UsageError(f"run {ref!r} is ambiguous in {self.root}: {len(matches)} records match")

    def _files(self) -> list[Path]:
        """The record files; a runs path that exists but is not a directory is a usage error."""
        if not self.root.exists():
            return []
        if not self.root.is_dir():
            raise UsageError(f"runs directory {self.root} is not a directory")
        return sorted(p for p in self.root.iterdir() if p.suffix == ".json" and not p.name.startswith("."))

    def scan(self) -> tuple[list[RunRecord], list[SkippedRecord]]:
        """Every readable record (oldest first) and every file that was skipped, with the reason."""
        records: list[RunRecord] = []
        skipped: list[SkippedRecord] = []
        for path in self._files():
            try:
                records.append(read_record(path))
            except UsageError as error:
                skipped.append(SkippedRecord(path, str(error)))
        records.sort(key=lambda r: r.created)
        return records, skipped


def checked_record(document: Any) -> RunRecord:
    """The record a document holds; a RecordError saying what is wrong with it, whatever broke."""
    try:
        return RunRecord.from_dict(document)
    except RecordError:
        raise
    except (OverflowError, TypeError, ValueError, AttributeError, KeyError) as error:
        raise RecordError(str(error)) from None


def read_record(path: Path) -> RunRecord:
    """Parse and validate one record file."""
    document = read_json_file(path, "dnnperf run record")
    try:
        return checked_record(document)
    except RecordError as error:
        raise UsageError(f"{path} is not a dnnperf run record: {error}") from None
