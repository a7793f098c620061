"""Speech recognition: Deep Speech 2 (conv front end, bidirectional GRUs) trained with CTC loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.data.formats import SpeechFormat
from dnnperf.models.speech import DEEPSPEECH2_PRESETS, DeepSpeech2
from dnnperf.workloads.base import Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.registry import register


def ctc_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    log_probs, output_lengths = model(batch["features"], batch["feature_lengths"])
    return F.ctc_loss(
        log_probs,
        batch["transcript"],
        output_lengths,
        batch["transcript_lengths"],
        blank=0,
        reduction="mean",
        zero_infinity=True,
    )


def _deepspeech2_task(config, device: torch.device) -> Task:
    model = DeepSpeech2(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return SupervisedTask(model, ctc_loss, optimizer)


DEEPSPEECH2 = register(
    Workload(
        name="deepspeech2",
        domain="speech recognition",
        summary="Deep Speech 2: conv front end, bidirectional GRUs, CTC",
        presets=DEEPSPEECH2_PRESETS,
        default_batch_size={"tiny": 8, "small": 16, "full": 32},
        make_task=_deepspeech2_task,
        make_data=lambda c: SpeechFormat(
            num_features=c.num_features,
            num_frames=c.num_frames,
            transcript_len=c.transcript_len,
            vocab_size=c.vocab_size,
        ),
        sample_unit="utterance",
    )
)
