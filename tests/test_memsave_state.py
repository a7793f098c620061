"""The training state off the device (memsave/state.py): each update fused into backward and the
optimizer state kept in files between updates. Checked against plain training (parameters and
optimizer state bitwise), against the state's own size (bytes moved, files), against the allocator's
peak with a hand count, and for what it must refuse and leave behind."""

from __future__ import annotations

import copy
import gc
import threading
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import open_files_in
from dnnperf.errors import DnnperfError, UsageError
from dnnperf.memsave import state as state_module
from dnnperf.memsave.planner import MeasuredPlan, MemoryModel, UnitCost, plan_budget
from dnnperf.memsave.policy import Unit
from dnnperf.memsave.run import tracked_step
from dnnperf.memsave.state import StateSaver, check_fusable
from dnnperf.results.memsave import KEEP, OFFLOAD, Plan
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import SupervisedTask


def _state_dicts_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sa.keys() == sb.keys() and all(
        sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k]) for k in sa[i]) for i in sa
    )


@pytest.mark.parametrize("name", ["vgg16", "resnet18", "gpt2"])  # SGD + momentum, BatchNorm, AdamW
def test_fused_steps_leave_the_parameters_and_state_of_plain_training(name, monkeypatch, tmp_path):
    """Three steps: the first and third with the state in files, the second with it kept, in chunks of
    1000 elements (many per parameter, a short last one): parameters and optimizer state bitwise those
    of three plain steps, after each block and at the end."""
    monkeypatch.setattr(state_module, "CHUNK_ELEMENTS", 1000)
    workload = get_workload(name)
    torch.manual_seed(0)
    plain = workload.build("tiny", "cpu")
    fused = copy.deepcopy(plain)
    batch = workload.data("tiny").synthesize(4, seed=1)
    for step in range(3):
        with torch.random.fork_rng():
            torch.manual_seed(step)
            plain.step(batch)
        saver = StateSaver(fused.optimizers(), offload_dir=tmp_path, offload_state=step != 1)
        with saver, torch.random.fork_rng():
            torch.manual_seed(step)
            fused.step(batch)
        for a, b in zip(plain.model.parameters(), fused.model.parameters(), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(plain.optimizers(), fused.optimizers(), strict=True):
            assert _state_dicts_equal(a, b)
    assert all(p.grad is None for p in fused.model.parameters())  # applied and freed in backward
    del saver  # never closed: its files go when it is collected
    gc.collect()
    assert list(tmp_path.iterdir()) == [] and not open_files_in(tmp_path)


def _mlp(width: int = 512, depth: int = 3) -> tuple[SupervisedTask, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(depth)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    task = SupervisedTask(model, lambda m, b: m(b["x"]).square().mean(), optimizer)
    return task, {"x": torch.randn(2, width)}


def test_the_state_lies_in_files_of_its_own_size_between_updates(tmp_path):
    """Inside the block no momentum is on the device; its files hold exactly the parameters' bytes; a
    step writes and reads each byte of it once (the hand count: numel x 4 bytes per parameter)."""
    task, batch = _mlp()
    task.step(batch)  # the momentum exists
    optimizer = task.optimizer
    state_bytes = sum(p.numel() * 4 for p in task.model.parameters())
    saver = StateSaver([optimizer], offload_dir=tmp_path)
    files = []
    for _ in range(2):  # the second block rewrites the files the first opened
        with saver:
            assert all("momentum_buffer" not in optimizer.state[p] for p in task.model.parameters())
            files.append(open_files_in(tmp_path))
            assert sum(files[-1].values()) == state_bytes  # unlinked, so not in the directory
            assert all("(deleted)" in name for name in files[-1])
            task.step(batch)
            assert all("momentum_buffer" not in optimizer.state[p] for p in task.model.parameters())
        assert saver.bytes_written == state_bytes
        # Read: all of it, and the next step's first chunk read ahead (one chunk at most).
        assert state_bytes <= saver.bytes_read <= state_bytes + state_module.CHUNK_ELEMENTS * 4
        assert all(optimizer.state[p]["momentum_buffer"].shape == p.shape for p in task.model.parameters())
    assert files[0] == files[1]
    saver.close()
    assert list(tmp_path.iterdir()) == [] and not open_files_in(tmp_path)


def _tracked_peak(task: SupervisedTask, batch: dict[str, torch.Tensor]) -> int:
    return tracked_step(task, batch, torch.device("cpu"), nullcontext).measured_peak


def test_the_peak_loses_every_gradient_but_one_and_the_whole_state(tmp_path):
    """Three 4 MiB layers, SGD with momentum and weight decay. Plain, the update holds parameters,
    gradients, momentum and weight decay's copy of a gradient: 4 x 4 MiB at least. With the state
    saver: the parameters, one layer's gradient and a few chunks: the hand count, from the allocator."""
    task, batch = _mlp(width=1024)
    layer = 1024 * 1024 * 4
    for _ in range(2):
        task.step(batch)
    plain = _tracked_peak(task, batch)
    with StateSaver([task.optimizer], offload_dir=tmp_path):
        task.step(batch)  # the read-ahead order learnt
        fused = _tracked_peak(task, batch)
    chunk = state_module.CHUNK_ELEMENTS * 4
    assert plain >= 3 * layer + 3 * layer + layer  # parameters, gradients + momentum, one copy
    # Parameters, one gradient, and at most: two chunks read back, the update's temporary, the
    # momentum chunk, and the activations and their gradients (2 x 1024 floats a layer: tiny).
    assert 3 * layer + layer <= fused <= 3 * layer + layer + 4 * chunk + 256 * 1024


def test_nothing_is_left_after_an_error_in_the_middle_of_backward(tmp_path):
    """A layer whose backward raises after the last layer was updated: the error reaches the caller;
    files, the reader thread and the hooks are gone; the state of the layers not reached is back in the
    optimizer and the layer already updated keeps its new momentum."""

    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("injected failure in backward")

    task, batch = _mlp()
    task.step(batch)
    first, _, last = task.model
    before = task.optimizer.state[first.weight]["momentum_buffer"].clone()
    task.loss_fn = lambda m, b: m[2](Fails.apply(m[1](m[0](b["x"])))).square().mean()
    with pytest.raises(RuntimeError, match="injected"), StateSaver([task.optimizer], offload_dir=tmp_path):
        task.step(batch)
    assert list(tmp_path.iterdir()) == []
    assert not any(t.name.startswith("dnnperf-state") for t in threading.enumerate())
    assert torch.equal(task.optimizer.state[first.weight]["momentum_buffer"], before)  # not reached
    assert "momentum_buffer" in task.optimizer.state[last.weight]
    task.model.zero_grad(set_to_none=True)
    task.model(batch["x"]).sum().backward()
    assert all(p.grad is not None for p in task.model.parameters())  # no hook left to apply them


class _Clipped(SupervisedTask):
    """Clips by the global norm before the update: each update needs every gradient."""

    def step(self, batch, stages=None):
        self.loss_fn(self.model, batch).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1e-3)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class _Accumulated(SupervisedTask):
    """Two backward passes (half a batch each) per update."""

    def step(self, batch, stages=None):
        for half in (batch["x"][:1], batch["x"][1:]):
            self.loss_fn(self.model, {"x": half}).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def test_an_update_that_needs_every_gradient_or_two_backwards_is_refused():
    task, batch = _mlp()
    check_fusable(task, batch)  # plain SGD: fusable
    for kind in (_Clipped, _Accumulated):
        other = kind(task.model, task.loss_fn, task.optimizer)
        with pytest.raises(UsageError, match=r"cannot be fused into backward: parameter 0\.weight"):
            check_fusable(other, batch)


def test_an_offload_directory_that_cannot_be_made_is_a_clear_error(tmp_path):
    task, _ = _mlp()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with (
        pytest.raises(DnnperfError, match="cannot use offload directory"),
        StateSaver([task.optimizer], offload_dir=blocker / "sub"),
    ):
        pass
    with pytest.raises(UsageError, match="no trainable parameter"):
        StateSaver([torch.optim.SGD([torch.zeros(2)], lr=0.1)])

    class NeedsMore(torch.optim.SGD):
        def __init__(self, params, scale):  # a user's optimizer with an argument of its own
            super().__init__(params, lr=0.1 * scale)

    with pytest.raises(UsageError, match="cannot fuse NeedsMore's update into backward"):
        StateSaver([NeedsMore(task.model.parameters(), 1.0)])


def _units(n: int) -> list[Unit]:
    return [Unit(f"u{i}", "seq", i) for i in range(n)]


def test_fused_updates_hold_one_units_gradients_in_the_model():
    """The planner's model of a unit's backward: every gradient so far, or (fused) the unit's own. Two
    units with gradients 100 and 30 bytes, nothing saved: the unfused peak is at unit 0 (130 bytes of
    gradients), the fused one at unit 0 too (100), the difference 30: the hand count."""
    costs = [UnitCost("u0", 0, 0, 0.001, 100), UnitCost("u1", 0, 0, 0.001, 30)]
    unfused = MemoryModel(_units(2), costs, 1000, 0.0, 0)
    fused = MemoryModel(_units(2), costs, 1000, 0.0, 0, fused_update=True)
    assert unfused._alive({}, []) - fused._alive({}, []) == 30
    assert unfused.rest == fused.rest - 30  # both fitted on the same measured peak


def test_the_planner_offloads_the_training_state_only_when_it_must():
    """Four units saving 300 bytes each, gradients 50 each; unoptimised peak 2000 bytes (offloading every
    activation: 1750 predicted), measured state baseline 1700 bytes at 5 ms (with every activation
    offloaded: 1400). A budget the activations alone can meet keeps the state (offloading is cheaper
    than 5 ms); one they cannot is met with the state off the device; without a state baseline it is
    infeasible; ``state_only`` never keeps it."""
    units = _units(4)
    costs = [UnitCost(u.name, 300, 300, 0.001, 50) for u in units]
    state = MeasuredPlan("offload-state", Plan(training_state=OFFLOAD), 1700, 0.005)
    easy = plan_budget(units, costs, 2000, 1900, 1e-6, 0, min_bytes=0, state=state)
    assert easy.feasible and easy.plan.training_state == KEEP and easy.predicted_overhead_s < 0.005
    hard = plan_budget(units, costs, 2000, 1600, 1e-6, 0, min_bytes=0, state=state)
    assert hard.feasible and hard.plan.training_state == OFFLOAD and hard.plan.policies
    assert hard.predicted_peak <= 1600 * 0.98 and hard.predicted_overhead_s >= 0.005
    assert hard.table["unit"].iloc[-1].startswith("(training state")
    assert hard.table["predicted_cost_s"].iloc[-1] == 0.005
    assert not plan_budget(units, costs, 2000, 1600, 1e-6, 0, min_bytes=0).feasible
    floor = plan_budget(units, costs, 2000, 1000, 1e-6, 0, min_bytes=0, state=state)
    assert not floor.feasible and "smallest predicted peak is 1,400 bytes" in floor.reason
    # An offloaded byte priced for this mode (measured beside the state's own I/O): the same plan, each
    # of its 300-byte writes at 1 s.
    dear = plan_budget(
        units, costs, 2000, 1600, 1e-6, 0, min_bytes=0, state=state, state_offload_s_per_byte=1.0
    )
    written = sum(300 for policy in hard.plan.policies.values() if policy == OFFLOAD)
    assert dear.plan == hard.plan and dear.predicted_overhead_s == pytest.approx(0.005 + written)
    assert hard.predicted_overhead_s == pytest.approx(0.005 + written * 1e-6)
    forced = plan_budget(units, costs, 2000, 1900, 1e-6, 0, min_bytes=0, state=state, state_only=True)
    assert forced.feasible and forced.plan.training_state == OFFLOAD
    assert Plan.from_dict(hard.plan.to_dict()) == hard.plan


def test_a_plan_dict_without_a_training_state_keeps_it(tmp_path: Path):
    """Records written before the training state existed read as keep."""
    assert Plan.from_dict({"policies": {}, "segments": []}).training_state == KEEP
    with pytest.raises(UsageError, match="training-state"):
        Plan(training_state="drop").validate([])


def test_a_full_disk_is_one_clear_error_and_leaves_nothing(monkeypatch, tmp_path):
    """Writing the state fails with ENOSPC: a DnnperfError saying the disk is full and naming the
    directory; nothing is left in it and the momentum is still in the optimizer."""
    import errno

    task, batch = _mlp()
    task.step(batch)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_module.os, "pwrite", full)
    saver = StateSaver([task.optimizer], offload_dir=tmp_path)
    full_disk = f"disk full: cannot write optimizer state to {tmp_path}: No space left"
    with pytest.raises(DnnperfError, match=full_disk), saver:
        pass
    assert list(tmp_path.iterdir()) == []
    assert all("momentum_buffer" in task.optimizer.state[p] for p in task.model.parameters())


class _Reversed(nn.Module):
    """Layers run in the reverse of their registration: backward updates them in registration order,
    the opposite of a saver's first guess."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in reversed(self.layers):
            x = layer(x)
        return x


def test_a_wrong_first_guess_of_the_order_reads_nothing_twice(monkeypatch, tmp_path):
    """The first step of a saver guesses backward's order; where the guess is wrong, the read-ahead
    must not fetch a parameter already updated (that read would wait, held, until the next step):
    one step reads the state once, plus the next step's first chunk; a saver entered again starts
    from the order learnt."""
    monkeypatch.setattr(state_module, "LEARNT_ORDER", state_module.weakref.WeakKeyDictionary())
    torch.manual_seed(0)
    model = _Reversed(512, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    task = SupervisedTask(model, lambda m, b: m(b["x"]).square().mean(), optimizer)
    batch = {"x": torch.randn(2, 512)}
    task.step(batch)
    state_bytes = sum(p.numel() * 4 for p in model.parameters())
    chunk = state_module.CHUNK_ELEMENTS * 4
    for _ in range(2):
        saver = StateSaver([optimizer], offload_dir=tmp_path)
        with saver:
            task.step(batch)
        assert state_bytes <= saver.bytes_read <= state_bytes + chunk
    assert state_module.LEARNT_ORDER[optimizer] == [id(p) for p in model.parameters()]
