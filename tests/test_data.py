"""Synthetic data: the in-memory and on-disk forms agree, datasets are written once and atomically,
preprocessing does what it says, and data workers are gone after close()."""

import io

import numpy as np
import psutil
import pytest
import torch
from PIL import Image

from dnnperf.data.formats import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DetectionFormat,
    ImageFormat,
    InteractionFormat,
    LanguageModelFormat,
    SpeechFormat,
    TranslationFormat,
    class_colours,
)
from dnnperf.data.sources import DiskDataset, DiskSource, MemorySource, ensure_dataset, open_source

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

FORMATS = [
    ImageFormat(image_size=24, num_classes=5),
    DetectionFormat(image_size=48, num_classes=3, boxes_per_image=2),
    TranslationFormat(vocab_size=50, src_len=6, tgt_len=9),
    LanguageModelFormat(vocab_size=40, seq_len=8),
    SpeechFormat(num_features=16, num_frames=40, transcript_len=5, vocab_size=10),
    InteractionFormat(num_users=30, num_items=40, negatives=4),
]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: type(f).__name__)
def test_memory_and_disk_samples_have_the_same_structure(fmt, tmp_path):
    memory = fmt.synthesize(3, seed=0)
    directory = ensure_dataset(fmt, 3, seed=0, root=tmp_path)
    disk = DiskDataset(fmt, directory)
    assert len(disk) == 3
    sample = disk[1]
    assert sample.keys() == memory.keys()
    for key, value in sample.items():
        assert value.dtype == memory[key].dtype, key
        assert value.shape == memory[key].shape[1:], key
    # The layout a DataLoader's collate makes, which the model's counted step and fault count use:
    # channels-last strides would run other kernels than the step the runner times.
    batch = next(iter(torch.utils.data.DataLoader(disk, batch_size=3)))
    for key, value in memory.items():
        assert value.is_contiguous() and batch[key].is_contiguous(), key


def test_datasets_are_written_once_and_reused(tmp_path):
    fmt = ImageFormat(image_size=16, num_classes=3)
    first = ensure_dataset(fmt, 4, root=tmp_path)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    second = ensure_dataset(fmt, 4, root=tmp_path)
    assert second == first and (first / "manifest.json").stat().st_mtime_ns == stamp
    assert ensure_dataset(fmt, 5, root=tmp_path) != first  # a different size is a different dataset
    assert not list(tmp_path.glob(".writing-*"))


def test_an_interrupted_write_leaves_nothing_a_later_run_would_trust(tmp_path, monkeypatch):
    fmt = ImageFormat(image_size=16, num_classes=3)

    def fail_midway(self, directory, count, seed):
        (directory / "images").mkdir()
        (directory / "images" / "0000000.jpg").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ImageFormat, "write", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        ensure_dataset(fmt, 4, root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_images_are_real_jpeg_files_larger_than_the_crop(tmp_path):
    fmt = ImageFormat(image_size=56, num_classes=4)
    directory = ensure_dataset(fmt, 2, root=tmp_path)
    files = sorted((directory / "images").glob("*.jpg"))
    assert len(files) == 2
    with Image.open(io.BytesIO(files[0].read_bytes())) as image:
        assert image.format == "JPEG" and image.size == (64, 64)  # 56 * 8 / 7
    assert fmt.preprocess(fmt.read(directory, 0))["image"].shape == (3, 56, 56)


def test_detection_boxes_follow_the_image_when_flipped(tmp_path):
    fmt = DetectionFormat(image_size=64, num_classes=3, boxes_per_image=1)
    directory = ensure_dataset(fmt, 1, root=tmp_path)
    raw = fmt.read(directory, 0)
    colour = torch.from_numpy(class_colours(4)[raw["labels"][0]]) / 255
    expected = (colour - IMAGENET_MEAN) / IMAGENET_STD
    torch.manual_seed(0)
    seen_flips = set()
    for _ in range(12):
        sample = fmt.preprocess(raw)
        flipped = not torch.equal(sample["boxes"], torch.from_numpy(raw["boxes"]))
        seen_flips.add(flipped)
        x0, y0, x1, y1 = (round(float(v)) for v in sample["boxes"][0])
        inner = sample["image"][:, y0 + 2 : y1 - 2, x0 + 2 : x1 - 2]
        # brightness jitter is at most +-20%; the box interior keeps the class colour's hue
        mean = inner.mean(dim=(1, 2)) * IMAGENET_STD + IMAGENET_MEAN
        assert torch.allclose(
            mean / mean.sum(), (expected * IMAGENET_STD + IMAGENET_MEAN) / colour.sum(), atol=0.08
        )
    assert seen_flips == {True, False}


def test_translation_targets_are_a_fixed_mapping_of_the_reversed_source():
    fmt = TranslationFormat(vocab_size=30, src_len=5, tgt_len=5)
    records = fmt.generate(200, np.random.default_rng(1))
    mapping = {}
    for src, tgt in zip(records["src"], records["tgt"], strict=True):
        for s, t in zip(src[::-1], tgt, strict=True):
            assert mapping.setdefault(int(s), int(t)) == int(t)
    sample = fmt.preprocess({k: v[0] for k, v in records.items()})
    assert sample["tgt_in"][0] == 1 and torch.equal(sample["tgt_in"][1:], sample["tgt_out"][:-1])


def test_interactions_carry_one_positive_and_sampled_negatives():
    fmt = InteractionFormat(num_users=10, num_items=20, negatives=4)
    sample = fmt.synthesize(2, seed=0)
    assert sample["label"].tolist() == [[1, 0, 0, 0, 0]] * 2
    assert (sample["user"] == sample["user"][:, :1]).all()


def test_memory_source_cycles_its_pool():
    source = MemorySource(ImageFormat(image_size=8, num_classes=2), batch_size=3, pool=2)
    a, b, c = next(source), next(source), next(source)
    assert a["image"].shape == (3, 3, 8, 8)
    assert not torch.equal(a["image"], b["image"]) and torch.equal(a["image"], c["image"])
    # Each batch owns its storage, no more than the batch (the memory profiler counts storages).
    for batch in (a, b):
        for tensor in batch.values():
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def test_disk_source_runs_past_an_epoch_and_close_stops_its_workers(tmp_path):
    fmt = ImageFormat(image_size=16, num_classes=3)
    # Children from before, not ours to stop: multiprocessing's resource tracker, which an earlier test
    # in this process may have started, lives as long as the process.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    source = open_source(fmt, "disk", batch_size=4, workers=2, data_dir=tmp_path, min_samples=8)
    assert isinstance(source, DiskSource)
    for _ in range(5):  # 8 samples, 2 batches per epoch: crosses two epoch boundaries
        assert next(source)["image"].shape == (4, 3, 16, 16)
    workers = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert len(workers) >= 2
    source.close()
    source.close()  # idempotent
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []


def test_the_endless_sampler_gives_a_fresh_permutation_every_epoch():
    from itertools import islice

    from dnnperf.data.sources import EndlessShuffle

    indices = list(islice(iter(EndlessShuffle(10, seed=3)), 30))
    epochs = [indices[i : i + 10] for i in (0, 10, 20)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert indices == list(islice(iter(EndlessShuffle(10, seed=3)), 30))  # reproducible
