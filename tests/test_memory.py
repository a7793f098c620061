"""The memory profiler against analytic truths: parameters, gradients, optimizer states, input and
saved activations of small models; the allocator's independent peak over the suite; the largest
batch under a limit; vgg19's feature maps."""

from __future__ import annotations

import json
import threading
from contextlib import nullcontext

import pytest
import torch
from torch import nn

from conftest import run_cli
from dnnperf.analysis.memory import parse_bytes, predict_max_batch, scaling_fit
from dnnperf.devices import on_device
from dnnperf.errors import UsageError
from dnnperf.probes.memory import ROOT_MODULE, MemoryTracker
from dnnperf.results.memory import StepMemory
from dnnperf.results.record import RecordError, RunRecord
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench
from dnnperf.workloads import all_workloads

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

FLOAT = 4


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def nbytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def tracked_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict, resident: bool = True
) -> StepMemory:
    def step() -> None:
        loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the first step creates the optimizer's state
    tracker = MemoryTracker(model, [optimizer], batch, resident=resident)
    with tracker:
        with tracker("forward"):
            loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
        with tracker("backward"):
            loss.backward()
        with tracker("update"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return tracker.result()


@pytest.mark.parametrize(
    ("make_optimizer", "state_per_parameter"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), 0),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),  # the momentum buffer
        (lambda p: torch.optim.Adam(p, lr=1e-3), 2),  # exp_avg and exp_avg_sq
    ],
)
@pytest.mark.parametrize("resident", [True, False])
def test_categories_equal_their_analytic_sizes(make_optimizer, state_per_parameter, resident):
    model = mlp()
    optimizer = make_optimizer(model.parameters())
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    memory = tracked_step(model, optimizer, batch, resident=resident)
    params = nbytes(model)
    assert params == (16 * 32 + 32 + 32 * 4 + 4) * FLOAT
    assert memory.category_max["parameters"] == params
    assert memory.category_max["gradients"] == params  # every parameter's gradient, at the update
    assert memory.category_max["optimizer_state"] == state_per_parameter * params
    assert memory.category_max["input"] == (8 * 16 + 8 * 4) * FLOAT
    # Saved for backward and not a parameter or the input: the ReLU's output (the second Linear saves
    # the same storage; counted once) and the model's output, which the MSE loss saves.
    assert memory.category_max["activations"] == 8 * 32 * FLOAT + 8 * 4 * FLOAT
    assert (
        memory.layers["1"]["saved"] == 8 * 32 * FLOAT
        and memory.layers["0"]["parameters"] == (16 * 32 + 32) * FLOAT
    )
    assert memory.layers["2"]["outputs"] == 8 * 4 * FLOAT
    # The allocator saw the same peak, independently.
    assert abs(memory.peak["unattributed"]) <= 0.05 * memory.measured_peak


@pytest.mark.parametrize("policy", ["keep", "offload"])
@pytest.mark.parametrize("saver_first", [True, False])
def test_a_memory_saver_beside_the_tracker_still_saves_and_its_kept_tensors_are_activations(
    saver_first, policy, tmp_path
):
    """Only the innermost saved-tensor hooks run. Whichever of the tracker and a MemorySaver is entered
    first, a plan that keeps every unit's activations gives the analytic activations (as without a
    saver: the ReLU's output and the model's), and a plan that offloads them still writes them out
    during the tracked step."""
    from dnnperf.memsave import KEEP, MemorySaver, Plan, find_units

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    plan = Plan(policies={u.name: policy for u in find_units(model)}, min_bytes=0)
    saver = MemorySaver(model, plan, offload_dir=tmp_path)

    def step() -> None:
        loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    tracker = MemoryTracker(model, [optimizer], batch)
    if saver_first:
        with saver, tracker:
            step()
    else:
        with tracker, saver:
            step()
    memory = tracker.result()
    if policy == KEEP:
        assert memory.category_max["activations"] == 8 * 32 * FLOAT + 8 * 4 * FLOAT
        assert saver.bytes_written == 0
    else:  # the first Linear's input is the batch (never moved): the ReLU's output goes to disk
        assert saver.bytes_written >= 8 * 32 * FLOAT
    saver.close()


def test_the_resident_cross_check_trims_the_heap_only_when_asked(monkeypatch):
    import dnnperf.probes.memory as probe

    trims = []
    monkeypatch.setattr(probe, "release_free_heap", lambda: trims.append(1))
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    without = tracked_step(model, optimizer, batch, resident=False)
    assert not trims and without.subsystem["peak_rss_growth_bytes"] is None
    assert without.subsystem["rss_bytes"] > 0 and without.subsystem["minor_faults"] >= 0
    checked = tracked_step(model, optimizer, batch)
    assert len(trims) == 1 and checked.subsystem["peak_rss_growth_bytes"] >= 0
    # The same step's figures either way (the trim changes when pages are resident, not what torch
    # allocates).
    assert (checked.peak, checked.category_max, checked.layers) == (
        without.peak,
        without.category_max,
        without.layers,
    )


@pytest.mark.parametrize("preempted_s", [-0.003, 0.003])
def test_a_preempted_start_marker_changes_no_attribution(monkeypatch, preempted_s):
    """The trace's clock is put on the host's by a start marker; on a loaded machine the marker can be
    preempted for milliseconds, misplacing that alignment by half as much. Injected here: every layer,
    category and the peak come out as with the marker undisturbed."""
    import dnnperf.probes.memory as probe

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    steady = tracked_step(model, optimizer, batch, resident=False)
    enter = probe.AllocatorEvents.__enter__

    def preempted_enter(self):
        entered = enter(self)
        self._marked_at += preempted_s
        return entered

    monkeypatch.setattr(probe.AllocatorEvents, "__enter__", preempted_enter)
    disturbed = tracked_step(model, optimizer, batch, resident=False)
    assert disturbed.layers == steady.layers
    assert (disturbed.peak, disturbed.category_max) == (steady.peak, steady.category_max)
    assert disturbed.peak_module == steady.peak_module and disturbed.peak_phase == steady.peak_phase


def test_the_resident_growth_ends_with_the_step_not_the_profilers_trace(monkeypatch):
    """Reading the profiler's trace back after the step takes memory of its own (on WGAN-GP at
    `small` more than the step's): the resident figures are taken before it."""
    import dnnperf.probes.memory as probe

    ballast = 64 << 20
    parse = probe.AllocatorEvents._parse

    def heavy_parse(self, raw):
        touched = bytearray(b"\x01") * ballast  # written, so resident
        assert len(touched) == ballast
        return parse(self, raw)

    monkeypatch.setattr(probe.AllocatorEvents, "_parse", heavy_parse)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    growth = tracked_step(model, optimizer, batch).subsystem["peak_rss_growth_bytes"]
    assert growth is not None and 0 <= growth < ballast // 2


def test_the_timeline_has_stages_and_the_peak_is_placed():
    model = mlp()
    memory = tracked_step(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    )
    times = [t for t, _ in memory.timeline]
    assert times == sorted(times) and times[-1] <= memory.wall_s
    assert [name for _, name in memory.stages if name != "other"] == ["forward", "backward", "update"]
    assert memory.peak_phase in ("forward", "backward", "update")
    assert 0 <= memory.peak_at_s <= memory.wall_s
    at_peak = max(memory.timeline, key=lambda item: sum(item[1].values()))[1]
    assert sum(at_peak.values()) == memory.tracked_peak


def test_hooks_perf_and_files_are_gone_also_on_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    tracker = MemoryTracker(model, [optimizer], batch)
    with pytest.raises(ValueError, match="boom"), tracker:
        model(batch["x"]).sum().backward()
        raise ValueError("boom")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    model(batch["x"]).sum().backward()  # would fail if a stale pack hook referenced the dead tracker
    assert tracker._counters._process is None and tracker._allocator._profiler is None
    with MemoryTracker(model, [optimizer], batch):
        model(batch["x"]).sum().backward()
    assert not list(tmp_path.iterdir())  # the profiler's trace was removed


@pytest.mark.slow
@pytest.mark.parametrize("name", [w.name for w in all_workloads()])
def test_the_unattributed_residual_is_small_on_every_workload(name, tmp_path):
    record = bench(BenchSettings(name, steps=1, warmup=1, memory=True), RunStore(tmp_path))
    memory = record.points[0].memory
    assert memory.measured_by.startswith("torch CPU allocator")
    assert memory.measured_peak == sum(memory.peak.values())  # every allocated byte in a category
    assert abs(memory.peak["unattributed"]) <= 0.05 * memory.measured_peak
    assert memory.category_max["parameters"] > 0 and memory.tracked_peak > 0
    assert isinstance(memory.subsystem["cache_counters"], (dict, str))


def test_the_largest_batch_under_a_limit_fits_and_the_next_does_not(tmp_path):
    sweep = (2, 4, 8, 16)
    record = bench(
        BenchSettings("basic_cnn", batch_sizes=sweep, steps=1, warmup=1, memory=True), RunStore(tmp_path)
    )
    points = [(p.batch_size, p.memory) for p in record.points]
    fit = scaling_fit(points).set_index("category")
    assert fit.loc["peak", "max_rel_error"] < 0.05  # linear in batch size
    peaks = {b: m.measured_peak for b, m in points}
    limit = (peaks[8] + peaks[16]) // 2  # an artificial limit between two sweep points
    predicted = predict_max_batch(points, limit)
    assert 8 <= predicted < 16
    check = bench(
        BenchSettings("basic_cnn", batch_sizes=(predicted,), steps=1, warmup=1, memory=True),
        RunStore(tmp_path),
    )
    assert check.points[0].memory.measured_peak <= limit < peaks[16]


@pytest.mark.slow
def test_vgg19_feature_maps_are_the_largest_category_and_grow_linearly(tmp_path):
    record = bench(
        BenchSettings("vgg19", preset="small", batch_sizes=(8, 16, 32), steps=1, warmup=1, memory=True),
        RunStore(tmp_path),
    )
    points = [(p.batch_size, p.memory) for p in record.points]
    fit = scaling_fit(points).set_index("category")
    assert fit.loc["activations", "max_rel_error"] < 0.05 and fit.loc["activations", "per_sample"] > 0
    biggest = points[-1][1].category_max
    assert max(biggest, key=biggest.get) == "activations"


def test_memory_records_round_trip_and_are_validated(tmp_path):
    record = bench(BenchSettings("basic_cnn", steps=1, warmup=0, memory=True), RunStore(tmp_path))
    document = json.loads(json.dumps(record.to_dict()))
    again = RunRecord.from_dict(document)
    assert again.points[0].memory.to_dict() == record.points[0].memory.to_dict()
    document["points"][0]["memory"]["peak"]["activations"] = -5
    with pytest.raises(RecordError, match="byte count"):
        RunRecord.from_dict(document)


def test_sizes_and_cli_errors():
    assert (
        parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("512MB") == 512 * 10**6 and parse_bytes("100") == 100
    )
    for bad in ("lots", "-1GB", "0", "5 parsecs"):
        with pytest.raises(UsageError):
            parse_bytes(bad)
    assert parse_bytes("1.5GB") == 1_500_000_000 and parse_bytes("0.5KiB") == 512
    for fraction in ("1.5", "0.5b", "0.0001k"):  # bytes come whole
        with pytest.raises(UsageError, match="not a whole number of bytes"):
            parse_bytes(fraction)
    result = run_cli("profile", "basic_cnn", "--memory-limit", "1GiB")
    assert (
        result.returncode == 2 and "--sweep" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    )
    result = run_cli("profile", "basic_cnn", "--memory-limit", "a lot", "--sweep", "2,4")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_cli_memory_profile_with_a_limit(tmp_path):
    result = run_cli(
        "profile",
        "basic_cnn",
        "--memory",
        "--sweep",
        "2,4,8",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--memory-limit",
        "4MB",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    scaling = document["memory_scaling"]
    assert scaling["predicted"] > 8 and scaling["checked_peak"] <= parse_bytes("4MB")
    assert {row["category"] for row in scaling["fit"]} >= {"activations", "peak"}
    text = run_cli("profile", "basic_cnn", "--memory", "--steps", "1", "--warmup", "0")
    assert text.returncode == 0 and "activations" in text.stdout and "saved for backward" in text.stdout


class _Workspace(torch.autograd.Function):
    """Identity whose backward allocates (and fills, then frees) a known workspace."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        workspace = torch.ones(2**21, device=grad.device)  # 8 MiB, far above the model's own bytes
        return grad * workspace[0]


class _WithWorkspace(nn.Module):
    def forward(self, x):
        return _Workspace.apply(x)


def test_a_known_backward_allocation_is_the_peak_and_is_placed_in_its_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), _WithWorkspace(), nn.Linear(32, 4))
    memory = tracked_step(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    )
    assert (memory.peak_module, memory.peak_phase) == ("1", "backward")
    assert memory.peak["temporaries"] >= 2**23  # the workspace, released within the step
    assert memory.measured_peak - 2**23 < 2**16  # and little else: the model is a few KiB


def test_each_layers_backward_peak_holds_its_own_workspace(monkeypatch):
    """The same step with a 4 or 8 MiB workspace in layer 1's backward: layer 1's ``backward_peak`` is
    the step's measured peak, and moves by exactly the workspace's bytes; the layers around it, which
    allocate before and after the workspace is freed, stay far below it."""
    real_ones = torch.ones
    peaks = {}
    for floats in (2**20, 2**21):

        def ones(size, *args, floats=floats, **kwargs):  # the workspace's size, as asked
            return real_ones(floats if size == 2**21 else size, *args, **kwargs)

        monkeypatch.setattr(torch, "ones", ones)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), _WithWorkspace(), nn.Linear(32, 4))
        batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
        memory = tracked_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch)
        peaks[floats] = {name: layer["backward_peak"] for name, layer in memory.layers.items()}
        assert peaks[floats]["1"] == memory.measured_peak
        assert 4 * floats <= peaks[floats]["1"] < 4 * floats + 2**16  # the model is a few KiB
        assert peaks[floats]["0"] < 2**16 and peaks[floats]["2"] < 2**16  # before and after it
        assert peaks[floats][ROOT_MODULE] == 0  # no backward of its own
    assert peaks[2**21]["1"] - peaks[2**20]["1"] == 4 * 2**20


def test_a_block_from_an_earlier_profiled_session_freed_mid_step_does_not_move_the_peak(monkeypatch):
    """An 8 MiB tensor allocated under an earlier profiler session (torch's CPU reporter then counts
    it in its running total) and freed by layer 0's forward, as a garbage collection of an earlier
    step's leftovers would: the step's peak is still layer 1's 4 MiB backward workspace, where the
    running total, 8 MiB higher before the release, would put it at the step's start."""
    real_ones = torch.ones

    def ones(size, *args, **kwargs):  # the workspace at 4 MiB: half the stale block
        return real_ones(2**20 if size == 2**21 else size, *args, **kwargs)

    monkeypatch.setattr(torch, "ones", ones)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True):
        stale = [torch.empty(2**21)]  # 8 MiB, known to the reporter, unknown to the tracker
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), _WithWorkspace(), nn.Linear(32, 4))
    calls = []  # the tracked step is the second: tracked_step's first makes the optimizer's state

    def free_stale(*_):
        calls.append(None)
        if len(calls) == 2:
            stale.clear()

    model[0].register_forward_hook(free_stale)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    memory = tracked_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch)
    assert not stale
    assert (memory.peak_module, memory.peak_phase) == ("1", "backward")
    assert memory.measured_peak == memory.layers["1"]["backward_peak"]
    assert 4 * 2**20 <= memory.measured_peak < 4 * 2**20 + 2**16


class _ForwardWorkspace(nn.Module):
    """Identity whose forward allocates (and frees) a workspace of ``floats`` float32s."""

    def __init__(self, floats: int) -> None:
        super().__init__()
        self.floats = floats

    def forward(self, x):
        workspace = torch.ones(self.floats)
        return x * float(workspace[0])  # a number: the workspace is not saved for backward


def test_each_layers_forward_peak_holds_its_own_workspace():
    """The same step with a 4 or 8 MiB workspace in layer 1's forward: layer 1's ``forward_peak`` moves
    by exactly the workspace's bytes and is the step's measured peak; the layers around it stay below."""
    peaks = {}
    for floats in (2**20, 2**21):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), _ForwardWorkspace(floats), nn.Linear(32, 4))
        batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
        memory = tracked_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch)
        peaks[floats] = {name: layer["forward_peak"] for name, layer in memory.layers.items()}
        assert peaks[floats]["1"] == memory.measured_peak
        assert peaks[floats]["0"] < 2**16 and peaks[floats]["2"] < 2**16
    assert peaks[2**21]["1"] - peaks[2**20]["1"] == 4 * 2**20


def test_the_tracker_keeps_nothing_alive_that_the_step_releases():
    """A gradient penalty (double backward through a fresh leaf) several times in one step: without
    the tracker each update's interpolated batch is released when the update ends, so the peak does
    not grow with the number of updates. A pack hook that kept the saved tensor itself would hold
    each batch in a reference cycle until the step's end (8 MiB more per update here; the cycle goes
    through group norm's double backward, as in WGAN-GP's critic)."""
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(2**18, 4), nn.GroupNorm(1, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(critic.parameters(), lr=0.01)
    real = torch.randn(8, 2**18)

    def updates(n: int, tracker: MemoryTracker) -> None:
        for _ in range(n):
            with tracker("forward"):
                interpolates = (0.5 * real).requires_grad_(True)
                (grad,) = torch.autograd.grad(critic(interpolates).sum(), interpolates, create_graph=True)
                loss = grad.square().sum()
            with tracker("backward"):
                loss.backward(inputs=list(critic.parameters()))
            with tracker("update"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    peaks = {}
    for n in (1, 3):
        tracker = MemoryTracker(critic, [optimizer], {"x": real})
        with tracker:
            updates(n, tracker)
        peaks[n] = tracker.result().measured_peak
    batch = real.numel() * FLOAT
    assert peaks[1] > 2 * batch  # the interpolates and their gradient at least
    assert abs(peaks[3] - peaks[1]) < batch / 4


def test_the_trace_parser_reads_allocations_nodes_and_cuda_copies():
    """The profiler's trace format, as kineto writes it for CUDA runs (which this machine cannot make):
    allocations on the tracked device only, backward nodes with their forward operator, copy bytes."""
    from dnnperf.probes.memory import NODE_EVENT, START_MARKER, AllocatorEvents

    raw = [
        {"ph": "X", "name": START_MARKER, "ts": 1000.0, "dur": 2.0, "args": {}},
        # Backward's operator carries its node's number, and on CUDA (the engine's device thread) can be
        # listed before the forward operator that made the node (seen on an H200): the earliest counts.
        {"ph": "X", "name": "AddmmBackward0", "ts": 1101.0, "dur": 18.0, "args": {"Sequence number": 7}},
        {"ph": "X", "name": "aten::addmm", "ts": 1010.0, "dur": 5.0, "args": {"Sequence number": 7}},
        {
            "name": "[memory]",
            "ts": 1012.0,
            "args": {"Device Type": 1, "Device Id": 0, "Addr": 64, "Bytes": 4096, "Total Allocated": 8192},
        },
        {
            "name": "[memory]",
            "ts": 1013.0,
            "args": {"Device Type": 1, "Device Id": 1, "Addr": 64, "Bytes": 512, "Total Allocated": 512},
        },
        {
            "name": "[memory]",
            "ts": 1014.0,
            "args": {"Device Type": 0, "Addr": 128, "Bytes": 16, "Total Allocated": 16},
        },
        {
            "ph": "X",
            "name": NODE_EVENT + "AddmmBackward0",
            "ts": 1100.0,
            "dur": 20.0,
            "args": {"Sequence number": 7},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pinned -> Device)",
            "ts": 1200.0,
            "dur": 4.0,
            "args": {"bytes": 2**20},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoH (Device -> Pageable)",
            "ts": 1300.0,
            "dur": 2.0,
            "args": {"bytes": 2**10},
        },
    ]
    events = AllocatorEvents(torch.device("cuda", 0), origin=0.5)
    events._marked_at = 1.0
    trace = events._parse(raw)
    # On the step's clock: the marker's middle (1001 us) is 0.5 s after the origin.
    assert [(round(e.ts, 6), e.addr, e.bytes) for e in trace.allocations] == [(0.500011, 64, 4096)]
    assert trace.forward_ops == {7: pytest.approx(0.500009)}
    assert trace.nodes == [(pytest.approx(0.500099), pytest.approx(0.500119), 7)]
    copies = trace.copy_summary()
    assert copies["host_to_device_bytes"] == 2**20
    assert copies["host_to_device_bytes_per_s"] == pytest.approx(2**20 / 4e-6)
    assert copies["device_to_host_bytes"] == 2**10


def test_a_memory_profile_checks_resident_memory_in_a_step_of_its_own(monkeypatch, tmp_path):
    """The heap trim (the cross-check's price) happens once per batch size, outside the tracked step,
    and the point still carries the resident growth."""
    import dnnperf.probes.memory as probe
    from dnnperf.results.store import RunStore
    from dnnperf.runner import BenchSettings, bench

    events: list[str] = []
    trim = probe.release_free_heap
    monkeypatch.setattr(probe, "release_free_heap", lambda: (events.append("trim"), trim())[1])
    enter, exit_ = probe.MemoryTracker.__enter__, probe.MemoryTracker.__exit__
    monkeypatch.setattr(probe.MemoryTracker, "__enter__", lambda s: (events.append("tracked"), enter(s))[1])
    monkeypatch.setattr(
        probe.MemoryTracker, "__exit__", lambda s, *e: (events.append("done"), exit_(s, *e))[1]
    )
    settings = BenchSettings("basic_cnn", batch_sizes=(2, 4), steps=1, warmup=1, memory=True)
    record = bench(settings, RunStore(tmp_path))
    assert events == ["tracked", "done", "trim"] * 2
    for point in record.points:
        assert point.memory.subsystem["peak_rss_growth_bytes"] is not None
        assert point.memory.subsystem["minor_faults"] > 0  # the trimmed step faults its pages in


def _zero_grad_first_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, stages
) -> None:
    """The common loop body: the last step's gradients released first, then forward, backward, update."""
    with stages("update"):
        optimizer.zero_grad(set_to_none=True)
    with stages("forward"):
        loss = model(x).square().mean()
    with stages("backward"):
        loss.backward()
    with stages("update"):
        optimizer.step()


@pytest.mark.parametrize("kept", [False, True], ids=["released", "kept by the caller"])
def test_gradients_from_before_the_step_count_until_the_step_releases_them(kept):
    """A 16 MiB layer whose loop zeroes gradients (set to None) at the start of the step. The profiler
    reports no release of a block allocated before it started, so the last step's gradients would be
    counted beside the new ones (48 MiB measured before the fix). By hand: parameters and one set of
    gradients, 32 MiB and the tiny activations; 48 MiB when the caller still holds the old gradients."""
    torch.manual_seed(0)
    model = nn.Linear(2048, 2048, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 2048)
    for _ in range(2):
        _zero_grad_first_step(model, optimizer, x, lambda name: nullcontext())
    held = [p.grad for p in model.parameters()] if kept else []
    tracker = MemoryTracker(model, [optimizer], {"x": x}, resident=False)
    with tracker:
        _zero_grad_first_step(model, optimizer, x, tracker)
    memory = tracker.result()
    layer = 2048 * 2048 * FLOAT
    small = 2**18  # the input, the output and the loss's temporaries: tens of KiB
    expected = 3 * layer if kept else 2 * layer
    assert expected <= memory.measured_peak <= expected + small
    assert memory.peak["gradients"] == (2 if kept else 1) * layer and memory.peak["parameters"] == layer
    assert abs(memory.peak["unattributed"]) <= small
    assert len(held) == int(kept)


def test_a_release_the_trace_reports_itself_is_taken_off_once():
    """Gradients zeroed between forward and backward, two tracked steps in a row: the first step's
    gradients were allocated under a profiled session, so the trace of the second reports their
    release itself (as CUDA's allocator always does). Taken off twice, backward would look 16 MiB
    smaller than it was and the end of forward would pass for the peak; the peak is backward's 8 MiB
    workspace beside the parameters and the new gradients (the big layer's backward runs first)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 2048, bias=False), _WithWorkspace(), nn.Linear(2048, 2048, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 8)

    def step(stages) -> None:
        with stages("forward"):
            loss = model(x).square().mean()
        with stages("update"):
            optimizer.zero_grad(set_to_none=True)
        with stages("backward"):
            loss.backward()
        with stages("update"):
            optimizer.step()

    step(lambda name: nullcontext())
    layer = 2048 * 2048 * FLOAT
    for _ in range(2):
        tracker = MemoryTracker(model, [optimizer], {"x": x}, resident=False)
        with tracker:
            step(tracker)
        memory = tracker.result()
        assert (memory.peak_phase, memory.peak_module) == ("backward", "1")
        assert 2 * layer + 2**23 <= memory.measured_peak <= 2 * layer + 2**23 + 2**19


def test_only_tensors_on_the_tracked_device_count_from_before_the_step():
    """A loop's host batch is none of a GPU's memory: the tracker of a CUDA step leaves it out."""
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.ones(2, 4)}
    assert on_device(batch["x"], torch.device("cpu"))
    assert not on_device(batch["x"], torch.device("cuda"))
    elsewhere = MemoryTracker(model, [optimizer], {"x": torch.ones(2, 4, device="meta")}, resident=False)
    with elsewhere:
        pass
    assert elsewhere._before["input"] == 0 and elsewhere._before["parameters"] == (4 * 4 + 4) * FLOAT


def test_releases_of_blocks_from_before_the_trace_that_no_category_holds_are_found():
    """The CUDA peak's correction (a loop's last device batch, alive at the start and released in the
    step): only releases of blocks the trace never saw allocated, and not the categories' own."""
    from dnnperf.probes.memory import AllocatorEvent, outside_releases

    events = [
        AllocatorEvent(0.1, 100, -512, 0),  # an earlier step's batch: outside
        AllocatorEvent(0.2, 200, -1024, 0),  # last step's gradient: a category's, known
        AllocatorEvent(0.3, 100, 2048, 0),  # the address reused by the step
        AllocatorEvent(0.4, 100, -2048, 0),  # and released: the step's own
        AllocatorEvent(0.5, 300, -4096, 0),  # outside
    ]
    assert outside_releases(events, known={200}) == [(0.1, 512), (0.5, 4096)]


def test_the_largest_batch_caption_says_where_its_answer_came_from():
    """The user's --memory-limit with nothing that fits says so (it once told the user to pass the
    --memory-limit they had passed); the device's capacity is predicted only; a checked batch says
    what it measured."""
    import pandas as pd

    from dnnperf.report.terminal import memory_scaling_table

    fit = pd.DataFrame([{"category": "peak", "fixed": 2000, "per_sample": 100, "max_rel_error": 0.0}])
    caption = str(memory_scaling_table(fit, 1000, None, asked=True).caption)
    assert caption.startswith("largest batch within 1 kB: none (predicted from the fit: even one sample")
    assert "pass --memory-limit" in str(memory_scaling_table(fit, 10**6, 9980).caption)
    checked = str(memory_scaling_table(fit, 10**6, 9980, checked=999_000, asked=True).caption)
    assert checked == "largest batch within 1 MB: 9980; ran it: peak 999 kB (within the limit)"


def test_releases_the_trace_did_not_see_are_put_back_with_the_running_total():
    """By hand: block 100 released on another thread (noted at 0.25), block 200 a collective's own
    copy (allocated inside the collective of 0.3-0.4, never released in the trace), block 300
    allocated again at its address (so released by 0.6, at the latest); block 400 released in the
    trace. Each added release lowers every later running total by its bytes."""
    from dnnperf.probes.memory import AllocatorEvent, with_unseen_releases

    events = [
        AllocatorEvent(0.1, 100, 1000, 1000),
        AllocatorEvent(0.2, 300, 30, 1030),
        AllocatorEvent(0.35, 200, 200, 1230),
        AllocatorEvent(0.5, 400, 4, 1234),
        AllocatorEvent(0.55, 400, -4, 1230),
        AllocatorEvent(0.6, 300, 30, 1260),  # 300 again, never released in between
        AllocatorEvent(0.7, 500, 5, 1265),
    ]
    out = with_unseen_releases(events, noted=[(0.25, 100, 1000)], collectives=[(0.3, 0.4)])
    assert [(e.ts, e.addr, e.bytes, e.total) for e in out] == [
        (0.1, 100, 1000, 1000),
        (0.2, 300, 30, 1030),
        (0.25, 100, -1000, 30),  # noted
        (0.35, 200, 200, 230),
        (0.4, 200, -200, 30),  # the collective's end
        (0.5, 400, 4, 34),
        (0.55, 400, -4, 30),
        (0.6, 300, -30, 0),  # the address reused
        (0.6, 300, 30, 30),
        (0.7, 500, 5, 35),
    ]
    # A noted release of a block the trace already released, or of another size, changes nothing.
    assert with_unseen_releases(events[3:5], noted=[(0.6, 400, 4), (0.52, 400, 8)]) == events[3:5]
    # A block allocated inside a collective but released in the trace after it is not the collective's.
    kept = [AllocatorEvent(0.35, 200, 200, 200), AllocatorEvent(0.9, 200, -200, 0)]
    assert with_unseen_releases(kept, noted=[], collectives=[(0.3, 0.4)]) == kept


def _release_on_another_thread(box: list) -> None:
    thread = threading.Thread(target=box.clear)  # the last reference goes on that thread
    thread.start()
    thread.join()


@pytest.mark.parametrize("how", ["watched", "collective"])
def test_a_block_released_on_another_thread_is_released_where_it_was(how):
    """An 8 MiB tensor made in forward and released on a Python thread (a release torch's profiler
    does not see, as a collective's on gloo's worker thread), then a 4 MiB one made and released in
    backward. The truth: the step never holds both, so its peak is the 8 MiB beside the model's few
    KiB, and nothing is held after it. Told by ``watch_release`` (the release noted where it happens)
    or by ``synchronous_collective`` (the tensor made inside a collective that has ended)."""
    from dnnperf.probes.memory import synchronous_collective, watch_release

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(8, 16), "y": torch.randn(8, 4)}
    big, small = 2**21, 2**20  # floats: 8 and 4 MiB
    tracker = MemoryTracker(model, [optimizer], batch, resident=False)
    with tracker:
        with tracker("forward"):
            loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
            if how == "watched":
                box = [torch.ones(big)]
                watch_release(box[0])
            else:
                with synchronous_collective():
                    box = [torch.ones(big)]
                    _release_on_another_thread(box)
            _release_on_another_thread(box)
        with tracker("backward"):
            loss.backward()
            del loss
            torch.ones(small).sum()
        with tracker("update"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    memory = tracker.result()
    assert memory.peak["unattributed"] == 0
    assert big * FLOAT <= memory.measured_peak < big * FLOAT + 2**16
    assert memory.peak_phase == "forward"
