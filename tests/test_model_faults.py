"""Page faults in the model: the count against the pages a step maps anew, the charge against the
machine's cost per fault, and the update's bandwidth taken at the whole update's working set."""

from __future__ import annotations

import dataclasses
import mmap
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from dnnperf.perfmodel.compute import ComputeOptions, op_times, step_time
from dnnperf.perfmodel.faults import steady_page_faults, workload_faults
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


def test_a_suite_workload_is_counted_in_a_fresh_process_and_can_be_turned_off(monkeypatch) -> None:
    assert workload_faults("basic_cnn", "tiny", 2) == 0.0  # the test suite turns counting off
    monkeypatch.setenv("DNNPERF_COUNT_FAULTS", "1")
    counted = workload_faults("basic_cnn", "tiny", 2, processes=1)
    assert counted >= 0 and counted == int(counted)


def test_the_count_is_the_median_of_fresh_processes(monkeypatch) -> None:
    """Two processes of one job can fault differently (0 or 992 a step): the middle one counts."""
    import subprocess

    from dnnperf.perfmodel import faults

    counts = iter([0.0, 992.0, 990.0])
    calls = []

    def fake_child(argv, env, timeout_s=None):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, f'{{"page_faults": {next(counts)}}}', "")

    monkeypatch.setenv("DNNPERF_COUNT_FAULTS", "1")
    monkeypatch.setattr(faults, "run_child", fake_child)
    assert workload_faults("basic_cnn", "tiny", 2) == 990.0
    assert len(calls) == 3 and all(a[-3:] == ["basic_cnn", "tiny", "2"] for a in calls)


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

    def fake_count(workload: str, preset: str, batch_size: int) -> float:
        counted.append((workload, preset, batch_size))
        return 1000.0

    monkeypatch.setattr(graphs, "workload_faults", fake_count)
    gpu = preset("seed002")  # page_fault_s 0: a GPU's caching allocator
    cpu = dataclasses.replace(gpu, page_fault_s=2e-6)
    free = predict("basic_cnn", gpu, 2, "single", preset="tiny")
    assert counted == []
    charged = predict("basic_cnn", cpu, 2, "single", preset="tiny")
    assert counted == [("basic_cnn", "tiny", 2)]
    assert charged.other_s - free.other_s == pytest.approx(1000 * 2e-6)
    predict("basic_cnn", cpu, 2, "single", preset="tiny")  # kept with the cached description
    assert len(counted) == 1
