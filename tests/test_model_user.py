"""``dnnperf.predict`` on a user's own model: one call from a model and an example batch to a prediction."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dnnperf
from dnnperf.errors import UsageError

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

WIDTH, BATCH = 1024, 256


def wide_linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH))


def test_backward_is_the_matrix_products_it_runs_and_the_state_is_exact():
    """The truths: a Linear layer's backward is two matrix products the size of its forward one (the
    input's and the weight's gradients), but the first layer's input needs no gradient, so two layers
    run 3 products backward for 2 forward: on a preset machine (a pure roofline, compute-bound at this
    size) backward takes 1.5x forward's time. Parameters, their gradients and SGD-with-momentum's
    buffers are each 4 bytes per parameter."""
    model = wide_linear()
    before = [p.detach().clone() for p in model.parameters()]
    prediction = dnnperf.predict(model, torch.randn(BATCH, WIDTH), machine="a100-ib")
    phases = prediction.detail["phases_s"]
    assert phases["backward"] / phases["forward"] == pytest.approx(1.5, rel=0.05)
    parameters = 4 * sum(p.numel() for p in model.parameters())
    for category in ("parameters", "gradients", "optimizer_state"):
        assert prediction.memory[category] == parameters, category
    assert prediction.batch_size == BATCH and prediction.machine == "a100-ib"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # put back


def test_another_batch_size_is_predicted_from_two_descriptions():
    """Asked for a batch it was not described at (4x the example, beyond both descriptions: the
    example's and its half), the prediction holds the input of that batch: 4 bytes x batch x width."""
    model, batch = wide_linear(), torch.randn(BATCH, WIDTH)
    larger = dnnperf.predict(model, batch, machine="a100-ib", batch_size=4 * BATCH)
    assert larger.batch_size == 4 * BATCH
    assert larger.memory["input"] == 4 * (4 * BATCH) * WIDTH
    at_example = dnnperf.predict(model, batch, machine="a100-ib")
    assert larger.detail["phases_s"]["forward"] > 2 * at_example.detail["phases_s"]["forward"]


def test_a_single_row_cannot_be_scaled():
    with pytest.raises(UsageError, match="at least 2"):
        dnnperf.predict(wide_linear(), torch.randn(1, WIDTH), machine="a100-ib", batch_size=8)


@pytest.mark.parametrize(
    ("machine", "needle"),
    [("no-such-machine", "a100-ib"), (42, "preset's name, a Machine or None")],
)
def test_a_bad_machine_is_one_line_naming_the_choices(machine, needle):
    with pytest.raises(UsageError, match=needle):
        dnnperf.predict(wide_linear(), torch.randn(4, WIDTH), machine=machine)


def test_this_machine_without_a_calibration_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    with pytest.raises(UsageError, match="dnnperf hw"):
        dnnperf.predict(wide_linear(), torch.randn(4, WIDTH))
