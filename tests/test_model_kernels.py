"""Replayed kernels (perfmodel/kernels.py): what the description keeps, what a replay measures, and how the
model uses it, against injected delays and the description's own counts."""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from dnnperf.perfmodel import kernels
from dnnperf.perfmodel.compute import ComputeOptions, op_times, other_replays
from dnnperf.perfmodel.graph import StepGraph, describe_model
from dnnperf.perfmodel.machine import Curve, Machine
from test_model_formulas import toy_machine

SLEEP_S = 0.004
#: What each of ``_sleepy``'s sleeps really took: on a loaded machine a 4 ms sleep can wake
#: milliseconds late, so the nominal 4 ms is no truth to hold a replay to; the log is.
_slept: list[float] = []
#: What a replay adds to its sleep: the custom operator's dispatch and the clone of a few floats,
#: tens of microseconds. The bound is two orders above that: the sleeps' own lateness is in the log,
#: so only a preemption inside those microseconds of most of the calls could reach it.
CALL_S = 0.002


@torch.library.custom_op("dnnperf_test::sleepy", mutates_args=())
def _sleepy(x: torch.Tensor) -> torch.Tensor:
    """Takes a known 4 ms, whatever its operand (logged in ``_slept``)."""
    started = time.perf_counter()
    time.sleep(SLEEP_S)
    _slept.append(time.perf_counter() - started)
    return x.clone()


def _replays_sleep() -> float:
    """The median of the sleeps of the last replay's timed calls (its first call is untimed)."""
    assert len(_slept) == kernels.REPEATS + 1, "the replay made another number of calls"
    return statistics.median(_slept[1:])


def _machine(**changes: object) -> Machine:
    """test_model_formulas' toy machine, with a convolution's fixed cost per call."""
    return toy_machine(call_s={"convolution/forward": 1e-3}, **changes)


def test_a_replay_measures_an_injected_delay() -> None:
    call = kernels.signature("dnnperf_test.sleepy", [torch.randn(8, 8)])
    assert call is not None
    _slept.clear()
    seconds = kernels.time_call(call, "cpu").seconds
    # Each timed call is its sleep and a little more, so their median is the sleeps' and a little more.
    assert _replays_sleep() <= seconds < _replays_sleep() + CALL_S
    assert math.isnan(kernels.time_call({"op": "aten.no_such_operator", "args": []}).seconds)


def test_the_description_keeps_each_distinct_convolution_with_its_rows() -> None:
    """Two calls of one convolution on the same shapes and one on another shape: two kernels, and
    their counts add up to the description's own call counts, row by row."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            small = nn.functional.avg_pool2d(x, 2)
            return self.conv(x).mean() + self.conv(x * 2).mean() + self.conv(small).mean()

    graph = describe_model(Twice(), torch.randn(2, 4, 8, 8), name="twice", count_faults=False)
    forward = [k for k in graph.kernels if k["call"]["op"] == "aten.convolution"]
    assert sorted(row[3] for k in forward for row in k["rows"]) == [1, 2]
    assert [k["call"]["args"][0]["shape"] for k in forward] == [[2, 4, 8, 8], [2, 4, 4, 4]]
    counted: dict[tuple[str, str, str], int] = {}
    for kernel in graph.kernels:
        for module, phase, op, count in kernel["rows"] if "family" not in kernel else []:
            counted[module, phase, op] = counted.get((module, phase, op), 0) + count
    conv = graph.ops[graph.ops["family"] == "convolution"]
    assert counted == {
        (m, p, o): int(c) for m, p, o, c in zip(conv.module, conv.phase, conv.op, conv.calls, strict=True)
    }
    assert StepGraph.from_dict(graph.to_dict()).kernels == graph.kernels  # kept with the description


def _sleepy_graph(counted: int) -> StepGraph:
    """One convolution row of 2 calls, ``counted`` of which the description kept as a sleepy kernel."""
    ops = pd.DataFrame(
        {
            "phase": ["forward"],
            "module": ["m"],
            "op": ["aten.convolution"],
            "family": ["convolution"],
            "dtype": ["float32"],
            "flops": [2e6],
            "bytes": [0.0],
            "calls": [2.0],
            "zeros": [0.0],
        }
    )
    call = kernels.signature("dnnperf_test.sleepy", [torch.randn(4)])
    graph = StepGraph("sleepy", 1, ops, 0, {}, 0, 0, 0)
    return dataclasses.replace(
        graph, kernels=[{"call": call, "rows": [["m", "forward", "aten.convolution", counted]]}]
    )


def test_a_row_replayed_on_this_host_takes_the_replays_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))  # measured now, not taken from a cache
    here = _machine(replay_device="cpu")
    roofline = 2e6 / 1e12 + 2 * (1e-6 + 1e-3)  # FLOPs at peak, dispatch and the family's fixed cost
    assert op_times(_sleepy_graph(2), _machine())["seconds"].iloc[0] == pytest.approx(roofline)
    _slept.clear()
    replayed = op_times(_sleepy_graph(2), here)["seconds"].iloc[0]
    sleep = _replays_sleep()
    assert 2 * sleep <= replayed - 2 * 1e-6 < 2 * (sleep + CALL_S)  # two sleeps and dispatch, no fixed cost
    # Not every call kept (a shapes-only description, say): the roofline stands.
    assert op_times(_sleepy_graph(1), here)["seconds"].iloc[0] == pytest.approx(roofline)
    off = op_times(_sleepy_graph(2), here, ComputeOptions(replay_kernels=False))
    assert off["seconds"].iloc[0] == pytest.approx(roofline)
    # A what-if on speed is no longer this host.
    assert (
        here.with_axis("tflops", 2).replay_device == "" and here.with_axis("nodes", 2).replay_device == "cpu"
    )
    # Measured once: the second prediction reads the replay from the cache on disk.
    kernels.forget_replays()
    monkeypatch.setattr(kernels, "time_call", lambda *a, **k: pytest.fail("replayed again"))
    assert op_times(_sleepy_graph(2), here)["seconds"].iloc[0] == pytest.approx(replayed)
    # Re-measured where asked (validate's rounds): once within, not from the disk cache.
    timed: list[kernels.Replay] = []
    slower = kernels.Replay(0.5, 0.0)
    monkeypatch.setattr(kernels, "time_call", lambda *a, **k: timed.append(slower) or slower)
    with kernels.remeasured():
        first = op_times(_sleepy_graph(2), here)["seconds"].iloc[0]
        assert op_times(_sleepy_graph(2), here)["seconds"].iloc[0] == first == pytest.approx(2 * 0.5 + 2e-6)
    assert len(timed) == 1


class _Mover(nn.Module):
    """Data movement (a pad, a concatenation, an unfold) around a linear layer, and a call of the sleepy
    operator, which has no formula, on a side path."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)  # (2, 4, 8, 8)
        padded = nn.functional.pad(h, (1, 1, 1, 1))
        patches = nn.functional.unfold(padded, 3)
        joined = torch.cat([patches, patches.transpose(1, 2).contiguous().transpose(1, 2)], 1)
        side = torch.ops.dnnperf_test.sleepy(x.detach())
        return joined.mean() + 0 * side.sum()


def test_the_description_keeps_data_movement_of_forward_and_backward_whole() -> None:
    """Every call of the memory family and of operators without a formula in forward and backward is
    kept, marked as data movement: row by row, the kept counts are the description's own."""
    torch.manual_seed(0)
    model = _Mover()
    graph = describe_model(
        model,
        torch.randn(2, 4, 8, 8),
        name="mover",
        count_faults=False,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    )
    moved = [k for k in graph.kernels if k.get("family") in kernels.DATA_MOVEMENT_FAMILIES]
    ops = {k["call"]["op"] for k in moved}
    assert {"aten.constant_pad_nd", "aten.im2col", "aten.col2im", "aten.cat", "dnnperf_test.sleepy"} <= ops
    counted: dict[tuple[str, str, str], int] = {}
    for kernel in moved:
        for module, phase, op, count in kernel["rows"]:
            counted[module, phase, op] = counted.get((module, phase, op), 0) + count
    assert {phase for _, phase, _ in counted} == {"forward", "backward"}
    rows = graph.ops[graph.ops["family"].isin(kernels.DATA_MOVEMENT_FAMILIES)]
    expected = {
        (m, p, o): int(c)
        for m, p, o, c in zip(rows.module, rows.phase, rows.op, rows.calls, strict=True)
        if p in kernels.KEPT_PHASES
    }
    assert counted == expected
    # A clone's memory format is kept, and replays.
    clone = next(k["call"] for k in moved if k["call"]["op"] == "aten.clone")
    assert clone.get("kwargs", {}).get("memory_format") == {"torch": "contiguous_format"}
    assert math.isfinite(kernels.time_call(clone, "cpu").seconds)
    # A concatenation's list of tensors is kept as a list of operands, and replays.
    cat = next(k["call"] for k in moved if k["call"]["op"] == "aten.cat")
    assert isinstance(cat["args"][0], list) and len(cat["args"][0]) == 2
    assert math.isfinite(kernels.time_call(cat, "cpu").seconds)
    assert StepGraph.from_dict(graph.to_dict()).kernels == graph.kernels


def test_a_calls_infinite_fill_is_plain_data_and_replays_as_such() -> None:
    """A causal mask's -inf fill goes through JSON (which has no infinities) and replays with -inf."""
    call = kernels.signature("aten.fill", [torch.zeros(3), -math.inf])
    assert call is not None and json.loads(json.dumps(call, allow_nan=False)) == call
    assert kernels.operands(call, torch.device("cpu"))[1] == -math.inf
    assert math.isfinite(kernels.time_call(call, "cpu").seconds)


def test_data_movement_takes_its_replays_time_only_where_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sleepy operator (no formula: family "uncovered"), described in a forward, priced at its
    replay (its logged sleeps) with ``replay_data_movement`` and at its bytes without."""
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    graph = describe_model(_Mover(), torch.randn(2, 4, 8, 8), name="mover", count_faults=False)
    row = (graph.ops["op"] == "dnnperf_test.sleepy").to_numpy()
    assert graph.ops.loc[row, "family"].tolist() == ["uncovered"]
    here = _machine(replay_device="cpu")
    by_bytes = op_times(graph, here)["seconds"].to_numpy()[row][0]
    assert by_bytes < SLEEP_S / 10  # 256 floats at the toy machine's bandwidth
    _slept.clear()
    replayed = op_times(graph, here, ComputeOptions(replay_data_movement=True))["seconds"].to_numpy()[row][0]
    sleep = _replays_sleep()
    floor = kernels.replay_floor("cpu")  # the replay's own cost a call, charged apart as dispatch
    assert 0 < floor < CALL_S
    assert sleep - floor <= replayed - here.dispatch_s < sleep + CALL_S
    # Not on a machine that is not this host's device: no replay to stand on.
    elsewhere = op_times(graph, _machine(), ComputeOptions(replay_data_movement=True))
    assert elsewhere["seconds"].to_numpy()[row][0] == pytest.approx(by_bytes)


def test_an_operator_the_zoo_never_timed_takes_its_replay_where_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With ``replay_untimed``, the sleepy operator is replayed (its logged sleeps) on a machine whose
    zoo did not time it, and priced by its family where the zoo timed it or the zoo is not known; the
    linear layer's product (timed by the zoo, and one of the products' own replays) is left alone."""
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    graph = describe_model(_Mover(), torch.randn(2, 4, 8, 8), name="mover", count_faults=False)
    sleepy = (graph.ops["op"] == "dnnperf_test.sleepy").to_numpy()
    others = ~sleepy & ~graph.ops["family"].isin(kernels.DATA_MOVEMENT_FAMILIES).to_numpy()
    asked = ComputeOptions(replay_untimed=True)
    unknown = op_times(graph, _machine(replay_device="cpu"), asked)["seconds"].to_numpy()
    every_op = frozenset(graph.ops["op"])
    timed = op_times(graph, _machine(replay_device="cpu", zoo_ops=every_op), asked)["seconds"].to_numpy()
    assert unknown == pytest.approx(timed)  # an unknown zoo: nothing replayed
    assert timed[sleepy][0] < SLEEP_S / 10
    zoo = frozenset(every_op - {"dnnperf_test.sleepy", "aten.constant_pad_nd", "aten.im2col"})
    _slept.clear()
    replayed = op_times(graph, _machine(replay_device="cpu", zoo_ops=zoo), asked)["seconds"].to_numpy()
    sleep = _replays_sleep()
    assert sleep - kernels.replay_floor("cpu") <= replayed[sleepy][0] - 1e-6 < sleep + CALL_S
    assert replayed[others] == pytest.approx(timed[others])  # the timed operators keep their price


class _Complex(nn.Module):
    """A linear layer, and the sleepy operator called on a complex tensor made from its output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        side = torch.ops.dnnperf_test.sleepy(torch.complex(h, h).detach())
        return h.mean() + 0 * side.real.sum()


def test_the_zoos_operators_in_another_dtype_take_their_replay_where_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A zoo that timed every operator the step runs, in float32: the sleepy operator's complex call
    is priced by its family, and with ``replay_other_dtypes`` at its replay (its logged sleeps); the
    float32 linear layer keeps its price either way."""
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    graph = describe_model(_Complex(), torch.randn(4, 8), name="complex", count_faults=False)
    sleepy = (graph.ops["op"] == "dnnperf_test.sleepy").to_numpy()
    kept = [k["call"] for k in graph.kernels if k["call"]["op"] == "dnnperf_test.sleepy"]
    assert [kernels.floating_dtypes(call) for call in kept] == [{"complex64"}]
    linear = (graph.ops["module"] == "linear").to_numpy()
    assert linear.any()
    machine = _machine(replay_device="cpu", zoo_ops=frozenset(graph.ops["op"]))
    by_family = op_times(graph, machine, ComputeOptions(replay_untimed=True))["seconds"].to_numpy()
    assert by_family[sleepy][0] < SLEEP_S / 10
    _slept.clear()
    asked = ComputeOptions(replay_untimed=True, replay_other_dtypes=True)
    replayed = op_times(graph, machine, asked)["seconds"].to_numpy()
    sleep = _replays_sleep()
    assert sleep - kernels.replay_floor("cpu") <= replayed[sleepy][0] - 1e-6 < sleep + CALL_S
    assert replayed[linear] == pytest.approx(by_family[linear])


def test_a_row_is_replayed_whole_where_some_of_its_calls_are_chosen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A row of two exps, one complex and one float32: with ``replay_other_dtypes`` the complex call
    is chosen and the float one replayed beside it, so the row takes both replays (2 x 1 ms); by
    operator alone neither is, and the row keeps its family's price (no replayed row)."""
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "time_call", lambda *a, **k: kernels.Replay(1e-3, 0))
    monkeypatch.setattr(kernels, "replay_floor", lambda device: 0.0)
    kernels.forget_replays()
    machine = _machine(replay_device="cpu", zoo_ops=frozenset({"aten.exp"}))
    calls = [
        kernels.signature("aten.exp", [torch.zeros(4, dtype=d)]) for d in (torch.complex64, torch.float32)
    ]
    kept = [{"call": c, "rows": [["m", "forward", "aten.exp", 1]], "family": "elementwise"} for c in calls]
    rows = {("m", "forward", "aten.exp"): 2}
    both = other_replays(machine, ComputeOptions(replay_untimed=True, replay_other_dtypes=True))
    assert kernels.replayed_rows(kept, rows, "cpu", others=both) == {("m", "forward", "aten.exp"): 2e-3}
    by_op = other_replays(machine, ComputeOptions(replay_untimed=True))
    assert kernels.replayed_rows(kept, rows, "cpu", others=by_op) == {}


def test_which_calls_count_as_untimed() -> None:
    """By operator and dtype: a zoo that timed exp and mm in float32 leaves their float32 calls to its
    prices, and their complex and double calls, products included, to replays; an operator it never
    timed is replayed in any dtype; without ``replay_other_dtypes``, by operator alone."""
    machine = _machine(replay_device="cpu", zoo_ops=frozenset({"aten.exp", "aten.mm"}))

    def call(op: str, dtype: str, operands: int = 1) -> dict[str, object]:
        found = kernels.signature(op, [torch.zeros(4, 4, dtype=getattr(torch, dtype))] * operands)
        assert found is not None
        return found

    both = other_replays(machine, ComputeOptions(replay_untimed=True, replay_other_dtypes=True))
    by_op = other_replays(machine, ComputeOptions(replay_untimed=True))
    assert both is not None and by_op is not None
    cases = {
        ("aten.exp", "float32"): (False, False),
        ("aten.exp", "complex64"): (True, False),
        ("aten.exp", "float64"): (True, False),
        ("aten.cumsum", "float32"): (True, True),
        ("aten.mm", "float32"): (False, False),
        ("aten.mm", "complex64"): (True, False),
    }
    for (op, dtype), expected in cases.items():
        family = "matmul" if op == "aten.mm" else "elementwise"
        made = call(op, dtype, 2 if op == "aten.mm" else 1)
        assert (both(made, family), by_op(made, family)) == expected, (op, dtype)
    assert kernels.floating_dtypes(call("aten.mm", "complex64", 2)) == {"complex64"}
    assert other_replays(machine, ComputeOptions(replay_untimed=False, replay_other_dtypes=True)) is None


def test_calls_that_take_indices_or_masks_are_never_replayed_for_their_family(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A gather's indices and a mask choose a kernel's work, and a replay's operands are zeros and
    all-true: of an index_select, a masked fill and a flip kept for their family, only the flip is
    timed."""
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    kernels.forget_replays()
    x = torch.randn(8, 4)
    calls = {
        "index": kernels.signature("aten.index_select", [x, 0, torch.tensor([3, 1])]),
        "mask": kernels.signature("aten.masked_fill", [x, x > 0, 0.0]),
        "flip": kernels.signature("aten.flip", [x, [0]]),
    }
    assert [kernels.reads_values(c) for c in calls.values()] == [True, True, False]
    timed: list[str] = []
    monkeypatch.setattr(
        kernels, "time_call", lambda call, *a, **k: timed.append(call["op"]) or kernels.Replay(1e-3, 0)
    )
    kept = [{"call": c, "rows": [["m", "forward", c["op"], 1]], "family": "memory"} for c in calls.values()]
    rows = {("m", "forward", c["op"]): 1 for c in calls.values()}
    replayed = kernels.replayed_rows(kept, rows, "cpu", others=lambda op, family: True)
    assert set(replayed) == {("m", "forward", "aten.flip")}
    assert "aten.index_select" not in timed and "aten.masked_fill" not in timed and "aten.flip" in timed


@torch.library.custom_op("dnnperf_test::fresh", mutates_args=())
def _fresh(x: torch.Tensor) -> torch.Tensor:
    """Writes a fresh 64 MiB block: a private anonymous mapping of its own each call, as glibc maps a
    block above its mmap threshold. (A torch allocation of that size took no fault in one full run:
    glibc served it from free memory already faulted at the top of its heap.)"""
    block = mmap.mmap(-1, 2**26, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    ones = np.frombuffer(block, dtype=np.float32)
    ones.fill(1.0)
    out = x + torch.from_numpy(ones[: x.numel()].copy()).view_as(x)
    del ones
    block.close()
    return out


def test_a_replays_page_faults_are_counted_and_left_to_the_steps_own_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    call = kernels.signature("dnnperf_test.fresh", [torch.randn(4)])
    replay = kernels.time_call(call, "cpu")
    pages = 2**26 // 4096
    assert pages / 512 <= replay.faults <= pages + 64  # 4 KiB pages, or 2 MiB ones where THP maps them
    kernels.forget_replays()
    monkeypatch.setattr(kernels, "time_call", lambda *a, **k: replay)
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    kept = [{"call": call, "rows": [["m", "forward", "aten.convolution", 2]]}]
    graph = dataclasses.replace(_sleepy_graph(2), kernels=kept)
    fault_s = replay.seconds / replay.faults / 2  # the faults are half the replay's time
    seconds = op_times(graph, _machine(replay_device="cpu", page_fault_s=fault_s))["seconds"].iloc[0]
    assert seconds == pytest.approx(2 * replay.seconds / 2 + 2 * 1e-6)


class _Fresh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.dnnperf_test.fresh(x))


def test_a_timed_counter_counts_each_operators_page_faults() -> None:
    """The operator that writes a fresh 64 MiB mapping takes its pages' faults in a timed count; the
    relu after it on four floats takes next to none; an untimed count keeps none."""
    from dnnperf.probes.opcount import OpCounter

    model, x = _Fresh(), torch.randn(4)
    with OpCounter(model, timed=True) as counter:
        model(x)
    rows = {r.name: r for r in counter.table()}
    pages = 2**26 // 4096
    assert pages / 512 <= (rows["dnnperf_test.fresh"].faults or 0) <= pages + 64
    assert (rows["aten.relu"].faults or 0) <= 8
    with OpCounter(model) as untimed:
        model(x)
    assert {r.faults for r in untimed.table()} == {None}


class _TwoConvs(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, width, 3, padding=1)
        self.second = nn.Conv2d(width, 6, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def test_a_split_convolution_is_described_as_a_rank_runs_it() -> None:
    """The calls tensor parallelism makes of a convolution split by output channel are those a layer
    of half the output channels makes: the full model's kernels, split, against the kernels the
    description records from running such a layer (forward and backward, bias and all)."""
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    full = describe_model(_TwoConvs(8), x, name="full", count_faults=False)
    half = describe_model(_TwoConvs(4), x, name="half", count_faults=False)  # its first: 4 channels
    split, rows = kernels.split_kernels(full.kernels, {"first"}, 2)
    first = [k["call"] for k in split if k["rows"][0][0] == "first"]
    assert len(first) == 2 and first == [k["call"] for k in half.kernels if k["rows"][0][0] == "first"]
    assert rows == {
        ("first", "forward", "aten.convolution"),
        ("first", "backward", "aten.convolution_backward"),
    }
    unsplit = [k for k in split if k["rows"][0][0] == "second"]
    assert unsplit == [k for k in full.kernels if k["rows"][0][0] == "second"]
    grouped = {
        "op": "aten.convolution",
        "args": [
            None,
            {"shape": [4, 1, 3, 3], "stride": [9, 9, 3, 1]},
            None,
            [1, 1],
            [0, 0],
            [1, 1],
            False,
            [0, 0],
            4,
        ],
    }
    assert kernels.split_output_channels(grouped, 2) is None  # grouped: not split this way


def test_tensor_parallel_takes_a_split_convolutions_replay_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this host, a split convolution's time is its replay at the split shapes (a library's time
    need not halve with the channels): a fake replay of 1 ms + 0.1 ms per output channel gives the
    split rows 1 + 0.1 * width / 2 ms a call, where halving the whole layer's would give half of
    1 + 0.1 * width."""
    from dnnperf.perfmodel.predict import predict

    def fake_replays(calls, device):
        def seconds(call):
            where = kernels.CHANNEL_ARGS[call["op"]]["weight"]
            return 1e-3 + 1e-4 * call["args"][where]["shape"][0]

        return [kernels.Replay(seconds(c), 0.0) for c in calls]

    monkeypatch.setattr(kernels, "replays", fake_replays)
    torch.manual_seed(0)
    graph = describe_model(_TwoConvs(8), torch.randn(2, 3, 8, 8), name="two", count_faults=False)
    here = dataclasses.replace(_machine(replay_device="cpu"), devices_per_node=2)
    times = op_times(graph, here)
    tp = predict(graph, here, 2, "tp")
    conv = times["family"] == "convolution"
    assert times.loc[conv, "replayed"].all()
    # Each rank splits both convolutions (8 and 6 output channels): 4 and 3 a rank.
    replayed = {"first": 1e-3 + 1e-4 * 4, "second": 1e-3 + 1e-4 * 3}
    expected = (
        sum(replayed[m] * c for m, c in zip(times.loc[conv, "module"], times.loc[conv, "calls"], strict=True))
        + times.loc[conv, "overhead_s"].sum()
        + times.loc[~conv, "seconds"].sum()
        + tp.detail["split_overhead_s"]  # the split's copies (test_model_predict checks them)
    )
    assert tp.compute_s == pytest.approx(expected)
    halved = times.loc[conv, "compute_s"].sum() / 2 + times.loc[conv, "overhead_s"].sum()
    assert tp.compute_s > halved + times.loc[~conv, "seconds"].sum()


def test_an_interpolated_description_takes_its_sources_replays_interpolated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A convolution whose replay takes an affine time in its batch (injected: 2 ms + 1 ms a sample,
    whatever the host): described at 6 and 3 and interpolated to 4, its rows take the replays'
    seconds at 4 exactly (what the exact description at 4 takes from its own replays), and not the
    roofline; off, or for a what-if machine, the roofline as before. Rows replayed in one source only
    keep the roofline."""
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))

    def affine(call: dict, device: str = "cpu") -> kernels.Replay:
        batch = call["args"][0]["shape"][0]
        return kernels.Replay(2e-3 + 1e-3 * batch, 0.0)

    monkeypatch.setattr(kernels, "time_call", affine)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))
    loss_fn = lambda m, b: m(b["x"]).square().mean()  # noqa: E731
    described = {n: describe_model(model, {"x": torch.randn(n, 3, 8, 8)}, loss_fn=loss_fn) for n in (6, 3, 4)}
    between = described[6].at_batch(described[3], 4)
    assert [s["batch"] for s in between.kernels_between] == [6, 3] and between.kernels == []
    here = _machine(replay_device="cpu")

    def convolutions(graph: StepGraph, machine: Machine, **options: bool) -> pd.Series:
        times = op_times(graph, machine, ComputeOptions(**options))
        rows = times[times["op"].isin(kernels.CONVOLUTION_OPS)]
        return rows.set_index(["phase", "op"])["compute_s"]

    exact = convolutions(described[4], here)
    interpolated = convolutions(between, here)
    assert len(exact) >= 2  # forward and backward
    assert interpolated.to_dict() == pytest.approx(exact.to_dict())
    assert exact.min() >= 2e-3 + 4e-3  # the injected replay at 4, not a roofline of microseconds
    off = convolutions(between, here, replays_between=False)
    elsewhere = convolutions(between, _machine())
    assert (off < 1e-3).all() and (elsewhere < 1e-3).all()
    one_source = dataclasses.replace(between, kernels_between=between.kernels_between[:1])
    assert (convolutions(one_source, here) < 1e-3).all()


def test_a_product_s_flops_from_its_signature() -> None:
    """2 x rows x inner x columns, times a bmm's batch; an addmm's bias does not count."""
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert kernels.product_flops(kernels.signature("aten.mm", [a, b])) == 2 * 3 * 5 * 7
    assert kernels.product_flops(kernels.signature("aten.addmm", [torch.randn(7), a, b])) == 2 * 3 * 5 * 7
    batched = kernels.signature("aten.bmm", [torch.randn(4, 3, 5), torch.randn(4, 5, 7)])
    assert kernels.product_flops(batched) == 4 * 2 * 3 * 5 * 7
    assert kernels.product_flops({"op": "aten.mm", "args": [1.0]}) == math.inf


@pytest.mark.parametrize("injected_s", [5e-3, 1e-9])
def test_a_matrix_product_takes_its_replay_only_where_slower_than_the_roofline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, injected_s: float
) -> None:
    """A linear layer's products (addmm forward, mm backward) replayed at an injected time: 5 ms a call
    (thousands of times the toy roofline of a 16x16 product) is taken as the rows' seconds; 1 ns a call
    (faster than the roofline) leaves the roofline. So does a machine whose matmul curve starts at the
    smallest product's FLOPs, a GPU machine, and the option off (the default)."""
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "time_call", lambda call, device="cpu": kernels.Replay(injected_s, 0.0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    loss_fn = lambda m, b: m(b["x"]).square().mean()  # noqa: E731
    graph = describe_model(model, {"x": torch.randn(4, 16)}, loss_fn=loss_fn, count_faults=False)
    assert {k["call"]["op"] for k in graph.kernels} >= {"aten.addmm", "aten.mm"}
    flops = [kernels.product_flops(k["call"]) for k in graph.kernels if "family" not in k]
    assert max(flops) == 2 * 4 * 16 * 16 and min(flops) == 2 * 4 * 16 * 1

    def products(starts_at: float, replay_device: str = "cpu", **options: bool) -> pd.DataFrame:
        curve = Curve(sizes=(starts_at, 1e12), rates=(1e9, 1e9))
        machine = _machine(replay_device=replay_device, compute_curves={"matmul": curve})
        times = op_times(graph, machine, ComputeOptions(**{"replay_matrix_products": True, **options}))
        return times[times["op"].isin(kernels.MATRIX_OPS)]

    roofline = products(1e6, replay_kernels=False)
    assert len(roofline) >= 3 and (roofline["compute_s"] < 1e-4).all()
    replayed = products(1e6)
    if injected_s > 1e-3:
        assert replayed["replayed"].all()
        expected = roofline["calls"].to_numpy(float) * injected_s
        assert replayed["compute_s"].to_numpy() == pytest.approx(expected)
    else:
        assert not replayed["replayed"].any()
        assert replayed["compute_s"].to_numpy() == pytest.approx(roofline["compute_s"].to_numpy())
    for kept in (products(min(flops)), products(1e6, "cuda"), products(1e6, replay_matrix_products=False)):
        assert not kept["replayed"].any()
        assert kept["compute_s"].to_numpy() == pytest.approx(roofline["compute_s"].to_numpy())


class _Attention(nn.Module):
    """Self-attention without dropout, with an additive mask: the CPU's fused attention kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[-2], x.shape[-2])
        q = x * self.scale
        return nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_the_description_keeps_each_attention_call_and_its_replay_runs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph = describe_model(_Attention(), torch.randn(2, 4, 16, 8), name="attention", count_faults=False)
    kept = [k for k in graph.kernels if k["call"]["op"] in kernels.ATTENTION_OPS]
    assert sorted(k["call"]["op"] for k in kept) == sorted(kernels.ATTENTION_OPS)
    # Each kept call as many times as the description counted the attention rows' calls.
    counted = {(m, p, o): c for k in kept for m, p, o, c in k["rows"]}
    attention = graph.ops[graph.ops["op"].isin(kernels.ATTENTION_OPS)]
    assert counted == {
        (m, p, o): int(c)
        for m, p, o, c in zip(attention.module, attention.phase, attention.op, attention.calls, strict=True)
    }
    # The mask, a keyword argument, is kept and rebuilt: every call replays.
    forward = next(k["call"] for k in kept if not k["call"]["op"].endswith("_backward"))
    assert forward["kwargs"]["attn_mask"]["shape"] == [16, 16]
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    for kernel in kept:
        assert kernels.time_call(kernel["call"], "cpu").seconds > 0


def test_a_keyword_argument_that_is_not_plain_data_is_not_replayed() -> None:
    x = torch.randn(3)
    assert kernels.signature("aten.add", [x], {"alpha": 2}) == {
        "op": "aten.add",
        "args": [{"shape": [3], "stride": [1], "dtype": "float32"}],
        "kwargs": {"alpha": 2},
    }
    assert "kwargs" not in kernels.signature("aten.add", [x], {})
    assert kernels.signature("aten.add", [x], {"out": object()}) is None


def _attention_graph() -> StepGraph:
    """One attention row of 3 calls, each kept (its replay is injected: never run)."""
    op = kernels.ATTENTION_OPS[0]
    ops = pd.DataFrame(
        {
            "phase": ["forward"],
            "module": ["m"],
            "op": [op],
            "family": ["attention"],
            "dtype": ["float32"],
            "flops": [3e6],
            "bytes": [0.0],
            "calls": [3.0],
            "zeros": [0.0],
        }
    )
    call = kernels.signature(op, [torch.randn(4)])
    graph = StepGraph("attention", 1, ops, 0, {}, 0, 0, 0)
    return dataclasses.replace(graph, kernels=[{"call": call, "rows": [["m", "forward", op, 3]]}])


def test_attention_rows_take_their_replay_unless_asked_not_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "time_call", lambda *a, **k: kernels.Replay(0.25, 0.0))  # a known 250 ms
    here = _machine(replay_device="cpu")
    roofline = 3e6 / 1e12  # the products' FLOPs at the toy machine's peak
    assert op_times(_attention_graph(), here)["compute_s"].iloc[0] == pytest.approx(3 * 0.25)
    products = ComputeOptions(replay_attention=False)
    assert op_times(_attention_graph(), here, products)["compute_s"].iloc[0] == pytest.approx(roofline)
    # Another machine than this host's CPU prices the row by its FLOPs.
    assert op_times(_attention_graph(), _machine())["compute_s"].iloc[0] == pytest.approx(roofline)
    assert op_times(_attention_graph(), _machine(replay_device="cuda"))["compute_s"].iloc[0] == pytest.approx(
        roofline
    )


def test_an_interpolated_description_prices_attention_by_its_sources_replays(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Attention replayed at an injected 1 ms + 2 ms a sample: described at 6 and 3 and interpolated
    to 4, its rows take the replays' seconds at 4 exactly, as the description at 4 does; asked not to
    replay, they keep their FLOPs' price (microseconds on the toy machine)."""
    kernels.forget_replays()
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        kernels,
        "time_call",
        lambda call, device="cpu": kernels.Replay(1e-3 + 2e-3 * call["args"][0]["shape"][0], 0.0),
    )
    model = _Attention()
    described = {n: describe_model(model, torch.randn(n, 2, 8, 4), count_faults=False) for n in (6, 3, 4)}
    between = described[6].at_batch(described[3], 4)
    assert between.kernels == [] and [s["batch"] for s in between.kernels_between] == [6, 3]
    here = _machine(replay_device="cpu")

    def attention(graph: StepGraph, **options: bool) -> dict:
        times = op_times(graph, here, ComputeOptions(**options))
        return times[times["op"].isin(kernels.ATTENTION_OPS)].set_index("phase")["compute_s"].to_dict()

    exact = attention(described[4])
    assert exact == pytest.approx({"forward": 1e-3 + 8e-3, "backward": 1e-3 + 8e-3})
    assert attention(between) == pytest.approx(exact)
    assert max(attention(between, replay_attention=False).values()) < 1e-4
