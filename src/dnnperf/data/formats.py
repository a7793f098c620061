"""The synthetic data of each application domain, in two forms.

* In memory: training-ready tensors generated directly on the host (no read, no preprocessing).
* On disk: raw samples written once as a real dataset (JPEG files for images, binary shards of
  fixed-size records for tokens, audio features and interactions). Reading a sample moves bytes from
  storage to host memory (:meth:`DataFormat.read`); preprocessing decodes and augments them
  (:meth:`DataFormat.preprocess`). Both are real work, so a profiler can time them.

Every generator is deterministic in its seed, and the samples carry learnable structure (labels follow
the image content, targets follow the source tokens) so that training on them can make progress.
"""

from __future__ import annotations

import io
import math
import os
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

Raw = dict[str, Any]
Sample = dict[str, torch.Tensor]

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406])
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225])


class DataFormat(ABC):
    """How one workload's samples are synthesised, stored, read back and preprocessed."""

    #: Bumped when the stored form changes, so cached datasets of the old form are not reused.
    version: int = 1
    #: False for data that only exists inside the step (an environment), with the reason.
    storable: bool = True
    why_not_storable: str = ""

    def describe(self) -> dict[str, Any]:
        """Parameters that identify the stored dataset (used in its cache key and manifest)."""
        return {"format": type(self).__name__, "version": self.version, **asdict(self)}  # type: ignore[call-overload]

    @abstractmethod
    def synthesize(self, count: int, seed: int) -> Sample:
        """``count`` training-ready samples, stacked along dim 0, generated in memory."""

    @abstractmethod
    def write(self, directory: Path, count: int, seed: int) -> None:
        """Write ``count`` raw samples under ``directory`` (which exists and is empty)."""

    @abstractmethod
    def read(self, directory: Path, index: int) -> Raw:
        """Load raw sample ``index`` from storage into host memory, without decoding it."""

    @abstractmethod
    def preprocess(self, raw: Raw) -> Sample:
        """Decode and augment one raw sample into training-ready tensors (uses torch's RNG)."""


# ---------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------


def class_colours(num_classes: int) -> np.ndarray:
    """One distinct RGB colour per class, spread around the hue circle."""
    hues = np.arange(num_classes) / max(num_classes, 1)
    angles = 2 * np.pi * (hues[:, None] + np.array([0.0, 1 / 3, 2 / 3]))
    return (127.5 + 100 * np.cos(angles)).astype(np.float32)


def _synthetic_images(count: int, size: int, labels: np.ndarray, num_classes: int, rng: np.random.Generator):
    """uint8 HWC images: smooth noise tinted by the class colour, with a class-coloured square."""
    coarse = max(size // 8, 2)
    noise = rng.standard_normal((count, 3, coarse, coarse), dtype=np.float32)
    smooth = torch.nn.functional.interpolate(
        torch.from_numpy(noise), size=(size, size), mode="bilinear", align_corners=False
    ).numpy()
    colours = class_colours(num_classes)[labels]  # [N, 3]
    images = colours[:, :, None, None] * 0.6 + 40.0 * smooth + 40.0
    side = max(size // 4, 1)
    for i in range(count):
        y, x = rng.integers(0, size - side + 1, size=2)
        images[i, :, y : y + side, x : x + side] = colours[i, :, None, None]
    return np.clip(images, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)  # NHWC


def _to_normalised_tensor(hwc_uint8: np.ndarray) -> torch.Tensor:
    """uint8 HWC (or NHWC) -> float CHW (NCHW) normalised with the ImageNet statistics."""
    tensor = torch.from_numpy(np.ascontiguousarray(hwc_uint8)).float().div_(255.0)
    tensor = tensor.movedim(-1, -3)
    shape = (3, 1, 1)
    # Contiguous NCHW, as a DataLoader's collate and the in-memory pool hand it over: the moved HWC
    # strides are channels-last, which oneDNN keeps through the network (inception_v3 `small` batch 4
    # ran 20% faster so), so a step counted or timed on them is not the step the runner times.
    return ((tensor - IMAGENET_MEAN.view(shape)) / IMAGENET_STD.view(shape)).contiguous()


def _encode_jpeg(hwc_uint8: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(hwc_uint8, mode="RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _decode_jpeg(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


@dataclass(frozen=True)
class ImageFormat(DataFormat):
    """Labelled RGB images. Stored as JPEG files 8/7 larger than the training size (like ImageNet's
    resize-256/crop-224); preprocessing decodes, randomly crops, flips and normalises."""

    image_size: int
    num_classes: int
    with_labels: bool = True

    @property
    def stored_size(self) -> int:
        return math.ceil(self.image_size * 8 / 7)

    def _generate(self, count: int, seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, self.num_classes, size=count)
        return _synthetic_images(count, size, labels, self.num_classes, rng), labels

    def synthesize(self, count: int, seed: int) -> Sample:
        images, labels = self._generate(count, seed, self.image_size)
        sample = {"image": _to_normalised_tensor(images)}
        if self.with_labels:
            sample["label"] = torch.from_numpy(labels).long()
        return sample

    def write(self, directory: Path, count: int, seed: int) -> None:
        images, labels = self._generate(count, seed, self.stored_size)
        (directory / "images").mkdir()
        for index in range(count):
            (directory / "images" / f"{index:07d}.jpg").write_bytes(_encode_jpeg(images[index]))
        labels.astype(np.int64).tofile(directory / "labels.int64")

    def read(self, directory: Path, index: int) -> Raw:
        label = np.fromfile(directory / "labels.int64", dtype=np.int64, count=1, offset=8 * index)[0]
        return {"jpeg": (directory / "images" / f"{index:07d}.jpg").read_bytes(), "label": int(label)}

    def preprocess(self, raw: Raw) -> Sample:
        image = _decode_jpeg(raw["jpeg"])
        size = self.image_size
        top, left = (int(v) for v in torch.randint(0, image.shape[0] - size + 1, (2,)))
        image = image[top : top + size, left : left + size]
        if torch.rand(()) < 0.5:
            image = image[:, ::-1]
        sample = {"image": _to_normalised_tensor(image)}
        if self.with_labels:
            sample["label"] = torch.tensor(raw["label"], dtype=torch.long)
        return sample


@dataclass(frozen=True)
class DetectionFormat(DataFormat):
    """Images with ``boxes_per_image`` class-coloured rectangles and their boxes (xyxy, pixels) and
    labels (1..num_classes; 0 is background). Stored as JPEG plus box/label shards; preprocessing
    decodes, flips image and boxes together, and jitters brightness."""

    image_size: int
    num_classes: int
    boxes_per_image: int

    def _generate(self, count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        size, k = self.image_size, self.boxes_per_image
        labels = rng.integers(1, self.num_classes + 1, size=(count, k))
        background = np.zeros(count, dtype=np.int64)
        images = _synthetic_images(count, size, background, self.num_classes + 1, rng).copy()
        colours = class_colours(self.num_classes + 1)
        wh = rng.uniform(0.15, 0.45, size=(count, k, 2)) * size
        xy = rng.uniform(0, 1, size=(count, k, 2)) * (size - wh)
        boxes = np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)
        for i in range(count):
            for j in range(k):
                x0, y0, x1, y1 = boxes[i, j].round().astype(int)
                images[i, y0:y1, x0:x1] = colours[labels[i, j]].astype(np.uint8)
        return images, boxes, labels

    def synthesize(self, count: int, seed: int) -> Sample:
        images, boxes, labels = self._generate(count, seed)
        return {
            "image": _to_normalised_tensor(images),
            "boxes": torch.from_numpy(boxes),
            "labels": torch.from_numpy(labels).long(),
        }

    def write(self, directory: Path, count: int, seed: int) -> None:
        images, boxes, labels = self._generate(count, seed)
        (directory / "images").mkdir()
        for index in range(count):
            (directory / "images" / f"{index:07d}.jpg").write_bytes(_encode_jpeg(images[index]))
        boxes.astype(np.float32).tofile(directory / "boxes.float32")
        labels.astype(np.int64).tofile(directory / "labels.int64")

    def read(self, directory: Path, index: int) -> Raw:
        k = self.boxes_per_image
        boxes = np.fromfile(directory / "boxes.float32", dtype=np.float32, count=4 * k, offset=16 * k * index)
        labels = np.fromfile(directory / "labels.int64", dtype=np.int64, count=k, offset=8 * k * index)
        jpeg = (directory / "images" / f"{index:07d}.jpg").read_bytes()
        return {"jpeg": jpeg, "boxes": boxes.reshape(k, 4), "labels": labels}

    def preprocess(self, raw: Raw) -> Sample:
        image = _decode_jpeg(raw["jpeg"]).astype(np.float32)
        boxes = raw["boxes"].copy()
        if torch.rand(()) < 0.5:
            image = image[:, ::-1]
            boxes[:, [0, 2]] = self.image_size - boxes[:, [2, 0]]
        image = np.clip(image * float(torch.empty(()).uniform_(0.8, 1.2)), 0, 255).astype(np.uint8)
        return {
            "image": _to_normalised_tensor(image),
            "boxes": torch.from_numpy(boxes),
            "labels": torch.from_numpy(raw["labels"]).long(),
        }


# ---------------------------------------------------------------------------------------------------
# Fixed-size records in binary shards: tokens, audio features, user-item interactions
# ---------------------------------------------------------------------------------------------------


class RecordFormat(DataFormat):
    """Samples made of fixed-shape numeric fields, stored as one raw binary file per field.

    Subclasses define :meth:`fields` (name -> (dtype, per-record shape)), :meth:`generate` (raw
    records) and :meth:`preprocess`; reading is shared: a positioned read of each field's bytes.
    """

    @abstractmethod
    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]: ...

    @abstractmethod
    def generate(self, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]: ...

    def synthesize(self, count: int, seed: int) -> Sample:
        records = self.generate(count, np.random.default_rng(seed))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # preprocessing may draw (negatives, masks): keep it reproducible
            samples = [self.preprocess({k: v[i] for k, v in records.items()}) for i in range(count)]
        return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}

    def write(self, directory: Path, count: int, seed: int) -> None:
        records = self.generate(count, np.random.default_rng(seed))
        for name, (dtype, shape) in self.fields().items():
            array = np.ascontiguousarray(records[name], dtype=dtype)
            if array.shape != (count, *shape):
                raise ValueError(f"field {name}: generated shape {array.shape}, expected {(count, *shape)}")
            array.tofile(directory / f"{name}.bin")

    def read(self, directory: Path, index: int) -> Raw:
        raw = {}
        for name, (dtype, shape) in self.fields().items():
            per_record = int(np.prod(shape, dtype=np.int64))
            nbytes = per_record * np.dtype(dtype).itemsize
            with open(directory / f"{name}.bin", "rb") as f:
                data = os.pread(f.fileno(), nbytes, nbytes * index)
            raw[name] = np.frombuffer(data, dtype=dtype).reshape(shape)
        return raw


def _markov_tokens(count: int, length: int, vocab: int, rng: np.random.Generator, low: int) -> np.ndarray:
    """Token sequences from a sparse random Markov chain over ids [low, vocab): predictable, not constant."""
    span = vocab - low
    successors = rng.integers(0, span, size=(span, 2))
    tokens = np.empty((count, length), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, span, size=count)
    choice = rng.integers(0, 2, size=(count, length))
    for t in range(1, length):
        tokens[:, t] = successors[tokens[:, t - 1], choice[:, t]]
    return tokens + low


BOS, EOS = 1, 2  # special token ids of the text formats; 0 is padding


@dataclass(frozen=True)
class TranslationFormat(RecordFormat):
    """Sentence pairs: the target is a fixed word-by-word mapping of the reversed source, framed by
    BOS/EOS. The step gets ``src``, ``tgt_in`` (BOS + target) and ``tgt_out`` (target + EOS)."""

    vocab_size: int
    src_len: int
    tgt_len: int

    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"src": (np.dtype(np.int32), (self.src_len,)), "tgt": (np.dtype(np.int32), (self.tgt_len,))}

    def generate(self, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        src = _markov_tokens(count, self.src_len, self.vocab_size, rng, low=3)
        mapping = rng.permutation(self.vocab_size - 3) + 3
        mapped = mapping[src[:, ::-1] - 3]
        repeats = math.ceil(self.tgt_len / self.src_len)  # longer targets repeat the mapped source
        return {"src": src, "tgt": np.tile(mapped, (1, repeats))[:, : self.tgt_len]}

    def preprocess(self, raw: Raw) -> Sample:
        tgt = torch.from_numpy(raw["tgt"].astype(np.int64))
        return {
            "src": torch.from_numpy(raw["src"].astype(np.int64)),
            "tgt_in": torch.cat([torch.tensor([BOS]), tgt[:-1]]),
            "tgt_out": tgt,
        }


@dataclass(frozen=True)
class LanguageModelFormat(RecordFormat):
    """Token sequences for next-token prediction: ``tokens`` and the shifted ``targets``."""

    vocab_size: int
    seq_len: int

    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"tokens": (np.dtype(np.int32), (self.seq_len + 1,))}

    def generate(self, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"tokens": _markov_tokens(count, self.seq_len + 1, self.vocab_size, rng, low=3)}

    def preprocess(self, raw: Raw) -> Sample:
        tokens = torch.from_numpy(raw["tokens"].astype(np.int64))
        return {"tokens": tokens[:-1], "targets": tokens[1:]}


@dataclass(frozen=True)
class SpeechFormat(RecordFormat):
    """Log-spectrogram utterances (stored as float16) with character transcripts (1..vocab-1; 0 is the
    CTC blank). Preprocessing normalises each utterance and applies SpecAugment-style masking."""

    num_features: int
    num_frames: int
    transcript_len: int
    vocab_size: int
    augment: bool = True

    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {
            "features": (np.dtype(np.float16), (self.num_frames, self.num_features)),
            "transcript": (np.dtype(np.int32), (self.transcript_len,)),
        }

    def generate(self, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        transcript = rng.integers(1, self.vocab_size, size=(count, self.transcript_len))
        # Each character owns a spectral signature; frames spell the transcript out in order.
        signatures = rng.standard_normal((self.vocab_size, self.num_features)).astype(np.float32)
        frame_char = (np.arange(self.num_frames) * self.transcript_len) // self.num_frames
        features = signatures[transcript[:, frame_char]]
        features += 0.3 * rng.standard_normal(features.shape, dtype=np.float32)
        return {"features": features.astype(np.float16), "transcript": transcript}

    def preprocess(self, raw: Raw) -> Sample:
        features = torch.from_numpy(raw["features"].astype(np.float32))
        features = (features - features.mean()) / (features.std() + 1e-5)
        if self.augment:
            features = features.clone()
            width = max(self.num_features // 8, 1)
            start = int(torch.randint(0, self.num_features - width + 1, ()))
            features[:, start : start + width] = 0.0
            span = max(self.num_frames // 20, 1)
            start = int(torch.randint(0, self.num_frames - span + 1, ()))
            features[start : start + span] = 0.0
        return {
            "features": features,
            "feature_lengths": torch.tensor(self.num_frames),
            "transcript": torch.from_numpy(raw["transcript"].astype(np.int64)),
            "transcript_lengths": torch.tensor(self.transcript_len),
        }

    def synthesize(self, count: int, seed: int) -> Sample:
        # In memory: normalised but not augmented, so a fixed batch stays fixed.
        return RecordFormat.synthesize(replace(self, augment=False), count, seed)


@dataclass(frozen=True)
class InteractionFormat(RecordFormat):
    """Implicit-feedback (user, item) positives from a low-rank preference model. Preprocessing draws
    ``negatives`` random items per positive (the NCF recipe), so a sample is 1 + negatives rows."""

    num_users: int
    num_items: int
    negatives: int

    def fields(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"user": (np.dtype(np.int32), ()), "item": (np.dtype(np.int32), ())}

    def generate(self, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        users = rng.integers(0, self.num_users, size=count)
        # Users prefer items in their own "genre": item = genre block chosen by user, random within it.
        genres = 8
        block = max(self.num_items // genres, 1)
        items = (users % genres) * block + rng.integers(0, block, size=count)
        return {"user": users, "item": np.minimum(items, self.num_items - 1)}

    def preprocess(self, raw: Raw) -> Sample:
        rows = 1 + self.negatives
        items = torch.empty(rows, dtype=torch.long)
        items[0] = int(raw["item"])
        items[1:] = torch.randint(0, self.num_items, (self.negatives,))
        labels = torch.zeros(rows)
        labels[0] = 1.0
        return {
            "user": torch.full((rows,), int(raw["user"]), dtype=torch.long),
            "item": items,
            "label": labels,
        }


@dataclass(frozen=True)
class EnvironmentFormat(DataFormat):
    """Reinforcement learning makes its data inside the step by playing its environment. A "batch"
    is one seed per parallel environment, so the batch size sets how many games run side by side."""

    storable = False
    why_not_storable = "this workload plays its environment inside the step instead of reading a dataset"

    def synthesize(self, count: int, seed: int) -> Sample:
        return {"env_seed": torch.arange(count, dtype=torch.long) + 1_000_003 * seed}

    def write(self, directory: Path, count: int, seed: int) -> None:
        raise NotImplementedError(self.why_not_storable)

    def read(self, directory: Path, index: int) -> Raw:
        raise NotImplementedError(self.why_not_storable)

    def preprocess(self, raw: Raw) -> Sample:
        raise NotImplementedError(self.why_not_storable)
