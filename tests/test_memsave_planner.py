"""The planner against measurement: a budget it calls feasible holds in a measured step; one it
cannot meet is called infeasible with the reason; the record's memsave section round-trips."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dnnperf.errors import UsageError
from dnnperf.memsave.run import MemsaveResult, memsave, parse_budget
from dnnperf.workloads.base import SupervisedTask


def conv_task() -> tuple[SupervisedTask, dict]:
    """Activations dominate: wide feature maps, few parameters."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    task = SupervisedTask(model, lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["y"]), optimizer)
    batch = {"x": torch.randn(16, 3, 48, 48), "y": torch.randint(0, 10, (16,))}
    return task, batch


@pytest.fixture(scope="module")
def feasible() -> MemsaveResult:
    task, batch = conv_task()
    return memsave(task, batch, torch.device("cpu"), "85%", pairs=1, min_bytes=0)


def test_feasible_budget_holds_when_measured(feasible):
    assert feasible.feasible, feasible.reason
    planned = feasible.variant("planner")
    assert feasible.budget == int(0.85 * feasible.baseline_peak)
    assert planned.predicted_peak <= feasible.budget
    assert planned.peak <= feasible.budget  # measured by the allocator, not predicted
    assert feasible.plan.policies  # something had to change
    names = {v.name for v in feasible.variants}
    assert names == {"none", "offload-all", "sqrt(n)", "planner"}
    assert feasible.variant("offload-all").bytes_written > 0


def test_infeasible_budget_says_why():
    task, batch = conv_task()
    result = memsave(task, batch, torch.device("cpu"), "3%", pairs=1, min_bytes=0)
    assert not result.feasible
    assert result.reason.startswith("infeasible") and "parameters" in result.reason
    assert "planner" not in {v.name for v in result.variants}


def test_record_section_round_trips(feasible):
    document = feasible.to_dict()
    again = MemsaveResult.from_dict(document)
    assert again.to_dict() == document
    broken = {**document, "budget": -1}
    with pytest.raises(ValueError, match="budget"):
        MemsaveResult.from_dict(broken)


def test_budget_parsing():
    assert parse_budget("50%", 1000) == 500
    assert parse_budget("2KiB", 1000) == 2048
    for bad in ("0%", "150%", "lots", "-3"):
        with pytest.raises(UsageError):
            parse_budget(bad, 1000)
