"""A layer's type comes from the operators it runs, not its class name: a user's or a library's own
module classes (transformers' ``Conv1D`` is a linear layer) get the type of the work they do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dnnperf.probes.layers import LayerProfiler

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


class Conv1D(nn.Module):
    """transformers' GPT-2 projection: a matrix product, named like a convolution."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)


class Mixer(nn.Module):
    """Scores through a softmax between matrix products (self-attention without projections)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(x @ x.transpose(-1, -2) / x.size(-1) ** 0.5, dim=-1)
        return scores @ x


class Squash(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class Block(nn.Module):
    """A residual block: its own work is an add, its layers are its children."""

    def __init__(self) -> None:
        super().__init__()
        self.project, self.mix, self.squash = Conv1D(16, 16), Mixer(), Squash()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.squash(self.mix(self.project(x)))


def test_each_module_gets_the_type_of_the_operators_it_runs():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    profiler = LayerProfiler(model, optimizer)
    with profiler:
        for _ in range(3):
            model(torch.randn(2, 8, 16)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()
    categories = {name: info.category for name, info in profiler.result().modules.items()}
    assert categories["0.project"] == "linear"  # addmm, whatever the class is called
    assert categories["0.mix"] == "attention"
    assert categories["0.squash"] == "activation"
    assert categories["0"] == "other"  # a block's own glue (its add) does not make it an activation
    assert categories["1"] == "linear"  # torch's own classes by class
