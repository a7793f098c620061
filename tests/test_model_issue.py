"""The host's issue time of a step, per phase (perfmodel/issue.py), against delays injected into it."""

from __future__ import annotations

import time

import torch
from torch import nn

from dnnperf.perfmodel.graph import describe_model
from dnnperf.perfmodel.issue import issue_seconds

CPU = torch.device("cpu")


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward sleeps ``seconds`` on the host."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class _Delayed(nn.Module):
    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.forward_s)
        return _SlowBackward.apply(self.linear(x), self.backward_s)


def _phases(model: nn.Module, update_s: float = 0.0) -> dict[str, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step(stages):
        with stages("forward"):
            loss = model(x).sum()
        with stages("backward"):
            loss.backward()
        with stages("update"):
            time.sleep(update_s)
            optimizer.step()
            optimizer.zero_grad()

    return issue_seconds(step, CPU, warm=1, counted=5)


def test_each_phases_issue_time_holds_the_delay_injected_into_it_and_no_other() -> None:
    plain = _phases(_Delayed(0.0, 0.0))
    assert set(plain) == {"forward", "backward", "update"}
    delayed = _phases(_Delayed(0.040, 0.025), update_s=0.015)
    # A sleep lasts at least its seconds: each phase grows by its own delay at least ...
    assert delayed["forward"] - plain["forward"] >= 0.040 * 0.95
    assert delayed["backward"] - plain["backward"] >= 0.025 * 0.95
    assert delayed["update"] - plain["update"] >= 0.015 * 0.95
    # ... and the delays stay in their phases: the forward holds neither backward's nor the update's.
    only_later = _phases(_Delayed(0.0, 0.060), update_s=0.060)
    assert only_later["forward"] < 0.030 < only_later["backward"]


def test_a_description_on_the_cpu_measures_no_issue_time() -> None:
    graph = describe_model(nn.Linear(8, 8), torch.randn(4, 8), count_faults=False)
    assert graph.issue_s == {}
