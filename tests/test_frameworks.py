"""The suite's CNNs in Keras 3 on TensorFlow and JAX (dnnperf.frameworks), and torch through the same
path: parameter counts against the PyTorch models, the training step against the loss it must lower,
the bench record against what the child and the watcher saw, and the framework verdicts of
``reproduce memory-subsystem`` against synthetic measurements."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from dnnperf.cli.frameworks import refuse_unsupported
from dnnperf.errors import UsageError
from dnnperf.frameworks import KERAS_FRAMEWORKS, KERAS_WORKLOADS
from dnnperf.frameworks import bench as frameworks_bench
from dnnperf.frameworks.bench import bench_framework, check_request, missing_packages, system_figures
from dnnperf.reproduce.memory_subsystem import framework_claims
from dnnperf.results.record import Point, RunRecord
from dnnperf.results.store import RunStore
from dnnperf.results.watch import StepMarks, WatchConfig, WatchResult
from dnnperf.runner import RunFailed
from dnnperf.watch.marks import ENV_MARKS
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import count_parameters

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

#: Steps of the loss check, and the fraction of an untrained classifier's loss (ln C) they must reach.
LOSS_STEPS = 25
LOSS_FACTOR = 0.85


def needs(framework: str) -> pytest.MarkDecorator:
    missing = missing_packages(framework)
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not importable (frameworks extra)")


BACKENDS = [pytest.param(f, marks=needs(f)) for f in KERAS_FRAMEWORKS]

# Runs in a child with KERAS_BACKEND set: every preset's parameter count, a forward shape, conv1's
# largest weight, and the losses of LOSS_STEPS steps on one fixed batch.
PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import keras
    from dnnperf.frameworks.keras_models import build
    spec = json.loads(sys.argv[1])
    out = {"counts": {}, "shapes": {}}
    for name, presets in spec["configs"].items():
        for preset, config in presets.items():
            model = build(name, config)
            out["counts"][f"{name}/{preset}"] = model.count_params()
            if preset == "tiny":
                x = np.zeros((3, config["image_size"], config["image_size"], 3), np.float32)
                out["shapes"][name] = list(model(x, training=False).shape)
            keras.backend.clear_session()
    with np.load(spec["data"], allow_pickle=False) as data:
        x, y = data["x"], data["y"]
    model = build("basic_cnn", spec["configs"]["basic_cnn"]["tiny"])
    kernel = np.asarray(model.get_layer("conv1").kernel)
    out["conv1_max"], out["conv1_min"] = float(kernel.max()), float(kernel.min())
    out["losses"] = [float(model.train_on_batch(x, y)) for _ in range(spec["steps"])]
    out["modules"] = sorted(m for m in ("torch", "tensorflow", "jax") if m in sys.modules)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The probe's answers per backend, each run once (a backend's import and first compile take
    seconds)."""
    directory = tmp_path_factory.mktemp("probe")
    sample = get_workload("basic_cnn").data("tiny").synthesize(16, 0)
    np.savez(
        directory / "batch.npz",
        x=sample["image"].numpy().transpose(0, 2, 3, 1).copy(),
        y=sample["label"].numpy().astype(np.int32),
    )
    configs = {
        name: {p: dataclasses.asdict(get_workload(name).config(p)) for p in ("tiny", "small", "full")}
        for name in KERAS_WORKLOADS
    }
    spec = json.dumps({"configs": configs, "data": str(directory / "batch.npz"), "steps": LOSS_STEPS})
    children = {}  # both backends at once: each is mostly one core's import and compile
    for backend in KERAS_FRAMEWORKS:
        if not missing_packages(backend):
            env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
            children[backend] = subprocess.Popen(
                [sys.executable, "-c", PROBE, spec],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
    answers = {}
    try:
        for backend, child in children.items():
            stdout, stderr = child.communicate(timeout=300)
            assert child.returncode == 0, stderr[-2000:]
            answers[backend] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    return answers


def torch_parameters(workload: str, preset: str) -> int:
    import torch

    with torch.device("meta"):
        return count_parameters(get_workload(workload).build(preset, "meta").model)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("preset", ["tiny", "small", "full"])
@pytest.mark.parametrize("workload", KERAS_WORKLOADS)
def test_parameter_count_matches_pytorch(probes: dict, backend: str, workload: str, preset: str) -> None:
    assert probes[backend]["counts"][f"{workload}/{preset}"] == torch_parameters(workload, preset)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_gives_one_logit_per_class(probes: dict, backend: str) -> None:
    for workload in KERAS_WORKLOADS:
        classes = get_workload(workload).config("tiny").num_classes
        assert probes[backend]["shapes"][workload] == [3, classes]


@pytest.mark.parametrize("backend", BACKENDS)
def test_initialisation_is_pytorchs_uniform_bound(probes: dict, backend: str) -> None:
    # conv1 of basic_cnn tiny: 3 channels x 5 x 5 inputs per output; PyTorch's bound is 1/sqrt(75).
    # 600 uniform draws come within 2% of both ends (the chance of missing one is below 1e-5).
    bound = 1 / math.sqrt(3 * 5 * 5)
    assert 0.98 * bound <= probes[backend]["conv1_max"] <= bound
    assert -bound <= probes[backend]["conv1_min"] <= -0.98 * bound


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_step_lowers_the_loss(probes: dict, backend: str) -> None:
    # An untrained 10-class classifier's cross-entropy is about ln 10; the L2 term adds < 0.01.
    losses = probes[backend]["losses"]
    assert losses[0] == pytest.approx(math.log(10), abs=0.1)
    assert losses[-1] < LOSS_FACTOR * math.log(10), losses
    # The backend runs without torch; JAX without TensorFlow (Keras's TensorFlow backend imports the
    # jax module, which starts no threads of its own until it computes).
    assert backend in probes[backend]["modules"] and "torch" not in probes[backend]["modules"]
    if backend == "jax":
        assert "tensorflow" not in probes[backend]["modules"]


@pytest.mark.parametrize("framework", [*BACKENDS, pytest.param("torch")])
def test_short_bench_gives_a_valid_record_with_watch_figures(tmp_path: Path, framework: str) -> None:
    store = RunStore(tmp_path)
    record = bench_framework("basic_cnn", framework, "tiny", [4, 8], steps=2, warmup=1, store=store)
    loaded = store.load(record.id)  # saved, and valid as `dnnperf show` reads it
    assert loaded.kind == "bench" and loaded.status == "complete"
    assert loaded.settings["framework"] == framework and loaded.settings["limitations"]
    assert [p.batch_size for p in loaded.points] == [4, 8]
    for point in loaded.points:
        assert point.status == "complete"
        assert len(point.warmup_s) == 1 and len(point.step_s) == 2 and len(point.loss) == 3
        assert all(s > 0 for s in point.step_s)
        assert all(v is not None and math.isfinite(v) for v in point.loss)
    watched = loaded.watch
    assert watched is not None and watched.exit_code == 0
    assert sorted(watched.marks.step) == list(range(6))  # every step marked, numbered across the sweep
    assert watched.peak_rss_bytes > 50 * 2**20  # a Python process with a framework loaded
    figures = system_figures(loaded)
    assert [f["batch_size"] for f in figures] == [4, 8]
    for row in figures:
        assert 0 < row["peak_rss_bytes"] <= watched.peak_rss_bytes
    assert figures[0]["minor_faults"] > 0  # importing a framework faults its pages in


@pytest.mark.parametrize("framework", BACKENDS[:1])
def test_a_failing_child_leaves_a_failed_record_and_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framework: str
) -> None:
    # Injected: the data handed to the child lacks the batch size's images.
    def wrong_data(*args: object) -> None:
        with open(str(args[-1]), "wb") as file:
            np.savez(file, other=np.zeros(1))

    monkeypatch.setattr(frameworks_bench, "write_data", wrong_data)
    store = RunStore(tmp_path)
    with pytest.raises(RunFailed, match="image_4") as failure:
        bench_framework("basic_cnn", framework, "tiny", [4, 8], steps=1, warmup=0, store=store)
    loaded = store.load(failure.value.record.id)
    assert loaded.status == "failed" and "image_4" in (loaded.error or "")
    assert [p.status for p in loaded.points] == ["failed"]  # the sweep stopped at the failure
    assert loaded.watch is not None and loaded.watch.exit_code == 0 and not loaded.watch.outlived
    assert not [
        p for p in psutil.Process().children(recursive=True) if "dnnperf.frameworks.child" in p.cmdline()
    ]


def test_requests_that_cannot_run_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown framework 'mxnet'"):
        check_request("basic_cnn", "mxnet", "auto")
    with pytest.raises(UsageError, match="resnet50 has no Keras version"):
        check_request("resnet50", "tensorflow", "auto")
    with pytest.raises(UsageError, match="runs on the CPU"):
        check_request("alexnet", "jax", "cuda")
    with pytest.raises(UsageError, match="--data disk does not apply"):
        refuse_unsupported(argparse.Namespace(data="disk"))
    with pytest.raises(UsageError, match="--nproc cannot be combined"):
        refuse_unsupported(argparse.Namespace(data="memory", nproc=2))


def synthetic_record(marks: list[tuple[float, int]]) -> RunRecord:
    """Two batch sizes of 1 warm-up + 2 steps; a watch sampled every 0.1 s for 2 s, whose RSS is
    100 MiB + 10 MiB per second, CPU time 1.5 s per second, minor faults 1000 per sample."""
    t = [round(0.1 * i, 1) for i in range(21)]
    watched = WatchResult(config=WatchConfig(["child"], 0.1), started_at=0.0, t=t)
    for i, at in enumerate(t):
        watched.total.append(
            {
                "cpu_s": 1.5 * at,
                "rss_bytes": int((100 + 10 * at) * 2**20),
                "pss_bytes": None,
                "uss_bytes": None,
                "minor_faults": 1000 * i,
                "major_faults": 0,
                "read_bytes": None,
                "write_bytes": None,
                "voluntary_switches": 0,
                "involuntary_switches": 0,
                "threads": 1,
            }
        )
        watched.total.processes.append(1)
    watched.marks = StepMarks(t=[m[0] for m in marks], step=[m[1] for m in marks])
    record = RunRecord(
        id="x", kind="bench", workload={}, settings={"warmup": 1, "steps": 2}, environment={}, watch=watched
    )
    record.points = [Point(batch_size=4), Point(batch_size=8)]
    return record


def test_system_figures_split_the_watch_at_the_step_marks() -> None:
    # Batch 4's steps end at 0.6, 0.8, 1.0 s; batch 8's at 1.2, 1.5, 2.0 s.
    record = synthetic_record([(0.6, 0), (0.8, 1), (1.0, 2), (1.2, 3), (1.5, 4), (2.0, 5)])
    first, second = system_figures(record)
    assert first["peak_rss_bytes"] == 110 * 2**20  # RSS at 1.0 s, the window's end
    assert second["peak_rss_bytes"] == 120 * 2**20
    assert first["minor_faults"] == 10_000 and second["minor_faults"] == 10_000  # 10 samples each
    # Measured steps from the warm-up step's mark: 0.6-1.0 s and 1.2-2.0 s, 1.5 cores throughout.
    assert first["cpu_cores"] == pytest.approx(1.5) and second["cpu_cores"] == pytest.approx(1.5)
    assert first["window_s"] == pytest.approx(1.0) and second["window_s"] == pytest.approx(1.0)


def test_system_figures_are_none_where_no_sample_falls() -> None:
    # Batch 8's measured steps last 0.02 s: shorter than an interval, no busy-cores figure for them.
    record = synthetic_record([(0.6, 0), (0.8, 1), (1.0, 2), (1.95, 3), (1.96, 4), (1.97, 5)])
    assert system_figures(record)[1]["cpu_cores"] is None


def framework_table(tf_rss: list[float], torch_rss: list[float]) -> pd.DataFrame:
    rows = []
    for framework, rss in (("tensorflow", tf_rss), ("torch", torch_rss)):
        for batch, value in zip((8, 16, 32, 64), rss, strict=True):
            rows.append(
                {
                    "framework": framework,
                    "batch": batch,
                    "throughput_per_s": 100.0 * batch,
                    "peak_rss_MiB": value,
                    "minor_faults": 1000.0 + batch,
                }
            )
    return pd.DataFrame(rows)


def test_framework_claims_hold_when_both_grow_together() -> None:
    # Both lines exact: 780 + 2.5 MiB and 340 + 1.25 MiB per sample.
    grows, alike = framework_claims(framework_table([800, 820, 860, 940], [350, 360, 380, 420]), ["cmd"])
    assert grows.verdict == "holds"
    assert "+2.50 MiB per sample" in grows.measured and "+1.25 MiB per sample" in grows.measured
    assert alike.verdict == "holds" and "r = 1.000" in alike.measured


def test_framework_claims_differ_when_one_does_not_grow() -> None:
    grows, alike = framework_claims(framework_table([800, 790, 780, 770], [350, 360, 380, 420]), ["cmd"])
    assert grows.verdict == "differs" and "1 of 2 frameworks" in grows.why
    assert alike.verdict == "differs"


def test_framework_claims_differ_without_a_second_framework() -> None:
    table = framework_table([800, 820, 860, 940], [350, 360, 380, 420])
    grows, alike = framework_claims(table[table["framework"] == "torch"], ["cmd"])
    assert grows.verdict == "differs" and alike.verdict == "differs"


@pytest.mark.skipif(bool(missing_packages("jax")), reason="the frameworks extra is not installed")
def test_the_command_line_runs_a_framework_and_refuses_what_it_cannot_run(tmp_path: Path, capsys) -> None:
    """`dnnperf bench --framework` end to end: a record whose steps are the child's marks, and one-line
    refusals (exit 2) before any child starts."""
    from dnnperf import cli

    runs = tmp_path / "runs"
    argv = ["bench", "basic_cnn", "--framework", "jax", "--preset", "tiny", "-b", "4", "--steps", "2"]
    assert cli.main([*argv, "--warmup", "1", "--runs-dir", str(runs), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    record = RunRecord.from_dict(document.get("record", document))
    assert record.settings["framework"] == "jax" and record.watch is not None
    assert len(record.points[0].step_s) == 2 and len(record.watch.marks.t) == 3  # 1 warm-up + 2 steps
    for refused, needle in [
        (["bench", "resnet50", "--framework", "tensorflow"], "resnet50 has no Keras version"),
        (["bench", "basic_cnn", "--framework", "jax", "--data", "disk"], "--data disk does not apply"),
    ]:
        assert cli.main([*refused, "--runs-dir", str(runs)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err


def first_child_mark(parent: subprocess.Popen, at_least: int, timeout_s: float = 240.0) -> None:
    """Wait until the framework child under ``parent`` has marked step ``at_least`` (or a later one)."""
    deadline = time.monotonic() + timeout_s
    marks = None
    while time.monotonic() < deadline and parent.poll() is None:
        if marks is None:
            for process in psutil.Process(parent.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "dnnperf.frameworks.child" in process.cmdline():
                        marks = process.environ()[ENV_MARKS]
        if marks is not None:
            with contextlib.suppress(OSError):
                steps = [int(line.split()[1]) for line in Path(marks).read_text().splitlines()]
                if steps and max(steps) >= at_least:
                    return
        time.sleep(0.02)
    raise AssertionError(f"no mark of step {at_least} before the run ended (exit {parent.poll()})")


@pytest.mark.parametrize(
    ("framework", "stop"),
    [
        pytest.param("jax", signal.SIGTERM, marks=needs("jax")),
        pytest.param("torch", signal.SIGTERM),
        pytest.param("torch", signal.SIGINT),
    ],
)
def test_a_stopped_framework_bench_exits_by_its_signal_and_keeps_the_measured_steps(
    tmp_path: Path, framework: str, stop: signal.Signals
) -> None:
    # Stopped during the second batch size: the first one's steps all kept, the second's so far.
    warmup, steps = 1, 100  # batch 8 then runs for 100 steps: ample time for the stop to land in it
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "dnnperf", "bench", "basic_cnn", "--framework", framework]
    argv += ["--sweep", "4,8,16"]
    argv += ["--steps", str(steps), "--warmup", str(warmup), "--runs-dir", str(runs)]
    parent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first_child_mark(parent, warmup + steps)  # the second batch size's first step
        parent.send_signal(stop)
        _, stderr = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert parent.returncode == 128 + int(stop), stderr  # 130 for Ctrl-C, 143 for SIGTERM
    [saved] = list(runs.rglob("*.json"))
    record = RunRecord.from_dict(json.loads(saved.read_text()))
    assert record.status == "partial" and record.watch is not None
    assert record.watch.stop_signal == stop
    first, second = record.points[:2]
    assert first.status == "complete" and len(first.step_s) == steps
    assert second.status == "partial" and second.batch_size == 8
    # Every step the child marked is in the record (one more where the stop fell between a step's
    # timing and its mark).
    marked = len(record.watch.marks.step)
    recorded = sum(len(p.warmup_s) + len(p.step_s) for p in record.points)
    assert warmup + steps < marked <= recorded <= marked + 1


def test_torch_marks_stay_in_their_batch_sizes_window_after_a_short_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Injected: batch 4 runs out of memory after 2 of its 3 steps; batch 8 runs all 3.
    from dnnperf import runner
    from dnnperf.frameworks import child

    def short_first_point(settings: object, on_step: object = None, **kwargs: object) -> RunRecord:
        for batch_size, done in [(4, 1), (4, 2), (8, 1), (8, 2), (8, 3)]:
            on_step(batch_size, done, 3)
        return RunRecord(id="x", kind="bench", workload={}, settings={}, environment={})

    numbers: list[int] = []
    monkeypatch.setattr(runner, "bench", short_first_point)
    monkeypatch.setattr(child, "mark_step", numbers.append)
    spec = {"workload": "basic_cnn", "preset": "tiny", "batch_sizes": [4, 8], "steps": 2, "warmup": 1,
            "device": "cpu", "seed": 0, "result": str(tmp_path / "result.json")}  # fmt: skip
    child.run_torch(spec)
    assert numbers == [0, 1, 3, 4, 5]
    # Batch 4's steps end at 0.4 and 0.6 s; batch 8's at 1.2, 1.5 and 2.0 s.
    marks = list(zip([0.4, 0.6, 1.2, 1.5, 2.0], numbers, strict=True))
    first, second = system_figures(synthetic_record(marks))
    assert first["window_s"] == pytest.approx(0.6) and first["minor_faults"] == 6_000
    assert second["window_s"] == pytest.approx(1.4) and second["minor_faults"] == 14_000
    assert second["peak_rss_bytes"] == 120 * 2**20 and second["cpu_cores"] == pytest.approx(1.5)


def test_two_framework_records_compare_per_batch_size(tmp_path: Path, capsys) -> None:
    from dnnperf import cli

    store = RunStore(tmp_path)
    a, b = (bench_framework("basic_cnn", "torch", "tiny", [4, 8], 3, 1, store=store) for _ in "ab")
    assert cli.main(["compare", a.id, b.id, "--runs-dir", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    steps = [(row["batch_a"], row["batch_b"]) for row in rows if row["kind"] == "step"]
    assert steps == [(4, 4), (8, 8)]
