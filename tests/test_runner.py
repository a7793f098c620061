"""The runner against known truths: injected delays, injected out-of-memory, raw-sample statistics."""

import os
import signal
import time

import pytest
import torch
from torch import nn

from dnnperf.data.formats import ImageFormat
from dnnperf.interrupts import stop_on_signals
from dnnperf.results.store import RunStore, read_record
from dnnperf.runner import BenchSettings, RunFailed, bench
from dnnperf.workloads import registry
from dnnperf.workloads.base import Batch, Task, Workload, no_stages

DELAY_S = 0.03


class SleepyTask(Task):
    """A step that sleeps a known time, and runs out of memory above a batch size."""

    def __init__(self, oom_above: int | None) -> None:
        self.model = nn.Linear(2, 1)
        self.oom_above = oom_above

    def step(self, batch: Batch, stages=no_stages) -> torch.Tensor:
        if self.oom_above is not None and batch["image"].shape[0] > self.oom_above:
            torch.empty(2**50, dtype=torch.uint8)  # a real allocation failure: 1 PiB
        time.sleep(DELAY_S)
        return torch.tensor(1.0)


@pytest.fixture
def sleepy(monkeypatch):
    def register(oom_above=None):
        workload = Workload(
            name="sleepy",
            domain="test",
            summary="sleeps",
            presets={"tiny": {"oom_above": oom_above}},
            default_batch_size={"tiny": 2},
            make_task=lambda config, device: SleepyTask(config["oom_above"]),
            make_data=lambda config: ImageFormat(image_size=8, num_classes=2),
        )
        monkeypatch.setitem(registry.REGISTRY, "sleepy", workload)
        return workload

    return register


def test_step_time_covers_an_injected_delay(sleepy, tmp_path):
    sleepy()
    record = bench(BenchSettings("sleepy", steps=5, warmup=1), RunStore(tmp_path))
    point = record.points[0]
    assert len(point.step_s) == 5 and len(point.warmup_s) == 1
    assert all(t >= DELAY_S for t in point.step_s)
    assert point.step_time.median < DELAY_S + 0.1  # generous: only rules out gross mis-timing
    # Two samples per step of at least DELAY_S: throughput is bounded by the injected delay.
    throughput = point.summary()["throughput"]
    assert 2 / (DELAY_S + 0.1) < throughput["median"] <= 2 / DELAY_S
    assert throughput["p10"] <= throughput["median"] <= throughput["p90"]
    saved = read_record(RunStore(tmp_path).path(record.id))
    assert saved.status == "complete" and saved.points[0].step_s == point.step_s


def test_out_of_memory_is_recorded_and_the_sweep_goes_on(sleepy, tmp_path):
    sleepy(oom_above=4)
    record = bench(BenchSettings("sleepy", batch_sizes=(2, 8, 4), steps=2, warmup=0), RunStore(tmp_path))
    assert [p.status for p in record.points] == ["complete", "oom", "complete"]
    assert "can't allocate memory" in record.points[1].error
    assert record.points[1].step_s == []
    assert record.status == "complete"


def test_record_describes_machine_software_and_settings(sleepy, tmp_path):
    sleepy()
    record = bench(BenchSettings("sleepy", steps=1, warmup=0, seed=3), RunStore(tmp_path))
    machine, software = record.environment["machine"], record.environment["software"]
    assert machine["cores_logical"] >= 1 and machine["memory_bytes"] > 0 and machine["cpu_model"]
    assert software["torch"] == torch.__version__
    assert record.settings["seed"] == 3 and record.settings["device"] == "cpu"
    assert record.settings["torch_threads"] == torch.get_num_threads()
    assert record.workload["name"] == "sleepy" and record.workload["parameters"] == 3


def test_a_failing_step_saves_a_failed_record(monkeypatch, sleepy, tmp_path):
    sleepy()

    def broken(self, batch, stages=no_stages):
        raise ValueError("bug in the step")

    monkeypatch.setattr(SleepyTask, "step", broken)
    with pytest.raises(RunFailed) as failure:
        bench(BenchSettings("sleepy", steps=1, warmup=0), RunStore(tmp_path))
    assert isinstance(failure.value.__cause__, ValueError)
    assert failure.value.record.status == "failed"
    [path] = tmp_path.glob("*.json")
    record = read_record(path)
    assert record.status == "failed" and "bug in the step" in record.error
    assert record.points[0].status == "failed"


def test_an_out_of_memory_error_without_a_message_is_still_recorded(sleepy, monkeypatch, tmp_path):
    sleepy()

    def bare_memory_error(self, batch, stages=no_stages):
        raise MemoryError()

    monkeypatch.setattr(SleepyTask, "step", bare_memory_error)
    record = bench(BenchSettings("sleepy", steps=1, warmup=0), RunStore(tmp_path))
    assert record.points[0].status == "oom" and record.points[0].error == "MemoryError"


def test_data_workers_are_stopped_when_a_step_fails(monkeypatch, sleepy, tmp_path):
    import psutil

    sleepy()

    def broken(self, batch, stages=no_stages):
        raise ValueError("bug in the step")

    monkeypatch.setattr(SleepyTask, "step", broken)
    settings = BenchSettings("sleepy", steps=1, warmup=0, data="disk", workers=2, data_dir=tmp_path / "d")
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # other tests' helpers, not ours
    with pytest.raises(RunFailed):
        bench(settings, RunStore(tmp_path / "runs"))
    ours = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(ours, timeout=10)
    assert alive == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": 2**40}, "--seed"),
        ({"workers": 1000}, "--workers"),
        ({"steps": 0}, "--steps"),
        ({"batch_sizes": (4, 0)}, "batch size"),
    ],
)
def test_bad_settings_fail_before_anything_is_written(sleepy, tmp_path, changes, message):
    from dnnperf.errors import UsageError

    sleepy()
    with pytest.raises(UsageError, match=message):
        bench(BenchSettings("sleepy", **changes), RunStore(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_data_dir_that_is_a_file_fails_before_anything_is_written(sleepy, tmp_path):
    from dnnperf.errors import UsageError

    sleepy()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        bench(BenchSettings("sleepy", data="disk", data_dir=blocker), RunStore(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


class _InterruptedWhileFinalising:
    """Ctrl-C that lands in a finaliser: Python prints "Exception ignored" and carries on."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs (and its KeyboardInterrupt is swallowed) in here


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed one
def test_a_swallowed_interrupt_still_stops_the_run_at_the_next_step(sleepy, tmp_path):
    sleepy()

    def after_step(batch_size: int, done: int, total: int) -> None:
        if done == 3:
            _InterruptedWhileFinalising()  # dropped at once: __del__ runs here

    before = signal.getsignal(signal.SIGINT)
    with stop_on_signals(), pytest.raises(KeyboardInterrupt):
        bench(BenchSettings("sleepy", steps=200, warmup=1), RunStore(tmp_path), on_step=after_step)
    [path] = list(tmp_path.glob("*.json"))
    record = read_record(path)
    assert record.status == "partial" and len(record.points[0].step_s) == 2  # 1 warm-up + 2 measured
    assert signal.getsignal(signal.SIGINT) is before  # the handler came back
