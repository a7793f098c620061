"""Per-layer analysis against known truths: injected per-layer delays in forward and backward, FLOPs
per layer against the analytic formulas, efficiency from a known time and peak, FLOP coverage, library
attribution, and the record round trip."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import KnownDelay, run_cli
from dnnperf.analysis import layers
from dnnperf.probes.layers import LayerProfiler, layer_category
from dnnperf.probes.opcount import OpCall, cpu_blas, library_of
from dnnperf.results.layers import LayerProfile, ModuleInfo, OpTiming
from dnnperf.results.record import RecordError, RunRecord
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench
from dnnperf.workloads import all_workloads

FORWARD_DELAY_S = 0.004
BACKWARD_DELAY_S = 0.006

# A custom operator that busy-waits a KnownDelay: the dispatch mode sees it as one operator, without
# a FLOP formula, in the forward of the layer that calls it and in that layer's backward.
_delays: dict[str, KnownDelay] = {}


@torch.library.custom_op("dnnperf_test::spin", mutates_args=())
def spin(x: torch.Tensor, which: str) -> torch.Tensor:
    _delays[which]()
    return x.clone()


@spin.register_fake
def _(x: torch.Tensor, which: str) -> torch.Tensor:
    return torch.empty_like(x)


def _spin_backward(ctx, grad: torch.Tensor):
    return spin(grad, "backward"), None


spin.register_autograd(_spin_backward)


class Spin(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return spin(x, "forward")


def profile_loop(model: nn.Module, steps: int = 7, data: TensorDataset | None = None) -> LayerProfile:
    """The documented loop: two operator-timed steps, then layer-timed ones; batches of 8 of ``data``
    (16 features to 4 targets by default)."""
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = data or TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 4))
    profiler = LayerProfiler(model, optimizer)
    with profiler:
        for inputs, targets in DataLoader(data, batch_size=8):
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()
    return profiler.result()


def test_injected_layer_delays_land_in_their_layer_and_phase(known_delay):
    _delays["forward"] = known_delay(FORWARD_DELAY_S)
    _delays["backward"] = known_delay(BACKWARD_DELAY_S)
    model = nn.Sequential(nn.Linear(16, 32), Spin(), nn.ReLU(), nn.Linear(32, 4))
    profile = profile_loop(model)
    table = layers.layer_table(profile).set_index(["module", "phase"])
    for phase in ("forward", "backward"):
        truth = statistics.median(_delays[phase].per_step(profile.steps))
        measured = table.loc[("1", phase), "time_s"]
        # the spin plus the clone around it (microseconds on a 8x32 tensor) and the hooks' own calls
        assert truth <= measured <= truth * 1.10 + 0.001
        others = table.drop(index=("1", phase), errors="ignore").xs(phase, level="phase")["time_s"]
        assert others.max() < 0.5 * truth  # nothing else took the delay
    # The uncovered operator is named, with its share of the measured operator time.
    cover = layers.coverage(profile)
    row = cover["uncovered"].set_index("op").loc["dnnperf_test.spin"]
    assert row["share"] == pytest.approx(row["time_s"] / cover["time_s"])
    # The spin (4 + 6 ms a step) outlasts every other uncovered operator (microseconds each), however
    # long a loaded host makes the covered ones (its share of the whole is not asserted: the first
    # operator-timed step's lazy initialisation can take as long as it).
    assert cover["uncovered"]["op"].iloc[0] == "dnnperf_test.spin"
    assert cover["covered_share"] == pytest.approx(1 - cover["uncovered"]["share"].sum())
    # Layers never take more than the step they ran in.
    per_step = sum(layers.layer_times(profile).values())
    assert len(per_step) == profile.steps == 5
    assert all(t <= w for t, w in zip(per_step, profile.step_s, strict=True))


def test_flops_per_layer_are_the_counted_ones_and_categories_aggregate():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    profile = profile_loop(model, steps=4)
    table = layers.layer_table(profile).set_index(["module", "phase"])
    # Linear forward: 2*N*in*out (the bias rides in addmm); backward: grad input (not for the first
    # layer, whose input needs none) + grad weight, 2*N*in*out each, + grad bias, a sum over N*out.
    assert table.loc[("0", "forward"), "flops"] == 2 * 8 * 16 * 32
    assert table.loc[("0", "backward"), "flops"] == 2 * 8 * 16 * 32 + 8 * 32
    assert table.loc[("2", "backward"), "flops"] == 2 * (2 * 8 * 32 * 4) + 8 * 4
    assert table.loc[("1", "forward"), "category"] == "activation"
    categories = layers.category_table(profile).set_index(["category", "phase"])
    linear = table[table["category"] == "linear"].xs("forward", level="phase")
    assert categories.loc[("linear", "forward"), "flops"] == linear["flops"].sum()
    assert profile.modules["0"].calls == 1


def test_in_place_shared_and_twice_called_modules_are_attributed():
    shared = nn.Linear(16, 16)
    relu = nn.ReLU(inplace=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.relu, self.head = shared, shared, relu, nn.Linear(16, 4)

        def forward(self, x):
            x = self.relu(self.a(x))
            x = self.relu(self.b(x))  # the shared Linear and the ReLU, each called twice
            return self.head(x)

    profile = profile_loop(Net(), steps=4)
    ops = layers.op_frame(profile)
    assert profile.modules["a"].calls == 2 and "b" not in set(ops["module"])  # first name, both calls
    # Layer times too: the in-place ReLU's forward and its autograd nodes (rebased onto the Linear's
    # output) are the ReLU's; the shared Linear's are under its first name.
    times = layers.layer_times(profile)
    for module in ("a", "relu", "head"):
        for phase in ("forward", "backward"):
            assert (times[(module, phase)] > 0).all(), (module, phase)
    assert not any(module == "b" for module, _ in times)
    relu_ops = ops[(ops["module"] == "relu") & (ops["family"] == "elementwise")]
    assert set(relu_ops["phase"]) == {"forward", "backward"}
    assert relu_ops.loc[relu_ops["phase"] == "forward", "calls"].sum() == 2
    assert relu_ops.loc[relu_ops["phase"] == "backward", "calls"].sum() == 2  # threshold_backward x 2
    linear_fwd = ops[(ops["module"] == "a") & (ops["phase"] == "forward") & (ops["family"] == "matmul")]
    assert linear_fwd["flops"].sum() == 2 * (2 * 8 * 16 * 16)


def test_the_hooks_own_time_is_no_parents(known_delay, monkeypatch):
    """A module calling 300 small children: our pre- and post-hooks run inside its call, 600 times.
    Its own time must not take them: it stays within the same forward with hooks that do nothing on
    every module (its known delay, the children's work, Python's calls and the slower call path any
    forward hook puts every module on, which no hook can time), timed in the same process,
    interleaved. Here that forward takes 1.2-1.4x the unhooked one, the parent's own time 0.75-0.9x
    of it, and the parent's own time with our hooks' about 2x of it. Everything here, the timer's
    readings included, is on this thread's CPU clock: another process's preemption (a CPU hog beside
    the tests doubled the wall times at random) moves neither side."""
    import time

    from dnnperf.probes.layers import PROFILER, LayerTimer

    monkeypatch.setattr(time, "perf_counter", time.thread_time)
    delay = known_delay(0.003, cpu=True)

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.kids = nn.ModuleList(nn.ReLU() for _ in range(300))

        def forward(self, x):
            delay()
            for kid in self.kids:
                x = kid(x)
            return x

    model = nn.Sequential(Parent())
    x = torch.randn(4, 4, requires_grad=True)
    own, idle, hooks = [], [], []
    with LayerTimer(model) as timer:
        for step in range(16):
            model(x).sum().backward()
            times = timer.take_step()
            if step >= 3:
                own.append(times["0"]["forward"])
                hooks.append(times[PROFILER]["forward"])
            timer.__exit__()  # ours removed, hooks that do nothing in their place
            handles = [m.register_forward_pre_hook(lambda *_: None) for m in model.modules()]
            handles += [m.register_forward_hook(lambda *_: None) for m in model.modules()]
            start = time.perf_counter()
            model(x).sum()
            if step >= 3:
                idle.append(time.perf_counter() - start)
            for handle in handles:
                handle.remove()
            timer.__enter__()
    assert statistics.median(own) >= 0.003
    assert statistics.median(own) <= statistics.median(idle)
    assert statistics.median(hooks) > 0  # the hooks' time is shown apart, as (profiler)


def test_hooks_are_gone_after_the_profiler_also_on_error():
    model = nn.Sequential(nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="boom"), LayerProfiler(model, optimizer):
        model(torch.randn(2, 16)).sum().backward()
        raise ValueError("boom")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    with pytest.raises(RuntimeError, match="no layer-timed step"):
        LayerProfiler(model, optimizer).result()


def test_libraries_follow_what_torch_dispatches():
    counts = {}
    for module, x in (
        (nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8)),
        (nn.Linear(8, 4), torch.randn(2, 8)),
        (nn.LSTM(8, 8), torch.randn(3, 2, 8)),
    ):
        profile = profile_loop_any(module, x)
        counts[type(module).__name__] = layers.layer_table(profile).set_index(["module", "phase"])
    conv = counts["Conv2d"].loc[("(root)", "forward"), "library"]
    assert conv == ("oneDNN" if torch.backends.mkldnn.is_available() else f"native im2col + {cpu_blas()}")
    assert counts["Linear"].loc[("(root)", "forward"), "library"] == cpu_blas()
    assert counts["LSTM"].loc[("(root)", "forward"), "library"] in ("oneDNN", cpu_blas())
    # the convolution backend comes from a private torch API: notice when it changes
    call = OpCall(
        (torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
        {},
        None,
        {},
    )
    assert library_of("aten.convolution", "convolution", call) != "unknown"


def profile_loop_any(module: nn.Module, x: torch.Tensor) -> LayerProfile:
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    profiler = LayerProfiler(module, optimizer)
    with profiler:
        for _ in range(3):
            out = module(x)
            (out[0] if isinstance(out, tuple) else out).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()
    return profiler.result()


def test_layer_categories():
    assert layer_category(nn.Conv2d(1, 1, 1)) == "convolution"
    assert layer_category(nn.Linear(1, 1)) == "linear"
    assert layer_category(nn.GRU(1, 1)) == "recurrent"
    assert layer_category(nn.MultiheadAttention(4, 2)) == "attention"
    assert layer_category(nn.BatchNorm2d(1)) == "normalization"
    assert layer_category(nn.MaxPool2d(2)) == "pooling"
    assert layer_category(nn.GELU()) == "activation"
    assert layer_category(nn.Embedding(2, 2)) == "embedding"
    assert layer_category(nn.Sequential()) == "other"


def layered(name: str, preset: str, tmp_path) -> RunRecord:
    settings = BenchSettings(name, preset=preset, steps=2, warmup=1, layers=True)
    return bench(settings, RunStore(tmp_path / "runs"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [w.name for w in all_workloads()])
def test_formulas_cover_the_time(name, tmp_path):
    profile = layered(name, "tiny", tmp_path).points[0].layers
    table = layers.layer_table(profile)
    assert layers.coverage(profile)["covered_share"] >= 0.95
    assert (table["time_s"] >= 0).all() and table["flops"].notna().any()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "vgg16", "transformer"])
def test_formulas_cover_the_time_at_small(name, tmp_path):
    profile = layered(name, "small", tmp_path).points[0].layers
    assert layers.coverage(profile)["covered_share"] >= 0.95


def test_convolution_flops_per_layer_are_the_analytic_ones():
    """2 x N x (C_out x C_in x k x k) x output positions a convolution; backward as much again for
    each gradient it computes (the first layer's input needs none)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2, padding=1), nn.Flatten(),
        nn.Linear(4 * 3 * 3, 2),
    )  # fmt: skip
    data = TensorDataset(torch.randn(8 * 4, 3, 6, 6), torch.randn(8 * 4, 2))
    table = layers.layer_table(profile_loop(model, data=data)).set_index(["module", "phase"])["flops"]
    first = 2 * 8 * (8 * 3 * 3 * 3) * (6 * 6)  # 6x6 positions (padding 1)
    second = 2 * 8 * (4 * 8 * 3 * 3) * (3 * 3)  # 3x3 positions (stride 2)
    assert table[("0", "forward")] == first and table[("0", "backward")] == first
    assert table[("2", "forward")] == second and table[("2", "backward")] == 2 * second


def test_efficiency_is_the_operators_flops_over_their_time_against_the_peak():
    """A layer's efficiency from known figures: its operator's FLOPs in its median operator-timed step
    (2 ms of 1, 3 and 2) against a 1 TFLOP/s peak; the layer-timed steps (0.5 s, with the layer's
    Python) are its time, not the FLOPs' divisor."""
    flops = 2 * 8 * 16 * 32
    profile = LayerProfile(
        steps=2,
        timing="host-clock",
        ops=[OpTiming("fc", "forward", "aten.addmm", "matmul", 1, flops, 0.0, 0.0, "MKL", "float32",
                      [1e-3, 3e-3, 2e-3])],
        modules={"fc": ModuleInfo("Linear", "linear", calls=1)},
        step_s=[0.5, 0.5],
        layer_seconds={"fc": {"forward": [0.5, 0.5]}},
        op_steps=3,
    )  # fmt: skip
    peak, bandwidth = 1e12, 1e11
    known = SimpleNamespace(
        peak_flops=lambda dtype: peak, ridge_point=lambda dtype: peak / bandwidth, memory_bandwidth=bandwidth
    )
    (row,) = layers.layer_table(profile, known).to_dict("records")
    assert row["time_s"] == 0.5 and row["op_time_s"] == pytest.approx(2e-3)
    assert row["achieved_flops"] == pytest.approx(flops / 2e-3)
    assert row["efficiency"] == pytest.approx(flops / 2e-3 / peak)


def test_the_layers_section_round_trips_and_is_validated(tmp_path):
    record = bench(BenchSettings("basic_cnn", steps=2, warmup=0, layers=True), RunStore(tmp_path))
    document = json.loads(json.dumps(record.to_dict()))
    again = RunRecord.from_dict(document)
    assert again.points[0].layers.to_dict() == record.points[0].layers.to_dict()
    assert len(record.points[0].layers.step_s) == 2 and record.points[0].stages is not None
    document["points"][0]["layers"]["ops"][0]["seconds"] = [-1.0, 0.0]  # two operator-timed steps
    with pytest.raises(RecordError, match="non-negative"):
        RunRecord.from_dict(document)


@pytest.mark.concurrent
def test_cli_profile_layers_and_libcompare(tmp_path):
    result = run_cli("profile", "basic_cnn", "--layers", "--steps", "2", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)["record"]
    assert record["points"][0]["layers"]["ops"]
    result = run_cli("profile", "basic_cnn", "--layers", "--steps", "2", "--warmup", "0")
    assert result.returncode == 0 and "by layer type" in result.stdout and "convolution" in result.stdout
    # The layer timer's own work is no layer: not ranked among them, said apart.
    assert "(profiler)" not in result.stdout
    assert "dnnperf's layer hooks took" in " ".join(result.stdout.split())
    missing = run_cli("profile", "basic_cnn", "--layers", "--hw", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    compared = run_cli("libcompare", "basic_cnn", "--repeats", "2", "--json")
    assert compared.returncode == 0, compared.stderr
    rows = json.loads(compared.stdout)["layers"]
    assert [r["name"] for r in rows] == ["conv1", "conv2"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layers_on_cuda_are_timed_with_events_and_attributed(tmp_path):
    record = bench(
        BenchSettings("resnet18", steps=2, warmup=1, layers=True, device="cuda"), RunStore(tmp_path)
    )
    profile = record.points[0].layers
    assert profile.timing == "cuda-kernels"
    table = layers.layer_table(profile).set_index(["module", "phase"])
    assert table.loc[("stem.conv1", "forward"), "time_s"] > 0
    assert table.loc[("stem.conv1", "forward"), "library"] in ("cuDNN", "native")
    assert table.loc[("fc", "forward"), "library"] == "cuBLAS"


def test_glue_between_layers_is_the_parents_not_the_next_layers(known_delay):
    """The parent's own operators before a child runs (here a spin between two Linears) have
    autograd nodes the child's backward walk must not take: they are the parent's."""
    _delays["forward"] = known_delay(FORWARD_DELAY_S)
    _delays["backward"] = known_delay(BACKWARD_DELAY_S)

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.second(spin(self.first(x), "forward"))

    profile = profile_loop(Parent())
    times = layers.layer_times(profile)
    # Step by step: a spin that a preemption stretched (4 ms took 10 once) stretches its own step only.
    for phase in ("forward", "backward"):
        spun = _delays[phase].per_step(profile.steps)
        assert all(t >= d for t, d in zip(times[("(root)", phase)], spun, strict=True)), phase
    truth = statistics.median(_delays["backward"].per_step(profile.steps))
    assert statistics.median(times[("second", "backward")]) < 0.5 * truth


def test_table_cells_from_missing_values_render():
    """A DataFrame's missing values (NaN, None) reach rich as text, not floats (a demo run crashed)."""
    from dnnperf.report.terminal import cell_text

    assert cell_text(float("nan")) == "" and cell_text(None) == "" and cell_text("oneDNN") == "oneDNN"


def test_device_work_is_placed_by_its_launch_in_the_innermost_module_or_the_running_node():
    """The CUDA layer times (LayerTimer on a GPU): each kernel's device seconds go to the module
    innermost when the host launched it (forward) or to the owner of the autograd node running then
    (backward; a re-entrant node inside another takes its own); work launched outside both is none."""
    from dnnperf.probes.layers import device_times

    changes = [(0.0, "(root)"), (1.0, "conv"), (2.0, "(root)"), (3.0, "fc"), (4.0, "(root)"), (5.0, "(none)")]
    nodes = [(10.0, 11.0, "fc"), (12.0, 15.0, "conv"), (13.0, 14.0, "fc")]
    kernels = [
        (0.5, 0.001),  # the root's own (a residual add)
        (1.5, 0.010),  # conv
        (1.7, 0.020),  # conv
        (3.5, 0.030),  # fc
        (6.0, 0.500),  # the loss, after the model returned: no layer's
        (10.5, 0.040),  # fc's node
        (11.5, 0.600),  # between nodes: autograd's own
        (12.5, 0.050),  # conv's node
        (13.5, 0.060),  # fc's node nested in conv's
        (14.5, 0.070),  # conv's again
    ]
    times = device_times(kernels, changes, nodes)
    assert times == {
        "(root)": {"forward": pytest.approx(0.001)},
        "conv": {"forward": pytest.approx(0.030), "backward": pytest.approx(0.120)},
        "fc": {"forward": pytest.approx(0.030), "backward": pytest.approx(0.100)},
    }


def test_the_trace_parser_joins_kernels_to_their_launches():
    """kineto's CUDA trace: a kernel and a copy with the correlation ids of the host calls that launched
    them; their device seconds at the launch's moment on the step's clock (a kernel whose launch is not
    in the trace is dropped)."""
    from dnnperf.probes.memory import START_MARKER, AllocatorEvents

    raw = [
        {"ph": "X", "name": START_MARKER, "ts": 1000.0, "dur": 2.0, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1010.0, "dur": 3.0,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": 1500.0, "dur": 40.0, "args": {"correlation": 5}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 1020.0, "dur": 3.0,
         "args": {"correlation": 6}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 1600.0,
         "dur": 8.0, "args": {"correlation": 6, "bytes": 4096}},
        {"ph": "X", "cat": "kernel", "name": "orphan", "ts": 1700.0, "dur": 9.0, "args": {"correlation": 99}},
    ]  # fmt: skip
    events = AllocatorEvents(torch.device("cuda", 0), origin=0.5, memory=False)
    events._marked_at = 1.0
    trace = events._parse(raw)
    assert trace.kernels == [
        (pytest.approx(0.500009), pytest.approx(40e-6)),
        (pytest.approx(0.500019), pytest.approx(8e-6)),
    ]
    assert trace.copies["DtoD"] == [4096.0, pytest.approx(8e-6)]


def test_layers_against_stages_leaves_out_what_no_layer_did(known_delay):
    """The closure line (layers vs stages): a layer's known forward delay is in the layers' sum; the
    ``(none)`` row (what the instrumented steps left outside every layer) and ``(profiler)`` are not,
    so the remainder is the stage's time that no layer accounts for."""
    _delays["forward"] = known_delay(FORWARD_DELAY_S)
    _delays["backward"] = known_delay(0.0)
    profile = profile_loop(nn.Sequential(nn.Linear(16, 32), Spin(), nn.Linear(32, 4)))
    own = layers.layer_times(profile)
    in_layers = float(
        statistics.median(sum(v for (m, p), v in own.items() if p == "forward" and m != "(profiler)"))
    )
    profile.layer_seconds["(none)"] = {"forward": [1.0] * profile.steps}
    outside = 0.25
    row = layers.closure(profile, {"forward": in_layers + outside}).set_index("phase").loc["forward"]
    assert row["layers_s"] == pytest.approx(in_layers) and row["layers_s"] >= FORWARD_DELAY_S
    assert row["remainder_s"] == pytest.approx(outside)
