"""Machine translation: a GNMT-style LSTM seq2seq with attention, and the Transformer (base).

Token-level cross-entropy with padding ignored; the Transformer uses label smoothing 0.1 and Adam with
beta2 0.98 as in Vaswani et al. (constant learning rate: no warm-up schedule in a benchmark step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.data.formats import TranslationFormat
from dnnperf.models.translation import SEQ2SEQ_PRESETS, TRANSFORMER_PRESETS, Seq2Seq, Transformer
from dnnperf.workloads.base import Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.registry import register

PAD = 0


def _token_loss(label_smoothing: float):
    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch["src"], batch["tgt_in"])
        return F.cross_entropy(
            logits.flatten(0, 1),
            batch["tgt_out"].flatten(),
            ignore_index=PAD,
            label_smoothing=label_smoothing,
        )

    return loss


def _pairs(config) -> TranslationFormat:
    return TranslationFormat(vocab_size=config.vocab_size, src_len=config.src_len, tgt_len=config.tgt_len)


def _seq2seq_task(config, device: torch.device) -> Task:
    model = Seq2Seq(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)  # MLPerf GNMT reference
    return SupervisedTask(model, _token_loss(0.0), optimizer)


def _transformer_task(config, device: torch.device) -> Task:
    model = Transformer(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    return SupervisedTask(model, _token_loss(0.1), optimizer)


SEQ2SEQ = register(
    Workload(
        name="seq2seq",
        domain="machine translation",
        summary="GNMT-style LSTM encoder-decoder with attention",
        presets=SEQ2SEQ_PRESETS,
        default_batch_size={"tiny": 8, "small": 32, "full": 64},
        make_task=_seq2seq_task,
        make_data=_pairs,
        sample_unit="sentence pair",
    )
)
TRANSFORMER = register(
    Workload(
        name="transformer",
        domain="machine translation",
        summary="Transformer base encoder-decoder",
        presets=TRANSFORMER_PRESETS,
        default_batch_size={"tiny": 8, "small": 32, "full": 64},
        make_task=_transformer_task,
        make_data=_pairs,
        sample_unit="sentence pair",
    )
)
