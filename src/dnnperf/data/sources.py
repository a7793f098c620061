"""Where a training loop's batches come from: a pool in memory, or a real dataset on disk.

On-disk datasets are written once into a cache directory and reused by later runs. A dataset is
written into a temporary sibling directory and renamed into place only when complete, so an
interrupted write never leaves a half dataset that a later run would trust; every open checks it
against its manifest (``integrity.py``), and a damaged one is rebuilt or refused before any step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from dnnperf.cache import cache_dir
from dnnperf.data.formats import DataFormat, Sample
from dnnperf.data.integrity import (
    WRITING_PREFIX,
    CorruptDataset,
    SampleError,
    put_in_place,
    remove_dataset,
    summary,
    verify_dataset,
    write_manifest,
    writer_lock,
)
from dnnperf.errors import UsageError

DATA_DIR_ENV = "DNNPERF_DATA_DIR"
DATA_KINDS = ("memory", "disk")


def default_data_dir() -> Path:
    """``$DNNPERF_DATA_DIR``, else ``datasets`` in dnnperf's cache directory (``~/.cache/dnnperf``)."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return cache_dir() / "datasets"


def dataset_key(fmt: DataFormat, count: int, seed: int) -> str:
    """A directory name that changes whenever the stored content would."""
    description = json.dumps({**fmt.describe(), "count": count, "seed": seed}, sort_keys=True)
    digest = hashlib.sha256(description.encode()).hexdigest()[:12]
    return f"{type(fmt).__name__.removesuffix('Format').lower()}-{count}-{digest}"


def ensure_dataset(fmt: DataFormat, count: int, seed: int = 0, root: Path | None = None) -> Path:
    """The directory of the on-disk dataset, checked against its manifest (see ``integrity.py``).

    A dataset not there yet is written. One that is damaged (a file changed, truncated or missing, a
    garbled manifest) is rebuilt, said in one line on stderr: it is a cache dnnperf generated from
    the seed. Where it cannot be written, a UsageError says why (a CorruptDataset for a damaged one).
    """
    root = Path(root) if root is not None else default_data_dir()
    description = {**fmt.describe(), "count": count, "seed": seed}
    directory = root / dataset_key(fmt, count, seed)
    problems = verify_dataset(directory, description) if os.path.lexists(directory) else None
    if problems == []:
        return directory
    try:
        root.mkdir(parents=True, exist_ok=True)
        with writer_lock(root):
            # Another run may have written or rebuilt it while this one waited for the lock.
            problems = verify_dataset(directory, description) if os.path.lexists(directory) else None
            if problems == []:
                return directory
            staging = Path(tempfile.mkdtemp(prefix=WRITING_PREFIX, dir=root))
            try:
                if problems:
                    sys.stderr.write(
                        f"dnnperf: dataset cache {directory} is damaged: {summary(problems)}; "
                        "rebuilding it (dnnperf generated it from its seed)\n"
                    )
                    sys.stderr.flush()
                fmt.write(staging, count, seed)
                write_manifest(staging, description)
                put_in_place(staging, directory)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        reason = error.strerror or str(error)
        fix = f"make it writable, or point --data-dir (or ${DATA_DIR_ENV}) at a writable directory"
        if problems:
            raise CorruptDataset(
                f"dataset cache {directory} is damaged: {summary(problems)}; it cannot be rebuilt "
                f"under {root} ({reason}): {fix}"
            ) from None
        raise UsageError(f"cannot write datasets under {root}: {reason}: {fix}") from None
    return directory


# Seconds of reading and preprocessing done by this process since the last batch was collated. Each
# DataLoader worker is its own process with its own copy, so the totals travel with the batch they
# belong to (under DATA_TIMES_KEY), whichever process made it.
_pending_data_times = {"read": 0.0, "preprocess": 0.0}
DATA_TIMES_KEY = "_dnnperf_data_times"
DATA_TIME_NAMES = ("read", "preprocess", "collate")


class DiskDataset(Dataset):
    """Samples of an on-disk dataset: each item is read from storage, then preprocessed; both are
    timed, and the times are delivered with the batch by :func:`timed_collate`."""

    def __init__(self, fmt: DataFormat, directory: Path) -> None:
        self.format = fmt
        self.directory = Path(directory)
        self.count = int(json.loads((self.directory / "manifest.json").read_text())["count"])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Sample:
        start = time.perf_counter()
        try:
            raw = self.format.read(self.directory, index)
            read_done = time.perf_counter()
            sample = self.format.preprocess(raw)
        except MemoryError:
            raise
        except Exception as error:
            # One line naming the sample: a DataLoader worker's error reaches the training process as
            # its whole traceback, whose last line this is (see DiskSource.__next__).
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            raise SampleError(f"sample {index} of {self.directory} could not be loaded: {detail}") from error
        _pending_data_times["read"] += read_done - start
        _pending_data_times["preprocess"] += time.perf_counter() - read_done
        return sample


def timed_collate(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """Stack samples into a batch and attach the read/preprocess/collate seconds spent making it."""
    start = time.perf_counter()
    batch = default_collate(samples)
    collate = time.perf_counter() - start
    batch[DATA_TIMES_KEY] = torch.tensor(
        [_pending_data_times["read"], _pending_data_times["preprocess"], collate], dtype=torch.float64
    )
    _pending_data_times["read"] = _pending_data_times["preprocess"] = 0.0
    return batch


def reset_data_times(*_: Any) -> None:
    """Forget times not yet delivered (a batch abandoned by an error, or copied into a new worker)."""
    _pending_data_times["read"] = _pending_data_times["preprocess"] = 0.0


def pop_data_times(batch: dict[str, Any]) -> dict[str, float] | None:
    """Remove and return the data-making times a batch carries (None for batches made in memory)."""
    times = batch.pop(DATA_TIMES_KEY, None)
    return None if times is None else dict(zip(DATA_TIME_NAMES, times.tolist(), strict=True))


class BatchSource:
    """An endless iterator of host batches (dicts of tensors). Close it to stop data workers."""

    #: DataLoader worker processes making the batches (0: made in the training process).
    workers: int = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def close(self) -> None:
        """Release workers and files; safe to call twice."""

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MemorySource(BatchSource):
    """Cycles through ``pool`` batches generated once in host memory: no read, no preprocessing."""

    def __init__(self, fmt: DataFormat, batch_size: int, pool: int = 2, seed: int = 0, pin: bool = False):
        data = fmt.synthesize(batch_size * pool, seed)
        # Each batch its own storage (a clone, not a view of the pool), as a loader's collate makes it:
        # the memory profiler counts a batch's storage, which a view would make the whole pool's.
        self.batches = [
            {key: value[i * batch_size : (i + 1) * batch_size].clone() for key, value in data.items()}
            for i in range(pool)
        ]
        if pin:
            self.batches = [{k: v.pin_memory() for k, v in b.items()} for b in self.batches]
        self.index = 0

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = self.batches[self.index % len(self.batches)]
        self.index += 1
        return batch


class EndlessShuffle(Sampler[int]):
    """Successive seeded permutations of the dataset indices, forever. One DataLoader iterator then
    serves every epoch: workers never restart and prefetching carries across epoch boundaries, so
    no measured step pays for an epoch's start-up."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.size, generator=generator).tolist()


class DiskSource(BatchSource):
    """Batches from a DataLoader over the on-disk dataset, reshuffled every epoch, forever."""

    def __init__(
        self,
        fmt: DataFormat,
        directory: Path,
        batch_size: int,
        workers: int,
        seed: int = 0,
        pin: bool = False,
    ) -> None:
        dataset = DiskDataset(fmt, directory)
        self.directory = dataset.directory
        reset_data_times()
        self.loader: DataLoader | None = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=EndlessShuffle(len(dataset), seed),
            drop_last=True,
            num_workers=workers,
            pin_memory=pin,
            collate_fn=timed_collate,
            worker_init_fn=reset_data_times,
        )
        self.workers = workers
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.loader is None:
            raise RuntimeError("batch source is closed")
        if self.iterator is None:
            self.iterator = iter(self.loader)
        try:
            return next(self.iterator)
        except SampleError as error:
            raise explain_sample_error(self.directory, error) from None

    def close(self) -> None:
        iterator, self.iterator = self.iterator, None
        # Stop the workers now rather than whenever the iterator is collected. The iterator's own
        # shutdown is private API (hence getattr); without it, dropping every reference lets its
        # finaliser stop them. A test checks that no worker process outlives close().
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del iterator
        self.loader = None


def explain_sample_error(directory: Path, error: SampleError) -> Exception:
    """The one-line error for a sample that failed to load during a run: a CorruptDataset naming the
    damaged file when hashing every file finds one (the dataset is then removed, so that the next run
    writes a fresh copy, even where the damage kept sizes and times), else the sample's own error."""
    problems = verify_dataset(directory, full=True)
    if not problems:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return SampleError(lines[-1].removeprefix(f"{SampleError.__module__}.{SampleError.__qualname__}: "))
    if remove_dataset(directory):
        action = "removed it: the next run writes a fresh copy"
    else:
        action = f"remove {directory} (a cache dnnperf regenerates) and run again"
    return CorruptDataset(f"dataset cache {directory} is damaged: {summary(problems)}; {action}")


def default_workers() -> int:
    """Data workers when none are asked for: half the usable cores, between 1 and 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores // 2))


def dataset_size(batch_size: int, minimum: int) -> int:
    """Samples in an on-disk dataset: the preset's minimum, and at least two batches."""
    return max(minimum, 2 * batch_size)


def open_source(
    fmt: DataFormat,
    kind: str,
    batch_size: int,
    *,
    seed: int = 0,
    workers: int | None = None,
    data_dir: Path | None = None,
    min_samples: int = 64,
    pin: bool = False,
) -> BatchSource:
    """The batch source for a workload's data format and a data kind (``memory`` or ``disk``)."""
    if kind not in DATA_KINDS:
        raise UsageError(f"unknown data kind {kind!r}: use one of {', '.join(DATA_KINDS)}")
    if kind == "disk" and not fmt.storable:
        raise UsageError(f"{fmt.why_not_storable}; --data disk does not apply")
    if kind == "memory":
        return MemorySource(fmt, batch_size, seed=seed, pin=pin)
    directory = ensure_dataset(fmt, dataset_size(batch_size, min_samples), seed, data_dir)
    return DiskSource(
        fmt, directory, batch_size, default_workers() if workers is None else workers, seed, pin
    )
