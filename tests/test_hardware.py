"""Hardware calibration: a quick real calibration, the work accounting behind its rates, the profile
file format, and the roofline helpers (checked analytically on hand-built profiles)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from dnnperf import calibration
from dnnperf import hardware as hw
from dnnperf.calibration import compute
from dnnperf.calibration.memory import MemorySweeps
from dnnperf.calibration.plans import PLANS
from dnnperf.calibration.timing import BackgroundLoad, Tracker, bytes_text
from dnnperf.errors import UsageError
from dnnperf.stats import Samples

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def calibrated() -> tuple[hw.HardwareProfile, list[tuple[str, float]]]:
    """One quick CPU calibration shared by the tests below, with the progress it reported."""
    reports: list[tuple[str, float]] = []
    profile = calibration.calibrate(CPU, progress=lambda text, done: reports.append((text, done)), quick=True)
    return profile, reports


@pytest.fixture
def profile(calibrated: tuple[hw.HardwareProfile, list[tuple[str, float]]]) -> hw.HardwareProfile:
    return calibrated[0]


def all_timings(profile: hw.HardwareProfile) -> list[hw.KernelTiming]:
    timings = [p for curve in profile.compute for p in curve.points]
    timings += [p for curve in profile.memory for p in curve.points]
    timings += list((profile.host_transfer or {}).values())
    return [*timings, profile.dispatch]


def assert_ordered(samples: Samples, what: str) -> None:
    assert len(samples) > 0, what
    assert all(math.isfinite(v) and v > 0 for v in samples.values), what
    assert samples.p10 <= samples.median <= samples.p90, what


# -- the quick calibration ---------------------------------------------------------------------------


def test_quick_calibration_measures_positive_finite_ordered_values(profile: hw.HardwareProfile) -> None:
    timings = all_timings(profile)
    assert len(timings) > 10
    for timing in timings:
        assert timing.calls >= 1 and timing.work > 0
        assert_ordered(timing.time, f"{timing.label} time")
        assert_ordered(timing.rate, f"{timing.label} rate")
    for kernel in ("copy", "triad"):
        for name, plateau in profile.cache_plateaus(kernel).items():
            assert_ordered(plateau, f"{kernel} {name} plateau")
    assert_ordered(profile.dispatch_us, "dispatch")
    for value in (profile.peak_flops(torch.float32), profile.memory_bandwidth, profile.dispatch_overhead_us):
        assert math.isfinite(value) and value > 0


def test_quick_calibration_describes_the_cpu(profile: hw.HardwareProfile) -> None:
    assert profile.device_type == "cpu" and profile.device_index is None and profile.quick
    assert profile.threads == torch.get_num_threads()
    assert profile.environment["machine"]["cpu_model"] == profile.device_name
    assert {c.op for c in profile.compute} == {"matmul", "conv2d"}
    assert {c.precision for c in profile.compute} <= {"float32", "bfloat16"}
    # bfloat16 is tried on CPU and the profile says what came of it.
    bf16 = profile.curves("matmul", "bfloat16")
    assert bf16 and bf16[0].points and bf16[0].note
    assert {m.kernel for m in profile.memory} == {"copy", "triad"}
    # No host<->device copies on a CPU: recorded as not applicable, with the reason.
    assert profile.host_transfer is None and "not applicable" in (profile.host_transfer_reason or "")
    assert profile.host_bandwidth("h2d") is None
    assert profile.duration_s > 0


def test_progress_is_monotonic_and_ends_at_one(
    calibrated: tuple[hw.HardwareProfile, list[tuple[str, float]]],
) -> None:
    _, reports = calibrated
    fractions = [done for _, done in reports]
    assert len(reports) > 5 and all(isinstance(text, str) and text for text, _ in reports)
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_calibrated_matmul_peak_is_plausible(profile: hw.HardwareProfile) -> None:
    """Independent check: not more than 2x below a naive single timed call, not above the hardware."""
    n = min(int(p.params["n"]) for p in profile.curves("matmul", "float32")[0].points)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # first-call setup (thread pool, BLAS dispatch) is not the rate
    start = time.perf_counter()
    torch.mm(a, b)
    reference = 2 * n**3 / (time.perf_counter() - start)
    peak = profile.peak_flops(torch.float32, op="matmul")
    assert peak >= reference / 2
    # Upper bound: 3.5 GHz x 64 FP32 FLOP/cycle per core (two AVX-512 FMA units x 16 lanes x 2 FLOPs,
    # the most any x86 core does; 3.5 GHz is above the all-core AVX-512 clock of server parts like this
    # one) times every core the process may use.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert peak <= cores * 3.5e9 * 64


def test_a_precision_too_slow_to_be_a_peak_is_kept_but_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # Demand bfloat16 be 1000x faster than float32: it is tried, timed at one size, and set aside.
    monkeypatch.setattr(compute, "SANE_FRACTION", 1000.0)
    profile = calibration.calibrate(CPU, quick=True)
    for op in hw.OPS:
        (curve,) = profile.curves(op, "bfloat16")
        assert not curve.usable and len(curve.points) == 1 and "not used" in (curve.note or "")
        assert_ordered(curve.points[0].rate, curve.points[0].label)
        with pytest.raises(hw.NotMeasuredError, match="bfloat16"):
            profile.peak_flops(torch.bfloat16, op=op)
    assert "bfloat16" not in profile.summary()["peak_flops"]["matmul"]
    reloaded = hw.HardwareProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert reloaded == profile


# -- work accounting ------------------------------------------------------------------------------------


def test_matmul_flops_match_hand_computed_values_and_the_flop_counter() -> None:
    assert hw.matmul_flops(2, 3, 4) == 48
    assert hw.matmul_flops(512, 512, 512) == 2 * 512**3
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, b)
    assert counter.get_total_flops() == hw.matmul_flops(5, 7, 3)


@pytest.mark.parametrize(
    ("input_shape", "weight_shape", "kwargs"),
    [
        ((1, 3, 5, 5), (2, 3, 3, 3), {}),
        ((8, 64, 28, 28), (64, 64, 3, 3), {"padding": 1}),
        ((2, 16, 15, 17), (32, 16, 3, 5), {"stride": 2, "padding": 2}),
        ((2, 8, 20, 20), (12, 2, 3, 3), {"groups": 4, "dilation": 2, "padding": 1}),
    ],
)
def test_conv2d_flops_match_the_flop_counter(
    input_shape: tuple[int, ...], weight_shape: tuple[int, ...], kwargs: dict[str, int]
) -> None:
    x, w = torch.randn(input_shape), torch.randn(weight_shape)
    with FlopCounterMode(display=False) as counter:
        out = F.conv2d(x, w, **kwargs)
    assert hw.conv2d_flops(input_shape, weight_shape, **kwargs) == counter.get_total_flops()
    geometry = {k: v for k, v in kwargs.items() if k != "groups"}
    assert hw.conv2d_output_hw(*input_shape[2:], weight_shape[2:], **geometry) == tuple(out.shape[2:])


def test_conv2d_flops_by_hand() -> None:
    # 2 * N * Cout * Hout * Wout * Cin * kh * kw with a 3x3 output.
    assert hw.conv2d_flops((1, 3, 5, 5), (2, 3, 3, 3)) == 2 * 1 * 2 * 3 * 3 * 3 * 3 * 3
    with pytest.raises(ValueError, match="groups"):
        hw.conv2d_flops((1, 4, 5, 5), (2, 3, 3, 3))


def test_bytes_moved_counts_reads_and_writes() -> None:
    assert hw.bytes_moved("copy", 1000) == 2000  # read src, write dst
    assert hw.bytes_moved("triad", 1000) == 3000  # read b and c, write a
    with pytest.raises(ValueError, match="unknown memory kernel"):
        hw.bytes_moved("scale", 1000)


def test_memory_points_use_that_accounting(profile: hw.HardwareProfile) -> None:
    for curve in profile.memory:
        assert curve.points
        for point in curve.points:
            nbytes = point.params["nbytes"]
            assert point.work == hw.bytes_moved(curve.kernel, nbytes)
            assert point.params["footprint"] == hw.TENSORS_TOUCHED[curve.kernel] * nbytes
        assert [size for size, _ in curve.curve()] == sorted(size for size, _ in curve.curve())


# -- the profile file ------------------------------------------------------------------------------------


def test_only_a_profile_of_this_host_replays_kernels(profile: hw.HardwareProfile) -> None:
    from dnnperf.perfmodel.machine import from_profile

    assert from_profile(profile).replay_device == "cpu"
    elsewhere = replace(profile, device_key="another-host-cpu")
    assert from_profile(elsewhere).replay_device == ""
    machine = {**profile.environment["machine"], "gpus": [{"index": 0, "memory_bytes": 80_000_000_000}]}
    gpu = {**profile.environment, "machine": machine}  # as environment.describe() records it
    elsewhere_gpu = from_profile(replace(profile, device_type="cuda", device_index=0, environment=gpu))
    assert elsewhere_gpu.replay_device == ""
    # A GPU's profile is an asynchronous machine with the GPU's memory, not the host's.
    assert elsewhere_gpu.asynchronous and not from_profile(profile).asynchronous
    assert elsewhere_gpu.memory_bytes == 80e9 and not elsewhere_gpu.comm_on_compute_cores


def test_a_link_put_on_a_calibrated_machine_keeps_every_other_term(profile: hw.HardwareProfile) -> None:
    """The distributed validation puts the fitted link on the calibrated machine (with_link): it must
    equal the machine built with that link from the start, host-work terms included (a machine rebuilt
    from some of its parts had lost the split regions' and DDP's)."""
    from dnnperf.perfmodel.machine import LOOPBACK_ALPHA, from_profile, with_link

    link = {
        "alpha": 2e-4,
        "bandwidth": 1.5e9,
        "reduce_bandwidth": 9e9,
        "ops": {"allgather": {"alpha": 4e-4, "bandwidth": 5e8, "reduce_bandwidth": 9e9}},
        "source": "a test's fit",
    }
    terms = dict(
        op_overhead_s=7e-6,
        efficiency={"convolution": 0.6},
        page_fault_s=1.1e-6,
        call_s={"convolution/forward": 3e-5},
        zero_operand_s={"aten.sqrt": 4e-9},
        split_region_s=5.5e-5,
        ddp_s=(1.8e-4, 6e-6),
    )
    bare = from_profile(profile, **terms)
    assert bare.link_latency == LOOPBACK_ALPHA and bare.collectives == {}
    linked = with_link(bare, link)
    assert linked == from_profile(profile, link=link, **terms)
    assert (linked.split_region_s, linked.ddp_step_s, linked.ddp_param_s) == (5.5e-5, 1.8e-4, 6e-6)
    assert (linked.link_latency, linked.intra_bandwidth, linked.reduce_bandwidth) == (2e-4, 1.5e9, 9e9)
    assert linked.collectives == link["ops"] and linked.sources["link"] == "a test's fit"


def test_profile_round_trips_through_json(profile: hw.HardwareProfile, tmp_path: Path) -> None:
    assert hw.load_profile(CPU) is None  # nothing saved yet in this test's cache directory
    path = hw.save_profile(profile)
    assert path == hw.profile_path(CPU) and path.parent.name == "hardware"
    document = json.loads(path.read_text())
    assert document["schema"] == "dnnperf.hardware" and document["schema_version"] == 1
    loaded = hw.load_profile(CPU)
    assert loaded == profile
    assert loaded is not None and loaded.to_dict() == profile.to_dict()
    assert loaded.peak_flops(torch.float32) == profile.peak_flops(torch.float32)
    assert loaded.memory_bandwidth == profile.memory_bandwidth
    # An explicit path works the same.
    other = hw.save_profile(profile, tmp_path / "elsewhere.json")
    assert hw.load_profile(CPU, other) == profile


def test_device_key_names_host_and_device() -> None:
    key = hw.device_key(CPU)
    assert key.endswith("-cpu") and re.fullmatch(r"[a-z0-9-]+", key)


def _mutations() -> dict[str, Any]:
    def set_in(path: list[Any], value: Any) -> Any:
        def mutate(document: dict[str, Any]) -> None:
            target = document
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return mutate

    return {
        "wrong schema": set_in(["schema"], "dnnperf.run"),
        "future version": set_in(["schema_version"], 2),
        "negative seconds": set_in(["compute", 0, "points", 0, "seconds", 0], -1.0),
        "string seconds": set_in(["memory", 0, "points", 0, "seconds"], ["fast"]),
        "empty seconds": set_in(["dispatch", "seconds"], []),
        "unknown op": set_in(["compute", 0, "op"], "fft"),
        "zero work": set_in(["compute", 0, "points", 0, "work"], 0),
        "bad device type": set_in(["device", "type"], "tpu"),
        "missing dispatch": set_in(["dispatch"], None),
        "threads not int": set_in(["threads"], "two"),
        "bad footprint": set_in(["memory", 1, "points", 0, "params", "footprint"], -5),
        "bad transfer": set_in(["host_transfer"], {"sideways": {}}),
        "negative background": set_in(["background_cores"], -0.5),
        "text background": set_in(["background_cores"], "busy"),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_invalid_profile_is_rejected_with_a_clear_error(
    profile: hw.HardwareProfile, tmp_path: Path, name: str
) -> None:
    document = profile.to_dict()
    _mutations()[name](document)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    with pytest.raises(UsageError, match="is not a dnnperf hardware profile") as caught:
        hw.load_profile(CPU, path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema": "dnnperf.hardware", ', "is not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"seconds": NaN}', "schema"),
        ("", "is not valid JSON"),
    ],
)
def test_corrupted_profile_file_is_rejected(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "profile.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        hw.load_profile(CPU, path)


def test_nan_sample_is_rejected(profile: hw.HardwareProfile, tmp_path: Path) -> None:
    document = profile.to_dict()
    document["compute"][0]["points"][0]["seconds"][0] = float("nan")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))  # json writes NaN, which Python's reader accepts
    with pytest.raises(UsageError, match="not a positive finite number"):
        hw.load_profile(CPU, path)


def test_profile_of_another_device_type_is_refused(profile: hw.HardwareProfile, tmp_path: Path) -> None:
    path = hw.save_profile(profile, tmp_path / "cpu.json")
    with pytest.raises(UsageError, match="profiles a cpu device"):
        hw.load_profile(torch.device("cuda"), path)


def test_stale_reasons(profile: hw.HardwareProfile) -> None:
    assert hw.stale_reasons(profile) == ["a quick calibration (few, short repetitions)"]
    other = replace(profile, threads=profile.threads + 1, quick=False)
    assert any("threads" in reason for reason in hw.stale_reasons(other))


def test_a_full_calibration_beside_other_work_is_flagged(profile: hw.HardwareProfile, tmp_path: Path) -> None:
    """The flag follows the recorded load: half a core of other work and more is named, with the
    figure; less, a quick calibration (flagged as quick already) or an older profile without the
    figure are not. The figure survives the profile's JSON, and a calibration records it."""
    assert profile.background_cores is not None and 0 <= profile.background_cores <= psutil.cpu_count() + 0.1
    full = replace(profile, quick=False)
    busy = replace(full, background_cores=1.25)
    assert hw.busy_reason(busy) is not None and "1.2 cores" in hw.busy_reason(busy)
    assert hw.busy_reason(busy) in hw.stale_reasons(busy)
    assert hw.busy_reason(replace(full, background_cores=hw.BUSY_CORES - 0.01)) is None
    assert hw.busy_reason(replace(full, background_cores=None)) is None
    assert hw.busy_reason(replace(busy, quick=True)) is None
    path = hw.save_profile(busy, tmp_path / "busy.json")
    assert hw.read_profile(path).background_cores == 1.25


BUSY_LOOP = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


@pytest.mark.concurrent
def test_the_background_load_counts_another_process_busy_loop() -> None:
    """The truth is the busy loop's own CPU time, read from the kernel for its process: the other
    processes' load over the same interval is at least that (more where other work ran too), and at
    most every core. This process sleeps meanwhile, so its own time is not what is counted."""
    hog = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        time.sleep(0.5)  # the interpreter has started and is spinning
        process = psutil.Process(hog.pid)
        hog_before, started = sum(process.cpu_times()[:2]), time.perf_counter()
        load = BackgroundLoad()
        time.sleep(2.0)
        cores = load.cores()
        hog_cores = (sum(process.cpu_times()[:2]) - hog_before) / (time.perf_counter() - started)
    finally:
        hog.kill()
        hog.wait()
    assert hog_cores > 0.05  # the loop ran
    assert cores >= 0.9 * hog_cores
    assert cores <= psutil.cpu_count() + 0.1


# -- roofline ------------------------------------------------------------------------------------------


def timing(work: float, unit: str = "FLOP", **params: Any) -> hw.KernelTiming:
    """A timing whose every sample takes one second: its rate is exactly ``work`` per second."""
    return hw.KernelTiming("synthetic", float(work), unit, 1, (1.0, 1.0, 1.0), params)


def memory_curve(kernel: str, rates_by_footprint: dict[int, float]) -> hw.BandwidthCurve:
    points = [
        timing(rate, "B", nbytes=footprint // hw.TENSORS_TOUCHED[kernel], footprint=footprint)
        for footprint, rate in sorted(rates_by_footprint.items())
    ]
    return hw.BandwidthCurve(kernel, tuple(points))


def synthetic_profile(peak: float, bandwidth: float) -> hw.HardwareProfile:
    MiB = 1 << 20
    triad = {
        3 * 4 * 1024: 9e10,  # L1d: fits in half of 32 KiB
        3 * 64 * 1024: 7e10,  # L2, held back by per-call overhead
        3 * 128 * 1024: 8e10,  # L2, the fastest there
        3 * MiB: 5e10,  # L3
        3 * 64 * MiB: bandwidth,  # beyond 4x the L3: DRAM
    }
    return hw.HardwareProfile(
        device_key="host-cpu",
        device_type="cpu",
        device_index=None,
        device_name="synthetic",
        threads=1,
        quick=False,
        created="2024-01-01T00:00:00+00:00",
        duration_s=1.0,
        environment={},
        caches=(hw.CacheLevel("L1d", 32 * 1024), hw.CacheLevel("L2", 1 * MiB), hw.CacheLevel("L3", 8 * MiB)),
        compute=(
            hw.ComputeCurve("matmul", "float32", (timing(peak / 2), timing(peak))),
            hw.ComputeCurve("conv2d", "float32", (timing(peak / 3),)),
            # Tried, too slow, not usable: never a peak.
            hw.ComputeCurve("matmul", "bfloat16", (timing(peak * 10),), usable=False, note="not used"),
        ),
        memory=(memory_curve("triad", triad), memory_curve("copy", {3 * 64 * MiB: bandwidth / 2})),
        dispatch=timing(1.0, "call"),
        host_transfer=None,
    )


def test_peak_flops_is_the_best_usable_size_at_its_best_rate() -> None:
    profile = synthetic_profile(peak=1e11, bandwidth=2e10)
    assert profile.peak_flops(torch.float32) == pytest.approx(1e11)
    assert profile.peak_flops("float32", op="conv2d") == pytest.approx(1e11 / 3)
    with pytest.raises(hw.NotMeasuredError, match="bfloat16"):
        profile.peak_flops(torch.bfloat16)
    with pytest.raises(hw.NotMeasuredError, match="tf32"):
        profile.peak_flops(torch.float32, tf32=True)


def test_roofline_helpers_are_analytic() -> None:
    peak, bandwidth = 1e11, 2e10
    profile = synthetic_profile(peak, bandwidth)
    assert profile.memory_bandwidth == pytest.approx(bandwidth)  # triad's DRAM plateau
    ridge = profile.ridge_point(torch.float32)
    assert ridge == pytest.approx(peak / bandwidth)
    for intensity in (0.0, 0.1, ridge / 2, ridge, 2 * ridge, 1e6):
        assert profile.attainable_flops(intensity, torch.float32) == pytest.approx(
            min(peak, intensity * bandwidth)
        )
    assert profile.attainable_flops(ridge) == pytest.approx(peak)
    with pytest.raises(ValueError, match="non-negative"):
        profile.attainable_flops(-1.0)


def test_cache_plateaus_group_sizes_by_cache_level() -> None:
    profile = synthetic_profile(1e11, 2e10)
    plateaus = {name: s.median for name, s in profile.cache_plateaus("triad").items()}
    assert plateaus == pytest.approx({"L1d": 9e10, "L2": 8e10, "L3": 5e10, "DRAM": 2e10})
    points, beyond_caches = profile.dram_points("triad")
    assert beyond_caches and len(points) == 1
    summary = profile.summary()
    assert summary["memory_bandwidth"] == pytest.approx(2e10)
    assert summary["peak_flops"] == {
        "matmul": {"float32": pytest.approx(1e11)},
        "conv2d": pytest.approx({"float32": 1e11 / 3}),
    }


# -- devices -----------------------------------------------------------------------------------------


def tf32_flags() -> dict[str, Any]:
    """Every flag tf32_mode touches, legacy ones as None where torch refuses to read them."""
    flags: dict[str, Any] = {}
    for name, read in (
        ("matmul_precision", torch.get_float32_matmul_precision),
        ("cublas", lambda: torch.backends.cuda.matmul.allow_tf32),
        ("cudnn", lambda: torch.backends.cudnn.allow_tf32),
    ):
        try:
            flags[name] = read()
        except RuntimeError:  # a mix of legacy and new flags
            flags[name] = None
    for i, holder in enumerate(compute.fp32_precision_flags()):
        flags[f"new{i}"] = holder.fp32_precision
    return flags


NEW_API = hasattr(torch.backends.cudnn, "conv") and hasattr(torch.backends.mkldnn, "matmul")


@pytest.mark.parametrize(
    "setup",
    [
        "default",
        "legacy-high",
        "legacy-medium",
        pytest.param("new-only-tf32", marks=pytest.mark.skipif(not NEW_API, reason="torch < 2.9")),
    ],
)
def test_tf32_mode_sets_and_restores_the_flags(setup: str) -> None:
    original = tf32_flags()
    try:
        if setup.startswith("legacy"):
            torch.set_float32_matmul_precision(setup.removeprefix("legacy-"))
        elif setup == "new-only-tf32":
            torch.backends.cuda.matmul.fp32_precision = "tf32"  # legacy getters now refuse to read
        before = tf32_flags()
        for enabled in (True, False):
            with compute.tf32_mode(enabled):
                assert torch.backends.cuda.matmul.allow_tf32 is enabled
                assert torch.backends.cudnn.allow_tf32 is enabled
            assert tf32_flags() == before
    finally:
        torch.set_float32_matmul_precision(original["matmul_precision"] or "highest")
        torch.backends.cudnn.allow_tf32 = original["cudnn"] if original["cudnn"] is not None else True
        for i, holder in enumerate(compute.fp32_precision_flags()):
            holder.fp32_precision = original[f"new{i}"]
    assert tf32_flags() == original


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_calibrating_a_missing_gpu_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no CUDA GPU"):
        calibration.calibrate(torch.device("cuda"), quick=True)


def test_calibrating_an_unsupported_device_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="use cpu or cuda"):
        calibration.calibrate(torch.device("meta"), quick=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_calibration_on_cuda(tmp_path: Path) -> None:
    profile = calibration.calibrate(torch.device("cuda"), quick=True)
    assert profile.device_type == "cuda" and profile.device_index is not None
    assert profile.host_transfer is not None and set(profile.host_transfer) == set(hw.TRANSFERS)
    for timing_ in all_timings(profile):
        assert_ordered(timing_.rate, timing_.label)
    assert {c.precision for c in profile.compute} == set(hw.PRECISIONS)
    # float16/bfloat16 may be set aside on GPUs without fast paths for them; float32 is always there.
    assert profile.peak_flops(torch.float32) > 0 and profile.peak_flops(torch.float32, tf32=True) > 0
    assert profile.memory_bandwidth > 0 and profile.dispatch_overhead_us > 0
    assert (profile.host_bandwidth("h2d") or 0) > 0 and (profile.host_bandwidth("d2h", pinned=False) or 0) > 0
    assert hw.load_profile("cuda", hw.save_profile(profile, tmp_path / "gpu.json")) == profile


def test_the_peak_is_the_best_sustained_rate_and_contention_does_not_lower_it() -> None:
    """A shared machine: other processes slow some samples down, never speed one up. The peak is the
    fastest sample of the best configuration, so adding contended samples leaves it where it was while
    the median and the p90 (the estimators this replaced) fall with them."""
    quiet = (1.0, 1.05, 1.1, 1.02, 1.2)
    busy = (*quiet, 1.6, 1.8, 2.0, 1.7, 1.9, 1.5, 2.2)
    alone = hw.KernelTiming("mm n=2", 1e11, "FLOP", 1, quiet, {"n": 2})
    shared = replace(alone, seconds=busy)
    # The other configuration has the higher median but the lower best rate: not the peak.
    steady = timing(0.98e11)
    for point in (alone, shared):
        curve = hw.ComputeCurve("matmul", "float32", (steady, point))
        assert curve.best is point
        assert curve.peak == pytest.approx(1e11) == point.best_rate
    assert shared.rate.p90 < alone.rate.p90 and shared.rate.median < alone.rate.median
    assert alone.rate.p90 < alone.best_rate  # the p90 of even quiet samples sits below the peak


def test_memory_bandwidth_is_the_best_sustained_rate_of_the_dram_sizes_only() -> None:
    profile = synthetic_profile(peak=1e11, bandwidth=2e10)
    triad = profile.bandwidth_curve("triad")
    MiB = 1 << 20
    dram = next(p for p in triad.points if p.params["footprint"] == 3 * 64 * MiB)
    # Contended samples of the DRAM size: twice and four times slower than its best.
    contended = replace(dram, seconds=(2.0, 1.0, 4.0, 2.0))
    points = tuple(contended if p is dram else p for p in triad.points)
    profile = replace(profile, memory=(hw.BandwidthCurve("triad", points), *profile.memory[1:]))
    assert profile.memory_bandwidth == pytest.approx(2e10)  # the fastest DRAM sample
    assert profile.dram_bandwidth().median == pytest.approx(1e10)  # the pooled samples keep the spread
    # The cache sizes are faster but are not the DRAM plateau.
    assert max(p.best_rate for p in triad.points) > profile.memory_bandwidth


def test_memory_sizes_are_swept_several_times_in_alternating_order_between_compute_rounds(
    calibrated: tuple[hw.HardwareProfile, list[tuple[str, float]]],
) -> None:
    profile, reports = calibrated
    plan = PLANS[("cpu", True)]
    assert plan.memory_sweeps >= 2
    visits = [
        re.fullmatch(r"memory triad (.+) sweep (\d+)/(\d+)", text) for text, _ in reports if "triad" in text
    ]
    assert all(visits)
    sweeps = [int(m.group(2)) for m in visits if m]
    assert sweeps == sorted(sweeps) and set(sweeps) == set(range(1, plan.memory_sweeps + 1))
    sizes = [m.group(1) for m in visits if m and m.group(2) == "1"]
    again = [m.group(1) for m in visits if m and m.group(2) == "2"]
    ascending = [bytes_text(n) for n in sorted(plan.memory_sizes)]
    assert sizes == ascending[::-1] and again == ascending
    # The sweeps are spread between the compute rounds, not run back to back.
    texts = [text for text, _ in reports]
    first_ends = max(i for i, text in enumerate(texts) if text.startswith("memory") and "sweep 1/" in text)
    second_starts = min(i for i, text in enumerate(texts) if text.startswith("memory") and "sweep 2/" in text)
    assert any(text.startswith("compute round") for text in texts[first_ends:second_starts])
    assert texts.index(next(t for t in texts if t.startswith("memory"))) > 0
    # Every curve is warmed up before the common rounds, which time all of them together.
    rounds = [i for i, text in enumerate(texts) if text.startswith("compute round")]
    warm_ups = [i for i, text in enumerate(texts) if text.endswith("warm-up")]
    assert rounds and warm_ups and max(warm_ups) < min(rounds)
    # Every size pools the samples of all its sweeps.
    for curve in profile.memory:
        for point in curve.points:
            assert len(point.seconds) >= plan.memory_sweeps * math.ceil(plan.min_repeats / plan.memory_sweeps)


def test_dram_probes_add_samples_of_the_smallest_dram_size_between_sweeps() -> None:
    """With a (made-up) 32 KiB last-level cache, 128 KiB tensors (3 x 128 KiB >= 4 x 32 KiB) are the
    smallest DRAM size: each probe adds one triad sample there, with the calls per sample of the
    sweeps, and nothing to the other sizes or to copy."""
    plan = PLANS[("cpu", True)]
    sweeps = MemorySweeps(CPU, plan, Tracker(None, 1.0), (hw.CacheLevel("L3", 32 * 1024),))
    assert sweeps.probe_size == 128 * 1024
    probes = 7
    for _ in range(probes):
        sweeps.probe()
    key = ("triad", 128 * 1024)
    assert list(sweeps.seconds) == [key] and len(sweeps.seconds[key]) == probes
    calls = sweeps.calls[key]
    curves = {c.kernel: {p.params["nbytes"]: p for p in c.points} for c in sweeps.curves([])}
    per_sweep = math.ceil(plan.min_repeats / plan.memory_sweeps)
    probed = curves["triad"][128 * 1024]
    assert probed.calls == calls and len(probed.seconds) >= probes + plan.memory_sweeps * per_sweep
    # No cache sizes known: no size is known to be DRAM, nothing is probed.
    assert MemorySweeps(CPU, plan, Tracker(None, 1.0)).probe_size is None


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="Linux's /proc/cpuinfo")
def test_the_cpu_revision_is_lscpus_family_model_and_stepping() -> None:
    from dnnperf import environment

    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no lscpu")
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    wanted = [fields.get(name, "").strip() for name in ("CPU family", "Model", "Stepping")]
    if not all(w.isdigit() for w in wanted):  # not an x86 CPU: lscpu has no family to give
        assert environment.cpu_revision() is None
        return
    assert environment.cpu_revision() == "family {} model {} stepping {}".format(*wanted)
    assert environment.cpu_model() == fields["Model name"].strip()
    assert environment.machine()["cpu_revision"] == environment.cpu_revision()
