"""The memory saver for a user's own model: ``plan_for`` measures what ``dnnperf memsave`` measures, on
the user's model, optimizer, loss and example batch.

    result = plan_for(model, optimizer, loss_fn, batch, "50%")   # loss_fn(model, batch) -> loss
    if not result.feasible:
        raise SystemExit(result.reason)                          # no plan reaches the budget: why
    print(result.variant("planner").peak, result.variant("planner").overhead)
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

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from dnnperf.errors import UsageError
from dnnperf.memsave.budget import Budget
from dnnperf.memsave.run import memsave
from dnnperf.memsave.saver import refuse_compiled
from dnnperf.restore import put_back
from dnnperf.results.memsave import MemsaveResult
from dnnperf.workloads.base import Batch, SupervisedTask


def plan_for(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
    batch: Batch,
    budget: Budget | str | int,
    *,
    pairs: int = 6,
    offload_dir: Path | str | None = None,
    training_state: str = "auto",
) -> MemsaveResult:
    """Profile one step of ``loss_fn(model, batch)``, backward and ``optimizer.step()``; measure the
    baselines; plan for ``budget`` (a :class:`~dnnperf.memsave.budget.Budget`; its text, "50%" of the
    unoptimised peak or a size such as "2GiB"; or a number of bytes); run the plan. ``batch`` is
    already on the model's device. Where ``result.feasible``, ``result.plan`` is what ``MemorySaver``
    runs (with a ``StateSaver`` around the loop where ``result.plan.training_state == "offload"``);
    otherwise ``result.reason`` says why no plan meets the budget."""
    wanted = Budget.of(budget)  # before anything runs
    if pairs < 1:
        raise UsageError(f"pairs must be at least 1, got {pairs}")
    refuse_compiled(model)
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        raise UsageError("the model has no parameters: there is no training step to plan")
    task = SupervisedTask(model, loss_fn, optimizer)
    with put_back(model, [optimizer]):
        return memsave(
            task,
            batch,
            parameter.device,
            wanted,
            pairs=pairs,
            offload_dir=None if offload_dir is None else Path(offload_dir),
            training_state=training_state,
        )


__all__ = ["plan_for"]
