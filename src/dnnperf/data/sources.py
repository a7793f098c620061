"""Where a training loop's batches come from: a pool in memory, or a real dataset on disk.

On-disk datasets are written once into a cache directory and reused by later runs. A dataset is
written into a temporary sibling directory and renamed into place only when complete, so an
interrupted write never leaves a half dataset that a later run would trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from dnnperf.cache import cache_dir
from dnnperf.data.formats import DataFormat, Sample
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
    """The directory of the on-disk dataset, writing it first if no complete copy exists."""
    root = Path(root) if root is not None else default_data_dir()
    directory = root / dataset_key(fmt, count, seed)
    if (directory / "manifest.json").exists():
        return directory
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=root))
    except OSError as error:
        raise UsageError(f"cannot write datasets under {root}: {error.strerror or error}") from None
    try:
        fmt.write(staging, count, seed)
        manifest = {**fmt.describe(), "count": count, "seed": seed}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            os.rename(staging, directory)
        except OSError:
            if not (directory / "manifest.json").exists():  # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


class DiskDataset(Dataset):
    """Samples of an on-disk dataset: each item is read from storage, then preprocessed."""

    def __init__(self, fmt: DataFormat, directory: Path) -> None:
        self.format = fmt
        self.directory = Path(directory)
        self.count = int(json.loads((self.directory / "manifest.json").read_text())["count"])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Sample:
        return self.format.preprocess(self.format.read(self.directory, index))


class BatchSource:
    """An endless iterator of host batches (dicts of tensors). Close it to stop data workers."""

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
        self.batches = [
            {key: value[i * batch_size : (i + 1) * batch_size].contiguous() for key, value in data.items()}
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
        self.loader: DataLoader | None = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=EndlessShuffle(len(dataset), seed),
            drop_last=True,
            num_workers=workers,
            pin_memory=pin,
        )
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.loader is None:
            raise RuntimeError("batch source is closed")
        if self.iterator is None:
            self.iterator = iter(self.loader)
        return next(self.iterator)

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
