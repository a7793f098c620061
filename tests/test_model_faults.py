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

from dnnperf.model.compute import ComputeOptions, op_times, step_time
from dnnperf.model.faults import steady_page_faults, workload_faults
from dnnperf.model.graph import StepGraph, describe_model
from dnnperf.model.machine import Curve, preset
from dnnperf.model.predict import predict

resource = pytest.importorskip("resource")

#: Above glibc's largest dynamic mmap threshold (32 MiB): every such block is mapped when allocated
#: and unmapped when freed, so each step touches all of its pages anew.
BLOCK = 64 << 20


def _fewest_faults() -> int:
    """The fewest faults a fresh BLOCK can take: one per page, or with transparent huge pages always
    on, one per 2 MiB where the kernel finds them."""
    try:
        thp_always = "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        thp_always = False
    return BLOCK // (2 << 20) if thp_always else BLOCK // mmap.PAGESIZE


def test_the_count_is_the_pages_a_step_maps_anew() -> None:
    def step() -> None:
        torch.empty(BLOCK // 4).fill_(1.0)  # allocated, written, freed

    faults = steady_page_faults(step)
    pages = BLOCK // mmap.PAGESIZE
    assert _fewest_faults() <= faults <= pages * 1.05  # a few more: the interpreter's own pages

    keep = torch.empty(BLOCK // 4)

    def reuse() -> None:
        keep.fill_(2.0)  # the same pages every time: nothing new to map

    assert steady_page_faults(reuse) < _fewest_faults() * 0.05


def test_a_suite_workload_is_counted_in_a_fresh_process_and_can_be_turned_off(monkeypatch) -> None:
    assert workload_faults("basic_cnn", "tiny", 2) == 0.0  # the test suite turns counting off
    monkeypatch.setenv("DNNPERF_COUNT_FAULTS", "1")
    counted = workload_faults("basic_cnn", "tiny", 2, processes=1)
    assert counted >= 0 and counted == int(counted)


def test_the_count_is_the_median_of_fresh_processes(monkeypatch) -> None:
    """Two processes of one job can fault differently (0 or 992 a step): the middle one counts."""
    import subprocess

    from dnnperf.model import faults

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
    class Fresh(nn.Module):  # allocates a block above the mmap threshold in every forward
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scratch = torch.empty(BLOCK // 4).fill_(1.0)
            return x * self.w + scratch[:1]

    graph = describe_model(Fresh(), torch.randn(2, 1))
    assert graph.page_faults >= _fewest_faults()
    assert describe_model(Fresh(), torch.randn(2, 1), count_faults=False).page_faults is None


def test_faults_are_counted_only_for_a_machine_that_charges_them(monkeypatch) -> None:
    from dnnperf.model import graph as graphs

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
