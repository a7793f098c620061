"""put_back: a user's training as it was after dnnperf ran steps on it (describe_model, plan_for)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dnnperf.errors import UsageError
from dnnperf.restore import put_back

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


class _Counted(nn.Module):
    """A Linear with BatchNorm, a step counter that is not in the state_dict, and extra state."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(4, 4), nn.BatchNorm1d(4)
        self.register_buffer("calls", torch.zeros(()), persistent=False)
        self.notes = {"calls": 0}

    def forward(self, x):
        self.calls += 1
        self.notes["calls"] += 1
        return self.norm(self.linear(x))

    def get_extra_state(self):
        return dict(self.notes)

    def set_extra_state(self, state):
        self.notes = dict(state)


def test_everything_the_steps_moved_is_put_back_also_on_error():
    """Weights, BatchNorm's statistics, a buffer outside the state_dict, extra state, a parameter the
    optimizer updates outside the model (a loss's learned weight), gradients, the optimizer's state and
    the random generator, after three steps and an error."""
    torch.manual_seed(0)
    model, head = _Counted(), nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([{"params": model.parameters()}, {"params": [head]}], lr=0.1, momentum=0.9)

    def step():
        (model(torch.randn(8, 4)) * head).sum().backward()
        optimizer.step()

    step()  # the momentum and the gradients exist
    before = {k: v.clone() if isinstance(v, torch.Tensor) else dict(v) for k, v in model.state_dict().items()}
    calls, notes, weight = model.calls.clone(), dict(model.notes), head.detach().clone()
    grads = [p.grad.clone() for p in [*model.parameters(), head]]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in [*model.parameters(), head]]
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="injected"), put_back(model, [optimizer]):
        for _ in range(3):
            step()
        raise RuntimeError("injected")
    after = model.state_dict()
    assert all(
        torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v for k, v in before.items()
    )
    assert torch.equal(model.calls, calls) and model.notes == notes and torch.equal(head, weight)
    assert all(torch.equal(p.grad, g) for p, g in zip([*model.parameters(), head], grads, strict=True))
    state = [optimizer.state[p]["momentum_buffer"] for p in [*model.parameters(), head]]
    assert all(torch.equal(a, b) for a, b in zip(state, momentum, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_model_with_uninitialised_lazy_modules_is_refused_before_anything_runs():
    refused = pytest.raises(UsageError, match="lazy modules: run one forward pass on it first")
    with refused, put_back(nn.Sequential(nn.LazyLinear(4))):
        raise AssertionError("not reached")
