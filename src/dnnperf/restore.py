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
from torch.nn.parameter import is_lazy

from dnnperf.errors import UsageError


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


@contextmanager
def put_back(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> Iterator[None]:
    """On exit, as on entry: the model's state (its ``state_dict``, extra state included), its buffers
    that are not in it, every parameter the optimizers update (those outside the model too, such as a
    loss's own) with its gradient, the optimizers' state, and the random generators (the CPU's and
    those of the GPUs the model is on)."""
    optimizers = list(optimizers)
    if any(is_lazy(t) for t in (*model.parameters(), *model.buffers())):
        raise UsageError("the model has uninitialised lazy modules: run one forward pass on it first")
    state = {name: _copy(value) for name, value in model.state_dict().items()}
    others = {name: b.detach().clone() for name, b in model.named_buffers() if name not in state}
    updated = {id(p): p for o in optimizers for group in o.param_groups for p in group["params"]}
    inside = {id(p) for p in model.parameters()}
    loose = [(p, p.detach().clone()) for key, p in updated.items() if key not in inside]  # a loss's own
    gradients = [
        (p, None if p.grad is None else p.grad.detach().clone())
        for p in [*model.parameters(), *(p for p, _ in loose)]
    ]
    optimizer_states: list[dict[str, Any]] = [copy.deepcopy(o.state_dict()) for o in optimizers]
    gpus = sorted({t.device for t in state.values() if isinstance(t, torch.Tensor) and t.is_cuda}, key=str)
    with torch.random.fork_rng(devices=gpus):
        try:
            yield
        finally:
            with torch.no_grad():
                model.load_state_dict(state)
                for name, value in others.items():
                    model.get_buffer(name).copy_(value)
                for p, value in loose:
                    p.copy_(value)
                for p, grad in gradients:
                    p.grad = grad
            for optimizer, saved in zip(optimizers, optimizer_states, strict=True):
                optimizer.load_state_dict(saved)
