"""The memory saver for a user's own model: ``plan_for`` measures what ``dnnperf memsave`` measures, on
the user's model, optimizer, loss and example batch.

    result = plan_for(model, optimizer, loss_fn, batch, "50%")   # loss_fn(model, batch) -> loss
    print(result.feasible, result.reason, result.variant("planner").peak)
    saver = MemorySaver(model, result.plan)                      # one for the loop: its file lasts
    with StateSaver([optimizer]) if result.plan.training_state == "offload" else nullcontext():
        for batch in loader:
            with saver:
                loss_fn(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    saver.close()

Measuring trains the model on the example batch for many steps; the model, its gradients, the
optimizer's state and the random generators are put back as they were afterwards (also on error),
so planning leaves the user's training where it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dnnperf.errors import UsageError
from dnnperf.memsave.command import check_budget
from dnnperf.memsave.run import MemsaveResult, memsave
from dnnperf.memsave.saver import refuse_compiled
from dnnperf.workloads.base import Batch, SupervisedTask


def plan_for(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
    batch: Batch,
    budget: str,
    *,
    pairs: int = 6,
    offload_dir: Path | str | None = None,
    training_state: str = "auto",
) -> MemsaveResult:
    """Profile one step of ``loss_fn(model, batch)``, backward and ``optimizer.step()``; measure the
    baselines; plan for ``budget`` ("50%" of the unoptimised peak, or a size such as "2GiB"); run the
    plan. ``batch`` is already on the model's device. ``result.plan`` is what ``MemorySaver`` runs (with
    a ``StateSaver`` around the loop where ``result.plan.training_state == "offload"``)."""
    check_budget(budget)  # before anything runs
    if pairs < 1:
        raise UsageError(f"pairs must be at least 1, got {pairs}")
    refuse_compiled(model)
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        raise UsageError("the model has no parameters: there is no training step to plan")
    task = SupervisedTask(model, loss_fn, optimizer)
    with _put_back(model, optimizer, parameter.device):
        return memsave(
            task,
            batch,
            parameter.device,
            budget,
            pairs=pairs,
            offload_dir=None if offload_dir is None else Path(offload_dir),
            training_state=training_state,
        )


@contextmanager
def _put_back(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> Iterator[None]:
    """Parameters, buffers, gradients, the optimizer's state and the random generators as they were on
    entry, restored on exit (the measured steps train on the example batch)."""
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    gradients = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    optimizer_state: dict[str, Any] = copy.deepcopy(optimizer.state_dict())
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            with torch.no_grad():
                model.load_state_dict(weights)
                for p, grad in zip(model.parameters(), gradients, strict=True):
                    p.grad = grad
            optimizer.load_state_dict(optimizer_state)


__all__ = ["plan_for"]
