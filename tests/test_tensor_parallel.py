"""Tensor parallelism on 2 gloo ranks: loss, every gradient (gathered from the shards) and the updated
parameters equal single-process training; collectives match Megatron's count and the layer sizes;
each rank holds only its shards; an injected delay in a collective lands in ``collective``."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dnnperf.distributed.tensor_parallel import tensor_parallel_task
from dnnperf.errors import UsageError
from pp_tp_ranks import GradCapture, batch_of, build, compare, reference_gradients, run_ranks

BATCH = 8
# gpt2, vgg16, resnet18: the acceptance set; the others: every other split (resnet50 and inception_v3
# in float64, see pp_tp_ranks.DOUBLE).
WORKLOADS = ["gpt2", "vgg16", "resnet18", "transformer", "alexnet", "resnet50", "inception_v3"]


def _split_layer_sizes(workload: str, batch: dict) -> dict[str, int]:
    """Independent truth for a convnet: every conv/linear's input and output bytes, from hooks on the
    single-process model (every layer of the tiny presets has an even channel count)."""
    task = build(workload)
    sizes = {"gather": 0, "reduce": 0, "reduce_calls": 0, "layers": 0}

    def hook(module, inputs, output):
        sizes["layers"] += 1
        sizes["gather"] += output.numel() * output.element_size() // 2  # each rank's half
        if inputs[0].requires_grad:  # the input gradient is summed over ranks (none for the image)
            sizes["reduce"] += inputs[0].numel() * inputs[0].element_size()
            sizes["reduce_calls"] += 1

    for module in task.model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.register_forward_hook(hook)
    task.loss_fn(task.model, batch)
    return sizes


def _equivalence(workloads: list[str]) -> list[dict]:
    results = []
    for workload in workloads:
        batch = batch_of(workload, BATCH)
        single = build(workload)
        full_bytes = sum(p.numel() * p.element_size() for p in single.model.parameters())
        tp = tensor_parallel_task(build(workload), workload)
        capture = GradCapture(tp.optimizer)
        start = time.perf_counter()
        loss = float(tp.step(batch))
        wall = time.perf_counter() - start
        grads = tp.gather_full(lambda p, grads=capture.grads: grads[id(p)])
        params = tp.gather_full()
        expected_loss, expected = reference_gradients(workload, batch)
        single.step(batch)  # the single-process update, to compare parameters after the step
        # Adam divides each gradient element by its own magnitude, so a gradient that is zero in exact
        # arithmetic (the attention's key bias: softmax ignores it) steps by +-lr on its rounding
        # noise; such parameters are left out of the comparison after the update, not of the gradients.
        noise = {name for name, g in expected.items() if g.abs().max() < 1e-6}
        after = {name: p for name, p in single.model.named_parameters() if name not in noise}
        results.append(
            {
                "loss": loss,
                "expected_loss": expected_loss,
                "grads": compare(grads, expected),
                "params": compare({name: params[name] for name in after}, after),
                "noise": sorted(noise),
                "collectives": tp.last_step_collectives(),
                "detail": tp.last_step_detail(),
                "wall": wall,
                "parameter_bytes": tp.parameter_bytes,
                "full_bytes": full_bytes,
                "shard_shapes": {
                    name: list(p.shape) for name, (p, dim) in tp.layout.items() if dim is not None
                },
                "sizes": _split_layer_sizes(workload, batch) if workload in ("vgg16", "resnet18") else None,
            }
        )
    return results


@pytest.fixture(scope="module")
def ranks() -> list[list[dict]]:
    return run_ranks(_equivalence, 2, WORKLOADS)


def _results(ranks, workload):
    return [rank[WORKLOADS.index(workload)] for rank in ranks]


@pytest.mark.concurrent
@pytest.mark.parametrize("workload", WORKLOADS)
def test_loss_gradients_and_update_match_single_process(ranks, workload):
    expected_names = {name for name, _ in build(workload).model.named_parameters()}
    for result in _results(ranks, workload):
        assert result["loss"] == pytest.approx(result["expected_loss"], rel=1e-5, abs=1e-6)
        assert all(name.endswith("k_proj.bias") for name in result["noise"]), result["noise"]
        assert set(result["grads"]) == expected_names
        assert set(result["params"]) == expected_names - set(result["noise"])
        for kind in ("grads", "params"):
            bad = {name: why for name, why in result[kind].items() if why}
            assert not bad, (kind, bad)


@pytest.mark.concurrent
@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_rank_holds_only_its_shards(ranks, workload):
    full = dict(build(workload).model.named_parameters())
    first, second = _results(ranks, workload)
    assert first["shard_shapes"] == second["shard_shapes"]
    assert first["shard_shapes"], "nothing was split"
    split_bytes = 0
    for name, shape in first["shard_shapes"].items():
        assert sum(shape) < sum(full[name].shape), name  # one dimension halved
        assert 2 * torch.Size(shape).numel() == full[name].numel(), name
        split_bytes += full[name].numel() * full[name].element_size()
    for result in (first, second):
        assert result["parameter_bytes"] == result["full_bytes"] - split_bytes // 2


@pytest.mark.concurrent
def test_megatron_block_has_two_all_reduces_each_way(ranks):
    """GPT-2: per block, attention and MLP each all-reduce the [B, S, D] activation once in forward
    (row-parallel output) and once in backward (the input gradient): 4 per block."""
    config = build("gpt2").model.config
    activation = BATCH * config.seq_len * config.n_embd * 4
    for result in _results(ranks, "gpt2"):
        collectives = result["collectives"]
        assert collectives["calls"] == {"all_reduce": 4 * config.n_layer, "all_gather": 0}
        assert collectives["bytes"]["all_reduce"] == 4 * config.n_layer * activation


@pytest.mark.concurrent
@pytest.mark.parametrize("workload", ["vgg16", "resnet18"])
def test_convnet_gathers_every_output_and_reduces_every_input_gradient(ranks, workload):
    for result in _results(ranks, workload):
        sizes, collectives = result["sizes"], result["collectives"]
        assert collectives["calls"] == {"all_gather": sizes["layers"], "all_reduce": sizes["reduce_calls"]}
        assert collectives["bytes"] == {"all_gather": sizes["gather"], "all_reduce": sizes["reduce"]}


@pytest.mark.concurrent
def test_detail_figures_add_up(ranks):
    for workload in WORKLOADS:
        for result in _results(ranks, workload):
            detail = result["detail"]
            assert detail["collective"] > 0 and detail["compute"] > 0
            assert detail["send"] == detail["recv"] == detail["bubble"] == 0
            assert sum(detail.values()) <= result["wall"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL tensor parallelism needs two CUDA devices")
def test_nccl_tensor_parallel_matches_single_process():
    """The CUDA path: NCCL collectives inside autograd; the single-process reference on the same GPU."""
    for rank in run_ranks(_equivalence, 2, ["gpt2", "vgg16"], backend="nccl"):
        for result in rank:
            assert result["loss"] == pytest.approx(result["expected_loss"], rel=1e-5, abs=1e-6)
            bad = {name: why for name, why in result["grads"].items() if why}
            assert not bad, bad
            assert result["detail"]["collective"] > 0


def _delayed_collective(delay) -> dict:
    """Rank 1 waits a known time before every all-reduce; both ranks should see it as collective."""
    original = dist.all_reduce
    if dist.get_rank() == 1:

        def slow(*args, **kwargs):
            delay()
            return original(*args, **kwargs)

        dist.all_reduce = slow
    tp = tensor_parallel_task(build("gpt2"), "gpt2")
    batch = batch_of("gpt2", BATCH)
    tp.step(batch)  # warm-up
    dist.barrier()
    start = time.perf_counter()
    tp.step(batch)
    wall = time.perf_counter() - start
    dist.all_reduce = original
    calls = tp.last_step_collectives()["calls"]["all_reduce"]
    return {"detail": tp.last_step_detail(), "wall": wall, "calls": calls}


def test_injected_collective_delay_is_counted_as_collective(known_delay):
    delay = known_delay(0.02, spin=False)
    ranks = run_ranks(_delayed_collective, 2, delay)
    injected = sum(delay.per_step(1, ranks[1]["calls"]))
    for result in ranks:
        detail = result["detail"]
        # Rank 1 sleeps inside its collectives; rank 0 waits for it inside the same collectives.
        assert detail["collective"] >= 0.95 * injected
        assert detail["compute"] <= result["wall"] - 0.95 * injected


@pytest.mark.concurrent
@pytest.mark.parametrize("workload", ["gpt2", "transformer", "vgg16", "resnet18", "alexnet"])
def test_the_models_split_moves_the_bytes_the_run_moved(ranks, workload):
    """The performance model's tensor-parallel regions (counted from one single-process step) against
    the bytes the 2-rank run's collectives carried: Megatron blocks all-reduce their output (forward)
    and input gradient (backward); a column-split layer all-gathers its output (each rank its half)
    and all-reduces its input gradient. (resnet50 and inception_v3 run in float64 here: left out.)"""
    from dnnperf.perfmodel.graph import describe_workload

    graph = describe_workload(workload, "tiny", BATCH)
    reduce = gather = 0
    for region in graph.tp_regions:
        if region["count"] % 2:
            continue  # stays whole
        reduce += region["input_bytes"]
        if region["kind"] == "column":
            gather += region["output_bytes"] // 2
        else:
            reduce += region["output_bytes"]
    assert graph.tp_regions and reduce > 0
    for result in _results(ranks, workload):
        assert result["collectives"]["bytes"] == {"all_reduce": reduce, "all_gather": gather}


def test_unsupported_workload_is_a_usage_error():
    with pytest.raises(UsageError, match=r"'seq2seq'.*gpt2.*resnet18.*vgg16"):
        tensor_parallel_task(build("seq2seq"), "seq2seq")
    with pytest.raises(UsageError, match="own"):
        tensor_parallel_task(build("a3c"), "a3c")
