"""Distributed runs through the real command and launcher: dp equals single-process training on the
combined batch, per-rank measurements reach one record, bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.conftest import run_cli, run_cli_batch
from tests.test_cli import assert_one_line_error

from dnnperf import cli
from dnnperf.data.sources import MemorySource
from dnnperf.distributed.gather import decode, encode
from dnnperf.distributed.ranks import bucket_table, rank_balance, rank_medians, rank_memory
from dnnperf.distributed.worker import model_parallel_available
from dnnperf.results.ranks import RankBreakdown
from dnnperf.results.record import RecordError, RunRecord
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import count_parameters

STEPS, WARMUP, BATCH = 3, 2, 8


def single_process(workload: str, steps: int, batch_size: int) -> tuple[dict[str, np.ndarray], list[float]]:
    """The truth: the same workload trained in this process on the whole batch, as the runner seeds it."""
    w = get_workload(workload)
    torch.manual_seed(0)
    task = w.build("tiny", "cpu")
    source = MemorySource(w.data("tiny"), batch_size, seed=0)
    losses = [float(task.step(next(source))) for _ in range(steps)]
    return {n: p.detach().numpy().copy() for n, p in task.model.named_parameters()}, losses


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One 2-rank dp run of basic_cnn (no batch norm, no dropout: the combined batch is the truth)."""
    root = tmp_path_factory.mktemp("dp")
    params = root / "params.npz"
    scratch = root / "tmp"  # the run's temporary directory: it must be left as it was found
    scratch.mkdir()
    result = run_cli(
        "profile", "basic_cnn", "--nproc", "2", "--strategy", "dp", "-b", str(BATCH),
        "--steps", str(STEPS), "--warmup", str(WARMUP), "--save-params", str(params), "--memory", "--json",
        env={"DNNPERF_RUNS_DIR": str(root / "runs"), "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    return {"document": document, "params": params, "runs": root / "runs", "scratch": scratch}


@pytest.mark.concurrent
def test_a_distributed_profile_writes_its_report_beside_the_record(dp_run):
    """As a single-process profile does: the HTML report, named in the JSON, beside the record, with
    the ranks side by side."""
    document = dp_run["document"]
    report = Path(document["report_path"])
    assert report.parent == Path(document["record_path"]).parent and report.suffix == ".html"
    assert "Ranks" in report.read_text()


@pytest.mark.concurrent
def test_a_run_leaves_nothing_in_the_temporary_directory(dp_run):
    """Neither dnnperf's rank directory nor torchrun's torchelastic_* directory outlives the run. (Any
    process that builds a torch optimizer imports torch._dynamo, which makes its compile cache,
    torchinductor_<user>, there: a cache kept on purpose, not a temporary file.)"""
    left = sorted(p.name for p in dp_run["scratch"].iterdir() if not p.name.startswith("torchinductor_"))
    assert left == []


@pytest.mark.concurrent
def test_dp_two_ranks_end_with_single_process_parameters(dp_run):
    truth, losses = single_process("basic_cnn", WARMUP + STEPS, BATCH)
    with np.load(dp_run["params"], allow_pickle=False) as saved:
        assert sorted(saved.files) == sorted(truth)
        for name, expected in truth.items():
            np.testing.assert_allclose(saved[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
    # The recorded dp loss (mean of the two shards' mean losses) is the combined batch's loss.
    record = dp_run["document"]["record"]
    np.testing.assert_allclose(record["points"][0]["loss"], losses, rtol=1e-5)


@pytest.mark.concurrent
def test_dp_record_has_every_rank_and_every_gradient_byte(dp_run):
    record = RunRecord.from_dict(dp_run["document"]["record"])
    assert record.status == "complete"
    assert record.settings["distributed"]["world_size"] == 2
    assert record.settings["distributed"]["batch"] == "global"
    ranks = record.points[0].ranks
    assert ranks is not None and ranks.world_size == 2 and ranks.steps == STEPS
    assert len({rank.pid for rank in ranks.ranks}) == 2  # two processes reported
    parameters = count_parameters(get_workload("basic_cnn").build("tiny", "meta").model)
    for rank in ranks.ranks:
        for step, wall in zip(rank.buckets, rank.wall_s, strict=True):
            # every gradient element is exchanged once per step, as float32
            assert sum(b["bytes"] for b in step) == 4 * parameters
            assert all(0 < b["seconds"] < wall for b in step)
            for b in step:  # the wait's parts add up to it
                parts = b["skew_s"] + b["queued_s"] + b["shared_s"] + b["allreduce_s"]
                assert parts == pytest.approx(b["seconds"], abs=1e-9)
        # the stages of each rank tile its step
        for i, wall in enumerate(rank.wall_s):
            assert sum(v[i] for v in rank.stages.values()) == pytest.approx(wall, rel=1e-6)
        assert "exchange" in rank.stages
    # rank 0's own numbers are the point's
    assert ranks.ranks[0].wall_s == record.points[0].step_s


@pytest.mark.concurrent
def test_every_ranks_tracked_step_holds_a_whole_replica(dp_run):
    """--memory on 2 dp ranks: each rank's tracked step, gathered on rank 0, holds the whole model's
    parameters and gradients (a replica each) and its own shard of the batch."""
    record = RunRecord.from_dict(dp_run["document"]["record"])
    ranks = record.points[0].ranks
    model = get_workload("basic_cnn").build("tiny", "meta").model
    parameter_bytes = 4 * count_parameters(model)
    memory = rank_memory(ranks)
    assert list(memory.index) == [0, 1]
    for rank in ranks.ranks:
        assert rank.memory is not None and rank.memory.measured_peak > 0
        assert rank.memory.category_max["parameters"] == parameter_bytes
        assert rank.memory.category_max["gradients"] == parameter_bytes
        assert rank.memory.peak["input"] > 0
    assert ranks.ranks[0].memory.to_dict() == record.points[0].memory.to_dict()  # rank 0's is the point's
    assert memory["peak_bytes"].tolist() == [r.memory.measured_peak for r in ranks.ranks]


def test_rank_analyses_against_hand_made_breakdown():
    breakdown = RankBreakdown("dp", 2, "gloo")
    for step in range(3):
        breakdown.add_step(
            [
                {"wall_s": 1.0, "stages": {"forward": 0.4, "exchange": 0.5, "other": 0.1}, "buckets": [
                    {"index": 0, "bytes": 100, "seconds": 0.2 + step}]},
                {"wall_s": 1.0, "stages": {"forward": 0.8, "exchange": 0.1, "other": 0.1}, "buckets": [
                    {"index": 0, "bytes": 100, "seconds": 0.3, "skew_s": 0.1 * step, "queued_s": 0.0,
                     "allreduce_s": 0.3 - 0.1 * step}]},
            ]
        )  # fmt: skip
    medians = rank_medians(breakdown)
    assert medians.loc["busy", 0] == pytest.approx(0.5) and medians.loc["busy", 1] == pytest.approx(0.9)
    balance = rank_balance(breakdown)
    assert bool(balance.loc[1, "slowest"]) and not bool(balance.loc[0, "slowest"])
    assert balance.loc[1, "excess"] == pytest.approx(0.9 / 0.7 - 1)
    buckets = bucket_table(breakdown)
    assert buckets.loc[0, "rank 0 s"] == pytest.approx(1.2) and buckets.loc[0, "steps"] == 3
    assert buckets.loc[0, "rank 1 skew s"] == pytest.approx(0.1)
    assert buckets.loc[0, "rank 1 allreduce s"] == pytest.approx(0.2)
    assert "rank 0 skew s" not in buckets.columns  # rank 0 recorded no split


@pytest.mark.concurrent
def test_ranks_section_round_trip_and_validation(dp_run):
    document = dp_run["document"]["record"]
    again = RunRecord.from_dict(json.loads(json.dumps(document))).to_dict()
    assert again["points"][0]["ranks"] == document["points"][0]["ranks"]
    broken = json.loads(json.dumps(document))
    broken["points"][0]["ranks"]["per_rank"][1]["wall_s"].pop()
    with pytest.raises(RecordError, match=r"ranks: per_rank\[1\].wall_s needs 3 values"):
        RunRecord.from_dict(broken)
    broken = json.loads(json.dumps(document))
    del broken["points"][0]["stages"]  # (its own check would refuse the shorter step_s first)
    broken["points"][0]["step_s"].pop()
    with pytest.raises(RecordError, match="more than the point's 2 measured steps"):
        RunRecord.from_dict(broken)
    broken = json.loads(json.dumps(document))
    broken["points"][0]["ranks"]["per_rank"][0]["stages"]["forward"][0] = -1.0
    with pytest.raises(RecordError, match="not a non-negative number"):
        RunRecord.from_dict(broken)
    broken = json.loads(json.dumps(document))
    broken["points"][0]["ranks"]["per_rank"][1]["buckets"][0][0]["skew_s"] = -0.5
    skew = r"per_rank\[1\]\.buckets\[0\]\[0\]\.skew_s is -0.5, not a non-negative number"
    with pytest.raises(RecordError, match=skew):
        RunRecord.from_dict(broken)
    broken = json.loads(json.dumps(document))
    peak = broken["points"][0]["ranks"]["per_rank"][1]["memory"]["peak"]  # checked as a point's memory
    category = next(name for name in peak if name != "unattributed")
    peak[category] = -5
    with pytest.raises(RecordError, match=rf"per_rank\[1\]\.memory\.peak\.{category} must be a byte count"):
        RunRecord.from_dict(broken)


def test_json_bytes_round_trip():
    document = {"rank": 1, "stages": {"forward": 0.25}, "name": "résumé ✓", "none": None}
    tensor = encode(document)
    assert tensor.dtype == torch.uint8
    padded = torch.cat([tensor, torch.zeros(7, dtype=torch.uint8)])
    assert decode(padded, tensor.numel()) == document
    with pytest.raises(ValueError):
        encode({"x": float("nan")})


@pytest.mark.concurrent
def test_show_prints_ranks_side_by_side(dp_run):
    path = next(Path(dp_run["runs"]).glob("*.json"))
    result = run_cli("show", str(path))
    assert result.returncode == 0, result.stderr
    assert "dp over 2 ranks" in result.stdout and "slowest rank" in result.stdout
    assert "each rank's tracked step" in result.stdout  # --memory: the ranks' peaks side by side
    assert "gradient buckets" in result.stdout
    from dnnperf.report.html import write_report

    record = RunRecord.from_dict(json.loads(path.read_text()))
    html = write_report(record, Path(dp_run["runs"]) / "report-test.html").read_text()
    assert "each rank&#x27;s tracked step at its peak" in html and html.count("<svg") >= 2  # escaped


BAD_INPUT = [
    (("--nproc", "0"), ("--nproc", "positive integer")),
    (("--nproc", "2", "--strategy", "zz"), ("--strategy", "invalid choice")),
    (("--nproc", "2", "-b", "7"), ("global batch 7", "divisible by 2")),
    (("--nproc", "2", "--link-mbit", "100"), ("--netns",)),
    (("--nproc", "2", "--layers"), ("--layers",)),
    (("--nproc", "2", "--strategy", "fsdp", "--save-params", "p.pt"), ("--save-params", "--strategy fsdp")),
    (("--strategy", "dp"), ("--nproc",)),
]
OWN_STEP = ("profile", "wgan_gp", "--nproc", "2")


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """The bad command lines below, in one fresh process (tests/conftest.py: ``run_cli_batch``)."""
    home = tmp_path_factory.mktemp("refused")
    argvs = [["profile", "basic_cnn", *args] for args, _ in BAD_INPUT] + [list(OWN_STEP)]
    env = {"DNNPERF_RUNS_DIR": str(home / "runs"), "DNNPERF_CACHE_DIR": str(home / "cache")}
    return {tuple(r.args[1:]): r for r in run_cli_batch(argvs, env=env)}


@pytest.mark.concurrent
@pytest.mark.parametrize(("args", "needles"), BAD_INPUT)
def test_bad_distributed_input_is_one_line(args, needles, refused):
    assert_one_line_error(refused[("profile", "basic_cnn", *args)], *needles)


@pytest.mark.concurrent
def test_dp_refuses_a_workload_with_its_own_step(refused):
    assert_one_line_error(refused[OWN_STEP], "wgan_gp", "own step")


def test_netns_without_root_is_one_line(monkeypatch, capsys):
    # In-process: a non-root user cannot run this venv's interpreter here (it lives under /root).
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code = cli.main(["profile", "basic_cnn", "--nproc", "2", "--netns"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == (
        "dnnperf: error: --netns needs root (it creates network namespaces and shapes links with tc)"
    )


@pytest.mark.parametrize("strategy", ["pp", "tp"])
def test_missing_model_parallel_strategy_is_one_line(strategy):
    if model_parallel_available(strategy):
        pytest.skip(f"{strategy} is available: its own CLI test covers it")
    assert_one_line_error(run_cli("profile", "gpt2", "--nproc", "2", "--strategy", strategy), strategy)


@pytest.mark.concurrent
@pytest.mark.parametrize(
    ("strategy", "extra", "details"),
    [
        ("pp", ("--schedule", "gpipe", "--microbatches", "2"), ("send", "recv", "bubble", "compute")),
        ("tp", (), ("collective", "compute")),
    ],
)
def test_model_parallel_run_records_its_communication(strategy, extra, details):
    if not model_parallel_available(strategy):
        pytest.skip(f"{strategy} is not there yet")
    result = run_cli(
        "profile", "gpt2", "--nproc", "2", "--strategy", strategy, *extra, "-b", "4", "--steps", "2",
        "--warmup", "1", "--memory", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = RunRecord.from_dict(json.loads(result.stdout)["record"])
    assert record.settings["distributed"]["strategy"] == strategy
    ranks = record.points[0].ranks
    assert ranks is not None and ranks.steps == 2 and ranks.world_size == 2
    for rank in ranks.ranks:
        assert set(details) <= set(rank.detail)
        for i, wall in enumerate(rank.wall_s):
            assert 0 < rank.detail["compute"][i] < wall  # a share of the step, not more
    # --memory: each rank's tracked step holds its own parameters, and gradients of the same size
    held = [rank.memory.category_max["parameters"] for rank in ranks.ranks]
    assert [rank.memory.category_max["gradients"] for rank in ranks.ranks] == held
    total = 4 * count_parameters(get_workload("gpt2").build("tiny", "meta").model)
    tied = 4 * get_workload("gpt2").build("tiny", "meta").model.wte.weight.numel()
    if strategy == "pp":  # the stages' parameters add up to the model's, the tied embedding on both ends
        assert sum(held) == total + tied and min(held) > 0
    else:  # every rank its share of the split layers and the whole of the rest
        assert total / 2 < held[0] == held[1] < total
    if strategy == "pp":  # stage 0 sends activations forward, stage 1 receives them; both idle some
        assert all(v > 0 for v in ranks.ranks[0].detail["send"])
        assert all(v > 0 for v in ranks.ranks[1].detail["recv"])
        assert all(v > 0 for rank in ranks.ranks for v in rank.detail["bubble"])
    else:
        assert all(v > 0 for rank in ranks.ranks for v in rank.detail["collective"])
    assert all(not b for rank in ranks.ranks for b in rank.buckets)  # no DDP buckets outside dp


def test_bucket_wait_split_against_a_hand_made_two_rank_schedule():
    """Rank 0's view of three buckets; rank 1 launched bucket 0 at 0.30 s and was ready for each bucket
    only then (its numbers arrive as ``latest``). One lane: bucket 1 also waits for bucket 0 to finish."""
    from dnnperf.distributed.ddp import ready_times, split_wait

    pending = [(1, 200, 0.10, 0.60), (0, 100, 0.00, 0.50), (2, 300, 0.20, 0.90)]
    assert ready_times(pending, lanes=1) == {0: 0.0, 1: 0.5, 2: 0.6}
    assert ready_times(pending, lanes=2) == {0: 0.0, 1: 0.1, 2: 0.5}
    latest = {0: [0.30, 0.30], 1: [0.35, 0.50], 2: [0.40, 0.60]}  # [latest launch, latest ready]
    buckets = split_wait(pending, latest, lanes=1)
    assert [b["index"] for b in buckets] == [0, 1, 2]
    assert [b["bytes"] for b in buckets] == [100, 200, 300]
    expected = {  # seconds = skew + queued + own, by hand
        "seconds": [0.5, 0.5, 0.7],
        "skew_s": [0.3, 0.25, 0.2],
        "queued_s": [0.0, 0.15, 0.2],
        "allreduce_s": [0.2, 0.1, 0.3],
    }
    for name, values in expected.items():
        assert [b[name] for b in buckets] == pytest.approx(values), name
    # Alone (no peer known): no skew, and the split falls back to this rank's own queue.
    assert [b["shared_s"] for b in buckets] == [0.0, 0.0, 0.0]  # one lane: never two at once
    alone = split_wait(pending, lanes=2)
    assert [b["skew_s"] for b in alone] == [0.0, 0.0, 0.0]
    assert [b["queued_s"] for b in alone] == pytest.approx([0.0, 0.0, 0.3])
    # Two lanes: 0 runs 0-0.5, 1 runs 0.1-0.6, 2 runs 0.6-0.9... from 0.5 (queued until 0 ended).
    # Each moment is split among the collectives running: 0 and 1 share 0.1-0.5, 1 and 2 share 0.5-0.6.
    assert [b["allreduce_s"] for b in alone] == pytest.approx([0.1 + 0.2, 0.2 + 0.05, 0.05 + 0.3])
    assert [b["shared_s"] for b in alone] == pytest.approx([0.2, 0.25, 0.05])
    assert sum(b["allreduce_s"] for b in alone) == pytest.approx(0.9)  # the time any one ran


SKEW_WORKER = """
import json, sys, time
import torch, torch.distributed as dist
from dnnperf.data.sources import MemorySource
from dnnperf.distributed import ddp
from dnnperf.distributed.worker import ShardSource
from dnnperf.workloads import get_workload

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
delay, shift, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
w = get_workload("basic_cnn")
torch.manual_seed(0)
task = ddp.DataParallelTask(w.build("tiny", "cpu"), "basic_cnn", torch.device("cpu"), 0.05)
source = ShardSource(MemorySource(w.data("tiny"), 8, seed=0), rank, world)
steps = []
for late in (None, 1, 0):  # a warm-up step (DDP rebuilds its buckets after it), then each rank late
    batch = next(source)
    dist.barrier()
    loss = task.inner.loss_fn(task.model, batch)
    slept = 0.0
    if rank == late:  # the injected delay between forward and backward, measured
        begin = time.perf_counter()
        time.sleep(delay)
        slept = time.perf_counter() - begin
    loss.backward()
    task.optimizer.step()
    task.optimizer.zero_grad(set_to_none=True)
    steps.append({"late": late, "slept": slept, "buckets": task.timer.take_step()})
# Ranks on different machines: rank 1's clock reads `shift` seconds ahead and its boot id differs,
# so the clock offsets must be estimated (only while the PeerClock is built).
real_clock, real_boot = ddp.time.perf_counter, ddp._boot_id
if rank == 1:
    ddp.time = type("T", (), {"perf_counter": staticmethod(lambda: real_clock() + shift)})
ddp._boot_id = lambda: 1000 + rank
peers = ddp.PeerClock()
ddp.time, ddp._boot_id = __import__("time"), real_boot
result = {"steps": steps, "shared": task.timer.peers.shared, "lanes": task.timer.lanes,
          "estimated": {"shared": peers.shared, "offsets": peers.offsets}}
open(f"{out}.{rank}", "w").write(json.dumps(result))
dist.destroy_process_group()
"""


def test_a_rank_launching_late_shows_as_skew_on_its_peer_not_in_the_allreduce(tmp_path):
    """The truth: a measured sleep on one rank between forward and backward. Its peer launches every
    bucket that much earlier, so the peer waits that long (``seconds``) as ``skew_s``, while the
    collective's own time stays small; the late rank itself waits for nobody."""
    delay, shift = 0.3, 1000.0
    script = tmp_path / "skew_worker.py"
    script.write_text(SKEW_WORKER)
    out = tmp_path / "result"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2"]
    result = subprocess.run(
        [*argv, str(script), str(delay), str(shift), str(out)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},  # torchrun's torchelastic_*
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    margin = 0.1  # basic_cnn tiny's compute differs between the ranks by milliseconds
    for report in ranks:
        assert report["shared"] is True and report["lanes"] >= 1
    for step in (1, 2):
        late = ranks[0]["steps"][step]["late"]
        slept = ranks[late]["steps"][step]["slept"]
        assert slept >= delay
        early = 1 - late
        waiting, late_buckets = ranks[early]["steps"][step]["buckets"], ranks[late]["steps"][step]["buckets"]
        assert len(waiting) >= 2 and len(waiting) == len(late_buckets)  # several buckets at 0.05 MB
        for bucket in waiting:
            total = bucket["skew_s"] + bucket["queued_s"] + bucket["shared_s"] + bucket["allreduce_s"]
            assert total == pytest.approx(bucket["seconds"], abs=1e-9)
            assert slept - margin < bucket["skew_s"] < slept + margin
            assert bucket["allreduce_s"] < margin
        for bucket in late_buckets:
            assert bucket["skew_s"] < margin and bucket["allreduce_s"] < margin
            assert bucket["seconds"] < margin
    # The clock offset of ranks on different machines, estimated from barrier exits.
    for report in ranks:
        estimated = report["estimated"]
        assert estimated["shared"] is False
        assert estimated["offsets"][1] - estimated["offsets"][0] == pytest.approx(shift, abs=0.02)


BUCKETS_WORKER = """
import json, sys
import torch, torch.distributed as dist
from dnnperf.data.sources import MemorySource
from dnnperf.distributed import ddp
from dnnperf.distributed.worker import ShardSource
from dnnperf.workloads import get_workload

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cap = None if sys.argv[1] == "default" else float(sys.argv[1])
w = get_workload("alexnet")
torch.manual_seed(0)
task = ddp.DataParallelTask(w.build("tiny", "cpu"), "alexnet", torch.device("cpu"), cap)
source = ShardSource(MemorySource(w.data("tiny"), 4, seed=0), rank, world)
sizes = []
for _ in range(3):  # DDP rebuilds its buckets in gradient-ready order after the first step
    task.step(next(source))
    sizes.append([b["bytes"] for b in task.timer.take_step()])
open(f"{sys.argv[2]}.{rank}", "w").write(json.dumps(sizes))
dist.destroy_process_group()
"""


@pytest.mark.concurrent
@pytest.mark.parametrize("cap", ["default", "25"])
def test_ddp_buckets_are_the_ones_the_model_predicts(tmp_path, cap):
    """The performance model buckets gradients as DDP does by default (a 1 MiB first bucket, then 25
    MiB, in gradient-ready order): alexnet `tiny` (3.1 MiB of parameters) after DDP's rebuild, against
    ``strategies.gradient_buckets`` on its description. A cap given explicitly (even DDP's own 25)
    drops the small first bucket, so dnnperf passes one only when the user asks."""
    from dnnperf.perfmodel import strategies
    from dnnperf.perfmodel.compute import op_times
    from dnnperf.perfmodel.graph import workload_graph
    from dnnperf.perfmodel.machine import preset

    script = tmp_path / "buckets_worker.py"
    script.write_text(BUCKETS_WORKER)
    out = tmp_path / "sizes"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2"]
    result = subprocess.run(
        [*argv, str(script), cap, str(out)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},  # torchrun's torchelastic_*
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = json.loads(Path(f"{out}.0").read_text())
    assert measured[1] == measured[2]  # settled after the rebuild
    graph = workload_graph("alexnet", "tiny", 2)
    _, predicted, _ = strategies.gradient_buckets(
        op_times(graph, preset("a100-eth")), graph.module_param_bytes
    )
    assert (
        sum(measured[2])
        == sum(predicted)
        == 4 * sum(p.numel() for p in get_workload("alexnet").build("tiny", "cpu").model.parameters())
    )
    if cap == "default":
        assert measured[2] == predicted and len(predicted) >= 2 and predicted[0] >= 1 << 20
    else:
        assert measured[2] == [sum(predicted)]  # one bucket: the first is no longer small
