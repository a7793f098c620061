"""``dnnperf.predict`` on a user's own model: one call from a model and an example batch to a prediction."""

from __future__ import annotations

import dataclasses

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


def test_this_machine_calibrates_the_link_and_fsdp_only_when_a_prediction_needs_them(
    tmp_path, monkeypatch
) -> None:
    """Two-rank calibrations (the gloo link, FSDP's host work) cost ~10 s each on a 2-core host: a
    one-device prediction skips them, and a machine built without one refuses what needs it."""
    from dnnperf import calibration, hardware
    from dnnperf.perfmodel import calibrate, collective_calibration
    from dnnperf.perfmodel.machine import NOT_CALIBRATED
    from dnnperf.perfmodel.predict import predict
    from dnnperf.perfmodel.validate import calibrated_machine

    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    ran: list[str] = []

    def fake(name, value):
        def measured(*args, **kwargs):
            ran.append(name)
            return value

        monkeypatch.setattr(calibrate if name != "link" else collective_calibration, name, measured)

    zoo = calibrate.ZooCalibration(efficiency={}, curves={}, call_s={}, kernel_s=0.0, host_call_s={})
    for name, value in [
        ("calibrated", zoo),
        ("update_cost", (1e-6, 1.0)),
        ("op_overhead", 5e-6),
        ("page_fault_cost", 1e-6),
        ("phase_call_cost", {}),
        ("zero_operand_cost", {}),
        ("split_region_cost", 0.0),
        ("ddp_cost", (0.0, 0.0)),
        ("cold_product_cost", (0.0, 0.0)),
        ("gap_call_cost", 0.0),
        ("fsdp_cost", (1e-3, 1e-4, 1e-6, 1e-6)),
    ]:
        fake(name, value)
    monkeypatch.setattr(collective_calibration, "link_calibration", lambda: ran.append("link") or {})
    hardware.save_profile(calibration.calibrate("cpu", quick=True))

    lean = calibrated_machine("cpu", link=False, fsdp=False)
    assert "link" not in ran and "fsdp_cost" not in ran and "calibrated" in ran
    assert lean.sources["link"] == lean.sources["fsdp"] == NOT_CALIBRATED
    two = dataclasses.replace(lean, nodes=2)
    with pytest.raises(UsageError, match="without its link"):
        predict("basic_cnn", two, 4, "dp", preset="tiny")
    linked = dataclasses.replace(two, sources={**two.sources, "link": "a fit"})
    assert predict("basic_cnn", linked, 4, "dp", preset="tiny").step_s > 0
    with pytest.raises(UsageError, match="without FSDP"):
        predict("basic_cnn", linked, 4, "fsdp", preset="tiny")
    assert predict("basic_cnn", lean, 4, "single", preset="tiny").step_s > 0
    ran.clear()
    heard: list[tuple[str, float]] = []
    full = calibrated_machine("cpu", progress=lambda what, done: heard.append((what, done)))
    assert "link" in ran and "fsdp_cost" in ran
    said = " ".join(what for what, _ in heard)
    assert all(part in said for part in ("layer zoo", "update", "FSDP", "gloo link"))
    assert [done for _, done in heard] == sorted(done for _, done in heard)
    assert NOT_CALIBRATED not in full.sources.values()
    assert predict("basic_cnn", dataclasses.replace(full, nodes=2), 4, "dp", preset="tiny").step_s > 0
