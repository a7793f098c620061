"""The performance model's sharded data parallelism (fsdp = ZeRO-3, zero1, zero2) against hand
computation: the overlap of per-unit collectives, the memory shares, ZeroRedundancyOptimizer's
partition, a prediction's memory by category, and a sweep that fits with fsdp where dp does not."""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from dnnperf.distributed.sharded import shard_units
from dnnperf.perfmodel import collectives, strategies
from dnnperf.perfmodel.machine import preset
from dnnperf.perfmodel.predict import link_for, predict, reduce_scatter_link, sweep
from dnnperf.perfmodel.whatif import best_per_configuration, crossovers
from dnnperf.report.terminal import prediction_table
from dnnperf.workloads import get_workload

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


@pytest.mark.parametrize(
    ("compute", "before", "after", "exposed"),
    [
        # Nothing to hide behind: every collective is exposed.
        ([0.0, 0.0], [1.0, 2.0], [0.5, 0.25], 3.75),
        # The first all-gather waits; the later ones run during the unit before.
        ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0], 0.5),
        # All-gathers longer than compute: 0-2 the first, 2-4 the second (issued when unit 0 starts at
        # 2), unit 1 computes 4-5: 5 - 2 of compute.
        ([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 3.0),
        # Reduce-scatters: unit 0 computes 0-1, its 0.5 runs 1-1.5 beside unit 1 (1-2); unit 1's 3 runs
        # 2-5 after its compute: 5 - 2.
        ([1.0, 1.0], [0.0, 0.0], [0.5, 3.0], 3.0),
    ],
)
def test_shard_overlap_against_hand_schedules(compute, before, after, exposed):
    assert strategies.shard_overlap(compute, before, after) == pytest.approx(exposed)


def test_sharded_memory_shares_by_hand():
    fsdp = strategies.sharded_memory("fsdp", 4, [100, 300], 50, 450)
    assert (fsdp.param_share, fsdp.gradient_share, fsdp.state_share) == (0.25, 0.25, 0.25)
    assert fsdp.gathered_params == 50 + 300  # the root, and the largest unit
    assert fsdp.gathered_gradients == 300
    kept = strategies.sharded_memory("fsdp", 4, [100, 300], 50, 450, reshard_after_forward=False)
    assert kept.gathered_params == 50 + 100 + 300  # every unit stays gathered until its backward
    zero1 = strategies.sharded_memory("zero1", 4, [], 0, 450, heaviest_share=0.3)
    assert (zero1.param_share, zero1.gradient_share, zero1.state_share) == (1.0, 1.0, 0.3)
    zero2 = strategies.sharded_memory("zero2", 4, [], 0, 450)
    assert (zero2.gradient_share, zero2.state_share, zero2.gathered_gradients) == (0.25, 0.25, 450)


def test_zero_partition_is_greedy_largest_first():
    # 5 to rank 0, 4 to rank 1, 3 to rank 1 (4 < 5), 3 to rank 0 (5 < 7).
    assert strategies.zero_partition([3, 5, 3, 4], 2) == [8, 7]


def test_unit_param_bytes_counts_submodules_in_their_unit():
    sizes = {"embed": 10, "blocks.0.attn": 4, "blocks.0.mlp": 6, "blocks.1.attn": 4, "(root)": 2}
    assert strategies.unit_param_bytes(sizes, ["blocks.0", "blocks.1"]) == ([10, 4], 12)


def _machine(devices: int):
    return preset("a100-ib").with_axis("devices_per_node", devices)


def test_fsdp_prediction_memory_by_hand():
    """basic_cnn on 2 devices. By hand from its layers: every parameter is in a unit (conv1, conv2,
    fc1, fc2; no root parameters), so a rank holds half the parameters and of SGD's momentum. Its peak
    falls in fc1's backward, where FSDP2 holds fc1 gathered and conv2 too (the all-gather it prefetches
    for the next unit of backward), and fc1's gradients whole beside the shards of fc2's and fc1's
    (those of fc1 about to be reduce-scattered); dp holds everything."""
    model = get_workload("basic_cnn").build("tiny", "meta").model
    total = 4 * sum(p.numel() for p in model.parameters())
    fc1, fc2 = 4 * (64 * 256 + 64), 4 * (10 * 64 + 10)
    conv2 = 4 * (16 * 8 * 5 * 5 + 16)
    fsdp = predict("basic_cnn", _machine(2), 8, "fsdp", preset="tiny", exact=False)
    dp = predict("basic_cnn", _machine(2), 8, "dp", preset="tiny", exact=False)
    assert (fsdp.memory["phase"], fsdp.memory["module"]) == ("backward", "fc1")
    assert fsdp.memory["parameters"] == pytest.approx(total / 2 + fc1 + conv2)
    assert fsdp.memory["gradients"] == pytest.approx((fc1 + fc2) / 2 + fc1)
    assert fsdp.memory["optimizer_state"] == pytest.approx(dp.memory["optimizer_state"] / 2)
    assert dp.memory["parameters"] == total and dp.memory["optimizer_state"] == total
    assert fsdp.memory["input"] == dp.memory["input"]  # the same per-rank batch
    assert fsdp.detail["units"] == 4
    # On the CPU-less preset (asynchronous GPUs) the collectives overlap compute: no more is exposed
    # than they take.
    assert 0 <= fsdp.communication_s <= fsdp.detail["allgather_s"] + fsdp.detail["reduce_scatter_s"]


def test_a_sweep_says_fsdp_fits_where_dp_does_not():
    """A device whose memory lies between fsdp's and dp's per-device peak at 8 devices: there fsdp is
    the best that fits; on 1 device nothing fits (both hold everything), and the crossover names it."""
    dp = predict("basic_cnn", _machine(8), 64, "dp", preset="tiny", exact=False)
    fsdp = predict("basic_cnn", _machine(8), 64, "fsdp", preset="tiny", exact=False)
    assert fsdp.memory_bytes < dp.memory_bytes
    machine = dataclasses.replace(preset("a100-ib"), memory_bytes=(fsdp.memory_bytes + dp.memory_bytes) / 2)
    axes = {"devices_per_node": [1.0, 8.0]}
    frame = sweep("basic_cnn", machine, 64, axes, strategies_=("dp", "fsdp"), preset="tiny")
    at8 = frame[frame["devices_per_node"] == 8.0].set_index("strategy")
    assert not at8.loc["dp", "fits"] and at8.loc["fsdp", "fits"]
    best = best_per_configuration(frame, ["devices_per_node"]).set_index("devices_per_node")["best"]
    assert best.loc[8.0] == "fsdp" and not isinstance(best.loc[1.0], str)
    changes = crossovers(frame, ["devices_per_node"]).to_dict("records")
    assert changes == [
        {"axis": "devices_per_node", "held": "", "below": 1.0, "above": 8.0, "before": None, "after": "fsdp"}
    ]


def test_fsdp_charges_its_host_work_per_group_parameter_tensor_and_update_call():
    """basic_cnn `tiny`: 4 units and the root (5 sharded groups), 8 parameter tensors (4 layers' weight
    and bias), and SGD with momentum and weight decay making 4 calls per tensor (the decay's add, the
    momentum's mul_ and add_, the parameter's add_): 32 update calls. Each calibrated figure adds its
    count times itself to compute, and nothing to communication; a preset charges nothing."""
    bare = predict("basic_cnn", _machine(2), 8, "fsdp", preset="tiny", exact=False)
    assert bare.detail["fsdp_host_s"] == 0.0  # no published figure for a described machine
    costs = {"fsdp_step_s": 3e-3, "fsdp_unit_s": 1e-3, "fsdp_param_s": 1e-4, "fsdp_update_call_s": 1e-5}
    expected = 3e-3 + 5 * 1e-3 + 8 * 1e-4 + 32 * 1e-5
    for name, cost in costs.items():
        machine = dataclasses.replace(_machine(2), **{name: cost})
        alone = predict("basic_cnn", machine, 8, "fsdp", preset="tiny", exact=False)
        count = {"fsdp_step_s": 1, "fsdp_unit_s": 5, "fsdp_param_s": 8, "fsdp_update_call_s": 32}[name]
        assert alone.detail["fsdp_host_s"] == pytest.approx(count * cost), name
    charged = predict(
        "basic_cnn", dataclasses.replace(_machine(2), **costs), 8, "fsdp", preset="tiny", exact=False
    )
    assert charged.detail["fsdp_host_s"] == pytest.approx(expected)
    assert charged.compute_s - bare.compute_s == pytest.approx(expected)
    assert charged.communication_s == bare.communication_s
    dp = predict("basic_cnn", dataclasses.replace(_machine(2), **costs), 8, "dp", preset="tiny", exact=False)
    assert "fsdp_host_s" not in dp.detail  # dp runs no FSDP


def test_what_fsdp_holds_gathered_follows_backward():
    """By hand on four units and a root of 100 bytes: outside the model (the loss) nothing is gathered
    and no gradient is whole; in the root's own modules its parameters and gradients; in unit i also
    unit i's parameters and gradients and unit i-1's parameters (prefetched); unit 0 prefetches none."""
    units, sizes = ["a", "b", "c", "d"], [10, 20, 30, 40]
    modules = ["embed", "a.x", "b", "c.y.z", "d", "head", "(none)"]
    held = strategies.gathered_in_backward(modules, units, sizes, 100)
    assert held == (
        (100, 100),
        (110, 110),
        (130, 120),
        (150, 130),
        (170, 140),
        (100, 100),
        (0, 0),
    )


def test_what_fsdp_holds_gathered_when_kept_after_forward():
    """By hand, the same units kept gathered after forward: a unit is whole from its forward until its
    backward has run, so where backward is at a segment every unit that began at or before it is
    whole, and the root throughout (the loss included); the gradients as when resharded."""
    units, sizes = ["a", "b", "c", "d"], [10, 20, 30, 40]
    modules = ["embed", "a.x", "b", "c.y.z", "d", "head", "(none)"]
    held = strategies.gathered_in_backward(modules, units, sizes, 100, reshard_after_forward=False)
    assert held == (
        (100, 100),
        (110, 110),
        (130, 120),
        (160, 130),
        (200, 140),
        (200, 100),
        (200, 0),
    )


def _group_bytes(workload: str) -> list[int]:
    """By hand: the bytes of each unit fsdp shards (``shard_units``' choice, tested in test_fsdp.py)
    and of the rest (the root), each tied tensor once."""
    model = get_workload(workload).build("tiny", "meta").model
    units = shard_units(model)
    groups = dict.fromkeys([*units, "(root)"], 0)
    for name, parameter in model.named_parameters():
        owner = next((u for u in units if name.startswith(u + ".")), "(root)")
        groups[owner] += 4 * parameter.numel()
    return list(groups.values())


@pytest.mark.parametrize("workload", ["basic_cnn", "gpt2"])
def test_fsdp_gathers_every_group_twice_and_reduces_it_once(workload):
    """`tiny` on 2 devices of a machine whose ranks wait for their collectives (the CPU's gloo: all
    exposed). By hand from the model's parameters: each unit and the root (resharded after forward
    like the units, as dnnperf runs FSDP2; gpt2's holds the embeddings) all-gathered for forward and
    again for backward, reduce-scattered once, over the machine's links."""
    machine = dataclasses.replace(_machine(2), asynchronous=False)
    if workload == "basic_cnn":  # every parameter in a unit (conv1, conv2, fc1, fc2), no root
        sizes = [4 * (8 * 3 * 25 + 8), 4 * (16 * 8 * 25 + 16), 4 * (64 * 256 + 64), 4 * (10 * 64 + 10)]
    else:
        sizes = _group_bytes(workload)
        assert len(sizes) > 2 and sizes[-1] > 0  # units, and a root holding the token embedding
    fsdp = predict(workload, machine, 8, "fsdp", preset="tiny", exact=False)
    gather_link = link_for(machine, 2, "allgather")
    scatter_link = reduce_scatter_link(machine, 2)
    assert fsdp.detail["allgather_s"] == pytest.approx(
        2 * sum(collectives.allgather(n, 2, gather_link) for n in sizes)
    )
    assert fsdp.detail["reduce_scatter_s"] == pytest.approx(
        sum(collectives.reduce_scatter(n, 2, scatter_link) for n in sizes)
    )
    assert fsdp.communication_s == pytest.approx(fsdp.detail["allgather_s"] + fsdp.detail["reduce_scatter_s"])
    # Kept gathered after forward: each group is all-gathered once, for its forward only.
    kept = predict(workload, machine, 8, "fsdp", preset="tiny", exact=False, reshard_after_forward=False)
    assert kept.detail["allgather_s"] == pytest.approx(
        sum(collectives.allgather(n, 2, gather_link) for n in sizes)
    )
    assert kept.detail["reduce_scatter_s"] == pytest.approx(fsdp.detail["reduce_scatter_s"])
    assert kept.memory_bytes > fsdp.memory_bytes
    assert (fsdp.detail["reshard_after_forward"], kept.detail["reshard_after_forward"]) == (True, False)
    console = Console(width=200, record=True)
    console.print(prediction_table([fsdp, kept], {}))
    shown = [line.split("│")[1].strip() for line in console.export_text().splitlines() if "│" in line]
    assert shown == ["fsdp", "fsdp kept after forward"]


def test_validation_calibrates_fsdp_only_when_asked_and_its_machines_say_so(monkeypatch):
    """Every microbenchmark of calibrated_machines stubbed; FSDP's the truth counted: measured once
    where asked, its figures then on every machine and in the headline figures; not asked, never
    measured, no figure, and each machine refuses an fsdp prediction (as calibrated_machine's do)."""
    from dnnperf import calibration
    from dnnperf.errors import UsageError
    from dnnperf.perfmodel import validate
    from dnnperf.perfmodel.calibrate import UpdateSamples, ZooCalibration
    from dnnperf.perfmodel.fsdp_calibration import FsdpCost
    from dnnperf.perfmodel.machine import NOT_CALIBRATED

    measured = FsdpCost(3e-3, 1e-3, 1e-4, 1e-5)
    # 2 us a call and the roofline as priced: a fit with a positive share.
    update_calls, roofline = [10.0, 100.0, 1e3], [1e-4, 1e-5, 1e-6]
    measured_steps = [2e-6 * c + r for c, r in zip(update_calls, roofline, strict=True)]
    samples = UpdateSamples(update_calls, roofline, measured_steps, [True, False, False])
    calls = []
    stubs = {
        "measure_op_overhead": lambda **_: 5e-6,
        "measure_page_fault_cost": lambda: 1e-7,
        "measure_zero_operand_cost": lambda: {},
        "measure_split_region_cost": lambda: 0.0,
        "measure_ddp_cost": lambda: (0.0, 0.0),
        "measure_fsdp_cost": lambda: calls.append("fsdp") or measured,
        "zoo_calibration": lambda machine, **_: ZooCalibration({}, {}, {}, 0.0),
        "measure_phase_call_cost": lambda: {},
        "update_samples": lambda machine, **_: samples,
        "measure_cold_product_cost": lambda: (0.0, 0.0),
        "measure_product_rows_efficiency": lambda: {},
        "measure_inner_call_cost": lambda: 0.0,
        "measure_gap_call_cost": lambda: {},
    }
    for name, stub in stubs.items():
        monkeypatch.setattr(validate, name, stub)
    profile = calibration.calibrate("cpu", quick=True)

    machines, figures = validate.calibrated_machines(profile, fsdp=True)
    assert calls == ["fsdp"] and figures["fsdp_step_s"] == measured.step_s
    assert {(m.fsdp_step_s, m.fsdp_update_call_s) for m in machines.values()} == {(3e-3, 1e-5)}
    assert all(m.sources.get("fsdp") != NOT_CALIBRATED for m in machines.values())

    machines, figures = validate.calibrated_machines(profile)
    assert calls == ["fsdp"] and not any(key.startswith("fsdp_") for key in figures)
    assert {m.sources.get("fsdp") for m in machines.values()} == {NOT_CALIBRATED}
    refusing = dataclasses.replace(_machine(2), sources=machines["model"].sources)
    with pytest.raises(UsageError, match="without FSDP's host work"):
        predict("basic_cnn", refusing, 8, "fsdp", preset="tiny", exact=False)
    assert predict("basic_cnn", refusing, 8, "dp", preset="tiny", exact=False).step_s > 0
