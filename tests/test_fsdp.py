"""Sharded data parallelism measured: fsdp (FSDP2) and zero1 on 2 CPU ranks train the model single-process
training does, hold 1/N of what they shard (to the byte), and book the waiting in ``exchange``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import run_cli, run_cli_batch
from tests.test_cli import assert_one_line_error
from tests.test_distributed import single_process

from dnnperf.distributed.sharded import shard_units
from dnnperf.results.record import RunRecord
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import count_parameters

STEPS, WARMUP, BATCH = 3, 2, 8
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]


def profile(tmp_path: Path, strategy: str, *extra: str) -> RunRecord:
    result = run_cli(
        "profile", "basic_cnn", "--nproc", "2", "--strategy", strategy, "-b", str(BATCH),
        "--steps", str(STEPS), "--warmup", str(WARMUP), *extra, "--json",
        env={"DNNPERF_RUNS_DIR": str(tmp_path / "runs"), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return RunRecord.from_dict(json.loads(result.stdout)["record"])


@pytest.fixture(scope="module")
def fsdp_record(tmp_path_factory: pytest.TempPathFactory) -> RunRecord:
    return profile(tmp_path_factory.mktemp("fsdp"), "fsdp", "--memory")


@pytest.fixture(scope="module")
def zero1_record(tmp_path_factory: pytest.TempPathFactory) -> RunRecord:
    return profile(tmp_path_factory.mktemp("zero1"), "zero1", "--memory")


@pytest.mark.concurrent
@pytest.mark.parametrize("strategy", ["fsdp", "zero1"])
def test_two_sharded_ranks_train_the_single_process_model(strategy, fsdp_record, zero1_record):
    """The truth: basic_cnn (no batch norm, no dropout) trained in this process on the whole global
    batch. Each rank's loss is its half's mean; their average is the global batch's loss at every step,
    which holds only when every step before updated the same parameters as single-process training."""
    record = fsdp_record if strategy == "fsdp" else zero1_record
    _, losses = single_process("basic_cnn", WARMUP + STEPS, BATCH)
    assert record.points[0].loss == pytest.approx(losses, rel=1e-5)


@pytest.mark.concurrent
def test_fsdp_ranks_side_by_side_with_the_exchange(fsdp_record):
    settings = fsdp_record.settings["distributed"]
    assert settings["strategy"] == "fsdp" and settings["reshard_after_forward"] is True
    ranks = fsdp_record.points[0].ranks
    assert ranks is not None and ranks.strategy == "fsdp" and [r.rank for r in ranks.ranks] == [0, 1]
    for rank in ranks.ranks:
        assert {"forward", "backward", "update", "exchange"} <= set(rank.stages)
        assert all(seconds > 0 for seconds in rank.stages["exchange"])  # every unit gathers every step
        for step, wall in enumerate(rank.wall_s):
            assert sum(values[step] for values in rank.stages.values()) == pytest.approx(wall, rel=1e-6)


@pytest.mark.concurrent
def test_zero1_splits_the_optimizer_state_and_keeps_a_replica(zero1_record):
    """The truth: basic_cnn's SGD with momentum keeps one buffer per parameter, so the whole state is
    the parameters' bytes; ZeroRedundancyOptimizer gives each rank whole parameters' state, so the
    ranks' states add up to it exactly, while parameters and gradients stay whole replicas."""
    parameter_bytes = 4 * count_parameters(get_workload("basic_cnn").build("tiny", "meta").model)
    ranks = zero1_record.points[0].ranks
    assert ranks is not None
    states = [r.memory.category_max["optimizer_state"] for r in ranks.ranks]
    assert sum(states) == parameter_bytes and all(0 < s < parameter_bytes for s in states)
    for rank in ranks.ranks:
        assert rank.memory.category_max["parameters"] == parameter_bytes
        assert rank.memory.category_max["gradients"] == parameter_bytes


@pytest.mark.concurrent
def test_fsdp_ranks_memory_is_their_shards(fsdp_record):
    """The truth: every parameter of basic_cnn has an even dim 0 (8, 16, 64, 10), so FSDP2 on 2 ranks
    gives each rank exactly half of every parameter, of its gradient and of its SGD momentum buffer,
    with no padding; the memory profiler reads the ranks' shards, not the whole tensors."""
    parameter_bytes = 4 * count_parameters(get_workload("basic_cnn").build("tiny", "meta").model)
    ranks = fsdp_record.points[0].ranks
    assert ranks is not None
    for rank in ranks.ranks:
        memory = rank.memory
        assert memory is not None
        for category in ("parameters", "gradients", "optimizer_state"):
            assert memory.category_max[category] == parameter_bytes // 2, category
        assert sum(layer["parameters"] for layer in memory.layers.values()) == parameter_bytes // 2


#: A rank of basic_cnn `tiny` under fsdp on gloo, the worker scripts' start.
BASIC_CNN_RANK = """
import json, sys
import torch, torch.distributed as dist
from dnnperf.data.sources import MemorySource
from dnnperf.distributed.sharded import FullyShardedTask
from dnnperf.distributed.worker import ShardSource
from dnnperf.probes.memory import MemoryTracker, optimizer_tensors, storages
from dnnperf.workloads import get_workload

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
w = get_workload("basic_cnn")
torch.manual_seed(0)
task = FullyShardedTask(w.build("tiny", "cpu"), w.name)
"""

SHARDS_WORKER = (
    BASIC_CNN_RANK
    + """
seen = {}

def at_update(optimizer, args, kwargs):
    seen["gradients"] = sum(storages(p.grad.to_local() for p in task.model.parameters()).values())

task.optimizer.register_step_pre_hook(at_update)
source = ShardSource(MemorySource(w.data("tiny"), 6, seed=0), rank, world)
for _ in range(2):
    task.step(next(source))
seen["parameters"] = sum(storages(p.to_local() for p in task.model.parameters()).values())
seen["optimizer_state"] = sum(storages(optimizer_tensors([task.optimizer])).values())  # local shards
open(f"{sys.argv[1]}.{rank}", "w").write(json.dumps(seen))
dist.destroy_process_group()
"""
)


@pytest.mark.concurrent
def test_fsdp_ranks_hold_their_shards_to_the_byte(tmp_path):
    """3 ranks, so that dim 0 of basic_cnn's tensors (8, 16, 64, 10) does not divide. The truth,
    computed here from the single-process model: FSDP2 shards every parameter on dim 0 with padding, so
    each rank's parameters and gradients are ceil(rows / 3) rows of every tensor; the optimizer's
    buffers are made like the parameter's unpadded local shard, rank r's rows being what is left of
    the tensor after r full shards."""
    world = 3
    script = tmp_path / "shards_worker.py"
    script.write_text(SHARDS_WORKER)
    out = tmp_path / "result"
    result = subprocess.run(
        [*TORCHRUN, f"--nproc-per-node={world}", str(script), str(out)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shapes = [tuple(p.shape) for p in get_workload("basic_cnn").build("tiny", "meta").model.parameters()]
    assert any(shape[0] % world for shape in shapes)  # padding is exercised

    def rows(shape: tuple[int, ...], rank: int) -> int:
        full = math.ceil(shape[0] / world)
        return max(0, min(full, shape[0] - rank * full))

    padded = sum(math.ceil(s[0] / world) * math.prod(s[1:]) * 4 for s in shapes)
    for rank in range(world):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["parameters"] == padded
        assert seen["gradients"] == padded
        assert seen["optimizer_state"] == sum(rows(s, rank) * math.prod(s[1:]) * 4 for s in shapes)
    assert padded < sum(math.prod(s) * 4 for s in shapes) / 2  # about 1/3 of a replica


DELAY_WORKER = """
import json, sys, time
import torch, torch.distributed as dist
from dnnperf.data.sources import MemorySource
from dnnperf.distributed.sharded import FullyShardedTask
from dnnperf.distributed.worker import ShardSource
from dnnperf.probes.clock import StageClock
from dnnperf.workloads import get_workload

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
delay = float(sys.argv[1])
w = get_workload("gpt2")
torch.manual_seed(0)
task = FullyShardedTask(w.build("tiny", "cpu"), w.name)
slept = [0.0]

def late(module, args, output):
    if rank == 1 and delay:
        start = time.perf_counter()
        time.sleep(delay)
        slept[0] = time.perf_counter() - start

task.model.get_submodule("ln_f").register_forward_hook(late)  # ln_f is the root's: no unit's hooks
source = ShardSource(MemorySource(w.data("tiny"), 4, seed=0), rank, world)
clock, steps = StageClock(), []
for _ in range(3):
    batch = next(source)
    clock.begin_step()
    task.step(batch, clock)
    timing = clock.end_step()
    steps.append({"stages": timing.stages, "slept": slept[0]})
open(f"{sys.argv[2]}.{rank}", "w").write(json.dumps(steps))
dist.destroy_process_group()
"""


def test_a_late_rank_shows_as_its_peers_exposed_exchange(tmp_path):
    """The truth: a measured sleep on rank 1 in the forward of a root layer (after the last block).
    Rank 0 then waits that long in the next collective, the all-gather of the last block's parameters
    for backward, which its clock books in ``exchange``; rank 1's sleep is in its ``forward``."""
    delay, margin = 0.3, 0.1
    script = tmp_path / "delay_worker.py"
    script.write_text(DELAY_WORKER)
    out = tmp_path / "result"
    result = subprocess.run(
        [*TORCHRUN, "--nproc-per-node=2", str(script), str(delay), str(out)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    early, late = (json.loads(Path(f"{out}.{r}").read_text()) for r in range(2))
    for step in (1, 2):
        slept = late[step]["slept"]
        assert slept >= delay
        assert late[step]["stages"]["forward"] >= slept
        assert early[step]["stages"]["exchange"] > slept - margin
        assert early[step]["stages"]["forward"] < early[step]["stages"]["exchange"]


TRACKED_WORKER = (
    BASIC_CNN_RANK
    + """
source = ShardSource(MemorySource(w.data("tiny"), 8, seed=0), rank, world)
for _ in range(2):
    task.step(next(source))
steps = []
for _ in range(int(sys.argv[2])):
    batch = next(source)
    tracker = MemoryTracker(task.model, task.optimizers(), batch, resident=False)
    with tracker:
        task.step(batch, tracker)
    steps.append(tracker.result().peak["unattributed"])
open(f"{sys.argv[1]}.{rank}", "w").write(json.dumps({"watched": task.watched, "unattributed": steps}))
dist.destroy_process_group()
"""
)


@pytest.mark.concurrent
def test_fsdp_collective_buffers_released_on_gloos_thread_are_not_held_to_the_steps_end(tmp_path):
    """The truth: an FSDP step holds nothing after it but parameters, gradients and optimizer state
    (FSDP frees its all-gathered parameters and its collective buffers within the step), so no
    tracked step may have unattributed bytes. gloo's worker thread drops the last reference to some
    collective's tensors (FSDP's buffers, gloo's own copies) in most such steps of basic_cnn, a
    release torch's profiler does not see: untold, they counted alive to the step's end."""
    script = tmp_path / "tracked_worker.py"
    script.write_text(TRACKED_WORKER)
    out = tmp_path / "result"
    result = subprocess.run(
        [*TORCHRUN, "--nproc-per-node=2", str(script), str(out), "12"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["watched"]
        assert seen["unattributed"] == [0] * 12


@pytest.mark.concurrent
def test_fsdp_units_are_the_repeated_blocks_without_tied_weights():
    """By hand from the models: gpt2's transformer layers and its position embedding (an Embedding like
    the token embedding, which is tied to lm_head and so stays with the root); resnet18's basic blocks
    (its stem's layers occur once); basic_cnn's two convolutions and two linear layers."""
    units = {
        w: shard_units(get_workload(w).build("tiny", "meta").model) for w in ("gpt2", "resnet18", "basic_cnn")
    }
    assert units["gpt2"] == ["wpe", "blocks.0", "blocks.1"]
    assert units["resnet18"] == [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    assert units["basic_cnn"] == ["conv1", "conv2", "fc1", "fc2"]


BAD_INPUT = [
    (("--nproc", "2", "--strategy", "fsdp", "-b", "7"), ("fsdp splits the global batch 7",)),
    (("--nproc", "2", "--strategy", "dp", "--mixed-precision", "bf16"), ("--mixed-precision", "fsdp")),
    (("--nproc", "2", "--strategy", "zero1", "--no-reshard-after-forward"), ("--reshard-after-forward",)),
    (("--mixed-precision", "bf16"), ("--nproc",)),
]
OWN_STEP = [("profile", "wgan_gp", "--nproc", "2", "--strategy", s) for s in ("fsdp", "zero1")]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    home = tmp_path_factory.mktemp("refused")
    argvs = [["profile", "basic_cnn", *args] for args, _ in BAD_INPUT] + [list(a) for a in OWN_STEP]
    env = {"DNNPERF_RUNS_DIR": str(home / "runs"), "DNNPERF_CACHE_DIR": str(home / "cache")}
    return {tuple(r.args[1:]): r for r in run_cli_batch(argvs, env=env)}


@pytest.mark.concurrent
@pytest.mark.parametrize(("args", "needles"), BAD_INPUT)
def test_bad_sharded_input_is_one_line(args, needles, refused):
    assert_one_line_error(refused[("profile", "basic_cnn", *args)], *needles)


@pytest.mark.concurrent
@pytest.mark.parametrize("argv", OWN_STEP)
def test_sharding_refuses_a_workload_with_its_own_step(argv, refused):
    assert_one_line_error(refused[argv], "wgan_gp", "own step", argv[-1])


@pytest.mark.concurrent
def test_zero1_keeps_the_workloads_optimizer_and_its_hyper_parameters(tmp_path):
    """gpt2's AdamW (lr 1e-3, betas 0.9/0.95, weight decay 0.1, as the workload builds it): its groups
    carry a key AdamW's constructor refuses (decoupled_weight_decay), which zero1 must not pass on.
    One gloo rank in this process."""
    import torch
    import torch.distributed as dist

    from dnnperf.distributed.sharded import ZeroOneTask

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        task = ZeroOneTask(get_workload("gpt2").build("tiny", "cpu"), "gpt2", torch.device("cpu"))
        (inner,) = task.optimizers()
        assert type(inner) is torch.optim.AdamW
        group = inner.param_groups[0]
        assert (group["lr"], group["betas"], group["weight_decay"]) == (1e-3, (0.9, 0.95), 0.1)
    finally:
        dist.destroy_process_group()


CLOSE_WORKER = """
import json, sys
import torch, torch.distributed as dist
from dnnperf.distributed.sharded import FullyShardedTask
from dnnperf.workloads import get_workload

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
w = get_workload("gpt2")
torch.manual_seed(0)
task = FullyShardedTask(w.build("tiny", "cpu"), w.name)
batch = w.data("tiny").synthesize(2, seed=0)
marks = []

class Recorder:
    def mark(self, stage):
        marks.append(stage)

seen = {}
for when in ("open", "closed"):
    marks.clear()
    task.comm.stages = Recorder()
    task.inner.loss_fn(task.model, batch).backward()
    task.comm.stages = None
    task.comm.forget_step()
    seen[when] = list(marks)
    task.close()
print(json.dumps(seen))
dist.destroy_process_group()
"""


@pytest.mark.concurrent
def test_a_closed_fsdp_task_leaves_no_hook_on_the_model(tmp_path):
    """The truth is the hooks' own effect: a forward and backward of the sharded model mark the clock
    (exchange, forward, backward) while the task is open, and nothing once it is closed, though FSDP
    itself still gathers and reduces."""
    result = subprocess.run(
        [sys.executable, "-c", CLOSE_WORKER, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"exchange", "forward", "backward"} <= set(seen["open"])
    assert seen["closed"] == []
