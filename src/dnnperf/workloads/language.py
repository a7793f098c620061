"""Language modelling: GPT-2 (decoder-only), next-token cross-entropy, AdamW as in nanoGPT."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.data.formats import LanguageModelFormat
from dnnperf.models.language import GPT2, GPT2_PRESETS
from dnnperf.workloads.base import Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.registry import register


def next_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["tokens"])
    return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())


def _gpt2_task(config, device: torch.device) -> Task:
    model = GPT2(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    return SupervisedTask(model, next_token_loss, optimizer)


GPT2_WORKLOAD = register(
    Workload(
        name="gpt2",
        domain="language modelling",
        summary="GPT-2 decoder-only transformer (small: 124 M)",
        presets=GPT2_PRESETS,
        default_batch_size={"tiny": 8, "small": 16, "full": 8},
        make_task=_gpt2_task,
        make_data=lambda c: LanguageModelFormat(vocab_size=c.vocab_size, seq_len=c.seq_len),
        sample_unit="sequence",
    )
)
