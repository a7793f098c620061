"""FLOPs per training sample against an analytic count, and the meta/CPU paths against each other."""

import json

import pytest

from dnnperf.analysis import flops
from dnnperf.cache import cache_dir
from dnnperf.probes.opcount import TORCH_FAMILIES, count_step
from dnnperf.workloads import get_workload

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def conv_flops(c_in: int, c_out: int, k: int, h: int, w: int) -> int:
    return 2 * c_in * c_out * k * k * h * w


def test_basic_cnn_products_match_the_analytic_forward_plus_backward_count():
    config = get_workload("basic_cnn").config("tiny")
    c1, c2 = config.channels
    s = config.image_size
    conv1 = conv_flops(config.in_channels, c1, 5, s, s)
    conv2 = conv_flops(c1, c2, 5, s // 2, s // 2)
    fc1 = 2 * (c2 * (s // 4) ** 2) * config.hidden
    fc2 = 2 * config.hidden * config.num_classes
    # Backward: weight gradients for every layer, input gradients for all but the first (the image
    # does not require grad), each costing as much as the forward product.
    expected = 2 * conv1 + 3 * conv2 + 3 * fc1 + 3 * fc2
    counter = count_step("basic_cnn", "tiny", 2, "cpu")
    products = sum(counter.total_flops(phase, families=TORCH_FAMILIES) for phase in ("forward", "backward"))
    assert products == 2 * expected
    # the per-sample figure adds the element-wise work (ReLU, pooling, loss) on top of the products
    flops.training_flops_per_sample.cache_clear()
    per_sample = flops.training_flops_per_sample("basic_cnn", "tiny")
    assert expected < per_sample < 1.1 * expected


def test_meta_and_cpu_counts_agree():
    meta = flops.count_step_flops("resnet18", "tiny", 2, "meta")
    cpu = flops.count_step_flops("resnet18", "tiny", 2, "cpu")
    assert meta == cpu > 0


def test_workloads_meta_cannot_run_are_counted_on_the_cpu_and_cached(monkeypatch):
    flops.training_flops_per_sample.cache_clear()
    with pytest.raises(Exception):  # noqa: B017 - the data-dependent NMS has no meta kernel
        flops.count_step_flops("faster_rcnn", "tiny", 2, "meta")
    value = flops.training_flops_per_sample("faster_rcnn", "tiny")
    assert value == flops.count_step_flops("faster_rcnn", "tiny", 2, "cpu") / 2
    stored = json.loads((cache_dir() / "flops.json").read_text())
    assert list(stored.values()) == [value]
    flops.training_flops_per_sample.cache_clear()

    def no_counting(*args):
        raise AssertionError("counted again instead of reading the disk cache")

    monkeypatch.setattr(flops, "count_step_flops", no_counting)
    assert flops.training_flops_per_sample("faster_rcnn", "tiny") == value


def test_double_backward_steps_are_counted():
    flops.training_flops_per_sample.cache_clear()
    assert flops.training_flops_per_sample("wgan_gp", "tiny") > 0
