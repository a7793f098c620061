"""Synthetic data in memory and on disk, and the batch sources a training loop reads from."""

from dnnperf.data.formats import (
    DataFormat,
    DetectionFormat,
    EnvironmentFormat,
    ImageFormat,
    InteractionFormat,
    LanguageModelFormat,
    SpeechFormat,
    TranslationFormat,
)
from dnnperf.data.integrity import CorruptDataset, verify_dataset
from dnnperf.data.sources import BatchSource, ensure_dataset, open_source

__all__ = [
    "BatchSource",
    "CorruptDataset",
    "DataFormat",
    "DetectionFormat",
    "EnvironmentFormat",
    "ImageFormat",
    "InteractionFormat",
    "LanguageModelFormat",
    "SpeechFormat",
    "TranslationFormat",
    "ensure_dataset",
    "open_source",
    "verify_dataset",
]
