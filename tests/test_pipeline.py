"""Pipeline parallelism on 2 gloo ranks: loss and every gradient equal single-process training; the
bubble matches the schedule's analytic share under a known per-stage delay; sent bytes match the
activation at the cut."""

from __future__ import annotations

import itertools
import random
import time

import pytest
import torch

from dnnperf.distributed.partition import balance, pipeline_split
from dnnperf.distributed.pipeline import BACKWARD, FORWARD, pipeline_task, schedule_actions
from dnnperf.errors import UsageError
from pp_tp_ranks import GradCapture, batch_of, build, compare, reference_gradients, run_ranks

BATCH = 8
# (workload, schedule, micro-batches, micro-batches of the single-process reference). ResNet's batch
# norm normalises each micro-batch, so with 4 micro-batches its reference accumulates over the same 4;
# with one micro-batch it is the plain full-batch step.
CASES = [
    ("gpt2", "gpipe", 4, 1),
    ("gpt2", "1f1b", 4, 1),
    ("vgg16", "gpipe", 4, 1),
    ("vgg16", "1f1b", 4, 1),
    ("resnet18", "gpipe", 4, 4),
    ("resnet18", "1f1b", 4, 4),
    ("resnet18", "1f1b", 1, 1),
    # Other supported workloads (resnet50 in float64: see pp_tp_ranks.DOUBLE).
    ("resnet50", "gpipe", 2, 2),
    ("alexnet", "1f1b", 4, 1),
]


def _equivalence(cases: list) -> list[dict]:
    results = []
    for workload, schedule, microbatches, reference_micro in cases:
        batch = batch_of(workload, BATCH)
        task = build(workload)
        names = {id(p): name for name, p in task.model.named_parameters()}
        layers = pipeline_split(workload).layers(build(workload).model)
        pp = pipeline_task(task, workload, schedule=schedule, microbatches=microbatches)
        capture = GradCapture(pp.optimizer)
        loss = float(pp.step(batch))
        expected_loss, expected = reference_gradients(workload, batch, reference_micro)
        # The activation crossing the cut, computed by running stage 0's layers in one process.
        x = batch[pp.input_key]
        with torch.no_grad():
            for _, layer in layers[: len(pp.layer_names[0])]:
                x = layer(x)
        results.append(
            {
                "loss": loss,
                "expected_loss": expected_loss,
                "mismatch": compare({names[k]: g for k, g in capture.grads.items()}, expected),
                "bytes": pp.last_step_bytes(),
                "cut_bytes": x.numel() * x.element_size(),
            }
        )
    return results


@pytest.fixture(scope="module")
def equivalence() -> list[list[dict]]:
    return run_ranks(_equivalence, 2, CASES)


@pytest.mark.concurrent
@pytest.mark.parametrize("index", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_loss_and_gradients_match_single_process(equivalence, index):
    ranks = [rank[index] for rank in equivalence]
    for result in ranks:
        assert result["loss"] == pytest.approx(result["expected_loss"], rel=1e-5, abs=1e-6)
    covered = set().union(*(r["mismatch"] for r in ranks))
    assert covered == {name for name, _ in build(CASES[index][0]).model.named_parameters()}
    assert all(r["mismatch"] for r in ranks), "a stage holds no parameters"
    bad = {name: why for r in ranks for name, why in r["mismatch"].items() if why}
    assert not bad, bad


@pytest.mark.concurrent
@pytest.mark.parametrize("index", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_bytes_are_the_activation_at_the_cut(equivalence, index):
    first, last = (rank[index] for rank in equivalence)
    cut = first["cut_bytes"]
    # Forward: stage 0 sends the activation; backward: stage 1 sends its gradient (same size).
    assert first["bytes"] == {"send": cut, "recv": cut}
    assert last["bytes"] == {"send": cut, "recv": cut}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL pipeline needs two CUDA devices")
def test_nccl_pipeline_matches_single_process():
    """The CUDA path: NCCL point-to-point, CUDA-event detail; the single-process reference on the same GPU."""
    cases = [("gpt2", "1f1b", 4, 1), ("resnet18", "gpipe", 4, 4)]
    for rank in run_ranks(_equivalence, 2, cases, backend="nccl"):
        for result in rank:
            assert result["loss"] == pytest.approx(result["expected_loss"], rel=1e-5, abs=1e-6)
            bad = {name: why for name, why in result["mismatch"].items() if why}
            assert not bad, bad


def _timed(schedule: str, delays: list, microbatches: int, steps: int) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    task = build("basic_cnn")
    pp = pipeline_task(task, "basic_cnn", schedule=schedule, microbatches=microbatches)
    pp.model.register_forward_pre_hook(lambda *_: delays[rank]())
    batch = batch_of("basic_cnn", BATCH)
    starts, walls, details = [], [], []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()  # CLOCK_MONOTONIC: one clock for both ranks on this machine
        pp.step(batch)
        walls.append(time.perf_counter() - start)
        starts.append(start)
        details.append(pp.last_step_detail())
    slept = delays[rank].durations()[-(steps - 1) * microbatches :]
    return {
        "start": starts[1:],
        "wall": walls[1:],
        "detail": details[1:],
        "slept": [slept[i : i + microbatches] for i in range(0, len(slept), microbatches)],
    }


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_is_the_analytic_share_with_equal_stages(schedule, known_delay):
    """Each stage's forward of a micro-batch takes a known 100 ms (the tiny model's own work is a few
    ms), so stage times are equal and the idle share of a step is (p - 1) / (m + p - 1) = 1 / 5: one
    slot of the m + p - 1. The delay sleeps: two spinning ranks on a shared two-core machine get
    descheduled at random.

    Each bound below is one slot, from the logged sleeps and what the rank's own clock says it did,
    so another process slowing a rank widens the step without breaking them: the last stage cannot
    start before the first has slept its first micro-batch's delay (from the first stage's start:
    both ranks read one monotonic clock), all of it waiting; the first stage cannot end before the
    last has slept its last micro-batch's delay after the first sent it; and no rank's idle holds
    its own delays. On a quiet machine they pin the bubble to one slot within the tiny model's own
    work; a rank that booked waiting as compute (or its delays as waiting) falls outside."""
    p, m = 2, 4
    delays = [known_delay(0.1, spin=False), known_delay(0.1, spin=False)]
    first, last = run_ranks(_timed, p, schedule, delays, m, 3)
    for rank, this in enumerate((first, last)):
        steps = zip(this["wall"], this["detail"], this["slept"], strict=True)
        for step, (wall, detail, slept) in enumerate(steps):
            own = sum(slept)
            # Compute holds this rank's own injected delays, and little else at this size.
            assert own <= detail["compute"] <= own + 0.35 * wall
            accounted = sum(detail.values())
            assert 0.9 * wall <= accounted <= wall
            assert detail["bubble"] <= wall - own  # idle is never this rank's own delay
            other_work = detail["compute"] - own  # what this rank did besides its delays (the model)
            waited = detail["bubble"] + detail["recv"] + detail["send"]
            if rank == 0:  # waits at least the last stage's forward of the last micro-batch
                assert waited >= last["slept"][step][-1] - other_work
            else:  # its first action waits for the first stage's first delay, from that stage's start
                head_start = first["start"][step] - this["start"][step]
                assert waited >= head_start + first["slept"][step][0]


def _makespan(schedule: str, world: int, microbatches: int) -> int:
    """Run every rank's actions with unit-time forward and backward, honouring the data
    dependencies; the time the last rank finishes (a deadlock fails the test)."""
    queues = [list(schedule_actions(schedule, r, world, microbatches)) for r in range(world)]
    done: dict[tuple[str, int, int], int] = {}  # (kind, rank, microbatch) -> finish time
    clock = [0] * world
    while any(queues):
        progressed = False
        for r, queue in enumerate(queues):
            if not queue:
                continue
            kind, i = queue[0]
            needs = []
            if kind == FORWARD and r > 0:
                needs.append((FORWARD, r - 1, i))
            if kind == BACKWARD:
                needs.append((FORWARD, r, i))
                if r < world - 1:
                    needs.append((BACKWARD, r + 1, i))
            if all(n in done for n in needs):
                start = max([clock[r], *(done[n] for n in needs)])
                clock[r] = done[(kind, r, i)] = start + 1
                queue.pop(0)
                progressed = True
        assert progressed, f"{schedule} deadlocks"
    return max(clock)


@pytest.mark.concurrent
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("world", "microbatches"), [(2, 1), (2, 4), (3, 5), (4, 8), (4, 2)])
def test_schedules_are_complete_and_take_m_plus_p_minus_1_slots(schedule, world, microbatches):
    for rank in range(world):
        actions = schedule_actions(schedule, rank, world, microbatches)
        assert sorted(actions) == sorted(itertools.product((FORWARD, BACKWARD), range(microbatches)))
        assert all(actions.index((FORWARD, i)) < actions.index((BACKWARD, i)) for i in range(microbatches))
        if schedule == "1f1b":  # activations alive at once: at most world - rank
            alive = peak = 0
            for kind, _ in actions:
                alive += 1 if kind == FORWARD else -1
                peak = max(peak, alive)
            assert peak == min(world - rank, microbatches)
    # Busy 2m slots of 2(m + p - 1): the idle share is (p - 1) / (m + p - 1).
    assert _makespan(schedule, world, microbatches) == 2 * (microbatches + world - 1)


def _worst(costs: list[float], starts: list[int]) -> float:
    return max(sum(costs[a:b]) for a, b in itertools.pairwise([*starts, len(costs)]))


def test_balance_is_the_best_consecutive_cut():
    rng = random.Random(3)
    for _ in range(40):
        costs = [rng.choice([0.0, 1.0, 5.0, rng.random() * 10]) for _ in range(rng.randint(3, 9))]
        parts = rng.randint(1, len(costs))
        starts = balance(costs, parts)
        assert starts[0] == 0 and len(starts) == parts and starts == sorted(set(starts))

        combinations = itertools.combinations(range(1, len(costs)), parts - 1)
        best = min(_worst(costs, [0, *c]) for c in combinations)
        assert _worst(costs, starts) == pytest.approx(best)


def test_unsupported_workload_and_schedule_are_usage_errors():
    with pytest.raises(UsageError, match=r"'transformer'.*gpt2.*vgg16"):
        pipeline_task(build("transformer"), "transformer")
    with pytest.raises(UsageError, match="schedule 'zigzag'"):
        pipeline_task(build("gpt2"), "gpt2", schedule="zigzag")
    with pytest.raises(UsageError, match="own"):
        pipeline_task(build("wgan_gp"), "wgan_gp")
