"""The performance model's formulas against hand-computed cases, and its refusals of bad input."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from dnnperf.errors import UsageError
from dnnperf.perfmodel import collectives as c
from dnnperf.perfmodel import strategies as s
from dnnperf.perfmodel.compute import ComputeOptions, op_times, queued_end, step_time
from dnnperf.perfmodel.graph import ScalableGraph, StepGraph
from dnnperf.perfmodel.machine import PRESETS, Machine, from_dict, preset
from dnnperf.perfmodel.predict import predict

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

LINK = c.Link(alpha=1e-5, beta=1e-9, gamma=5e-10)  # 10 us, 1 GB/s, 2 GB/s reduction


def test_ring_allreduce_of_n_bytes_on_p_ranks() -> None:
    # p=4, n=8 MB: 2*3 alphas + 2*(3/4)*8e6 bytes at 1 ns + (3/4)*8e6 reduced at 0.5 ns
    assert c.allreduce(8e6, 4, LINK, "ring") == pytest.approx(6e-5 + 12e-3 + 3e-3)


def test_other_allreduces_allgather_reduce_scatter_broadcast_send() -> None:
    n, p = 8e6, 8
    assert c.allreduce(n, p, LINK, "rabenseifner") == pytest.approx(6e-5 + 2 * 7 / 8 * 8e-3 + 7 / 8 * 4e-3)
    assert c.allreduce(n, p, LINK, "recursive_doubling") == pytest.approx(3 * (1e-5 + 8e-3 + 4e-3))
    assert c.allreduce(n, p, LINK, "tree") == pytest.approx(6 * (1e-5 + 8e-3) + 3 * 4e-3)
    assert c.allgather(n, p, LINK) == pytest.approx(7e-5 + 7 / 8 * 8e-3)
    assert c.reduce_scatter(n, p, LINK) == pytest.approx(7e-5 + 7 / 8 * 8e6 * 1.5e-9)
    assert c.broadcast(n, 5, LINK) == pytest.approx(3 * (1e-5 + 8e-3))  # ceil(log2 5) = 3
    assert c.send_recv(1e6, LINK) == pytest.approx(1e-5 + 1e-3)
    assert c.allreduce(n, 1, LINK) == 0.0


def test_segmentation_multiplies_the_latency_per_step() -> None:
    seg = dataclasses.replace(LINK, segment_bytes=1 << 20)
    # 16 MiB on 2 ranks: each of the 2 steps sends 8 MiB = 8 segments of 1 MiB
    n = 16 * (1 << 20)
    assert c.allreduce(n, 2, seg) - c.allreduce(n, 2, LINK) == pytest.approx(2 * 7 * 1e-5)


def test_hierarchical_allreduce_sums_its_three_phases() -> None:
    intra = c.Link(1e-6, 1e-11)
    expected = c.reduce_scatter(8e6, 4, intra) + c.allreduce(2e6, 2, LINK) + c.allgather(8e6, 4, intra)
    assert c.hierarchical_allreduce(8e6, 4, 2, intra, LINK) == pytest.approx(expected)
    assert c.hierarchical_allreduce(8e6, 4, 1, intra, LINK) == c.allreduce(8e6, 4, intra)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_bubble_over_compute_is_p_minus_1_over_m(schedule: str) -> None:
    # Equal stages (forward 0.4 s, backward 0.6 s), free messages: (m + p - 1) slots of 1 s.
    t = s.pipeline_time([0.4] * 4, [0.6] * 4, micro_batches=8, send_s=0.0, schedule=schedule)
    assert t.step_s == pytest.approx(11.0)
    assert t.compute_s == pytest.approx(8.0) and t.communication_s == 0.0
    assert t.bubble_s / t.compute_s == pytest.approx(3 / 8)


def test_pipeline_messages_overlap_the_senders_next_compute() -> None:
    """Two stages (forward 1 s, backward 1 s), 2 micro-batches, 0.5 s a message, 1F1B, by hand:
    stage 0: F0 0-1, F1 1-2 (its activations arrive at stage 1 at 1.5 and 2.5); stage 1: F0 1.5-2.5,
    B0 2.5-3.5, F1 3.5-4.5, B1 4.5-5.5 (gradients arrive at stage 0 at 4.0 and 6.0); stage 0: B0
    4-5, B1 6-7. Free messages: 6 s. The closed form, slots of compute plus two sends, would say 9 s."""
    t = s.pipeline_time([1.0, 1.0], [1.0, 1.0], micro_batches=2, send_s=0.5, schedule="1f1b")
    assert t.step_s == pytest.approx(7.0)
    assert t.compute_s == pytest.approx(4.0)
    assert t.bubble_s == pytest.approx(2.0) and t.communication_s == pytest.approx(1.0)
    # A slower second stage: the first waits on it (bubble), the messages hide behind its compute.
    slow = s.pipeline_time([1.0, 2.0], [1.0, 2.0], micro_batches=4, send_s=0.25, schedule="gpipe")
    # Stage 1's forwards end at 1.25 + 2 * 4 = 9.25, its backwards at 17.25; stage 0's last
    # backward starts when the last gradient arrives (17.5) and ends at 18.5.
    assert slow.step_s == pytest.approx(18.5)
    assert slow.compute_s == pytest.approx(16.0)


def test_ddp_bucket_overlap_on_a_toy_schedule() -> None:
    # Backward lasts 10 s; buckets ready at 2, 5, 9 taking 2, 2, 3 s: ends 4, 7, 12 -> 2 s exposed.
    assert s.bucket_overlap([2, 5, 9], [2, 2, 3], 10.0) == pytest.approx(2.0)
    # A slow first bucket delays the others: ends 8, 10, 13 -> 3 s exposed.
    assert s.bucket_overlap([2, 5, 9], [6, 2, 3], 10.0) == pytest.approx(3.0)
    assert s.bucket_overlap([2, 5], [1, 1], 10.0) == 0.0


def test_gradient_buckets_follow_backward_order_and_caps() -> None:
    times = pd.DataFrame(
        {
            "phase": ["forward", "backward", "backward", "backward"],
            "module": ["a", "c", "b", "a"],
            "seconds": [5.0, 1.0, 2.0, 3.0],
        }
    )
    mib = 1 << 20
    ready, sizes, total = s.gradient_buckets(times, {"a": mib, "b": 2 * mib, "c": mib // 2})
    # c ready at 1 (0.5 MiB, below the first cap), with b at 3 it passes 1 MiB; a at 6 closes the last.
    assert (ready, sizes, total) == ([3.0, 6.0], [mib // 2 + 2 * mib, mib], 6.0)


def test_partition_balances_contiguous_stages_and_refuses_too_many() -> None:
    assert s.partition([1, 1, 1, 1, 4], 2) == [0, 4]
    assert s.partition([3, 1, 1, 1, 3, 3], 3) == [0, 2, 5] or s.partition([3, 1, 1, 1, 3, 3], 3) == [0, 3, 5]
    with pytest.raises(UsageError, match="needs at least 4 layers"):
        s.partition([1, 2, 3], 4)


def toy_machine(**changes: object) -> Machine:
    base = dict(
        name="toy",
        peak_flops={"float32": 1e12},
        memory_bandwidth=1e11,
        memory_bytes=1e9,
        link_bandwidth=1e9,
        link_latency=1e-5,
        intra_bandwidth=1e10,
        intra_latency=1e-6,
        dispatch_s=1e-6,
    )
    base.update(changes)
    return Machine(**base)  # type: ignore[arg-type]


def test_roofline_max_or_sum_plus_overhead_per_call() -> None:
    ops = pd.DataFrame(
        {
            "phase": ["forward", "forward", "forward"],
            "module": ["m", "m", "m"],
            "op": ["aten.mm", "aten.add", "aten.view"],
            "family": ["matmul", "elementwise", "free"],
            "dtype": ["float32"] * 3,
            "flops": [2e9, 1e6, 0.0],
            "bytes": [1e8, 3e8, 0.0],
            "calls": [2.0, 4.0, 5.0],
        }
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(efficiency={"matmul/forward": 0.5, "matmul/backward": 0.25})
    times = op_times(graph, machine, ComputeOptions("max"))
    # mm: max(2e9 / 1e12, 1e8 / 1e11) / 0.5 = 4 ms + 2 calls x 1 us; add: max(1 us, 3 ms) + 4 us;
    # view: nothing
    assert times["seconds"].tolist() == pytest.approx([4e-3 + 2e-6, 3e-3 + 4e-6, 0.0])
    summed = op_times(graph, machine, ComputeOptions(overhead=False))  # the default: the sum
    assert summed["seconds"].tolist() == pytest.approx([(2e-3 + 1e-3) / 0.5, 3e-3 + 1e-6, 0.0])
    # An operator's own efficiency comes before its family's and phase's, which comes before the family's.
    machine = toy_machine(
        efficiency={"matmul/forward/aten.mm": 0.8, "matmul/forward": 0.5, "elementwise": 0.25}
    )
    times = op_times(graph, machine, ComputeOptions("max", overhead=False))
    assert times["seconds"].tolist() == pytest.approx([2e-3 / 0.8, 3e-3 / 0.25, 0.0])
    # A family's fixed cost per call joins the dispatch overhead of each of its calls, in its phase only.
    machine = toy_machine(call_s={"matmul/forward": 3e-6, "elementwise/backward": 1.0})
    times = op_times(graph, machine)
    assert times["overhead_s"].tolist() == pytest.approx([2 * (1e-6 + 3e-6), 4 * 1e-6, 0.0])
    assert op_times(graph, machine, ComputeOptions(overhead=False))["overhead_s"].sum() == 0


def test_each_phase_pays_its_own_call_cost_and_the_update_a_share_of_its_bytes() -> None:
    ops = pd.DataFrame(
        {
            "phase": ["forward", "backward", "update", "update"],
            "module": ["m", "m", "", ""],
            "op": ["aten.add", "aten.add", "aten.add_", "aten.view"],
            "family": ["elementwise", "elementwise", "elementwise", "free"],
            "dtype": ["float32"] * 4,
            "flops": [0.0] * 4,
            "bytes": [1e8, 1e8, 1e8, 0.0],
            "calls": [3.0, 5.0, 7.0, 2.0],
        }
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(phase_call_s={"forward": 4e-6, "update": 2e-6}, update_byte_share=0.5)
    times = op_times(graph, machine)
    # 1e8 bytes at 1e11 bytes/s: 1 ms, the update's at half its bytes; each call its phase's cost,
    # backward the machine's dispatch_s (it has none of its own); a view no call cost at all.
    assert times["compute_s"].tolist() == pytest.approx([1e-3, 1e-3, 0.5e-3, 0.0])
    assert times["overhead_s"].tolist() == pytest.approx([3 * 4e-6, 5 * 1e-6, 7 * 2e-6, 0.0])
    # Either off: the one dispatch cost, the bytes as counted.
    plain = op_times(graph, machine, ComputeOptions(phase_calls=False, update_share=False))
    assert plain["compute_s"].tolist() == pytest.approx([1e-3, 1e-3, 1e-3, 0.0])
    assert plain["overhead_s"].tolist() == pytest.approx([3e-6, 5e-6, 7e-6, 0.0])


def test_a_compiled_functions_later_kernels_pay_the_inner_call_cost_in_the_forward_alone() -> None:
    ops = pd.DataFrame(
        {
            "phase": ["forward", "forward", "backward", "forward"],
            "module": ["m"] * 4,
            "op": ["aten.add_", "aten.addmm", "aten.add", "aten.t"],
            "family": ["elementwise", "matmul", "elementwise", "free"],
            "dtype": ["float32"] * 4,
            "flops": [0.0] * 4,
            "bytes": [0.0] * 4,
            "calls": [10.0, 4.0, 6.0, 8.0],
            "inner_calls": [10.0, 1.0, 6.0, 0.0],  # the backward's as if counted: not charged so
        }
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(
        phase_call_s={"forward": 12e-6, "backward": 5e-6}, call_s={"matmul/forward": 3e-6}, inner_call_s=2e-6
    )
    times = op_times(graph, machine)  # the default: on
    # Forward: 10 inner calls at 2 us; the product's 3 outer calls at 12 us and its inner one at 2 us,
    # each with the family's 3 us. Backward: its phase's 5 us a call. A view: nothing.
    assert times["overhead_s"].tolist() == pytest.approx(
        [10 * 2e-6, 3 * (12e-6 + 3e-6) + (2e-6 + 3e-6), 6 * 5e-6, 0.0]
    )
    # Off, or a machine without the calibration: every call at its phase's cost.
    expected = [10 * 12e-6, 4 * (12e-6 + 3e-6), 6 * 5e-6, 0.0]
    off = op_times(graph, machine, ComputeOptions(composite_calls=False))
    assert off["overhead_s"].tolist() == pytest.approx(expected)
    plain = dataclasses.replace(machine, inner_call_s=0.0)
    uncalibrated = op_times(graph, plain)
    assert uncalibrated["overhead_s"].tolist() == pytest.approx(expected)
    # A phase cost below the inner calls' (every call at dispatch_s, 1 us): never raised by it. An
    # asynchronous device: its host costs are its queue's, untouched here.
    one_cost = op_times(graph, machine, ComputeOptions(phase_calls=False))
    assert one_cost["overhead_s"].tolist() == pytest.approx([10 * 1e-6, 4 * (1e-6 + 3e-6), 6 * 1e-6, 0.0])
    queued = dataclasses.replace(machine, asynchronous=True)
    assert op_times(graph, queued)["overhead_s"].tolist() == pytest.approx(expected)


def test_a_forward_or_backward_product_pays_its_operands_trip_from_memory() -> None:
    rows = [  # phase, op, family, bytes, calls
        ("forward", "aten.mm", "matmul", 1e8, 3.0),
        ("backward", "aten.bmm", "matmul", 2e8, 5.0),
        ("update", "aten.mm", "matmul", 1e8, 7.0),
        ("forward", "aten.add", "elementwise", 1e8, 2.0),
    ]
    columns = ["phase", "op", "family", "bytes", "calls"]
    ops = pd.DataFrame(rows, columns=columns).assign(module="m", dtype="float32", flops=0.0)
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(cold_product_call_s=10e-6, cold_product_byte_s=1e-11)
    times = op_times(graph, machine, ComputeOptions(overhead=False))  # the default: on
    # 1e8 bytes at 1e11 bytes/s: 1 ms; the products of forward and backward 10 us a call and
    # 0.01 ns a byte on top (3 x 10 us + 1 ms; 5 x 10 us + 2 ms); the update's product and the add none.
    assert times["compute_s"].tolist() == pytest.approx(
        [1e-3 + 30e-6 + 1e-3, 2e-3 + 50e-6 + 2e-3, 1e-3, 1e-3]
    )
    hot = op_times(graph, machine, ComputeOptions(overhead=False, cold_products=False))
    assert hot["compute_s"].tolist() == pytest.approx([1e-3, 2e-3, 1e-3, 1e-3])


def test_a_product_of_few_rows_computes_at_the_machines_fraction_for_its_smallest_dimension() -> None:
    rows = [  # op, family, counted rows (each call's smallest dimension, summed), calls
        ("aten.mm", "matmul", 8.0, 2.0),  # 4 rows a call: a calibrated point
        ("aten.addmm", "matmul", 6.0, 1.0),  # 6: between 4 and 8
        ("aten.mm", "matmul", 3 * 64.0, 3.0),  # 64: twice the most calibrated, the many-rows rate
        ("aten.mm", "matmul", 1.0, 1.0),  # 1: below the fewest, the fewest's
        ("aten.mm", "matmul", 0.0, 1.0),  # rows not recorded (an older description)
        ("aten.bmm", "matmul", 4.0, 1.0),  # a batched product: not priced by its rows
        ("aten.convolution", "convolution", 4.0, 1.0),  # a convolution's rows: its own classes
    ]
    columns = ["op", "family", "rows", "calls"]
    ops = pd.DataFrame(rows, columns=columns).assign(
        phase="forward", module="m", dtype="float32", flops=1e9, bytes=0.0
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(product_rows_efficiency={"4": 0.25, "8": 0.5, "32": 0.8})
    priced = ComputeOptions(overhead=False, few_rows_products=True)
    times = op_times(graph, machine, priced)
    # 1e9 FLOPs at 1e12 FLOP/s: 1 ms at the full rate. Between two calibrated rows the fraction is
    # log-linear in the rows: at 6, 0.25 x (0.5 / 0.25) ** (log(6 / 4) / log(8 / 4)).
    between = 0.25 * 2 ** (math.log(1.5) / math.log(2))
    assert times["compute_s"].tolist() == pytest.approx(
        [1e-3 / 0.25, 1e-3 / between, 1e-3, 1e-3 / 0.25, 1e-3, 1e-3, 1e-3]
    )
    # From 32 rows (0.8) to 64 (1.0), log-linear too: at 45 rows, 0.8 x 1.25 ** (log(45/32) / log 2).
    one_row = ops.iloc[[0]].assign(rows=45.0, calls=1.0)
    at_45 = op_times(StepGraph("toy", 1, one_row, 0, {}, 0, 0, 0), machine, priced)
    assert at_45["compute_s"].iloc[0] == pytest.approx(
        1e-3 / (0.8 * 1.25 ** (math.log(45 / 32) / math.log(2)))
    )
    # Off (the default), or a machine without the calibration: every product at its FLOPs' rate.
    off = op_times(graph, machine, ComputeOptions(overhead=False))
    assert off["compute_s"].tolist() == pytest.approx([1e-3] * len(rows))
    plain = op_times(graph, toy_machine(), priced)
    assert plain["compute_s"].tolist() == pytest.approx([1e-3] * len(rows))


def test_a_model_pays_the_hosts_gaps_beyond_the_calibration_networks_on_the_cpu_it_was_described_on() -> None:
    rows = [
        ("forward", "aten.add", "elementwise", 1e8, 2.0),
        ("backward", "aten.add", "elementwise", 2e8, 2.0),
    ]
    columns = ["phase", "op", "family", "bytes", "calls"]
    ops = pd.DataFrame(rows, columns=columns).assign(
        module="m", dtype="float32", flops=0.0, zeros=0.0, rows=0.0, kind=""
    )
    gaps = {"forward": [5e-3, 400.0], "backward": [1e-3, 500.0], "update": [9e-3, 100.0]}
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0, gaps=gaps)
    here = toy_machine(replay_device="cpu", gap_call_s={"forward": 5e-6, "backward": 4e-6, "update": 1e-6})
    off, whole = ComputeOptions(host_gaps=False), ComputeOptions(fixed_gaps=False)
    plain = step_time(graph, here, off)
    charged = step_time(graph, here, whole)
    # Forward: 5 ms between 400 calls, 2 ms of them at 5 us a call: 3 ms more. Backward: 1 ms between
    # 500 calls at 4 us (2 ms): nothing, never less. The update: its own calibration, not charged.
    assert charged.forward_s - plain.forward_s == pytest.approx(3e-3)
    assert charged.backward_s == pytest.approx(plain.backward_s)
    assert charged.update_s == pytest.approx(plain.update_s)
    assert charged.overhead_s - plain.overhead_s == pytest.approx(3e-3)
    # A prediction's step and phases carry it (one device, and each rank of data parallelism).
    with_gaps = predict(graph, here, batch_size=1, options=whole)
    without = predict(graph, here, batch_size=1, options=off)
    assert with_gaps.step_s - without.step_s == pytest.approx(3e-3)
    assert with_gaps.detail["phases_s"]["forward"] == pytest.approx(charged.forward_s)
    # Another machine (a preset) runs other Python at another speed: nothing charged.
    elsewhere = dataclasses.replace(here, replay_device="")
    assert step_time(graph, elsewhere, whole).total_s == pytest.approx(
        step_time(graph, elsewhere, off).total_s
    )
    # Interpolated between two batches, the gaps are the two's in proportion; kept through JSON.
    other = dataclasses.replace(
        graph, batch_size=3, gaps={"forward": [7e-3, 400.0], "backward": [3e-3, 500.0]}
    )
    between = graph.at_batch(other, 2)
    assert between.gaps == {"forward": [pytest.approx(6e-3), 400.0], "backward": [pytest.approx(2e-3), 500.0]}
    assert StepGraph.from_dict(between.to_dict()).gaps == between.gaps
    # Their part that does not grow with the batch: the line through (1, 5 ms) and (3, 7 ms) at batch
    # 0 is 4 ms forward (2 ms over 400 calls at 5 us: 2 ms charged), (1, 1 ms) and (3, 3 ms) give 0
    # backward; the same at any batch, the described one included. The model's default.
    assert between.fixed_gaps == {"forward": [pytest.approx(4e-3), 400.0], "backward": [0.0, 500.0]}
    for size in (1, 2, 5):
        at = ScalableGraph(graph, other).at(size)
        assert step_time(at, here).forward_s - step_time(at, here, off).forward_s == pytest.approx(2e-3)
        assert step_time(at, here).backward_s == pytest.approx(step_time(at, here, off).backward_s)
    # One description has no fixed part to charge.
    assert step_time(graph, here).total_s == pytest.approx(plain.total_s)


def test_cold_product_fit_recovers_a_call_cost_and_a_cost_per_byte() -> None:
    from dnnperf.perfmodel.calibrate import cold_product_fit

    counted = [2e4, 3e5, 1e6, 5e6]
    hot = [5e-6, 30e-6, 120e-6, 1.5e-3]
    # 20 us a call and 0.05 ns a byte (20 GB/s) beyond the time in cache.
    cold = [h + 20e-6 + 5e-11 * b for h, b in zip(hot, counted, strict=True)]
    assert cold_product_fit(counted, hot, cold) == pytest.approx((20e-6, 5e-11))
    # Cold no slower than hot (all in cache): nothing, never a negative cost.
    assert cold_product_fit(counted, hot, hot) == pytest.approx((0.0, 0.0), abs=1e-15)


def test_update_cost_fit_recovers_a_call_cost_and_a_share() -> None:
    from dnnperf.perfmodel.calibrate import update_cost_fit

    calls = [3000.0, 1500.0, 400.0, 60.0]
    roofline = [1e-4, 1e-3, 1e-2, 5e-2]
    # 3 us a call and two thirds of the roofline.
    measured = [3e-6 * c + 2 / 3 * r for c, r in zip(calls, roofline, strict=True)]
    assert update_cost_fit(calls, roofline, measured) == pytest.approx((3e-6, 2 / 3))
    # A step slower than either term can give (calls or bytes): the fit never goes negative.
    fitted = update_cost_fit(calls, roofline, [1e-3 / c for c in calls])
    assert min(fitted) >= 0


def test_update_step_fit_recovers_a_fixed_cost_a_step_besides_calls_and_bytes() -> None:
    from dnnperf.perfmodel.calibrate import update_step_fit

    calls = [3000.0, 1500.0, 400.0, 60.0, 6.0, 24.0]
    roofline = [1e-4, 1e-3, 1e-2, 5e-2, 1e-6, 1e-4]
    # 0.4 ms a step, 3 us a call, two thirds of the roofline.
    measured = [4e-4 + 3e-6 * c + 2 / 3 * r for c, r in zip(calls, roofline, strict=True)]
    assert update_step_fit(calls, roofline, measured) == pytest.approx((4e-4, 3e-6, 2 / 3))
    # Without a fixed cost the fit finds none.
    measured = [3e-6 * c + 2 / 3 * r for c, r in zip(calls, roofline, strict=True)]
    assert update_step_fit(calls, roofline, measured) == pytest.approx((0.0, 3e-6, 2 / 3), abs=1e-12)


def _queue_by_call(
    rows: list[tuple[float, float, int]], issued: float = 0.0, free: float = 0.0
) -> list[float]:
    """The asynchronous device one call at a time: the independent truth for queued_end's closed form."""
    ends = []
    for h, d, calls in rows:
        for _ in range(calls):
            issued += h
            free = max(free, issued) + d
        ends.append(free)
    return ends


def test_an_asynchronous_device_ends_each_row_as_its_calls_queue() -> None:
    # Host-bound: 10 calls issued every 5 us, 1 us each on the device: the last ends at 50 + 1 us.
    assert queued_end([5e-6], [1e-6], [10]).tolist() == pytest.approx([51e-6])
    # Device-bound: the first call is issued at 1 us, then 10 x 5 us back to back.
    assert queued_end([1e-6], [5e-6], [10]).tolist() == pytest.approx([51e-6])
    # A long kernel keeps the device busy while the host issues the next row: the queue carries over.
    assert queued_end([1e-6, 1e-6], [100e-6, 1e-6], [1, 10]).tolist() == pytest.approx([101e-6, 111e-6])
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows = [
            (float(rng.uniform(0, 1e-5)), float(rng.uniform(0, 1e-5)), int(rng.integers(1, 9)))
            for _ in range(12)
        ]
        h, d, calls = zip(*rows, strict=True)
        assert queued_end(list(h), list(d), list(calls), 3e-6, 7e-6).tolist() == pytest.approx(
            _queue_by_call(rows, 3e-6, 7e-6)
        )


def _forward_backward_update(matmul_flops: float) -> pd.DataFrame:
    """A matmul forward (and 3 views), twice its FLOPs backward, a 1 MB update (10 us at 100 GB/s)."""
    return pd.DataFrame(
        {
            "phase": ["forward", "forward", "backward", "update"],
            "module": ["m", "m", "m", "(optimizer)"],
            "op": ["aten.mm", "aten.view", "aten.mm", "aten._foreach_add_"],
            "family": ["matmul", "free", "matmul", "elementwise"],
            "dtype": ["float32"] * 4,
            "flops": [matmul_flops, 0.0, 2 * matmul_flops, 0.0],
            "bytes": [0.0, 0.0, 0.0, 1e6],
            "calls": [1.0, 3.0, 1.0, 1.0],
        }
    )


def test_an_asynchronous_step_overlaps_host_and_device() -> None:
    ops = _forward_backward_update(1e9)  # 1 ms and 2 ms at 1 TFLOP/s
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 1_000_000)  # a 1 MB batch
    machine = toy_machine(dispatch_s=20e-6, asynchronous=True, kernel_s=2e-6, host_bandwidth=1e10)
    step = step_time(graph, machine)
    # The copy: issued at 20 us, 100 us on the device. The host issues mm at 40 us; the device runs it
    # from 120 us for 1 ms + 2 us; backward's mm follows back to back (2 ms + 2 us), then the update's
    # 10 us + 2 us. The host finished issuing at 80 us, long before.
    assert step.data_s == pytest.approx(120e-6)
    assert step.forward_s == pytest.approx(1002e-6)
    assert step.backward_s == pytest.approx(2002e-6)
    assert step.update_s == pytest.approx(12e-6)
    assert step.total_s == pytest.approx(120e-6 + 1002e-6 + 2002e-6 + 12e-6)
    # Host-bound: a slow host (5 ms a call, longer than any kernel) issues the update's kernel at 20 ms
    # (the copy and three kernels before it); the device idles between kernels.
    slow = dataclasses.replace(machine, dispatch_s=5e-3)
    assert step_time(graph, slow).total_s == pytest.approx(20e-3 + 12e-6)
    # A family's own host cost joins each of its calls; views cost theirs alone (3 x 1 ms here).
    costly = dataclasses.replace(slow, host_call_s={"free/forward": 1e-3, "matmul/backward": 2e-3})
    assert step_time(graph, costly).total_s == pytest.approx(20e-3 + 3e-3 + 2e-3 + 12e-6)
    # The synchronous machine (a CPU) adds the host's per-call cost to every kernel instead.
    sync = dataclasses.replace(machine, asynchronous=False, host_bandwidth=0.0)
    times = op_times(graph, sync)
    assert step_time(graph, sync).total_s == pytest.approx(times["seconds"].sum() + 2 * 1e6 / 1e11)


def test_the_host_seconds_a_description_measured_replace_the_calls_costs_phase_by_phase() -> None:
    ops = _forward_backward_update(1e6)  # 1 us and 2 us at 1 TFLOP/s
    measured = {"forward": 30e-3, "backward": 7e-3}  # the update's issue not measured
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0, issue_s=measured)
    # A slow host (5 ms a kernel call, views 1 ms): each kernel waits for its issue.
    host = toy_machine(dispatch_s=5e-3, asynchronous=True, host_call_s={"free/forward": 1e-3})
    by_calls = step_time(graph, host)
    # The copy (5 ms), forward 5 + 3 x 1 ms, backward 5 ms, update 5 ms, then the update's 10 us kernel.
    assert by_calls.total_s == pytest.approx(5e-3 + 8e-3 + 5e-3 + 5e-3 + 10e-6)
    # On this host's GPU (a profile's stream device) each measured phase takes its measured seconds,
    # the update its calls' own; nothing else moves.
    this_host = dataclasses.replace(host, stream_device="cuda:0")
    step = step_time(graph, this_host)
    assert step.total_s == pytest.approx(5e-3 + 30e-3 + 7e-3 + 5e-3 + 10e-6)
    assert step.forward_s == pytest.approx(30e-3, rel=1e-3)
    assert step.backward_s == pytest.approx(7e-3, rel=1e-3)  # and its 2 us kernel
    # A machine described elsewhere (a preset), or the option off: the calls' costs alone.
    assert step_time(graph, this_host, ComputeOptions(measured_issue=False)).total_s == pytest.approx(
        by_calls.total_s
    )
    # Device-bound phases stay the device's: 1,000x the FLOPs make each matmul longer than its issue.
    heavy = dataclasses.replace(graph, ops=_forward_backward_update(1e11))
    assert step_time(heavy, this_host).total_s == pytest.approx(5e-3 + 5e-3 + 0.1 + 0.2 + 10e-6, rel=0.05)


def test_an_interpolated_description_keeps_the_smaller_issue_time_of_its_two() -> None:
    ops = pd.DataFrame(
        {
            "phase": ["forward"],
            "module": ["m"],
            "op": ["aten.mm"],
            "family": ["matmul"],
            "dtype": ["float32"],
            "flops": [1e6],
            "bytes": [0.0],
            "calls": [1.0],
            "zeros": [0.0],
            "rows": [0.0],
            "kind": [""],
        }
    )
    small = StepGraph("toy", 2, ops, 0, {}, 0, 0, 0, issue_s={"forward": 3e-3, "backward": 9e-3})
    large = dataclasses.replace(small, batch_size=8, ops=ops.assign(flops=[4e6]), issue_s={"forward": 5e-3})
    between = small.at_batch(large, 4)
    assert between.ops["flops"].tolist() == pytest.approx([2e6])
    assert between.issue_s == {"forward": 3e-3}  # backward measured once only: not kept
    assert StepGraph.from_dict(between.to_dict()).issue_s == between.issue_s


def test_zero_operands_cost_what_the_machine_says_per_zero() -> None:
    ops = pd.DataFrame(
        {
            "phase": ["update", "update"],
            "module": ["(none)", "(none)"],
            "op": ["aten.sqrt", "aten.add"],
            "family": ["elementwise", "elementwise"],
            "dtype": ["float32"] * 2,
            "flops": [1e6, 1e6],
            "bytes": [8e6, 8e6],
            "calls": [1.0, 1.0],
            "zeros": [5e5, 5e5],
        }
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(zero_operand_s={"aten.sqrt": 4e-9})
    plain = op_times(graph, machine, ComputeOptions(zero_operands=False))["compute_s"]
    charged = op_times(graph, machine)["compute_s"]
    # 500,000 zeros at 4 ns each, on the square root only (the add is not slow on zeros here).
    assert (charged - plain).tolist() == pytest.approx([2e-3, 0.0])
    assert op_times(graph, toy_machine())["compute_s"].tolist() == pytest.approx(plain.tolist())


def test_fixed_cost_fit_recovers_a_fixed_cost_and_an_efficiency() -> None:
    from dnnperf.perfmodel.calibrate import fixed_cost_fit

    roofline = [1e-6, 1e-5, 1e-4, 1e-3]
    # 50 us a call, then twice the roofline: efficiency 0.5.
    assert fixed_cost_fit(roofline, [5e-5 + 2 * x for x in roofline]) == pytest.approx((5e-5, 0.5))
    # Faster than the roofline at every size: efficiency 1, what is left is the fixed cost (here none).
    fixed, efficiency = fixed_cost_fit(roofline, [0.5 * x for x in roofline])
    assert efficiency == 1.0 and fixed == pytest.approx(0.0, abs=1e-9)
    # A fit whose fixed cost would be negative: none, and the slope through the origin.
    fixed, efficiency = fixed_cost_fit(roofline, [4 * x - 5e-7 for x in roofline])
    assert fixed == 0.0 and 0.25 < efficiency < 1
    assert fixed_cost_fit([], []) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"memory_bandwidth": 0}, "memory_bandwidth must be a positive number"),
        ({"link_bandwidth": -1.0}, "link_bandwidth must be a positive number"),
        ({"peak_flops": {"float32": float("nan")}}, "peak_flops"),
        ({"nodes": 0}, "nodes must be a positive integer"),
        ({"link_latency": -1e-6}, "link_latency must be zero or a positive number"),
        ({"efficiency": {"matmul": 1.5}}, r"efficiency\['matmul'\] must be in \(0, 1\]"),
        ({"call_s": {"convolution/forward": -1e-6}}, r"call_s\['convolution/forward'\] must be zero or"),
        ({"zero_operand_s": {"aten.sqrt": float("inf")}}, r"zero_operand_s\['aten.sqrt'\] must be zero or"),
        ({"asynchronous": "yes"}, "asynchronous must be true or false"),
        ({"kernel_s": -1e-6}, "kernel_s must be zero or a positive number"),
        ({"phase_call_s": {"forward": -1e-6}}, r"phase_call_s\['forward'\] must be zero or"),
        ({"phase_call_s": [1]}, "phase_call_s must be an object"),
        ({"update_byte_share": 0.0}, "update_byte_share must be a positive number"),
        # Mistyped fields of a JSON description: named, never a crash further on.
        ({"efficiency": 5}, "efficiency must be an object, got 5"),
        ({"call_s": [1]}, r"call_s must be an object, got \[1\]"),
        ({"collectives": "x"}, "collectives must be an object"),
        ({"host_call_s": "x"}, "host_call_s must be an object"),
        ({"zero_operand_s": 3}, "zero_operand_s must be an object"),
        ({"efficiency": {"matmul": "x"}}, r"efficiency\['matmul'\] must be in \(0, 1\], got 'x'"),
        ({"collectives": {"allreduce": [1]}}, r"collectives\['allreduce'\] needs a positive bandwidth"),
        ({"segment_bytes": "x"}, "segment_bytes must be zero or a positive integer, got 'x'"),
        ({"segment_bytes": -5}, "segment_bytes must be zero or a positive integer"),
        ({"segment_bytes": 1.5}, "segment_bytes must be zero or a positive integer"),
        ({"sources": [1]}, "sources must be an object"),
        ({"sources": {"peak": 1}}, r"sources\['peak'\] must be a string"),
        ({"name": 5}, "name must be a non-empty string, got 5"),
        ({"name": " "}, "name must be a non-empty string"),
        ({"cold_product_byte_s": -1e-11}, "cold_product_byte_s must be zero or a positive number"),
        ({"inner_call_s": -1e-6}, "inner_call_s must be zero or a positive number"),
        ({"product_rows_efficiency": [1]}, "product_rows_efficiency must be an object"),
        (
            {"product_rows_efficiency": {"four": 0.5}},
            r"product_rows_efficiency\['four'\] needs a positive whole",
        ),
        ({"product_rows_efficiency": {"0": 0.5}}, r"product_rows_efficiency\['0'\] needs a positive whole"),
        ({"product_rows_efficiency": {"4": 1.5}}, r"product_rows_efficiency\['4'\] .* got 1.5"),
        ({"product_rows_efficiency": {"04": 0.5}}, r"product_rows_efficiency\['04'\] needs a positive whole"),
    ],
)
def test_bad_machine_descriptions_are_refused(change: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        toy_machine(**change)


def test_described_machine_needs_every_field() -> None:
    described = {
        k: v
        for k, v in dataclasses.asdict(toy_machine()).items()
        if k not in ("compute_curves", "bandwidth_curve", "replay_device", "stream_device", "zoo_ops")
    }
    with pytest.raises(UsageError, match="lacks link_bandwidth"):
        from_dict({k: v for k, v in described.items() if k != "link_bandwidth"})
    with pytest.raises(UsageError, match="unknown fields bogus"):
        from_dict({**described, "bogus": 1})
    assert from_dict(described).memory_bandwidth == 1e11
    with pytest.raises(UsageError, match="unknown fields replay_device"):  # a description is not this host
        from_dict({**described, "replay_device": "cpu"})
    with pytest.raises(UsageError, match="unknown fields stream_device"):
        from_dict({**described, "stream_device": "cuda:0"})


def test_presets_are_valid_and_axes_change_one_thing() -> None:
    for name in PRESETS:
        machine = preset(name, nodes=2)
        assert machine.devices == 2 * PRESETS[name]["devices_per_node"]
    a100 = preset("a100-ib")
    assert a100.with_axis("link_gbps", 100).link_bandwidth == pytest.approx(12.5e9)
    assert a100.with_axis("tflops", 39).peak("bfloat16") == pytest.approx(624e12)
    with pytest.raises(UsageError, match="unknown sweep axis"):
        a100.with_axis("colour", 1)
    assert math.isclose(a100.reduce_bandwidth, a100.memory_bandwidth / 3)


def test_per_element_kernels_take_one_bandwidth_whatever_fits_in_cache() -> None:
    """A GELU or a dropout mask costs the same per element in cache and out of it (measured: see
    compute.PER_ELEMENT_OPS): their bytes take the machine's bandwidth from memory, so their time
    is linear in bytes; an add's follows the cache curve (10x faster at 1 MB than at 100 MB here)."""
    from dnnperf.perfmodel.machine import Curve

    sizes = [1e6, 1e8]
    rows = [
        {"op": op, "family": family, "bytes": nbytes}
        for op, family in (
            ("aten.gelu[tanh]", "elementwise"),
            ("aten.bernoulli_", "random"),
            ("aten.add", "elementwise"),
        )
        for nbytes in sizes
    ]
    ops = pd.DataFrame(
        [
            {"phase": "forward", "module": "m", "dtype": "float32", "flops": 0.0, "calls": 1.0, **r}
            for r in rows
        ]
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    efficiency = {"elementwise/forward/aten.gelu[tanh]": 0.25, "random/forward": 0.05}
    machine = toy_machine(
        bandwidth_curve=Curve((1e6, 1e8), (1e12, 1e11)), memory_bandwidth=1e11, efficiency=efficiency
    )
    seconds = op_times(graph, machine, ComputeOptions(overhead=False))["seconds"].to_numpy()
    assert seconds[:2] == pytest.approx([1e6 / 1e11 / 0.25, 1e8 / 1e11 / 0.25])  # linear in bytes
    assert seconds[2:4] == pytest.approx([1e6 / 1e11 / 0.05, 1e8 / 1e11 / 0.05])
    assert seconds[4:] == pytest.approx([1e6 / 1e12, 1e8 / 1e11])  # the cache curve
    cached = op_times(graph, machine, ComputeOptions(overhead=False, per_element=False))["seconds"].to_numpy()
    assert cached[0] == pytest.approx(1e6 / 1e12 / 0.25)  # the ablation: every kernel on the curve


def test_elementwise_from_memory_takes_the_bandwidth_from_memory_at_every_size() -> None:
    """With ComputeOptions.elementwise_from_memory an add's bytes take the machine's bandwidth from
    memory at 1 MB as at 100 MB (through the cache's curve, 10x faster at 1 MB); other families keep
    the curve."""
    from dnnperf.perfmodel.machine import Curve

    sizes = [1e6, 1e8]
    rows = [
        {"op": op, "family": family, "bytes": nbytes}
        for op, family in (("aten.add", "elementwise"), ("aten.cat", "memory"))
        for nbytes in sizes
    ]
    ops = pd.DataFrame(
        [
            {"phase": "forward", "module": "m", "dtype": "float32", "flops": 0.0, "calls": 1.0, **r}
            for r in rows
        ]
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(bandwidth_curve=Curve((1e6, 1e8), (1e12, 1e11)), memory_bandwidth=1e11)
    on = ComputeOptions(overhead=False, elementwise_from_memory=True)
    seconds = op_times(graph, machine, on)["seconds"].to_numpy()
    assert seconds[:2] == pytest.approx([1e6 / 1e11, 1e8 / 1e11])
    assert seconds[2:] == pytest.approx([1e6 / 1e12, 1e8 / 1e11])
    off = op_times(graph, machine, ComputeOptions(overhead=False))["seconds"].to_numpy()
    assert off[:2] == pytest.approx([1e6 / 1e12, 1e8 / 1e11])


def test_copies_from_memory_keep_the_rate_of_a_copy_that_writes_fresh_memory() -> None:
    """A copy that truly runs at the bandwidth from memory at every size (it writes memory just
    allocated), timed by the zoo once at 4e5 bytes (in cache on the curve, 4x faster than memory):
    fitted and priced from memory (ComputeOptions.copies_from_memory) it comes out at that bandwidth
    at a tenth and at a hundred times the zoo's size; fitted and priced through the curve, its
    efficiency (a quarter) prices the 4e7 bytes at four times what they take. An add keeps the curve."""
    from dnnperf.perfmodel.calibrate import zoo_fit
    from dnnperf.perfmodel.machine import Curve

    machine = toy_machine(bandwidth_curve=Curve((4e5, 4e6, 4e7), (4e11, 2e11, 1e11)), memory_bandwidth=1e11)
    curve = machine.bandwidth_curve
    copy, add = ("aten.clone", "memory"), ("aten.add", "elementwise")
    base = {"phase": "forward", "module": "m", "dtype": "float32", "kind": "", "flops": 0.0, "calls": 1.0}
    zoo = pd.DataFrame(
        [
            {**base, "op": copy[0], "family": copy[1], "bytes": 4e5, "rows": 0.0, "measured": 4e5 / 1e11},
            {**base, "op": add[0], "family": add[1], "bytes": 4e5, "rows": 0.0, "measured": 4e5 / curve(4e5)},
        ]
    )
    sizes = (4e4, 4e7)
    step = pd.DataFrame(
        [
            {**base, "op": op, "family": family, "bytes": n, "rows": 0.0}
            for op, family in (copy, add)
            for n in sizes
        ]
    )
    graph = StepGraph("toy", 1, step, 0, {}, 0, 0, 0)
    priced = {}
    for from_memory in (True, False):
        options = ComputeOptions(overhead=False, copies_from_memory=from_memory)
        efficiency, _ = zoo_fit(zoo, machine, options)
        priced[from_memory] = op_times(graph, dataclasses.replace(machine, efficiency=efficiency), options)
    on, off = (priced[k]["seconds"].to_numpy() for k in (True, False))
    assert on[:2] == pytest.approx([n / 1e11 for n in sizes])
    assert off[1] == pytest.approx(4 * 4e7 / 1e11)  # the in-cache efficiency, a quarter, at memory's rate
    assert on[2:] == pytest.approx(off[2:])
    assert on[2:] == pytest.approx([n / curve(n) for n in sizes])


def test_large_copies_from_memory_take_the_rate_of_the_zoo_s_large_copies() -> None:
    """A copy that truly runs at a tenth of the cache's curve up to the L2 and at 0.8 of the bandwidth
    from memory beyond it, timed by the zoo at 4e5 bytes and (``sized``) at 8e6: with
    ComputeOptions.large_copies_from_memory a call of 4e4 bytes keeps the small copy's efficiency on
    the curve and one of 4e7 comes out at 0.8 of memory's bandwidth; without, the 4e7 are priced at
    a tenth of the curve, eight times what they take."""
    from dnnperf.perfmodel.calibrate import zoo_fit
    from dnnperf.perfmodel.compute import LARGE_COPY_BYTES
    from dnnperf.perfmodel.machine import Curve

    machine = toy_machine(bandwidth_curve=Curve((4e5, 4e6, 4e7), (4e11, 2e11, 1e11)), memory_bandwidth=1e11)
    curve = machine.bandwidth_curve
    assert 4e5 < LARGE_COPY_BYTES < 8e6
    base = {"phase": "forward", "module": "m", "dtype": "float32", "kind": "", "flops": 0.0, "calls": 1.0}
    small = {**base, "op": "aten.clone", "family": "memory", "rows": 0.0}
    zoo = pd.DataFrame(
        [
            {**small, "bytes": 4e5, "measured": 4e5 / curve(4e5) / 0.1, "sized": False},
            {**small, "bytes": 8e6, "measured": 8e6 / 1e11 / 0.8, "sized": True},
        ]
    )
    graph = StepGraph("toy", 1, pd.DataFrame([{**small, "bytes": n} for n in (4e4, 4e7)]), 0, {}, 0, 0, 0)
    priced = {}
    for on in (True, False):
        options = ComputeOptions(overhead=False, large_copies_from_memory=on)
        efficiency, _ = zoo_fit(zoo, machine, options)
        fitted = dataclasses.replace(machine, efficiency=efficiency)
        priced[on] = op_times(graph, fitted, options)["seconds"].to_numpy()
    assert priced[True] == pytest.approx([4e4 / curve(4e4) / 0.1, 4e7 / 1e11 / 0.8])
    assert priced[False] == pytest.approx([4e4 / curve(4e4) / 0.1, 4e7 / curve(4e7) / 0.1])


def test_norms_priced_per_element_keep_the_zoo_rate_at_every_size() -> None:
    """A batch norm that truly takes 0.2 ns a byte at any size and an add that truly runs at the cache
    curve's bandwidth, each timed once in a zoo of one size (4 MB): fitted and priced per element
    (ComputeOptions.norms_per_element), the norm comes out at 0.2 ns a byte at a tenth and at ten
    times the zoo's size; fitted and priced through the cache's curve, it follows the curve (too fast
    in cache). The add is priced by the curve either way."""
    from dnnperf.perfmodel.calibrate import zoo_fit
    from dnnperf.perfmodel.compute import per_element
    from dnnperf.perfmodel.machine import Curve

    machine = toy_machine(bandwidth_curve=Curve((4e5, 4e6, 4e7), (4e11, 2e11, 1e11)), memory_bandwidth=1e11)
    curve = machine.bandwidth_curve
    norm, add = ("aten._native_batch_norm_legit", "normalization"), ("aten.add", "elementwise")
    base = {"phase": "forward", "module": "m", "dtype": "float32", "kind": "", "flops": 0.0, "calls": 1.0}
    zoo = pd.DataFrame(
        [
            {**base, "op": norm[0], "family": norm[1], "bytes": 4e6, "rows": 0.0, "measured": 4e6 * 0.2e-9},
            {**base, "op": add[0], "family": add[1], "bytes": 4e6, "rows": 0.0, "measured": 4e6 / curve(4e6)},
        ]
    )
    sizes = (4e5, 4e7)
    step = pd.DataFrame(
        [
            {**base, "op": op, "family": family, "bytes": n, "rows": 0.0}
            for op, family in (norm, add)
            for n in sizes
        ]
    )
    graph = StepGraph("toy", 1, step, 0, {}, 0, 0, 0)
    assert per_element(step, norms=True).tolist() == [True, True, False, False]
    assert not per_element(step).any()
    priced = {}
    for norms in (True, False):
        options = ComputeOptions(overhead=False, norms_per_element=norms)
        efficiency, _ = zoo_fit(zoo, machine, options)
        fitted = dataclasses.replace(machine, efficiency=efficiency)
        priced[norms] = op_times(graph, fitted, options)["seconds"].to_numpy()
    assert priced[True][:2] == pytest.approx([n * 0.2e-9 for n in sizes])
    in_cache = [n * 0.2e-9 * curve(4e6) / curve(n) for n in sizes]  # the zoo's rate, moved by the curve
    assert priced[False][:2] == pytest.approx(in_cache)
    assert priced[True][2:] == pytest.approx(priced[False][2:])
    assert priced[True][2:] == pytest.approx([n / curve(n) for n in sizes])


def test_norms_out_of_cache_take_the_rate_of_the_zoo_s_calls_beyond_the_l2() -> None:
    """A group norm that truly takes 0.2 ns a byte in the L2 and 0.3 beyond it, and an add on the
    bandwidth curve, timed by the zoo at 4 MB and again (``sized``) at 40 MB: out of cache
    (ComputeOptions.norms_out_of_cache) the norm is priced at 0.3 ns a byte at any size, its one
    efficiency the 40 MB row's; otherwise the sized row plays no part (the 4 MB row's efficiency,
    exactly). The add's efficiency comes from its unsized row either way. An operator of the family
    the zoo never ran is priced per element at the family's efficiency, or where only the zoo's are
    (``norms_zoo_only``) through the curve."""
    from dnnperf.perfmodel.calibrate import zoo_fit
    from dnnperf.perfmodel.machine import Curve

    machine = toy_machine(bandwidth_curve=Curve((4e5, 4e6, 4e7), (4e11, 2e11, 1e11)), memory_bandwidth=1e11)
    curve = machine.bandwidth_curve
    base = {"phase": "forward", "module": "m", "dtype": "float32", "kind": "", "flops": 0.0, "calls": 1.0}
    base["rows"] = 0.0
    norm = {**base, "op": "aten.native_group_norm", "family": "normalization"}
    add = {**base, "op": "aten.add", "family": "elementwise"}
    zoo = pd.DataFrame(
        [
            {**norm, "bytes": 4e6, "measured": 4e6 * 0.2e-9, "sized": False},
            {**norm, "bytes": 4e7, "measured": 4e7 * 0.3e-9, "sized": True},
            {**add, "bytes": 4e6, "measured": 2 * 4e6 / curve(4e6), "sized": False},
            {**add, "bytes": 4e7, "measured": 9.0, "sized": True},  # never used: not a norm
        ]
    )
    out = ComputeOptions(overhead=False, norms_out_of_cache=True)
    efficiency, _ = zoo_fit(zoo, machine, out)
    assert efficiency["normalization/forward"] == pytest.approx(4e7 / 1e11 / (4e7 * 0.3e-9))
    assert efficiency["elementwise/forward"] == pytest.approx(0.5)
    in_cache, _ = zoo_fit(zoo, machine)
    assert in_cache["normalization/forward"] == pytest.approx(4e6 / curve(4e6) / (4e6 * 0.2e-9))
    assert in_cache["elementwise/forward"] == pytest.approx(0.5)
    sizes = (4e5, 4e6)
    step = pd.DataFrame([{**norm, "bytes": n} for n in sizes])
    graph = StepGraph("toy", 1, step, 0, {}, 0, 0, 0)
    seconds = op_times(graph, dataclasses.replace(machine, efficiency=efficiency), out)["seconds"]
    assert seconds.to_numpy() == pytest.approx([n * 0.3e-9 for n in sizes])
    # An operator of the family the zoo never ran: per element too, unless only the zoo's are.
    other = pd.DataFrame([{**norm, "op": "aten.native_batch_norm", "bytes": 4e5}])
    graph = StepGraph("toy", 1, other, 0, {}, 0, 0, 0)
    fitted = dataclasses.replace(machine, efficiency=efficiency)
    family = efficiency["normalization/forward"]
    assert op_times(graph, fitted, out)["seconds"].iloc[0] == pytest.approx(4e5 / 1e11 / family)
    only = dataclasses.replace(out, norms_zoo_only=True)
    assert op_times(graph, fitted, only)["seconds"].iloc[0] == pytest.approx(4e5 / curve(4e5) / family)
    assert zoo_fit(zoo, machine, only)[0] == efficiency  # the zoo's operators are all the zoo's


def test_the_zoo_net_of_its_page_faults_fits_the_rate_beyond_them() -> None:
    """A copy the zoo timed at twice its bandwidth's time, half of it page faults: net of them
    (ComputeOptions.zoo_faults_apart) its efficiency is 1, with them 0.5; rows without faults keep
    theirs."""
    from dnnperf.perfmodel.calibrate import zoo_fit

    machine = toy_machine(memory_bandwidth=1e11)
    base = {"phase": "forward", "module": "m", "dtype": "float32", "kind": "", "flops": 0.0, "calls": 1.0}
    roofline = 4e6 / 1e11
    zoo = pd.DataFrame(
        [
            {**base, "op": "aten.cat", "family": "memory", "bytes": 4e6, "rows": 0.0, "sized": False}
            | {"measured": 2 * roofline, "faults": 100.0, "fault_s": roofline},
            {**base, "op": "aten.add", "family": "elementwise", "bytes": 4e6, "rows": 0.0, "sized": False}
            | {"measured": 4 * roofline, "faults": 0.0, "fault_s": 0.0},
        ]
    )
    with_faults, _ = zoo_fit(zoo, machine, ComputeOptions(overhead=False))
    apart, _ = zoo_fit(zoo, machine, ComputeOptions(overhead=False, zoo_faults_apart=True))
    assert with_faults["memory/forward"] == pytest.approx(0.5)
    assert apart["memory/forward"] == pytest.approx(1.0)
    assert with_faults["elementwise/forward"] == apart["elementwise/forward"] == pytest.approx(0.25)


def test_host_costs_per_call_solve_the_layers_issue_times() -> None:
    """Issue times made from known seconds per call (elementwise 5 us, convolution 40 us, a view 2 us
    forward; backward 9 and 70 us): the fit gives them back; a phase lost in noise (0 s) is left out."""
    from dnnperf.perfmodel.calibrate import fit_host_costs

    truth = {
        "elementwise/forward": 5e-6,
        "convolution/forward": 40e-6,
        "free/forward": 2e-6,
        "elementwise/backward": 9e-6,
        "convolution/backward": 70e-6,
    }
    layers = [  # (layer, phase, {family: calls})
        (0, "forward", {"convolution": 7}),
        (1, "forward", {"convolution": 7, "elementwise": 14}),
        (2, "forward", {"elementwise": 7, "free": 7}),
        (3, "forward", {"elementwise": 21}),
        (0, "backward", {"convolution": 7, "elementwise": 14}),
        (3, "backward", {"elementwise": 21}),
    ]
    rows = [
        (layer, phase, family, calls, sum(truth[f"{f}/{phase}"] * n for f, n in found.items()))
        for layer, phase, found in layers
        for family, calls in found.items()
    ]
    rows.append((4, "backward", "convolution", 7, 0.0))
    frame = pd.DataFrame(rows, columns=["layer", "phase", "family", "calls", "issue_s"])
    assert fit_host_costs(frame) == pytest.approx(truth, rel=1e-9)


def test_a_family_the_layers_never_run_apart_from_another_is_not_priced() -> None:
    """A recurrent layer's forward runs rnn and memory operators together in every layer: the fit
    cannot split their seconds and prices neither; a layer of the memory operator alone determines
    both (memory 10 us a call, rnn 300 us)."""
    from dnnperf.perfmodel.calibrate import fit_host_costs, identified

    mixed = [(0, "forward", "rnn", 7, 7 * 300e-6 + 14 * 10e-6), (0, "forward", "memory", 14, 0.0)]
    mixed += [(1, "forward", "rnn", 7, 7 * 300e-6 + 21 * 10e-6), (1, "forward", "memory", 21, 0.0)]
    columns = ["layer", "phase", "family", "calls", "issue_s"]
    frame = pd.DataFrame(mixed, columns=columns)
    frame["issue_s"] = frame.groupby("layer")["issue_s"].transform("max")
    assert identified(frame) == set() and fit_host_costs(frame) == {}
    alone = pd.DataFrame([(2, "forward", "memory", 7, 70e-6)], columns=columns)
    both = pd.concat([frame, alone], ignore_index=True)
    assert identified(both) == {"memory/forward", "rnn/forward"}
    assert fit_host_costs(both) == pytest.approx({"memory/forward": 10e-6, "rnn/forward": 300e-6})


def test_a_gpus_host_cost_per_call_is_what_a_family_adds_to_the_overhead() -> None:
    """A kernel family is charged its seconds per call beyond the overhead every kernel call pays
    (never below zero); a view, which pays no overhead, its own seconds."""
    from dnnperf.perfmodel.calibrate import host_call_costs

    per_call = {"convolution/forward": 40e-6, "elementwise/forward": 4e-6, "free/forward": 2e-6}
    assert host_call_costs(per_call, reference_s=5e-6) == pytest.approx(
        {"convolution/forward": 35e-6, "elementwise/forward": 0.0, "free/forward": 2e-6}
    )


def test_a_replayed_kernel_is_not_charged_a_kernels_floor_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from dnnperf.perfmodel import compute

    ops = pd.DataFrame(
        {
            "phase": ["forward", "forward"],
            "module": ["a", "b"],
            "op": ["aten.convolution", "aten.relu"],
            "family": ["convolution", "elementwise"],
            "dtype": ["float32"] * 2,
            "flops": [0.0, 0.0],
            "bytes": [0.0, 0.0],
            "calls": [1.0, 1.0],
        }
    )
    graph = StepGraph("toy", 1, ops, 0, {}, 0, 0, 0)
    machine = toy_machine(dispatch_s=0.0, asynchronous=True, kernel_s=5e-6)
    times = ops.assign(compute_s=[100e-6, 10e-6], overhead_s=[0.0, 0.0], replayed=[True, False])
    step = compute.queued_step(graph, machine, times, ComputeOptions())
    assert step.total_s == pytest.approx(100e-6 + 10e-6 + 5e-6)  # the floor on the roofline row only


def test_a_gpus_dispatch_gives_back_the_microbenchmarks_own_views(monkeypatch: pytest.MonkeyPatch) -> None:
    from dnnperf.perfmodel import calibrate

    monkeypatch.setattr(calibrate, "step_calls", lambda device: (100, 50))  # half a view per kernel call
    views = {"free/forward": 2e-6, "free/backward": 4e-6, "convolution/forward": 30e-6}
    assert calibrate.dispatch_net_of_views(18e-6, views, "cpu") == pytest.approx(18e-6 - 0.5 * 3e-6)
    assert calibrate.dispatch_net_of_views(18e-6, {}, "cpu") == 18e-6


def test_a_what_if_keeps_the_devices_operator_stream_but_replays_nothing() -> None:
    gpu = toy_machine(replay_device="cuda:0", stream_device="cuda:0", asynchronous=True)
    for axis, value in (("tflops", 10.0), ("memory_gbs", 500.0)):
        changed = gpu.with_axis(axis, value)
        assert changed.replay_device == "" and changed.stream_device == "cuda:0" and changed.asynchronous


def test_the_zoo_keeps_each_layers_fastest_pass_so_a_slow_spell_moves_nothing() -> None:
    """Layers whose timed rows are known: a slow spell (3x every time measured) over the whole first
    pass, and another over the last layer's second pass, leave what the passes keep equal to the rows
    of a quiet host, layer by layer and in order."""
    from dnnperf.perfmodel.calibrate import fastest_passes

    layers = [(object(), (i + 1, 4)) for i in range(4)]
    quiet = {shape: pd.DataFrame({"op": ["aten.mm"], "measured": [1e-3 * shape[0]]}) for _, shape in layers}
    calls: list[tuple[int, ...]] = []

    def slow_at_times(layer: object, shape: tuple[int, ...]) -> pd.DataFrame:
        calls.append(shape)
        slow = len(calls) <= len(layers) or (len(calls) == 2 * len(layers) and shape == (4, 4))
        return quiet[shape].assign(measured=quiet[shape]["measured"] * (3.0 if slow else 1.0))

    kept = fastest_passes(layers, slow_at_times, passes=3)
    assert calls == [shape for _ in range(3) for _, shape in layers]  # interleaved: pass after pass
    assert [frame["measured"].tolist() for frame in kept] == [
        quiet[s]["measured"].tolist() for _, s in layers
    ]
    # One pass keeps whatever it measured: the slow spell stays.
    calls.clear()
    assert fastest_passes(layers, slow_at_times, passes=1)[0]["measured"].tolist() == [3e-3]


def test_inner_calls_follow_the_batch_and_an_older_description_has_none() -> None:
    def graph(batch: int, inner: float) -> StepGraph:
        ops = pd.DataFrame(
            {"phase": ["forward"], "module": ["rnn"], "op": ["aten.add_"], "family": ["elementwise"]}
        ).assign(
            dtype="float32", flops=0.0, bytes=0.0, calls=2 * inner, inner_calls=inner, zeros=0.0, rows=0.0
        )
        return StepGraph("toy", batch, ops, 0, {}, 0, 0, 0)

    # 12 inner calls at batch 2, 20 at 4 (a loop over a sequence whose length follows the batch): 16 at 3.
    assert graph(2, 12.0).at_batch(graph(4, 20.0), 3).ops["inner_calls"].tolist() == [16.0]
    document = graph(2, 12.0).to_dict()
    del document["ops"]["inner_calls"]
    assert StepGraph.from_dict(document).ops["inner_calls"].tolist() == [0.0]


def test_each_optimizer_step_pays_the_machines_fixed_cost_a_step_in_its_update() -> None:
    """A step with one update (a supervised step described on the CPU) and one with three (WGAN-GP's
    critic twice and its generator once): Machine.update_step_s once per optimizer step, in the update
    phase and the overhead; nothing without overhead or an update."""
    import torch
    from torch import nn

    from dnnperf.perfmodel.graph import describe_model

    graph = describe_model(nn.Linear(8, 8), torch.randn(4, 8), count_faults=False)
    assert graph.update_steps == 1
    plain = preset("seed002")
    fixed = dataclasses.replace(plain, update_step_s=1e-3)
    before, after = step_time(graph, plain), step_time(graph, fixed)
    assert after.update_s - before.update_s == pytest.approx(1e-3)
    assert after.overhead_s - before.overhead_s == pytest.approx(1e-3)
    assert after.forward_s == before.forward_s and after.backward_s == before.backward_s
    no_overhead = ComputeOptions(overhead=False)
    assert step_time(graph, fixed, no_overhead).update_s == step_time(graph, plain, no_overhead).update_s
    no_update = dataclasses.replace(graph, ops=graph.ops[graph.ops["phase"] != "update"])
    assert no_update.update_steps == 0
    assert step_time(no_update, fixed).update_s == 0.0


def test_a_wgan_step_takes_one_optimizer_step_a_cycle() -> None:
    from dnnperf.perfmodel.predict import workload_graph

    graph = workload_graph("wgan_gp", "tiny", 2)
    cycles = {s.cycle for s in graph.memory_walk}
    assert graph.update_steps == len(cycles) > 1


def test_the_models_update_fit_leaves_out_the_sets_of_a_few_small_tensors() -> None:
    from dnnperf.perfmodel.calibrate import UpdateSamples

    samples = UpdateSamples([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [False, True, False])
    assert samples.fitted(step_sets=False) == ([1.0, 3.0], [4.0, 6.0], [7.0, 9.0])
    assert samples.fitted(step_sets=True) == ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0])


def test_the_memory_family_fitted_on_the_zoos_copies_too_where_asked() -> None:
    """A recurrent layer's stack that runs at a tenth of the bandwidth curve and a copy of the sized
    zoo (``sized``) at half of it: with ComputeOptions.copies_calibrated the copy's operator has its
    own efficiency, 0.5, and the family's is their sums' ratio; otherwise the copy plays no part (the
    stack's 0.1, exactly). Other families' sized rows never enter it."""
    from dnnperf.perfmodel.calibrate import zoo_fit
    from dnnperf.perfmodel.machine import Curve

    machine = toy_machine(bandwidth_curve=Curve((4e5, 4e7), (4e11, 1e11)), memory_bandwidth=1e11)
    curve = machine.bandwidth_curve
    base = {"phase": "forward", "module": "m", "dtype": "float32", "kind": "", "flops": 0.0, "calls": 1.0}
    base["rows"] = 0.0
    stack = {**base, "op": "aten.stack", "family": "memory", "bytes": 1e6, "sized": False}
    pad = {**base, "op": "aten.constant_pad_nd", "family": "memory", "bytes": 4e6, "sized": True}
    add = {**base, "op": "aten.add", "family": "elementwise", "bytes": 4e6}
    zoo = pd.DataFrame(
        [
            {**stack, "measured": 10 * 1e6 / curve(1e6)},
            {**pad, "measured": 2 * 4e6 / curve(4e6)},
            {**add, "measured": 2 * 4e6 / curve(4e6), "sized": False},
            {**add, "measured": 9.0, "sized": True},  # never used: not a copy
        ]
    )
    plain, _ = zoo_fit(zoo, machine)
    assert plain["memory/forward"] == pytest.approx(0.1)
    assert "memory/forward/aten.constant_pad_nd" not in plain
    copies, _ = zoo_fit(zoo, machine, ComputeOptions(copies_calibrated=True))
    assert copies["memory/forward/aten.constant_pad_nd"] == pytest.approx(0.5)
    assert copies["memory/forward/aten.stack"] == pytest.approx(0.1)
    both = (1e6 / curve(1e6) + 4e6 / curve(4e6)) / (10 * 1e6 / curve(1e6) + 2 * 4e6 / curve(4e6))
    assert copies["memory/forward"] == pytest.approx(both)
    assert copies["elementwise/forward"] == plain["elementwise/forward"] == pytest.approx(0.5)
