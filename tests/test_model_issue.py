"""The host's issue time of a step, per phase (perfmodel/issue.py), against delays injected into it."""

from __future__ import annotations

import time

import pytest
import torch
from tests.test_model_formulas import toy_machine
from torch import nn

import dnnperf
from dnnperf.perfmodel.graph import describe_model
from dnnperf.perfmodel.issue import gap_seconds, issue_seconds
from dnnperf.perfmodel.machine import Machine

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


def _step(model: nn.Module, update_s: float = 0.0):
    """One training step of ``model`` on a batch of 4, ``update_s`` of sleep in its update."""
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

    return step


def _phases(model: nn.Module, update_s: float = 0.0) -> dict[str, float]:
    return issue_seconds(_step(model, update_s), CPU, warm=1, counted=5)


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


@torch.library.custom_op("dnnperf_test::slow_identity", mutates_args=())
def _slow_identity(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """An operator whose own call takes ``seconds`` (a sleep inside it)."""
    time.sleep(seconds)
    return x.clone()


@_slow_identity.register_fake
def _(x: torch.Tensor, seconds: float) -> torch.Tensor:
    return torch.empty_like(x)


_slow_identity.register_autograd(lambda ctx, grad: (grad, None))


class _Gapped(nn.Module):
    """Two linear layers with ``python_s`` of Python between them and an operator of ``inside_s``."""

    def __init__(self, python_s: float, inside_s: float, backward_s: float = 0.0) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)
        self.python_s, self.inside_s, self.backward_s = python_s, inside_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        time.sleep(self.python_s)
        x = _slow_identity(x, self.inside_s)
        return self.second(_SlowBackward.apply(x, self.backward_s))


def _gaps(model: nn.Module) -> dict[str, list[float]]:
    return gap_seconds(_step(model), warm=1, counted=3)


def test_the_gaps_hold_the_python_between_calls_and_not_the_calls_own_time() -> None:
    plain = _gaps(_Gapped(0.0, 0.0))
    assert set(plain) == {"forward", "backward", "update"}
    python = _gaps(_Gapped(0.030, 0.0, backward_s=0.020))
    # A sleep lasts at least its seconds: the forward's gaps grow by the Python's delay at least, the
    # backward's by its Function's (the engine runs it between operator calls) ...
    assert python["forward"][0] - plain["forward"][0] >= 0.030 * 0.95
    assert python["backward"][0] - plain["backward"][0] >= 0.020 * 0.95
    # ... and the calls are those of the same network.
    assert python["forward"][1] == plain["forward"][1] > 0
    # An operator's own 60 ms is inside a call, not between two: the gaps stay far below it.
    inside = _gaps(_Gapped(0.0, 0.060))
    assert inside["forward"][0] < 0.030


def test_a_description_on_the_cpu_times_its_gaps_where_asked() -> None:
    assert describe_model(_Gapped(0.0, 0.0), torch.randn(4, 8), count_faults=False).gaps == {}
    graph = describe_model(_Gapped(0.010, 0.0), torch.randn(4, 8), count_faults=False, time_gaps=True)
    assert graph.gaps["forward"][0] >= 0.010 * 0.95
    assert graph.gaps["forward"][1] > 0


def test_dnnperf_predict_on_this_hosts_cpu_charges_the_python_that_does_not_grow_with_the_batch() -> None:
    """The truth: 20 ms of Python slept between two operator calls of each forward, at every batch.
    On a machine that is this host's CPU (``replay_device``), ``dnnperf.predict`` times the host
    between the calls of two descriptions (the example batch and its half) and charges their line at
    batch 0 (ComputeOptions.fixed_gaps): the forward comes out at least half the sleep above the same
    network's without it (a sleep lasts at least its seconds; the margin is for a busy host's gaps at
    the two batches), and not even twice it. A preset machine runs other Python: nothing charged."""
    here = toy_machine(replay_device="cpu", gap_call_s={"forward": 0.0, "backward": 0.0, "update": 0.0})
    batch = torch.randn(4, 8)

    def forward_s(model: nn.Module, machine: Machine | str) -> float:
        return dnnperf.predict(model, batch, machine=machine).detail["phases_s"]["forward"]

    torch.manual_seed(0)
    charged = forward_s(_Gapped(0.020, 0.0), here) - forward_s(_Gapped(0.0, 0.0), here)
    assert 0.010 <= charged < 0.040
    assert forward_s(_Gapped(0.020, 0.0), "a100-ib") == pytest.approx(forward_s(_Gapped(0.0, 0.0), "a100-ib"))
