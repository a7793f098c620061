"""The memory profiler on a user's own loop (dnnperf.MemoryProfiler): the documented lines, the step's
categories against their analytic sizes, the stages found by hooks, and what it leaves behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tests.conftest import DEVICES
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dnnperf

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

FLOAT = 4


def _loop(profiler: dnnperf.MemoryProfiler, model: nn.Module, optimizer, steps: int = 4) -> None:
    """The common loop: gradients zeroed (set to None) first, then forward, backward, update."""
    data = TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 4))
    with profiler:
        for inputs, targets in profiler.batches(DataLoader(data, batch_size=8)):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()


def test_a_step_of_your_own_loop_has_the_analytic_sizes():
    """Adam over 16 -> 32 -> 4: parameters, gradients, two state tensors a parameter, the batch and the
    saved activations by hand (the ReLU's output, saved by it and by the next Linear: one storage; the
    model's output, which the loss saves); the stages in order; the allocator's own peak agrees."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    profiler = dnnperf.MemoryProfiler(model, optimizer)
    _loop(profiler, model, optimizer)
    memory = profiler.result()
    params = (16 * 32 + 32 + 32 * 4 + 4) * FLOAT
    assert memory.category_max["parameters"] == params
    assert memory.category_max["gradients"] == params  # the last step's released first: not twice
    assert memory.category_max["optimizer_state"] == 2 * params
    assert memory.category_max["input"] == (8 * 16 + 8 * 4) * FLOAT
    assert memory.category_max["activations"] == 8 * 32 * FLOAT + 8 * 4 * FLOAT
    assert memory.layers["2"]["outputs"] == 8 * 4 * FLOAT
    stages = [s for _, s in memory.stages if s != "other"]
    assert (
        stages.index("forward")
        < stages.index("backward")
        < max(i for i, s in enumerate(stages) if s == "update")
    )
    assert abs(memory.peak["unattributed"]) <= 0.05 * memory.measured_peak
    assert not model._forward_hooks and not model._forward_pre_hooks  # every hook removed


@pytest.mark.parametrize("device", DEVICES)
def test_what_follows_a_break_inside_the_block_is_not_the_tracked_steps(device: str):
    """The loop breaks right after the tracked step, then allocates 8 MiB inside the ``with`` block:
    the tracked step's peak is its own (the model is a few KiB), not the 8 MiB."""
    model = nn.Linear(16, 4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = dnnperf.MemoryProfiler(model, optimizer, warmup=1)
    data = TensorDataset(torch.randn(32, 16), torch.randn(32, 4))
    with profiler:
        for step, (inputs, targets) in enumerate(profiler.batches(DataLoader(data, batch_size=8))):
            inputs, targets = inputs.to(device), targets.to(device)
            nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step == 1:  # the tracked step
                break
        after = torch.ones(2**21, device=device)  # 8 MiB
    assert profiler.result().measured_peak < 2**16
    del after


def test_a_loop_that_ends_before_the_tracked_step_is_an_error_not_an_empty_report():
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = dnnperf.MemoryProfiler(model, optimizer, warmup=5)
    _loop(profiler, model, optimizer, steps=3)
    with pytest.raises(RuntimeError, match="no tracked step"):
        profiler.result()


def test_an_error_in_the_tracked_step_removes_the_tracker_and_reaches_the_caller():
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = dnnperf.MemoryProfiler(model, optimizer, warmup=0)
    with pytest.raises(ValueError, match="injected"), profiler:
        for _ in profiler.batches([torch.randn(2, 16)]):
            raise ValueError("injected")
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not torch.autograd.profiler._is_profiler_enabled  # the profiler stopped
    with pytest.raises(RuntimeError, match="no tracked step"):
        profiler.result()


def test_the_documented_lines_profile_a_loop_as_documented():
    """docs/memory.md shows the exact lines a user adds; run them as written."""
    text = (Path(__file__).parents[1] / "docs" / "memory.md").read_text()
    snippet = re.search(r"## Your own loop.*?```python\n(.*?)```", text, re.S).group(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(TensorDataset(torch.randn(32, 16), torch.randn(32, 4)), batch_size=8)
    namespace = {"model": model, "optimizer": optimizer, "loader": loader, "loss_fn": nn.functional.mse_loss}
    exec(compile(snippet, "docs/memory.md", "exec"), namespace)
    memory = namespace["memory"]
    assert memory.category_max["optimizer_state"] == sum(p.numel() * FLOAT for p in model.parameters())


def test_an_error_ending_the_tracked_step_at_a_break_reaches_the_caller(monkeypatch):
    """The step a break ends is ended when the loop drops its generator, where Python only prints an
    exception; one raised there (the tracker failing to finish) is raised by the with block instead."""
    from dnnperf.probes import memory as memory_module

    def fail(self, end):
        raise RuntimeError("tracker failed")

    monkeypatch.setattr(memory_module.MemoryTracker, "_finish", fail)
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = dnnperf.MemoryProfiler(model, optimizer, warmup=1)
    data = TensorDataset(torch.randn(32, 16), torch.randn(32, 4))
    with pytest.raises(RuntimeError, match="tracker failed"), profiler:
        for step, (inputs, targets) in enumerate(profiler.batches(DataLoader(data, batch_size=8))):
            nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            if step == 1:  # the tracked step
                break
    assert not model._forward_hooks and not model._forward_pre_hooks
