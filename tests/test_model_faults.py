"""Page faults in the model: the count against the pages a step maps anew, the charge against the
machine's cost per fault, and the update's bandwidth taken at the whole update's working set."""

from __future__ import annotations

import dataclasses
import json
import mmap
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from dnnperf.perfmodel.compute import ComputeOptions, op_times, step_time
from dnnperf.perfmodel.faults import counting_workload_faults, steady_page_faults
from dnnperf.perfmodel.graph import StepGraph, describe_model
from dnnperf.perfmodel.machine import Curve, preset
from dnnperf.perfmodel.predict import predict

resource = pytest.importorskip("resource")

#: Above glibc's largest dynamic mmap threshold (32 MiB): every such block is mapped when allocated
#: and unmapped when freed, so each step touches all of its pages anew.
BLOCK = 64 << 20


def _largest_folio() -> int:
    """The largest block the kernel may fault in at once into a plain anonymous mapping: a page, or
    a (multi-size) transparent huge page whose size is set to ``always`` (``inherit`` follows the
    top-level setting)."""
    root = Path("/sys/kernel/mm/transparent_hugepage")
    try:
        top = root.joinpath("enabled").read_text()
    except OSError:
        return mmap.PAGESIZE
    largest = (2 << 20) if "[always]" in top else mmap.PAGESIZE
    for size in root.glob("hugepages-*kB"):
        try:
            setting = size.joinpath("enabled").read_text()
        except OSError:
            continue
        if "[always]" in setting or ("[inherit]" in setting and "[always]" in top):
            largest = max(largest, int(size.name.removeprefix("hugepages-").removesuffix("kB")) << 10)
    return largest


def _fewest_faults() -> int:
    """The fewest faults touching a fresh BLOCK can take: one per page or per huge folio."""
    return BLOCK // _largest_folio()


def _map_and_touch() -> None:
    """A step that maps BLOCK anew, writes every page and unmaps it: mapped by the kernel directly,
    so no allocator can hand back pages an earlier test left resident (glibc serves even a 64 MiB
    malloc from a free hole in its heap, without a fault: the cause of a CI failure)."""
    block = mmap.mmap(-1, BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        for offset in range(0, BLOCK, mmap.PAGESIZE):
            block[offset] = 1
    finally:
        block.close()


def test_the_count_is_the_pages_a_step_maps_anew() -> None:
    faults = steady_page_faults(_map_and_touch)
    pages = BLOCK // mmap.PAGESIZE
    assert _fewest_faults() <= faults <= pages * 1.05  # a few more: the interpreter's own pages

    keep = mmap.mmap(-1, BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:

        def reuse() -> None:
            for offset in range(0, BLOCK, mmap.PAGESIZE):
                keep[offset] = 2  # the same pages every time: nothing new to map

        assert steady_page_faults(reuse) < _fewest_faults() * 0.05
    finally:
        keep.close()


def test_the_cost_per_fault_is_measured_whatever_holes_the_heap_has() -> None:
    """A 100 MiB free hole in glibc's heap, as a long process leaves: a tensor allocated there would
    take no fault, so the cost per fault is timed on a mapping of its own and stays measurable."""
    import ctypes

    from dnnperf.perfmodel.calibrate import measure_page_fault_cost

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    mib = 1 << 20
    libc.free(libc.malloc(30 * mib))  # an mmapped block freed: glibc's mmap threshold rises to 30 MiB
    blocks = [libc.malloc(20 * mib) for _ in range(5)]  # now from the heap
    for block in blocks:
        libc.memset(block, 1, 20 * mib)
    guard = libc.malloc(mib)  # keeps the hole off the heap's top, where it would be trimmed
    for block in blocks:
        libc.free(block)
    try:
        assert measure_page_fault_cost(nbytes=16 * mib, repeats=5) > 0
    finally:
        libc.free(guard)


def _counted(*args, **kwargs) -> dict[int, float]:
    with counting_workload_faults(*args, **kwargs) as wait:
        return wait()


def test_counting_a_suite_workload_in_fresh_processes_can_be_turned_off() -> None:
    assert _counted("basic_cnn", "tiny", [2]) == {2: 0.0}  # the test suite turns counting off


def test_the_count_is_the_median_of_fresh_processes(monkeypatch) -> None:
    """Two processes of one job can fault differently (0 or 992 a step): the middle one counts."""
    import subprocess

    from dnnperf.perfmodel import faults

    reports = iter([{"2": 0.0, "4": 7.0}, {"2": 992.0, "4": 5.0}, {"2": 990.0, "4": 6.0}])
    calls = []

    @contextmanager
    def fake_children(commands, env, parallel=1, timeout_s=None):
        calls.extend(commands)
        out = [json.dumps({"page_faults": next(reports)}) for _ in commands]
        yield lambda: [subprocess.CompletedProcess(c, 0, o, "") for c, o in zip(commands, out, strict=True)]

    monkeypatch.setenv("DNNPERF_COUNT_FAULTS", "1")
    monkeypatch.setattr(faults, "children_beside", fake_children)
    assert _counted("basic_cnn", "tiny", [2, 4]) == {2: 990.0, 4: 6.0}
    assert [c[-3:] for c in calls] == [["basic_cnn", "tiny", "2,4"]] * 3


@pytest.mark.concurrent  # counts, not times
def test_each_batch_size_is_counted_in_a_process_of_its_own_and_a_failure_is_one_line(monkeypatch) -> None:
    from dnnperf.errors import DnnperfError

    monkeypatch.setenv("DNNPERF_COUNT_FAULTS", "1")
    counted = _counted("basic_cnn", "tiny", [2, 4], processes=1)
    assert set(counted) == {2, 4}
    assert all(c >= 0 and (2 * c).is_integer() for c in counted.values())  # medians of counts
    # resnet18 trains no batch of 1 (BatchNorm on one value per channel): the error says so.
    with pytest.raises(DnnperfError, match=r"at batch 1: ValueError: Expected more than 1 value per channel"):
        _counted("resnet18", "tiny", [2, 1], processes=1)


def test_a_budget_stops_counting_after_the_least_steps_and_none_counts_them_all() -> None:
    steps = []

    def busy() -> None:  # a step that takes CPU time
        steps.append(1)
        deadline = time.process_time() + 0.02
        while time.process_time() < deadline:
            pass

    steady_page_faults(busy, warm=2, counted=10, budget_s=0.01, least=3)
    assert len(steps) == 2 + 3
    steps.clear()
    steady_page_faults(busy, warm=2, counted=10, budget_s=100.0, least=3)
    assert len(steps) == 2 + 10
    steps.clear()
    steady_page_faults(busy, warm=1, counted=6)
    assert len(steps) == 1 + 6


def _graph(page_faults: float) -> StepGraph:
    ops = pd.DataFrame(
        [
            {
                "phase": "forward",
                "module": "a",
                "op": "aten.relu",
                "family": "elementwise",
                "dtype": "float32",
                "flops": 1e3,
                "bytes": 1e6,
                "calls": 1.0,
            },
            *[
                {
                    "phase": "update",
                    "module": "(none)",
                    "op": f"aten.add_{i}",
                    "family": "elementwise",
                    "dtype": "float32",
                    "flops": 1e3,
                    "bytes": 1e6,
                    "calls": 1.0,
                }
                for i in range(10)
            ],
        ]
    )
    return StepGraph("toy", 4, ops, 4000, {"a": 4000}, 4000, 0, 1000, page_faults=page_faults)


def test_each_fault_costs_the_machines_page_fault_seconds() -> None:
    machine = dataclasses.replace(preset("seed002"), page_fault_s=2e-6)
    with_faults, without = _graph(5000), _graph(0)
    extra = step_time(with_faults, machine).total_s - step_time(without, machine).total_s
    assert extra == pytest.approx(5000 * 2e-6)
    assert step_time(with_faults, machine, ComputeOptions(faults=False)).total_s == pytest.approx(
        step_time(without, machine).total_s
    )
    single = (
        predict(with_faults, machine, 4, "single").other_s - predict(without, machine, 4, "single").other_s
    )
    assert single == pytest.approx(5000 * 2e-6)
    # A machine that does not count them (the GPU presets) charges nothing.
    assert step_time(with_faults, preset("seed002")).total_s == pytest.approx(
        step_time(without, preset("seed002")).total_s
    )


def test_the_update_streams_from_memory_while_forward_reads_from_cache() -> None:
    # 1 MB per call runs at 100 GB/s (in cache), 10 MB at 10 GB/s: the update's ten 1 MB calls are
    # one 10 MB working set (the parameters, untouched since backward).
    machine = dataclasses.replace(
        preset("seed002"), bandwidth_curve=Curve((1e6, 1e7), (1e11, 1e10)), efficiency={}
    )
    times = op_times(_graph(0), machine, ComputeOptions("max", overhead=False))  # the bandwidth term
    forward = times[times.phase == "forward"]["seconds"].iloc[0]
    update = times[times.phase == "update"]["seconds"].to_numpy()
    assert forward == pytest.approx(1e6 / 1e11)
    assert update == pytest.approx([1e6 / 1e10] * 10)
    cached = op_times(_graph(0), machine, ComputeOptions("max", overhead=False, update_from_memory=False))
    assert cached[cached.phase == "update"]["seconds"].to_numpy() == pytest.approx([1e6 / 1e11] * 10)


def test_a_users_model_on_the_cpu_is_counted_in_this_process() -> None:
    class Fresh(nn.Module):  # maps and touches a fresh block in every forward
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _map_and_touch()
            return x * self.w

    graph = describe_model(Fresh(), torch.randn(2, 1))
    assert graph.page_faults >= _fewest_faults()
    assert describe_model(Fresh(), torch.randn(2, 1), count_faults=False).page_faults is None


def test_faults_are_counted_only_for_a_machine_that_charges_them(monkeypatch) -> None:
    from dnnperf.perfmodel import graph as graphs

    counted: list[tuple[str, str, int]] = []

    @contextmanager
    def fake_count(workload: str, preset: str, batch_sizes: list[int]):
        counted.extend((workload, preset, b) for b in batch_sizes)
        yield lambda: {b: 1000.0 for b in batch_sizes}

    monkeypatch.setattr(graphs, "counting_workload_faults", fake_count)
    gpu = preset("seed002")  # page_fault_s 0: a GPU's caching allocator
    cpu = dataclasses.replace(gpu, page_fault_s=2e-6)
    free = predict("basic_cnn", gpu, 2, "single", preset="tiny")
    assert counted == []
    charged = predict("basic_cnn", cpu, 2, "single", preset="tiny")
    assert counted == [("basic_cnn", "tiny", 2)]
    assert charged.other_s - free.other_s == pytest.approx(1000 * 2e-6)
    predict("basic_cnn", cpu, 2, "single", preset="tiny")  # kept with the cached description
    assert len(counted) == 1


def test_a_sweeps_two_descriptions_are_counted_together_and_kept_if_counting_stops(monkeypatch) -> None:
    from dnnperf.perfmodel import graph as graphs

    asked: list[list[int]] = []

    @contextmanager
    def stopped(workload: str, preset: str, batch_sizes: list[int]):
        asked.append(list(batch_sizes))

        def wait() -> dict[int, float]:
            raise KeyboardInterrupt

        yield wait

    monkeypatch.setattr(graphs, "counting_workload_faults", stopped)
    with pytest.raises(KeyboardInterrupt):
        graphs.workload_graph("basic_cnn", "tiny", 3, exact=False, count_faults=True)
    assert asked == [[2, 4]]
    captured = []
    monkeypatch.setattr(graphs, "_capture_workload", lambda *args: captured.append(args))

    @contextmanager
    def counted(workload: str, preset: str, batch_sizes: list[int]):
        yield lambda: {b: 10.0 * b for b in batch_sizes}

    monkeypatch.setattr(graphs, "counting_workload_faults", counted)
    mid = graphs.workload_graph("basic_cnn", "tiny", 3, exact=False, count_faults=True)
    assert captured == []  # both descriptions came back from the cache
    assert mid.page_faults == pytest.approx(30.0)  # 20 at 2, 40 at 4
