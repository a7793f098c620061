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


def test_a_tuple_or_list_batch_is_predicted_as_the_same_batch_in_a_dict():
    """The commonest batch, ``(inputs, targets)``, gives the prediction the same tensors in a dict give:
    the same rows, so the same FLOPs, bytes and memory, at the example batch and at 4x it."""

    def loss_of_pair(model: nn.Module, batch) -> torch.Tensor:
        inputs, targets = batch if not isinstance(batch, dict) else (batch["x"], batch["y"])
        return nn.functional.mse_loss(model(inputs), targets)

    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    as_dict = dnnperf.predict(wide_linear(), {"x": x, "y": y}, loss_fn=loss_of_pair, machine="a100-ib")
    for batch in ((x, y), [x, y]):
        found = dnnperf.predict(wide_linear(), batch, loss_fn=loss_of_pair, machine="a100-ib")
        assert found.step_s == pytest.approx(as_dict.step_s) and found.memory == as_dict.memory
    larger = dnnperf.predict(
        wide_linear(), (x, y), loss_fn=loss_of_pair, machine="a100-ib", batch_size=4 * BATCH
    )
    assert larger.memory["input"] == 2 * 4 * (4 * BATCH) * WIDTH  # both tensors, at 4x the rows


def test_a_namedtuple_or_nested_batch_is_cut_to_half_with_its_structure():
    """The second description's batch (half the example's rows) keeps the batch's own types: a
    namedtuple's fields, a nested dict, a scalar left whole; the prediction at 4x the example holds
    both inputs at that batch (4 bytes x rows x width each)."""
    from collections import namedtuple

    from dnnperf.perfmodel.graph import first_rows

    Pair = namedtuple("Pair", ["inputs", "targets"])
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    half = first_rows({"pair": Pair(x, y), "scale": torch.tensor(2.0)}, BATCH // 2)
    assert isinstance(half["pair"], Pair) and half["pair"].inputs.shape == (BATCH // 2, WIDTH)
    assert half["scale"].dim() == 0

    def loss_of(model: nn.Module, batch) -> torch.Tensor:
        return nn.functional.mse_loss(model(batch.inputs), batch.targets)

    larger = dnnperf.predict(
        wide_linear(), Pair(x, y), loss_fn=loss_of, machine="a100-ib", batch_size=4 * BATCH
    )
    assert larger.memory["input"] == 2 * 4 * (4 * BATCH) * WIDTH


def test_a_step_that_fails_after_changing_the_model_leaves_it_as_it_was():
    """The user's step ran the optimizer, then failed: one line naming the error, and the weights are
    the ones before the call."""
    model = wide_linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]

    def failing(model: nn.Module, batch) -> torch.Tensor:
        model(batch).sum().backward()
        optimizer.step()
        raise ValueError("no loss today")

    with pytest.raises(UsageError, match="batch of 4 failed: ValueError: no loss today"):
        dnnperf.predict(model, torch.randn(4, WIDTH), loss_fn=failing, optimizer=optimizer, machine="a100-ib")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    ("batch", "needle"),
    [
        (torch.randn(4, WIDTH - 1), r"step of the model on an example batch of 4 failed: RuntimeError: mat1"),
        ("not a batch", "tensor, or a dict, tuple or list of tensors.*got str"),
        ((), "got tuple"),
        ({"x": torch.tensor(3.0)}, "first tensor is a scalar"),
    ],
)
def test_a_batch_the_model_cannot_take_is_one_line(batch, needle):
    with pytest.raises(UsageError, match=needle) as raised:
        dnnperf.predict(wide_linear(), batch, machine="a100-ib")
    assert "\n" not in str(raised.value)


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


def _fake_link(ops) -> dict:
    """A link calibration of allreduce and ``ops``, as collective_calibration.link_of makes it."""
    fit = {"alpha": 1e-5, "bandwidth": 1e9, "reduce_bandwidth": 1e10}
    measured = ["allreduce", *(op for op in ops if op != "allreduce")]
    return {**fit, "ops": {op: dict(fit) for op in measured}, "calibrated": measured, "source": "fake"}


def test_this_machine_calibrates_only_the_collectives_and_fsdp_a_prediction_needs(
    tmp_path, monkeypatch
) -> None:
    """Two-rank calibrations (each gloo collective, FSDP's host work) cost seconds each on a 2-core
    host: a one-device prediction skips them, a several-device one times only the collectives its
    strategies use, and a machine built without one refuses what needs it."""
    from dnnperf import calibration, hardware
    from dnnperf.cli.predict import load_machine
    from dnnperf.perfmodel import calibrate, collective_calibration
    from dnnperf.perfmodel.collectives import OPERATIONS
    from dnnperf.perfmodel.machine import NOT_CALIBRATED
    from dnnperf.perfmodel.predict import predict
    from dnnperf.perfmodel.validate import calibrated_machine

    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    ran: list = []

    def fake(name, value):
        def measured(*args, **kwargs):
            ran.append(name)
            return value

        monkeypatch.setattr(calibrate, name, measured)

    zoo = calibrate.ZooCalibration(
        efficiency={}, curves={}, call_s={}, kernel_s=0.0, host_call_s={}, ops=frozenset({"aten.relu"})
    )
    for name, value in [
        ("calibrated", zoo),
        ("update_step_cost", (1e-4, 1e-6, 1.0)),
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

    def link_calibration(ops=OPERATIONS):
        ran.append(("link", tuple(sorted(ops))))
        return _fake_link(ops)

    monkeypatch.setattr(collective_calibration, "link_calibration", link_calibration)
    hardware.save_profile(calibration.calibrate("cpu", quick=True))

    lean = calibrated_machine("cpu", collectives=(), fsdp=False)
    assert "fsdp_cost" not in ran and "calibrated" in ran and not [r for r in ran if r[0] == "link"]
    assert lean.sources["link"] == lean.sources["fsdp"] == NOT_CALIBRATED
    assert lean.zoo_ops == {"aten.relu"}  # the zoo's operators: the others are replayed
    two = dataclasses.replace(lean, nodes=2)
    with pytest.raises(UsageError, match="without its link"):
        predict("basic_cnn", two, 4, "dp", preset="tiny")
    assert predict("basic_cnn", lean, 4, "single", preset="tiny").step_s > 0
    ran.clear()
    # What `dnnperf predict --sweep nodes=...` asks for with strategy auto (dp, pp, tp): every
    # collective but reduce-scatter, which only fsdp and zero2 use, and no FSDP.
    swept = load_machine("hw", "cpu", ("dp", "pp", "tp"), several=True)
    assert ran.count(("link", ("allgather", "allreduce", "broadcast", "send_recv"))) == 1
    assert "fsdp_cost" not in ran
    swept = dataclasses.replace(swept, nodes=2)
    for strategy in ("dp", "pp", "tp"):
        assert predict("basic_cnn", swept, 4, strategy, preset="tiny").step_s > 0
    with pytest.raises(UsageError, match="without reduce_scatter"):
        predict("basic_cnn", swept, 4, "zero2", preset="tiny")
    with pytest.raises(UsageError, match="without FSDP"):
        predict("basic_cnn", swept, 4, "fsdp", preset="tiny")
    ran.clear()
    load_machine("hw", "cpu", ("dp", "pp", "tp"), several=False)
    assert not [r for r in ran if r[0] == "link"]
    ran.clear()
    heard: list[tuple[str, float]] = []
    full = calibrated_machine("cpu", progress=lambda what, done: heard.append((what, done)))
    assert ("link", tuple(sorted(OPERATIONS))) in ran and "fsdp_cost" in ran
    said = " ".join(what for what, _ in heard)
    assert all(part in said for part in ("layer zoo", "update", "FSDP", "gloo link"))
    assert [done for _, done in heard] == sorted(done for _, done in heard)
    assert NOT_CALIBRATED not in full.sources.values()
    assert predict("basic_cnn", dataclasses.replace(full, nodes=2), 4, "zero2", preset="tiny").step_s > 0


def test_each_strategy_predicts_with_exactly_the_collectives_it_is_said_to_need(
    tmp_path, monkeypatch
) -> None:
    """The truth is link_for's own refusal: a machine whose link measured allreduce and a strategy's
    COLLECTIVES predicts that strategy on 2 nodes of 1 and of 2 devices, and leaving out any one of
    them is refused, naming it, on at least one of the two (zero2 across nodes of several devices
    reduces hierarchically, by allreduce)."""
    from dnnperf import calibration
    from dnnperf.perfmodel.machine import from_profile
    from dnnperf.perfmodel.predict import COLLECTIVES, STRATEGIES, predict

    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    profile = calibration.calibrate("cpu", quick=True)
    layouts = [(2, 1), (2, 2)]

    def predicted(strategy, ops, layout) -> bool:
        machine = from_profile(profile, link=_fake_link(ops))
        machine = dataclasses.replace(machine, nodes=layout[0], devices_per_node=layout[1])
        try:
            return predict("basic_cnn", machine, 4, strategy, preset="tiny").step_s > 0
        except UsageError as error:
            missing = [op for op in COLLECTIVES[strategy] if op not in ops]
            assert missing and any(f"without {op}" in str(error) for op in missing), str(error)
            return False

    assert set(COLLECTIVES) == set(STRATEGIES)
    for strategy, needed in COLLECTIVES.items():
        assert all(predicted(strategy, needed, layout) for layout in layouts), strategy
        for op in needed:
            without = [o for o in needed if o != op]
            assert not all(predicted(strategy, without, layout) for layout in layouts), (strategy, op)


def test_the_zoos_operators_come_back_from_the_calibration_cache(monkeypatch, tmp_path) -> None:
    """The operators the zoo timed, which decide what a prediction replays, are kept in the cache."""
    from dnnperf import calibration
    from dnnperf.perfmodel import calibrate
    from dnnperf.perfmodel.machine import from_profile

    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    timed = calibrate.ZooCalibration({}, {}, {}, 0.0, {}, ops=frozenset({"aten.relu", "aten.gelu[tanh]"}))
    runs: list[int] = []
    monkeypatch.setattr(calibrate, "zoo_calibration", lambda machine: runs.append(1) or timed)
    base = from_profile(calibration.calibrate("cpu", quick=True))
    assert calibrate.calibrated(base).ops == timed.ops
    assert calibrate.calibrated(base).ops == timed.ops and runs == [1]  # the second from the cache
