"""Subnormal floats in a description's operator outputs (perfmodel/subnormals.py): counted against
outputs whose values are known to be subnormal or not."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dnnperf
from dnnperf.perfmodel.graph import describe_model
from dnnperf.perfmodel.machine import preset
from dnnperf.perfmodel.predict import predict
from dnnperf.perfmodel.subnormals import SAMPLE, notable_shares, subnormal_elements

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
