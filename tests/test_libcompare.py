"""The default-convolution vs im2col+GEMM comparison: the explicit path against F.conv2d (outputs and
gradients), FLOPs against hand arithmetic, capture and hook hygiene, skips, and one timing truth."""

import json
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.analysis import libcompare
from dnnperf.analysis.libcompare import (
    ConvSite,
    LayerComparison,
    capture_conv_inputs,
    compare_convolutions,
    compare_layer,
    comparison_table,
    conv_flops,
    im2col_conv1d,
    im2col_conv2d,
)
from dnnperf.errors import UsageError
from dnnperf.hardware import conv2d_flops
from dnnperf.stats import Samples
from dnnperf.workloads import get_workload

TOL = {"rtol": 1e-4, "atol": 1e-4}


def no_hooks_left(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


class TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x)))


# ---------------------------------------------------------------------------------------------------------
# The explicit path equals F.conv2d
# ---------------------------------------------------------------------------------------------------------

CASES = {
    # name: (input shape, weight shape, bias, stride, padding, dilation, groups)
    "stride 2": ((2, 4, 9, 9), (6, 4, 3, 3), True, 2, 0, 1, 1),
    "padding (1, 2)": ((2, 4, 8, 8), (6, 4, 3, 3), True, 1, (1, 2), 1, 1),
    "dilation 2": ((2, 4, 11, 11), (6, 4, 3, 3), True, 1, 1, 2, 1),
    "groups 2": ((2, 4, 8, 8), (6, 2, 3, 3), True, 1, 1, 1, 2),
    "depthwise": ((2, 6, 8, 8), (12, 1, 3, 3), True, 1, 1, 1, 6),
    "1x1": ((2, 5, 7, 7), (3, 5, 1, 1), True, 1, 0, 1, 1),
    "no bias": ((2, 4, 8, 8), (6, 4, 3, 3), False, 1, 1, 1, 1),
    "non-square": ((2, 3, 7, 12), (5, 3, 3, 5), True, (2, 1), (1, 2), (1, 2), 1),
}


def gradients(fn, x, weight, bias, grad_out_seed=1):
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
    out = fn(*leaves)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_out_seed))
    out.backward(grad_out)
    return out.detach(), [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_im2col_conv2d_equals_conv2d_outputs_and_gradients(case):
    input_shape, weight_shape, with_bias, stride, padding, dilation, groups = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn(input_shape, generator=g)
    weight = torch.randn(weight_shape, generator=g)
    bias = torch.randn(weight_shape[0], generator=g) if with_bias else None
    hyper = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}

    expected, expected_grads = gradients(lambda *t: F.conv2d(*t, **hyper), x, weight, bias)
    got, got_grads = gradients(lambda *t: im2col_conv2d(*t, **hyper), x, weight, bias)

    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, **TOL)
    for mine, reference in zip(got_grads, expected_grads, strict=True):
        if reference is None:
            assert mine is None
        else:
            torch.testing.assert_close(mine, reference, **TOL)


def test_im2col_conv1d_equals_conv1d_outputs_and_gradients():
    g = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(2, 4, 20, generator=g), torch.randn(6, 2, 5, generator=g), torch.randn(6)
    hyper = {"stride": 2, "padding": 3, "dilation": 2, "groups": 2}
    expected, expected_grads = gradients(lambda *t: F.conv1d(*t, **hyper), x, weight, bias)
    got, got_grads = gradients(lambda *t: im2col_conv1d(*t, **hyper), x, weight, bias)
    torch.testing.assert_close(got, expected, **TOL)
    for mine, reference in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(mine, reference, **TOL)


# ---------------------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------------------


def test_flops_equal_hand_arithmetic():
    # N=2, Cin=4, 10x12 input, Cout=6, groups 2, 3x3 kernel, stride 2, padding 1:
    # Hout = (10 + 2 - 2 - 1)//2 + 1 = 5, Wout = (12 + 2 - 2 - 1)//2 + 1 = 6.
    n, c_in, c_out, groups, kh, kw, h_out, w_out = 2, 4, 6, 2, 3, 3, 5, 6
    expected = n * c_out * h_out * w_out * (c_in // groups) * kh * kw * 2
    assert expected == 12960
    assert conv_flops((2, 4, 10, 12), (6, 2, 3, 3), 2, 1, 1, 2) == expected
    assert conv_flops((2, 4, 10, 12), (6, 2, 3, 3), (2, 2), (1, 1), (1, 1), 2) == expected
    assert conv2d_flops((2, 4, 10, 12), (6, 2, 3, 3), 2, 1, 1, 2) == expected  # the same convention

    model = nn.Sequential(nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2))
    x = torch.randn(2, 4, 10, 12)
    [result] = compare_convolutions(model, lambda: model(x), repeats=1, warmup=0)
    assert result.flops_forward == expected
    assert result.flops_backward == 2 * expected
    assert result.output_shape == (2, 6, 5, 6)


# ---------------------------------------------------------------------------------------------------------
# Capture and comparison
# ---------------------------------------------------------------------------------------------------------


def test_capture_records_each_module_and_distinct_shape():
    conv = nn.Conv2d(3, 3, 3, padding=1)
    model = nn.Sequential(conv)
    small, large = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 12, 12)

    def run():
        model(small)
        model(small)
        model(large)

    sites = capture_conv_inputs(model, run)
    assert [(s.name, s.input_shape, s.calls) for s in sites] == [
        ("0", (1, 3, 8, 8), 2),
        ("0", (1, 3, 12, 12), 1),
    ]
    assert all(s.module is conv and s.dtype == torch.float32 for s in sites)
    assert no_hooks_left(model)


def test_two_conv_model_one_entry_per_call_with_times_and_efficiency():
    model = TwoConvs()
    x = torch.randn(2, 3, 16, 16)
    peak = 1e12
    rng_state = torch.get_rng_state()
    results = compare_convolutions(model, lambda: model(x), "cpu", repeats=3, warmup=1, peak_flops=peak)
    assert torch.equal(torch.get_rng_state(), rng_state)  # inputs come from a private generator

    assert [r.name for r in results] == ["conv1", "conv2"]
    assert [r.input_shape for r in results] == [(2, 3, 16, 16), (2, 8, 16, 16)]
    assert [r.output_shape for r in results] == [(2, 8, 16, 16), (2, 4, 7, 7)]
    for r in results:
        assert r.skipped is None
        for method in libcompare.METHODS:
            for phase in libcompare.PHASES:
                samples = r.samples(method, phase)
                assert len(samples) == 3 and all(s > 0 for s in samples.values)
                achieved = r.achieved_flops(method, phase)
                assert achieved == pytest.approx(r.flops(phase) / samples.median)
                assert r.efficiency(method, phase) == pytest.approx(achieved / peak)
        assert r.speedup["forward"] == pytest.approx(r.im2col_forward.median / r.default_forward.median)
        assert r.speedup["backward"] == pytest.approx(r.im2col_backward.median / r.default_backward.median)
    assert no_hooks_left(model)
    # Nothing of the benchmark leaks into the model.
    assert all(p.grad is None for p in model.parameters())

    rows = comparison_table(results)
    json.dumps(rows, allow_nan=False)
    json.dumps([r.to_dict() for r in results], allow_nan=False)
    assert rows[0]["layer"] == "conv1" and rows[0]["default_fwd_ms"] > 0 and rows[0]["ratio_bwd"] > 0

    without_peak = compare_convolutions(model, lambda: model(x), repeats=1, warmup=0)
    assert all(r.efficiency("default", "forward") is None for r in without_peak)
    assert all(r.achieved_flops("default", "forward") > 0 for r in without_peak)


def test_basic_cnn_workload_step():
    workload = get_workload("basic_cnn")
    torch.manual_seed(0)
    task = workload.build("tiny", "cpu")
    batch = workload.data("tiny").synthesize(2, 0)
    progress = []
    results = compare_convolutions(
        task.model,
        lambda: task.step(batch),
        repeats=2,
        warmup=1,
        peak_flops=1e11,
        progress=lambda what, fraction: progress.append(fraction),
    )
    assert [(r.name, r.input_shape, r.kernel, r.padding) for r in results] == [
        ("conv1", (2, 3, 16, 16), (5, 5), (2, 2)),
        ("conv2", (2, 8, 8, 8), (5, 5), (2, 2)),
    ]
    assert all(r.skipped is None and r.default_backward.median > 0 for r in results)
    assert all(r.efficiency("im2col+gemm", "backward") > 0 for r in results)
    assert progress == [0.0, 0.5, 1.0]
    assert no_hooks_left(task.model)


def test_hooks_removed_when_the_forward_raises():
    model = TwoConvs()

    def broken():
        model(torch.randn(1, 3, 8, 8))
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        compare_convolutions(model, broken, repeats=1)
    assert no_hooks_left(model)


def test_conv1d_layers_are_compared():
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv1d(8, 8, 5, stride=2, groups=4))
    x = torch.randn(2, 4, 32)
    results = compare_convolutions(model, lambda: model(x), repeats=1, warmup=0)
    assert [r.module_type for r in results] == ["Conv1d", "Conv1d"]
    assert [r.output_shape for r in results] == [(2, 8, 32), (2, 8, 14)]
    assert all(r.skipped is None and r.im2col_forward.median > 0 for r in results)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_padding_strings_and_modes():
    model = nn.Sequential(
        nn.Conv2d(2, 2, 3, padding="same"),
        nn.Conv2d(2, 2, 3, padding="valid"),
        nn.Conv2d(2, 2, 4, padding="same"),  # uneven: 3 rows of padding
        nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"),
    )
    x = torch.randn(1, 2, 10, 10)
    same, valid, uneven, reflect = compare_convolutions(model, lambda: model(x), repeats=1, warmup=0)
    assert same.skipped is None and same.padding == (1, 1) and same.output_shape == (1, 2, 10, 10)
    assert valid.skipped is None and valid.padding == (0, 0) and valid.output_shape == (1, 2, 8, 8)
    assert uneven.skipped is not None and "same" in uneven.skipped
    assert reflect.skipped is not None and "reflect" in reflect.skipped
    assert len(reflect.default_forward) == 0 and reflect.median_s("default", "forward") is None
    row = comparison_table([reflect])[0]
    assert row["default_fwd_ms"] is None and row["ratio_fwd"] is None and "reflect" in row["skipped"]


# ---------------------------------------------------------------------------------------------------------
# Errors and guards
# ---------------------------------------------------------------------------------------------------------


def test_a_model_without_convolutions_is_a_usage_error():
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(UsageError, match=r"no nn\.Conv1d or nn\.Conv2d"):
        compare_convolutions(model, lambda: model(torch.randn(1, 4)))
    assert no_hooks_left(model)


@pytest.mark.parametrize("bad", [{"repeats": 0}, {"warmup": -1}, {"peak_flops": 0.0}])
def test_bad_numbers_are_usage_errors(bad):
    model = TwoConvs()
    with pytest.raises(UsageError):
        compare_convolutions(model, lambda: model(torch.randn(1, 3, 8, 8)), **bad)


def test_max_bytes_guard_skips_with_a_reason():
    model = TwoConvs()
    x = torch.randn(2, 3, 16, 16)
    results = compare_convolutions(model, lambda: model(x), repeats=1, max_bytes=1000)
    # conv1's columns: N * Cin*kh*kw * Hout*Wout * 4 bytes = 2 * 27 * 256 * 4.
    assert results[0].column_bytes == 2 * 3 * 3 * 3 * 16 * 16 * 4
    for r in results:
        assert r.skipped is not None and "max_bytes" in r.skipped
        assert all(len(r.samples(m, p)) == 0 for m in libcompare.METHODS for p in libcompare.PHASES)
        assert r.flops_forward > 0


def test_a_kernel_error_becomes_a_skip(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("can't allocate memory: you tried to allocate 10 GB")

    monkeypatch.setattr(libcompare, "im2col_conv2d", failing)
    conv = nn.Conv2d(3, 4, 3)
    site = ConvSite("conv", conv, (1, 3, 8, 8), torch.float32, torch.device("cpu"))
    result = compare_layer(site, "cpu", repeats=1, warmup=0)
    assert isinstance(result, LayerComparison)
    assert result.skipped is not None and result.skipped.startswith("out of memory")


# ---------------------------------------------------------------------------------------------------------
# Timing truth
# ---------------------------------------------------------------------------------------------------------


def test_a_known_delay_in_the_im2col_path_shows_in_its_forward_median(monkeypatch, known_delay):
    delay = known_delay(0.005)
    original = libcompare.im2col_conv2d

    def slowed(*args, **kwargs):
        delay()
        return original(*args, **kwargs)

    monkeypatch.setattr(libcompare, "im2col_conv2d", slowed)
    conv = nn.Conv2d(3, 4, 3)
    site = ConvSite("conv", conv, (1, 3, 8, 8), torch.float32, torch.device("cpu"))
    repeats = 5
    result = compare_layer(site, "cpu", repeats=repeats, warmup=1)
    # Each timed forward contains one whole delay call, so every sample is at least its delay and the
    # median at least the median of the delays of the timed calls (the last `repeats` logged).
    delays = delay.per_step(repeats)
    assert len(delay.durations()) == repeats + 1
    assert result.im2col_forward.median >= statistics.median(delays)
    assert len(result.default_forward) == repeats and isinstance(result.default_forward, Samples)
