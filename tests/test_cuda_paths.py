"""The CUDA paths of the memory profiler and the memory saver, against independent counters: the caching
allocator's own peak (``torch.cuda.max_memory_allocated``), analytic sizes, and the gradients and
optimizer state of plain training on the same GPU. Skipped on a machine without CUDA; run on a GPU
machine with ``pytest tests/test_cuda_paths.py`` (benchmarks/gpu_check.sh does)."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext

import pytest
import torch
from tests.test_memory import _WithWorkspace
from torch import nn

from dnnperf.memsave import KEEP, OFFLOAD, RECOMPUTE, MemorySaver, Plan, find_units, plan_of
from dnnperf.memsave.run import memsave
from dnnperf.memsave.state import StateSaver
from dnnperf.probes.memory import MemoryTracker
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import SupervisedTask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
FLOAT = 4


@pytest.fixture(autouse=True)
def deterministic():
    """Deterministic cuDNN and no TF32: two runs of one step differ only by what the saver does. (TF32
    rounds a convolution's inputs to 10 bits: the last-bit differences of an atomic reduction, such as
    adaptive average pooling's backward, became 8e-4 relative in vgg16's gradients on an H200.)"""
    flags = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (flags[0].deterministic, flags[0].benchmark, flags[0].allow_tf32, flags[1].allow_tf32)
    flags[0].deterministic, flags[0].benchmark, flags[0].allow_tf32, flags[1].allow_tf32 = (
        True,
        False,
        False,
        False,
    )
    yield
    flags[0].deterministic, flags[0].benchmark, flags[0].allow_tf32, flags[1].allow_tf32 = before


def _mlp(width: int, depth: int, batch: int, momentum: float = 0.9):
    """Linear layers whose every tensor is a multiple of 512 bytes (the caching allocator's rounding)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]).to(CUDA)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
    task = SupervisedTask(model, lambda m, b: nn.functional.mse_loss(m(b["x"]), b["y"]), optimizer)
    data = {"x": torch.randn(batch, width, device=CUDA), "y": torch.randn(batch, width, device=CUDA)}
    return task, data


# -- the memory profiler ---------------------------------------------------------------------------------


def test_cuda_categories_equal_their_analytic_sizes_and_the_allocators_peak():
    """Adam over two 128-wide layers, batch 32: parameters, gradients, two state tensors per parameter,
    the input and the saved activations by hand; the peak is the caching allocator's own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128)).to(CUDA)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = {"x": torch.randn(32, 64, device=CUDA), "y": torch.randn(32, 128, device=CUDA)}
    task = SupervisedTask(model, lambda m, b: nn.functional.mse_loss(m(b["x"]), b["y"]), optimizer)
    task.step(batch)  # the optimizer's state exists
    torch.cuda.synchronize()
    tracker = MemoryTracker(model, [optimizer], batch, device=CUDA)
    with tracker:
        task.step(batch, tracker)
    memory = tracker.result()
    params = (64 * 128 + 128 + 128 * 128 + 128) * FLOAT
    assert memory.measured_by == "cuda caching allocator"
    assert memory.category_max["parameters"] == params
    assert memory.category_max["gradients"] == params
    assert memory.category_max["optimizer_state"] == 2 * params
    assert memory.category_max["input"] == (32 * 64 + 32 * 128) * FLOAT
    # The ReLU's output (saved by it and by the second Linear: one storage) and the model's output.
    assert memory.category_max["activations"] == 2 * 32 * 128 * FLOAT
    assert abs(memory.peak["unattributed"]) <= 0.05 * memory.measured_peak


def _with_workspace():
    """A model whose layer 1 allocates an 8 MiB workspace in backward, after one step (SGD, no state)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), _WithWorkspace(), nn.Linear(128, 128)).to(CUDA)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(32, 64, device=CUDA), "y": torch.randn(32, 128, device=CUDA)}
    task = SupervisedTask(model, lambda m, b: nn.functional.mse_loss(m(b["x"]), b["y"]), optimizer)
    task.step(batch)
    return model, optimizer, batch, task


def test_a_known_cuda_allocation_in_backward_is_the_peak_and_is_placed():
    model, optimizer, batch, task = _with_workspace()
    tracker = MemoryTracker(model, [optimizer], batch, device=CUDA)
    with tracker:
        task.step(batch, tracker)
    memory = tracker.result()
    assert (memory.peak_module, memory.peak_phase) == ("1", "backward")
    assert memory.peak["temporaries"] >= 2**23
    assert memory.measured_peak - 2**23 < 2**18  # the model and its batch: under 256 KiB


def test_a_block_from_before_the_step_freed_mid_step_does_not_move_the_cuda_peak():
    """A 16 MiB tensor allocated before the tracked step and freed by layer 0's forward, as a garbage
    collection of an earlier step's leftovers would: the step's peak is still layer 1's 8 MiB backward
    workspace, not the step's start, where the allocator held 16 MiB more."""
    model, optimizer, batch, task = _with_workspace()
    stale = [torch.empty(2**22, device=CUDA)]  # 16 MiB, unknown to the tracker
    hook = model[0].register_forward_hook(lambda *_: stale.clear())
    tracker = MemoryTracker(model, [optimizer], batch, device=CUDA)
    try:
        with tracker:
            task.step(batch, tracker)
    finally:
        hook.remove()
    memory = tracker.result()
    assert not stale
    assert (memory.peak_module, memory.peak_phase) == ("1", "backward")
    assert memory.measured_peak == memory.layers["1"]["backward_peak"]
    assert 2**23 <= memory.measured_peak < 2**23 + 2**18  # the model and its batch: under 256 KiB


# -- the memory saver: offload to pinned memory, recompute ---------------------------------------------


def _one_step(name: str, plan_for=None):
    """Gradients at the update, buffers and loss of one step of ``name`` at tiny on the GPU."""
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("tiny", CUDA)
    batch = {
        k: v.to(CUDA)
        for k, v in workload.data("tiny").synthesize(workload.default_batch_size["tiny"], 1).items()
    }
    names = {p: n for n, p in task.model.named_parameters()}
    grads: list[dict[str, torch.Tensor]] = []
    handles = [
        o.register_step_pre_hook(
            lambda o, a, k: grads.append(
                {names[p]: p.grad.clone() for g in o.param_groups for p in g["params"] if p.grad is not None}
            )
        )
        for o in task.optimizers()
    ]
    saver = None
    torch.manual_seed(1)  # dropout: the same draws in both runs
    if plan_for is None:
        loss = task.step(batch)
    else:
        saver = MemorySaver(task.model, plan_for(find_units(task.model)))
        with saver:
            loss = task.step(batch)
    for handle in handles:
        handle.remove()
    torch.cuda.synchronize()
    return grads, {n: b.clone() for n, b in task.model.named_buffers()}, loss, saver


def _max_relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("name", ["vgg16", "resnet18", "gpt2"])
def test_pinned_offload_gives_the_gradients_of_the_plain_step(name):
    """Every unit offloaded to the pinned pool on the side stream: the gradients are those of the plain
    step, every byte written is read back. Not bitwise on a GPU: vgg16's adaptive average pooling
    reduces its backward with atomics, in an order that varies from run to run (offloaded against
    plain, 1.9e-6 relative on an H200 with TF32 off); 1e-5 still catches a copy read before it landed."""
    ref_grads, ref_buffers, ref_loss, _ = _one_step(name)
    grads, buffers, loss, saver = _one_step(
        name, lambda units: Plan(policies={u.name: OFFLOAD for u in units}, min_bytes=0)
    )
    assert saver.bytes_written > 0 and saver.bytes_written == saver.bytes_read
    assert len(grads) == len(ref_grads) > 0
    worst = max(_max_relative(g[k], w[k]) for g, w in zip(grads, ref_grads, strict=True) for k in w)
    assert worst <= 1e-5, f"gradients differ by {worst:.2e} relative"
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    for key in ref_buffers:
        torch.testing.assert_close(buffers[key], ref_buffers[key], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["resnet18", "gpt2"])  # BatchNorm; dropout (the CUDA RNG replayed)
def test_recompute_on_cuda_gives_the_gradients_of_the_plain_step(name):
    def mixed(units):
        cycle = (RECOMPUTE, RECOMPUTE, OFFLOAD, KEEP)
        return plan_of(units, {u.name: cycle[i % 4] for i, u in enumerate(units)}, min_bytes=0)

    ref_grads, ref_buffers, ref_loss, _ = _one_step(name)
    grads, buffers, loss, _ = _one_step(name, mixed)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    worst = max(_max_relative(g[k], w[k]) for g, w in zip(grads, ref_grads, strict=True) for k in w)
    assert worst <= 1e-6, f"gradients differ by {worst:.2e} relative"
    for key in ref_buffers:  # BatchNorm's running statistics updated exactly once
        torch.testing.assert_close(buffers[key], ref_buffers[key], rtol=1e-6, atol=1e-7)


def test_offloading_every_unit_lowers_the_allocators_peak_by_the_activations():
    """Eight 256-wide layers at batch 65536: each ReLU's output (64 MiB) is saved for backward, the
    parameters are a few hundred KiB. Plain, the step holds all eight at the end of forward; offloaded
    to the pinned pool, a few at a time (the one in use, one read ahead, backward's gradients): the
    caching allocator's peak falls by at least four of them (on the CPU's disk tier, 5.9 measured)."""
    task, batch = _mlp(width=256, depth=8, batch=65536)
    activation = 65536 * 256 * FLOAT
    for _ in range(2):
        task.step(batch)

    def peak(context) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with context:
            task.step(batch)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    plain = peak(nullcontext())
    plan = Plan(
        policies={u.name: OFFLOAD for u in find_units(task.model)}, min_bytes=0, prefetch_bytes=activation
    )
    saver = MemorySaver(task.model, plan)
    offloaded = peak(saver)
    assert saver.bytes_written >= 8 * activation
    assert plain >= 8 * activation
    assert plain - offloaded >= 4 * activation, (plain / activation, offloaded / activation)


# -- the training state in pinned memory -----------------------------------------------------------------


def test_fused_updates_with_the_state_in_pinned_memory_match_plain_training():
    """gpt2 (AdamW) and resnet18 (SGD, BatchNorm) for three steps, the state in pinned host memory in
    the first and third: parameters and optimizer state those of plain training on the same GPU."""
    for name in ("gpt2", "resnet18"):
        workload = get_workload(name)
        torch.manual_seed(0)
        plain = workload.build("tiny", CUDA)
        fused = copy.deepcopy(plain)
        batch = {k: v.to(CUDA) for k, v in workload.data("tiny").synthesize(4, seed=1).items()}
        for step in range(3):
            with torch.random.fork_rng(devices=[CUDA]):
                torch.manual_seed(step)
                plain.step(batch)
            with (
                StateSaver(fused.optimizers(), offload_state=step != 1),
                torch.random.fork_rng(devices=[CUDA]),
            ):
                torch.manual_seed(step)
                fused.step(batch)
            torch.cuda.synchronize()
            for a, b in zip(plain.model.parameters(), fused.model.parameters(), strict=True):
                torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
            for a, b in zip(plain.optimizers(), fused.optimizers(), strict=True):
                sa, sb = a.state_dict()["state"], b.state_dict()["state"]
                assert sa.keys() == sb.keys()
                for i in sa:
                    assert sa[i].keys() == sb[i].keys()
                    for k in sa[i]:
                        torch.testing.assert_close(sb[i][k], sa[i][k], rtol=1e-6, atol=1e-7)
        assert all(p.grad is None for p in fused.model.parameters())


def _allocated() -> int:
    """Bytes the caching allocator counts once every queued copy is done: a block freed while a side
    stream still used it (``record_stream``) leaves the count only when an allocation processes its
    event, so one is made."""
    torch.cuda.synchronize()
    torch.empty(1, device=CUDA)
    return torch.cuda.memory_allocated()


def test_the_state_leaves_the_device_inside_the_block():
    """SGD's momentum of four 1024-wide layers moved to pinned memory on entering: the allocator's count
    falls by exactly its bytes, and comes back on leaving."""
    task, batch = _mlp(width=1024, depth=4, batch=64)
    task.step(batch)
    momentum = sum(p.numel() * FLOAT for p in task.model.parameters())
    before = _allocated()
    saver = StateSaver([task.optimizer])
    with saver:
        inside = _allocated()
        task.step(batch)
    assert before - inside == momentum
    assert _allocated() == before
    assert saver.bytes_written == momentum


# -- the whole memsave run -----------------------------------------------------------------------------


def test_memsave_on_cuda_measures_its_baselines_and_keeps_its_promise():
    """The whole run on a small CNN: the CUDA baselines (save_on_cpu) are there, every variant's peak
    is the allocator's, and a plan called feasible measures within its budget."""
    workload = get_workload("vgg16")
    torch.manual_seed(0)
    task = workload.build("tiny", CUDA)
    batch = {k: v.to(CUDA) for k, v in workload.data("tiny").synthesize(16, 0).items()}
    result = memsave(task, batch, CUDA, "70%", pairs=2)
    names = [v.name for v in result.variants]
    assert {"none", "save_on_cpu", "offload-all", "sqrt(n)"} <= set(names)
    assert all(v.peak > 0 for v in result.variants)
    if result.feasible:
        planned = result.variant("planner")
        assert planned.peak <= result.budget
    else:
        assert result.reason


def test_your_own_loop_on_cuda_counts_the_device_copy_of_the_batch_not_the_host_one():
    """dnnperf.MemoryProfiler over a loop that copies each host batch to the GPU: the host batch is none
    of the device's memory; parameters, gradients and SGD's momentum by hand; the allocator's own peak
    agrees with the categories."""
    import dnnperf

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128)).to(CUDA)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = [(torch.randn(32, 64), torch.randn(32, 128)) for _ in range(3)]
    profiler = dnnperf.MemoryProfiler(model, optimizer)
    with profiler:
        for inputs, targets in profiler.batches(batches):
            inputs, targets = inputs.to(CUDA), targets.to(CUDA)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
    memory = profiler.result()
    params = (64 * 128 + 128 + 128 * 128 + 128) * FLOAT
    assert memory.peak["input"] == 0  # the host batch
    assert memory.category_max["parameters"] == params
    assert memory.category_max["gradients"] == params
    assert memory.category_max["optimizer_state"] == params
    assert abs(memory.peak["unattributed"]) <= 0.05 * memory.measured_peak


# -- the performance model on a GPU ----------------------------------------------------------------------


def test_a_kernels_floor_is_at_least_what_the_profiler_times_of_it():
    """measure_kernel_floor's seconds per back-to-back tiny kernel against the CUDA profiler's own
    duration of those kernels: the floor holds each kernel and the gap before the next."""
    from torch.profiler import ProfilerActivity, profile

    from dnnperf.perfmodel.calibrate import measure_kernel_floor

    floor = measure_kernel_floor(CUDA)
    tiny = torch.zeros(1, device=CUDA)
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(200):
            tiny.add_(1.0)
        torch.cuda.synchronize()
    kernels = [e for e in trace.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels
    mean_kernel_s = sum(e.device_time for e in kernels) / len(kernels) * 1e-6
    assert mean_kernel_s <= floor < 50e-6


def test_a_gpu_machine_predicts_a_step_from_its_own_calibration():
    """A quick GPU profile with the model's GPU calibrations: an asynchronous machine whose operators
    were described on the GPU (its convolutions replayed there), and whose step (resnet18 `tiny`,
    batch 4) lasts at least as long as the host's issue of its calls and as the device's work, and at
    most both end to end: the queue overlaps them, it never loses or invents time."""
    from dnnperf import calibration
    from dnnperf.perfmodel.calibrate import measure_op_overhead, zoo_calibration
    from dnnperf.perfmodel.compute import op_times, step_time
    from dnnperf.perfmodel.graph import describe_workload
    from dnnperf.perfmodel.machine import from_profile

    profile = calibration.calibrate(CUDA, quick=True)
    overhead = measure_op_overhead(device=CUDA)
    zoo = zoo_calibration(from_profile(profile), repeats=2)
    machine = from_profile(
        profile,
        op_overhead_s=overhead,
        efficiency=zoo.efficiency,
        kernel_s=zoo.kernel_s,
        host_call_s=zoo.host_call_s,
    )
    assert machine.asynchronous and machine.replay_device.startswith("cuda") and machine.host_bandwidth > 0
    assert 0 < zoo.kernel_s < 50e-6 and all(0 < v <= 1 for v in zoo.efficiency.values())
    assert "convolution/forward" in zoo.host_call_s and "free/forward" in zoo.host_call_s
    assert all(0 <= v < 1e-3 for v in zoo.host_call_s.values())
    graph = describe_workload("resnet18", "tiny", 4, machine.replay_device)
    times = op_times(graph, machine)
    assert times["replayed"].any()
    queued = step_time(graph, machine)
    host = queued.overhead_s  # every call's host cost, issued one after another
    device = step_time(graph, dataclasses.replace(machine, dispatch_s=0.0, host_call_s={})).total_s
    assert host > 0 and device > 0
    assert max(host, device) <= queued.total_s * (1 + 1e-9)
    assert queued.total_s <= (host + machine.dispatch_s + device) * (1 + 1e-9)  # the batch's copy: one call


def test_a_replay_behind_a_lead_times_the_kernel_not_its_launch():
    """A small convolution's replay (the device kept busy while the host launches it) against events
    around the same call on an idle GPU, which also time the host's set-up and launch."""
    from dnnperf.perfmodel.kernels import signature, time_call

    x, w = torch.randn(4, 16, 8, 8, device=CUDA), torch.randn(16, 16, 3, 3, device=CUDA)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    call = signature("aten.convolution", args)
    replayed = time_call(call, CUDA, repeats=9).seconds
    idle = []
    for _ in range(9):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.ops.aten.convolution(*args)
        end.record()
        end.synchronize()
        idle.append(start.elapsed_time(end) * 1e-3)
    assert 0 < replayed < sorted(idle)[len(idle) // 2]


def test_the_host_costs_per_call_add_up_to_a_networks_issue_time():
    """A network of 12 conv-BatchNorm-ReLU blocks (a shape not in the zoo): the host seconds the model
    charges its calls (the overhead per kernel call and each family's cost, from the zoo fitted on
    one call per family at a time) against the forward and backward's issue time measured on the host
    clock, nothing synchronised inside: within a factor 1.5 (the GPU host's own spread between
    runs: 20-40%)."""
    import statistics
    import time

    from dnnperf import calibration
    from dnnperf.perfmodel.calibrate import dispatch_net_of_views, op_overhead, zoo_calibration
    from dnnperf.perfmodel.compute import NO_KERNEL
    from dnnperf.perfmodel.machine import from_profile
    from dnnperf.probes.opcount import OpCounter

    profile = calibration.calibrate(CUDA, quick=True)
    zoo = zoo_calibration(from_profile(profile), repeats=3)
    dispatch = dispatch_net_of_views(op_overhead(device=str(CUDA)), zoo.host_call_s, CUDA)
    torch.manual_seed(0)
    net = nn.Sequential(
        *[nn.Sequential(nn.Conv2d(48, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU()) for _ in range(12)]
    ).to(CUDA)
    x = torch.randn(24, 48, 20, 20, device=CUDA, requires_grad=True)
    grad = torch.randn_like(net(x)).detach()
    for _ in range(3):
        net(x).backward(grad)
    counter = OpCounter(net, count=False)
    with counter:
        net(x).backward(grad)
    charged = 0.0
    for r in counter.table():
        own = zoo.host_call_s.get(f"{r.family}/{r.phase}", 0.0)
        charged += r.calls * (own if r.family in NO_KERNEL else dispatch + own)
    issued = []
    for _ in range(15):
        torch.cuda.synchronize()
        started = time.perf_counter()
        net(x).backward(grad)
        issued.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    measured = statistics.median(issued)
    assert measured / 1.5 <= charged <= measured * 1.5, (charged, measured)


def test_the_gpus_host_fit_prices_every_family_its_layers_run():
    """On the GPU's own operators (cuDNN's recurrent layers make their states beside the rnn kernel),
    every family the host fit's layers run is determined by them (``calibrate.identified``)."""
    from dnnperf.perfmodel.calibrate import host_issue_rows, host_zoo, identified
    from dnnperf.perfmodel.compute import NO_KERNEL

    rows = host_issue_rows(host_zoo(CUDA), CUDA, repeats=1)
    kernels = rows[~rows["family"].isin(NO_KERNEL)]
    assert {"memory/forward", "rnn/forward", "matmul/backward"} <= set(
        kernels["family"] + "/" + kernels["phase"]
    )
    assert identified(rows) == set(rows["family"] + "/" + rows["phase"])


def test_a_description_on_the_gpu_times_the_hosts_issue_and_the_prediction_follows_it():
    """A network whose forward sleeps 20 ms on the host (its step waits for its host, as a small
    model's does for its Python): the description times the forward's issue at the sleep or more, and
    the prediction for this host's GPU is at least the phases' measured seconds; without them (the
    calibrated per-call costs alone) it misses the sleep."""
    import time

    from dnnperf.perfmodel.compute import ComputeOptions
    from dnnperf.perfmodel.graph import describe_model
    from dnnperf.perfmodel.machine import preset
    from dnnperf.perfmodel.predict import predict

    class Sleepy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.020)
            return self.conv(x)

    graph = describe_model(Sleepy().to(CUDA), torch.randn(4, 8, 16, 16, device=CUDA))
    assert set(graph.issue_s) == {"forward", "backward", "update"}
    assert graph.issue_s["forward"] >= 0.020
    this_host = dataclasses.replace(preset("h100-ib"), stream_device="cuda:0", asynchronous=True)
    predicted = predict(graph, this_host, 4).step_s
    assert predicted >= sum(graph.issue_s.values())
    assert predict(graph, this_host, 4, options=ComputeOptions(measured_issue=False)).step_s < 0.020
