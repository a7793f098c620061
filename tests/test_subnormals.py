"""Subnormal floats in a description's operator outputs (perfmodel/subnormals.py): counted against
outputs whose values are known to be subnormal or not; their slowdown timed against delays injected
only where subnormals survive, and priced as the factor it is."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import dnnperf
from dnnperf.perfmodel import graph as graph_module
from dnnperf.perfmodel.compute import ComputeOptions
from dnnperf.perfmodel.graph import describe_model
from dnnperf.perfmodel.machine import preset
from dnnperf.perfmodel.predict import predict
from dnnperf.perfmodel.subnormals import (
    SAMPLE,
    flushed_slowdown,
    flushing,
    notable_shares,
    priced_slowdown,
    subnormal_elements,
    warnings_of,
)

TINY = torch.finfo(torch.float32).tiny


class Scaled(nn.Module):
    """A linear layer whose output is scaled into the subnormal range and back."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_subnormal_elements_are_the_non_zero_ones_below_the_smallest_normal() -> None:
    values = torch.tensor([0.0, TINY, TINY / 2, -TINY / 4, 1e-45, 1.0, -0.5])
    assert subnormal_elements(values) == 3  # TINY / 2, -TINY / 4 and 1e-45; TINY itself is normal
    assert subnormal_elements(torch.zeros(8)) == 0
    # Above SAMPLE elements, a sample of every k-th, k odd: a quarter subnormal in a pattern of four
    # (as channels repeat) comes out a quarter, not all or none.
    pattern = torch.tensor([TINY / 2, 1.0, 2.0, 0.0]).repeat(SAMPLE)
    assert subnormal_elements(pattern) == pytest.approx(pattern.numel() / 4, rel=0.01)


def test_a_description_counts_the_forward_s_subnormal_outputs_exactly() -> None:
    """The forward's outputs: the linear layer's (normal), the scaled one (every element subnormal:
    |x| < 12 times 1e-39) and the loss's (rescaled by 1e39: normal). So the forward's count is the
    scaled output's elements, 8 x 16. The gradients are normal (through the rescale, ~1e37, then
    scaled back), so backward's count is 0. The same model scaled by 1 has none in any phase."""
    torch.manual_seed(0)
    batch = torch.randn(8, 16)

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (model(x) / model.scale).square().mean()

    graph = describe_model(Scaled(1e-39), batch, loss_fn=loss, count_faults=False)
    subnormal, elements = graph.subnormal_outputs["forward"]
    assert subnormal == 8 * 16 and elements > subnormal
    assert graph.subnormal_outputs["backward"][0] == 0
    clean = describe_model(Scaled(1.0), batch, loss_fn=loss, count_faults=False)
    assert all(count == 0 for count, _ in clean.subnormal_outputs.values())
    assert set(clean.subnormal_outputs) == {"forward", "backward", "update"}
    # The prediction carries each phase's share, and the CLI warns of the notable ones only.
    machine = preset("seed002")
    scaled, plain = predict(graph, machine, 8), predict(clean, machine, 8)
    share = scaled.detail["subnormal_outputs"]["forward"]
    assert share == subnormal / elements
    assert set(notable_shares(scaled.detail)) == {"forward"} and notable_shares(plain.detail) == {}


def test_dnnperf_predict_warns_of_a_phase_with_subnormal_outputs() -> None:
    """``dnnperf.predict`` on the scaled model warns of its forward (and says the share); on the plain
    one it warns of nothing."""
    torch.manual_seed(0)
    batch = torch.randn(8, 16)

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (model(x) / model.scale).square().mean()

    with pytest.warns(RuntimeWarning, match=r"of the forward's operator outputs are subnormal floats"):
        dnnperf.predict(Scaled(1e-39), batch, loss_fn=loss, machine="seed002")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        dnnperf.predict(Scaled(1.0), batch, loss_fn=loss, machine="seed002")


def test_the_slowdown_is_the_step_as_it_runs_over_the_step_with_subnormals_flushed() -> None:
    """A step whose forward sleeps 60 ms where a subnormal survives and 20 ms where it is flushed: 3x.
    Its backward sleeps 20 ms as it runs and 30 ms flushed: never faster flushed, so 1 (a ratio that
    is the host's noise is no slowdown). Flushing is off afterwards, as before."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormal floats")

    def step(stages: Callable[[str], Any]) -> None:
        with stages("forward"):
            time.sleep(0.02 if flushing() else 0.06)
        with stages("backward"):
            time.sleep(0.03 if flushing() else 0.02)

    slowdown = flushed_slowdown(step, pairs=3)
    assert set(slowdown) == {"forward", "backward"}
    assert 2.0 < slowdown["forward"] < 4.0  # 3 with sleeps exactly as asked
    assert slowdown["backward"] == 1.0
    assert not flushing()


def test_the_thread_s_flush_mode_is_put_back_also_when_the_step_fails() -> None:
    """Flushing on before stays on after; a step that raises leaves the mode as it found it."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormal floats")

    def failing(stages: Callable[[str], Any]) -> None:
        raise RuntimeError("the model's own error")

    try:
        torch.set_flush_denormal(True)
        assert flushing()
        with pytest.raises(RuntimeError, match="the model's own error"):
            flushed_slowdown(failing)
        assert flushing()
        torch.set_flush_denormal(False)
        with pytest.raises(RuntimeError):
            flushed_slowdown(failing)
        assert not flushing()
    finally:
        torch.set_flush_denormal(False)


def test_a_description_times_the_slowdown_only_where_outputs_are_notably_subnormal(monkeypatch) -> None:
    """The scaled model's forward is notably subnormal: the description times the slowdown once and
    keeps what it found; the plain model's is never timed."""
    torch.manual_seed(0)
    batch = torch.randn(8, 16)
    timed: list[int] = []

    def counted(step: Callable[[Callable[[str], Any]], Any]) -> dict[str, float]:
        timed.append(1)
        return {"forward": 1.5, "backward": 1.0, "update": 1.0}

    monkeypatch.setattr(graph_module, "flushed_slowdown", counted)

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (model(x) / model.scale).square().mean()

    scaled = describe_model(Scaled(1e-39), batch, loss_fn=loss, count_faults=False)
    assert len(timed) == 1 and scaled.subnormal_slowdown == {"forward": 1.5, "backward": 1.0, "update": 1.0}
    assert describe_model(Scaled(1.0), batch, loss_fn=loss, count_faults=False).subnormal_slowdown == {}
    assert len(timed) == 1


def test_the_prediction_multiplies_each_phase_by_its_slowdown_and_says_so() -> None:
    """A description given a slowdown of 2 in backward: with ``ComputeOptions.subnormals`` its backward
    is twice the backward without, forward and update as they were; the warning names the factor. At a
    batch between a description with a slowdown of 3 and one without (1), the factor is their mean;
    beyond them, the nearer one's, never past either."""
    torch.manual_seed(0)
    batch = torch.randn(8, 16)

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (model(x) / model.scale).square().mean()

    graph = describe_model(Scaled(1e-39), batch, loss_fn=loss, count_faults=False)
    # Backward's outputs made notably subnormal (one in a hundred); the update's none, so its slowdown
    # of 1.5 is not its own cost and stays unpriced.
    outputs = {**graph.subnormal_outputs, "backward": [1.0, 100.0], "update": [0.0, 100.0]}
    slowdown = {"backward": 2.0, "update": 1.5}
    graph = dataclasses.replace(graph, subnormal_outputs=outputs, subnormal_slowdown=slowdown)
    machine = preset("seed002")
    plain = predict(graph, machine, 8, options=ComputeOptions(subnormals=False))
    priced = predict(graph, machine, 8, options=ComputeOptions(subnormals=True))
    before, after = plain.detail["phases_s"], priced.detail["phases_s"]
    assert after["backward"] == pytest.approx(2 * before["backward"])
    assert after["forward"] == pytest.approx(before["forward"])
    assert after["update"] == pytest.approx(before["update"])
    assert priced.detail["subnormal_slowdown"] == plain.detail["subnormal_slowdown"] == slowdown
    assert priced.detail["subnormals_priced"] and not plain.detail["subnormals_priced"]
    # The warnings name the factor timed, and say whether the prediction priced it.
    shares = {"forward": 0.5, "backward": 0.5, "update": 0.5}
    timed = {"subnormal_outputs": shares, "subnormal_slowdown": {"forward": 1.0, "backward": 3.0}}
    said = warnings_of(timed)
    assert "did not make the phase faster" in said[0] and "does not price" in said[0]
    assert (
        "ran 3.00x as long" in said[1] and "does not price" in said[1] and "a moment of training" in said[1]
    )
    assert "was not timed" in said[2]
    said = warnings_of({**timed, "subnormals_priced": True})
    assert "does not price" in said[0] and "which the prediction prices" in said[1]
    graph = dataclasses.replace(graph, subnormal_slowdown={"forward": 3.0})
    half = dataclasses.replace(graph, batch_size=4, subnormal_slowdown={})
    assert graph.at_batch(half, 6).subnormal_slowdown == {"forward": pytest.approx(2.0)}
    # Beyond the two batches, never beyond the two factors: 3 at batch 8 and 1 at 4 stay within 1-3.
    assert graph.at_batch(half, 40).subnormal_slowdown == {"forward": 3.0}  # the line: 19
    assert graph.at_batch(half, 2).subnormal_slowdown == {"forward": 1.0}  # the line: 0


def test_an_update_in_place_counts_what_it_writes() -> None:
    """Gradients of 1e-41 times the inputs (the loss scaled by 1e-41) are subnormal, and so are SGD's
    momentum buffers, which its foreach update writes in place, returning nothing: scaled by the
    momentum, then the gradient added. The parameters it then updates stay normal. So the update
    writes the buffers' 16 x 16 + 16 elements twice, subnormal, and the parameters' once."""
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x).sum() * 1e-41

    graph = describe_model(
        model, torch.rand(8, 16) + 1, loss_fn=loss, optimizer=optimizer, count_faults=False
    )
    parameters = 16 * 16 + 16
    assert graph.subnormal_outputs["update"] == [2 * parameters, 3 * parameters]


def test_only_a_phase_whose_own_outputs_are_notably_subnormal_is_priced() -> None:
    outputs = {"forward": [0.0, 1000.0], "backward": [1.0, 1000.0], "update": [0.9, 1000.0]}
    slowdown = {"forward": 1.09, "backward": 2.5, "update": 1.3}
    assert priced_slowdown(outputs, slowdown) == {"backward": 2.5}  # 0.1% and more; 0.09% is not
    assert priced_slowdown({}, slowdown) == {}


class ScaledInPlace(Scaled):
    """The scaled model, its output scaled in place: ``mul_`` writes its input and returns it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).mul_(self.scale)


def test_an_in_place_output_is_counted_once() -> None:
    """``mul_`` both writes its target and returns it: its 8 x 16 subnormal elements count once, as
    the out-of-place product's do."""
    torch.manual_seed(0)
    batch = torch.randn(8, 16)

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (model(x) / model.scale).square().mean()

    in_place = describe_model(ScaledInPlace(1e-39), batch, loss_fn=loss, count_faults=False)
    plain = describe_model(Scaled(1e-39), batch, loss_fn=loss, count_faults=False)
    assert in_place.subnormal_outputs["forward"][0] == plain.subnormal_outputs["forward"][0] == 8 * 16
