"""The collective calibration: the fit recovers known alpha and beta from the model's own formulas, the
microbenchmark runs real gloo ranks and leaves nothing behind, and a calibrated machine uses each
operation's own fit inside a node only."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import psutil
import pytest

from dnnperf.errors import UsageError
from dnnperf.perfmodel import collective_calibration as cc
from dnnperf.perfmodel import collectives
from dnnperf.perfmodel.machine import GLOO_SEGMENT, Machine
from dnnperf.perfmodel.predict import link_for, reduce_scatter_link
from test_model_formulas import toy_machine


def _known(alpha: float, bandwidth: float, gamma: float, noise: float = 0.0) -> pd.DataFrame:
    link = collectives.Link.of(alpha, bandwidth, 1 / gamma, GLOO_SEGMENT)
    rows = []
    for i, (op, n) in enumerate((op, n) for op in cc.OPS for n in cc.SIZES):
        wobble = 1 + noise * (1 if i % 2 else -1)
        rows.append({"op": op, "bytes": n, "median_s": cc.predict_op(op, n, 2, link) * wobble})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("op", cc.OPS)
def test_the_fit_recovers_alpha_and_bandwidth_from_the_formulas(op: str) -> None:
    alpha, bandwidth, gamma = 150e-6, 1.3e9, 1 / 4e9
    fit = cc.fit_op(_known(alpha, bandwidth, gamma), op, 2, gamma)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert fit["bandwidth"] == pytest.approx(bandwidth, rel=1e-6)
    assert fit["reduce_bandwidth"] == pytest.approx(1 / gamma)


def test_the_comparison_is_exact_without_noise_and_sees_injected_noise() -> None:
    alpha, bandwidth, gamma = 200e-6, 0.8e9, 1 / 3e9
    exact = _known(alpha, bandwidth, gamma)
    links = {op: cc.fit_op(exact, op, 2, gamma) for op in cc.OPS}
    table = cc.compare(exact, links, 2)
    assert table["error"].abs().max() < 1e-9
    # +-5% alternating noise: a least-squares fit cannot follow it, errors stay near 5%.
    noisy = _known(alpha, bandwidth, gamma, noise=0.05)
    links = {op: cc.fit_op(noisy, op, 2, gamma) for op in cc.OPS}
    summary = cc.summary(cc.compare(noisy, links, 2))
    assert 0.02 < summary["median_abs_error"] < 0.08
    assert sorted(cc.held_out(cc.SIZES)) == list(cc.SIZES[1::2])


def _stalled(alpha: float, bandwidth: float, gamma: float, stall_s: float, share: float) -> pd.DataFrame:
    """Rows as measure() gives them when ``share`` of the messages stall ``stall_s`` more (the waits
    seen on this host): the median follows alpha, the mean alpha + share x stall."""
    rows = _known(alpha, bandwidth, gamma)
    return rows.assign(mean_s=_known(alpha + share * stall_s, bandwidth, gamma)["median_s"])


def test_a_fit_on_means_carries_the_stalls_a_fit_on_medians_leaves_out() -> None:
    alpha, bandwidth, gamma, stall_s = 150e-6, 1.3e9, 1 / 4e9, 3e-3
    rows = _stalled(alpha, bandwidth, gamma, stall_s, share=0.3)
    for op in cc.OPS:
        typical = cc.fit_op(rows, op, 2, gamma)
        assert (typical["alpha"], typical["bandwidth"]) == pytest.approx((alpha, bandwidth), rel=1e-6)
        expected = cc.fit_op(rows, op, 2, gamma, statistic="mean_s")
        stalled = (alpha + 0.3 * stall_s, bandwidth)
        assert (expected["alpha"], expected["bandwidth"]) == pytest.approx(stalled, rel=1e-6)


def test_calibrate_gives_steps_the_mean_fit_and_its_table_the_median_fit(monkeypatch) -> None:
    """The machine's link (what steps pay) is fitted on means; the table compares the typical call."""
    alpha, bandwidth, gamma = 150e-6, 1.3e9, 1 / 4e9
    rows = _stalled(alpha, bandwidth, gamma, 3e-3, share=0.3)
    monkeypatch.setattr(cc, "measure", lambda world, rounds, ops: rows[rows["op"].isin(ops)])
    monkeypatch.setattr(cc, "reduce_seconds_per_byte", lambda: gamma)
    monkeypatch.setattr(cc, "page_fault_cost", lambda: 0.0)
    link, table = cc.calibrate()
    assert table["error"].abs().max() < 1e-9  # the median fit against the medians
    for op in cc.OPS:
        assert link["ops"][op] == cc.fit_op(rows, op, 2, gamma, statistic="mean_s")
    assert link["alpha"] == link["ops"]["allreduce"]["alpha"] > alpha
    # Means that give no line (a small message's mean above a large one's): that operation's medians.
    rows.loc[rows["op"] == "broadcast", "mean_s"] = [1e-2 / (i + 1) for i in range(len(cc.SIZES))]
    link, _ = cc.calibrate()
    assert link["ops"]["broadcast"] == cc.fit_op(rows, "broadcast", 2, gamma)
    assert link["ops"]["allgather"] == cc.fit_op(rows, "allgather", 2, gamma, statistic="mean_s")


def test_each_collective_is_measured_once_when_a_prediction_first_needs_it(tmp_path, monkeypatch) -> None:
    """The truth is the calls to measure(): allreduce comes with whatever is asked, an operation
    cached is not timed again, the ones missing are timed together, and the link assembled from
    cached and fresh entries holds each one's own fit, marking what is still unmeasured."""
    from dnnperf.perfmodel.machine import NOT_CALIBRATED, link_source, with_link

    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    gamma = 1 / 4e9
    rows = _stalled(150e-6, 1.3e9, gamma, 3e-3, share=0.2)
    timed: list[list[str]] = []

    def measure(world, rounds, ops):
        timed.append(list(ops))
        return rows[rows["op"].isin(ops)]

    monkeypatch.setattr(cc, "measure", measure)
    monkeypatch.setattr(cc, "reduce_seconds_per_byte", lambda: gamma)
    monkeypatch.setattr(cc, "page_fault_cost", lambda: 0.0)
    tp = cc.link_calibration(["allgather"])
    assert timed == [["allreduce", "allgather"]] and tp["calibrated"] == ["allreduce", "allgather"]
    pp = cc.link_calibration(["send_recv", "broadcast", "allgather"])
    assert timed[1:] == [["broadcast", "send_recv"]]
    assert pp["calibrated"] == ["allreduce", "allgather", "broadcast", "send_recv"]
    for op in pp["calibrated"]:
        assert pp["ops"][op] == cc.fit_op(rows, op, 2, gamma, statistic="mean_s")
    assert pp["alpha"] == pp["ops"]["allreduce"]["alpha"]
    assert cc.link_calibration(["broadcast"])["calibrated"] == ["allreduce", "broadcast"]
    assert len(timed) == 2
    machine = with_link(toy_machine(), pp)
    assert machine.sources[link_source("reduce_scatter")] == NOT_CALIBRATED
    assert all(machine.sources.get(link_source(op)) is None for op in pp["calibrated"])
    # A fuller link clears the marks of the one before.
    assert NOT_CALIBRATED not in with_link(machine, cc.link_calibration(cc.OPS)).sources.values()
    assert timed[2:] == [["reduce_scatter"]]
    cc.link_calibration(refresh=True)
    assert timed[3:] == [list(cc.OPS)]
    # An allreduce that gave no line is timed again (the machine's own link); another operation not.
    rows = rows.assign(median_s=1e-3, mean_s=1e-3)  # as long at every size: no line
    cc.link_calibration(refresh=True)
    assert cc.link_calibration(["broadcast"])["ops"] == {}
    assert timed[4:] == [list(cc.OPS), ["allreduce"]]
    for wrong in ("allgather", ["allgather", "all_to_all"]):
        with pytest.raises(UsageError, match="allgather" if wrong == "allgather" else "all_to_all"):
            cc.link_calibration(wrong)


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("dnnperf-collectives-*")}


def test_measure_runs_two_gloo_ranks_and_leaves_nothing_behind() -> None:
    before_dirs, before_children = _leftovers(), {p.pid for p in psutil.Process().children(recursive=True)}
    frame = cc.measure(2, sizes=(4096, 65536), rounds=2)
    assert sorted(zip(frame["op"], frame["bytes"], strict=True)) == sorted(
        (op, n) for op in cc.OPS for n in (4096, 65536)
    )
    assert (frame["median_s"] > 0).all() and (frame["p10_s"] <= frame["p90_s"]).all()
    assert (frame["mean_s"] >= frame["p10_s"]).all()  # a mean is never below the 10th percentile
    assert _leftovers() == before_dirs
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}
    assert after <= before_children


def _machine(**changes: object) -> Machine:
    """The formula tests' toy machine with two devices in each of two nodes."""
    return toy_machine(devices_per_node=2, nodes=2, **changes)


def test_a_calibrated_machine_uses_each_operations_fit_inside_a_node_only() -> None:
    fits = {"send_recv": {"alpha": 3e-4, "bandwidth": 2e9, "reduce_bandwidth": 0.0}}
    machine = _machine(collectives=fits)
    inside = link_for(machine, 2, "send_recv")
    assert (inside.alpha, inside.beta) == pytest.approx((3e-4, 1 / 2e9))
    other = link_for(machine, 2, "allgather")  # no fit of its own: the node's link
    assert (other.alpha, other.beta) == pytest.approx((1e-6, 1 / 1e10))
    across = link_for(machine, 4, "send_recv")  # between nodes: the described link, not the local fit
    assert (across.alpha, across.beta) == pytest.approx((1e-5, 1 / 1e9))


def test_a_reduce_scatter_runs_over_its_own_fit_else_the_allreduces() -> None:
    """gloo's reduce-scatter of a tensor costs more than its allreduce: where the calibration fitted
    it, FSDP's and zero2's reduce-scatters use that fit; a machine calibrated before keeps the
    allreduce's. The truth: the formula on the fit's own alpha and beta."""
    allreduce = {"alpha": 1e-4, "bandwidth": 4e9, "reduce_bandwidth": 0.0}
    scatter = {"alpha": 3e-4, "bandwidth": 1e9, "reduce_bandwidth": 0.0}
    fits = {"allreduce": allreduce, "reduce_scatter": scatter}
    with_fit = reduce_scatter_link(_machine(collectives=fits), 2)
    assert (with_fit.alpha, with_fit.beta) == pytest.approx((3e-4, 1 / 1e9))
    before = reduce_scatter_link(_machine(collectives={"allreduce": allreduce}), 2)
    assert (before.alpha, before.beta) == pytest.approx((1e-4, 1 / 4e9))
    n = 64 << 10  # 2 ranks, each half one message (under a segment): one latency, half the bytes sent
    assert collectives.reduce_scatter(n, 2, with_fit) == pytest.approx(3e-4 + n / 2 / 1e9)


def test_a_collective_fit_without_a_bandwidth_is_refused() -> None:
    with pytest.raises(UsageError, match=r"collectives\['allreduce'\] needs a positive bandwidth"):
        _machine(collectives={"allreduce": {"alpha": 1e-4}})


def test_timings_that_do_not_grow_with_size_give_no_fit_and_no_prediction() -> None:
    """Noise can make a large message look faster than a small one: no bandwidth can be fitted, the
    operation keeps the machine's default link, and its rows are predicted by nothing."""
    shrinking = pd.DataFrame(
        {
            "op": "broadcast",
            "bytes": list(cc.SIZES),
            "median_s": [1e-3 / (i + 1) for i in range(len(cc.SIZES))],
        }
    )
    assert cc.fit_op(shrinking, "broadcast", 2, 1 / 4e9) is None
    table = cc.compare(shrinking, {}, 2)
    assert table["predicted_s"].isna().all()
    from dnnperf.perfmodel.validate import collective_rows

    assert collective_rows(table) == []


def test_gather_buffer_faults_follow_glibcs_mmap_threshold() -> None:
    assert collectives.gather_buffer_faults(32 << 20) == 0  # reused from the heap
    assert collectives.gather_buffer_faults((64 << 20) + 1) == 16385  # fresh pages, rounded up


def test_the_fit_takes_counted_page_faults_off_and_the_prediction_adds_gloos_own() -> None:
    """Known alpha and bandwidth, with a 64 MiB allgather's 16,384 faults injected at 2 us each: the fit
    recovers the line, and the comparison predicts the faulted row exactly."""
    alpha, bandwidth, gamma, fault_s = 150e-6, 1.3e9, 1 / 4e9, 2e-6
    rows = _known(alpha, bandwidth, gamma)
    rows["faults"] = [
        collectives.gather_buffer_faults(n) if op == "allgather" else 0.0
        for op, n in zip(rows["op"], rows["bytes"], strict=True)
    ]
    rows["median_s"] += rows["faults"] * fault_s
    assert rows["faults"].max() == 16384
    fit = cc.fit_op(rows, "allgather", 2, gamma, fault_s)
    assert (fit["alpha"], fit["bandwidth"]) == pytest.approx((alpha, bandwidth), rel=1e-6)
    table = cc.compare(rows, {"allgather": fit}, 2, fault_s)
    assert table.dropna()["error"].abs().max() < 1e-9
    # Without the faults taken off, the line bends: the fit no longer recovers the bandwidth.
    bent = cc.fit_op(rows, "allgather", 2, gamma, 0.0)
    assert bent["bandwidth"] < 0.95 * bandwidth


def test_measure_counts_the_page_faults_of_gloos_allgather_buffer() -> None:
    """getrusage's minor faults, counted per sample, against collectives.gather_buffer_faults: a 48 MiB
    allgather maps its result afresh each call; an allreduce of the same buffer reduces in place (at
    most its first calls' 2 MiB scratch segments fault, before glibc's threshold has risen)."""
    n = 48 << 20
    frame = cc.measure(2, sizes=(n,), rounds=2).set_index("op")
    assert frame.loc["allgather", "faults"] == pytest.approx(collectives.gather_buffer_faults(n), rel=0.05)
    assert frame.loc["allreduce", "faults"] < collectives.gather_buffer_faults(n) / 10


def test_tensor_parallel_allgathers_pay_their_result_buffers_faults() -> None:
    """CPU ranks' links carry the machine's fault cost (GPUs' do not), and tp's all-gather of a 64 MiB
    output pays 16,384 faults at it, against a hand count."""
    from types import SimpleNamespace

    from dnnperf.perfmodel.predict import tp_collectives, tp_regions

    cpu = link_for(_machine(page_fault_s=1e-6, comm_on_compute_cores=True), 2, "allgather")
    assert cpu.fault_s == 1e-6
    assert link_for(_machine(page_fault_s=1e-6), 2, "allgather").fault_s == 0.0
    region = {"kind": "column", "module": "fc", "count": 4, "input_bytes": 1000, "output_bytes": 64 << 20}
    graph = SimpleNamespace(tp_regions=[region])
    times = pd.DataFrame({"module": ["fc"]})
    link = collectives.Link.of(1e-4, 1e9, 4e9, GLOO_SEGMENT)
    priced = collectives.Link.of(1e-4, 1e9, 4e9, GLOO_SEGMENT, fault_s=1e-6)
    _, regions = tp_regions(graph, times, 2, "toy")
    without = tp_collectives(regions, 2, link, link, "ring")
    with_faults = tp_collectives(regions, 2, priced, link, "ring")
    assert with_faults - without == pytest.approx(16384 * 1e-6)


@pytest.mark.parametrize("mbit", [None, 100.0, 1000.0, 10000.0])
def test_shaped_link_sizes_reach_ddps_buckets_and_skip_what_the_burst_hides(mbit: float | None) -> None:
    from dnnperf.distributed.netns import burst_bytes

    sizes, smallest = cc.shaped_sizes(mbit)
    assert sizes[0] == 1024 and sizes == tuple(1024 * 4**i for i in range(len(sizes)))
    assert sizes[-1] >= 16 << 20  # DDP's buckets (25 MiB caps) are in the range the fit sees
    if mbit is not None:
        assert smallest == 8 * burst_bytes(mbit) and sizes[-1] >= 32 * burst_bytes(mbit)
        assert sum(n >= smallest for n in sizes) >= 2  # a line needs two sizes
