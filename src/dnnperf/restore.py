"""Put a user's training back as it was after dnnperf measured steps of it.

Describing a model for the performance model and planning its memory saving both run real training
steps on the user's example batch: they move the weights, BatchNorm's running statistics, the
gradients, the optimizer's state and the random generators. ``put_back`` snapshots all of these on
entry and restores them on exit, also on error, so measuring leaves the user's training where it was.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def put_back(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> Iterator[None]:
    """Parameters, buffers, gradients, the optimizers' state and the random generators (the CPU's and
    those of the GPUs the model is on) as they were on entry, restored on exit."""
    optimizers = list(optimizers)
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    gradients = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    states: list[dict[str, Any]] = [copy.deepcopy(o.state_dict()) for o in optimizers]
    gpus = sorted({t.device for t in weights.values() if t.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=gpus):
        try:
            yield
        finally:
            with torch.no_grad():
                model.load_state_dict(weights)
                for p, grad in zip(model.parameters(), gradients, strict=True):
                    p.grad = grad
            for optimizer, state in zip(optimizers, states, strict=True):
                optimizer.load_state_dict(state)
