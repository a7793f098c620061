"""Every workload of the suite trains for real at `tiny`, and `full` matches the published models."""

import pytest
import torch

from dnnperf.workloads import all_workloads, count_parameters, get_workload

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

EXPECTED_NAMES = {
    "basic_cnn",
    "alexnet",
    "vgg16",
    "vgg19",
    "resnet18",
    "resnet50",
    "inception_v3",
    "seq2seq",
    "transformer",
    "gpt2",
    "deepspeech2",
    "faster_rcnn",
    "wgan_gp",
    "a3c",
    "neumf",
}
# Workloads without a supervised loss: each step must change every trainable parameter instead.
SELF_SUPERVISED = {"wgan_gp", "a3c"}
SUPERVISED = sorted(EXPECTED_NAMES - SELF_SUPERVISED)

# Published parameter counts (torchvision / the papers); the suite's full presets must match within 2%.
PUBLISHED_PARAMETERS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "alexnet": 61_100_840,
    "inception_v3": 23_834_568,  # without the auxiliary head (27,161,264 with it)
    "gpt2": 124_439_808,  # GPT-2 small, tied embeddings
}


def test_the_suite_is_complete():
    assert {w.name for w in all_workloads()} == EXPECTED_NAMES


def fixed_batch(name: str, preset: str = "tiny"):
    workload = get_workload(name)
    batch_size = workload.default_batch_size[preset]
    return workload, workload.data(preset).synthesize(batch_size, seed=0)


@pytest.mark.parametrize("name", SUPERVISED)
def test_loss_falls_over_20_steps_on_a_fixed_batch(name):
    torch.manual_seed(0)
    workload, batch = fixed_batch(name)
    task = workload.build("tiny", "cpu")
    losses = [float(task.step(batch)) for _ in range(20)]
    assert all(torch.isfinite(torch.tensor(losses)))
    # The end of training sits clearly below its start (averages absorb dropout noise).
    start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert end < 0.97 * start, losses


@pytest.mark.parametrize("name", sorted(SELF_SUPERVISED))
def test_one_step_changes_every_trainable_parameter(name):
    torch.manual_seed(0)
    workload, batch = fixed_batch(name)
    task = workload.build("tiny", "cpu")
    before = {n: p.detach().clone() for n, p in task.model.named_parameters() if p.requires_grad}
    loss = task.step(batch)
    assert torch.isfinite(loss)
    unchanged = [n for n, p in task.model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert unchanged == []


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_full_presets_match_published_parameter_counts(name):
    model = get_workload(name).build("full", "meta").model  # meta: shapes only, no memory, no step
    count = count_parameters(model)
    assert count == pytest.approx(PUBLISHED_PARAMETERS[name], rel=0.02)


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_every_preset_builds_and_its_data_matches(name):
    workload = get_workload(name)
    assert set(workload.presets) == {"tiny", "small", "full"}
    for preset in ("small", "full"):
        assert count_parameters(workload.build(preset, "meta").model) > 0
    task = workload.build("tiny", "cpu")
    batch = workload.data("tiny").synthesize(workload.default_batch_size["tiny"], seed=1)
    assert torch.isfinite(task.step(batch))
