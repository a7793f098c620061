"""Recommendation: NeuMF (neural collaborative filtering), embedding-dominated, binary cross-entropy on
one positive and ``negatives`` sampled negatives per sample, Adam as in the MLPerf NCF reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.data.formats import InteractionFormat
from dnnperf.models.recommendation import NEUMF_PRESETS, NeuMF
from dnnperf.workloads.base import Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.registry import register


def implicit_feedback_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["user"].flatten(), batch["item"].flatten())
    return F.binary_cross_entropy_with_logits(logits, batch["label"].flatten())


def _neumf_task(config, device: torch.device) -> Task:
    model = NeuMF(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return SupervisedTask(model, implicit_feedback_loss, optimizer)


NEUMF = register(
    Workload(
        name="neumf",
        domain="recommendation",
        summary="NeuMF: GMF + MLP towers over user/item embeddings",
        presets=NEUMF_PRESETS,
        default_batch_size={"tiny": 256, "small": 2048, "full": 8192},
        make_task=_neumf_task,
        make_data=lambda c: InteractionFormat(
            num_users=c.num_users, num_items=c.num_items, negatives=c.negatives
        ),
        sample_unit="positive interaction",
        notes=("each sample is one positive interaction plus `negatives` sampled negatives",),
    )
)
