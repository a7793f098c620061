"""``dnnperf watch``: the sampled tree against what its processes did and measured themselves.

The memory and CPU tests run alone (no concurrent marker): a sampler starved for a second on a
loaded machine could miss a held allocation. Everything else asserts counts, codes and files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from dnnperf.distributed.lifeline import job_processes
from dnnperf.errors import UsageError
from dnnperf.results.record import RecordError
from dnnperf.results.watch import SERIES_KINDS, WatchResult
from dnnperf.watch import marks as marks_module
from dnnperf.watch import sampler as sampler_module
from dnnperf.watch.gpu import GpuSampler, open_gpus
from dnnperf.watch.run import parse_marks, watch

MIB = 1024 * 1024
PYTHON = sys.executable


def wait_for(path: Path, timeout_s: float = 60.0) -> str:
    """The file's text once it exists and is not empty (a generous bound: imports are slow)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()):
            return text
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear within {timeout_s} s")


def interpolate(times: list[float], values: list[float], at: float) -> float:
    for (t0, v0), (t1, v1) in pairwise(zip(times, values, strict=True)):
        if t0 <= at <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (at - t0) / (t1 - t0)
    raise AssertionError(f"{at} is outside the samples ({times[0]} to {times[-1]})")


# (a) memory --------------------------------------------------------------------------------------

ALLOCATE = """
import sys, time
time.sleep(0.5)
block = bytearray(int(sys.argv[1]))
for i in range(0, len(block), 4096):  # touched page by page: resident, not just reserved
    block[i] = 1
time.sleep(1.5)
del block  # a large bytearray is its own mapping: freeing it returns the pages at once
time.sleep(1.0)
"""


def test_the_resident_size_rise_is_the_bytes_the_command_allocated() -> None:
    size = 400 * MIB
    result = watch([PYTHON, "-c", ALLOCATE, str(size)], interval_s=0.05)
    assert result.end == "exited" and result.exit_code == 0
    alive = result.total.rss_bytes[:-1]  # the last sample is taken once the command was reaped
    rise = max(alive) - alive[-1]  # the same process, before and after the block was freed
    assert abs(rise - size) < 0.1 * size, rise / MIB
    pss = [p for p in result.total.pss_bytes[:-1] if p is not None]
    assert abs(max(pss) - pss[-1] - size) < 0.1 * size, (max(pss) - pss[-1]) / MIB
    # The kernel's exact maximum is at least what a sample saw.
    assert result.kernel_peak_rss_bytes is not None and result.kernel_peak_rss_bytes >= 0.98 * max(alive)
    assert result.total.minor_faults[-2] >= size / 4096 * 0.9  # one fault per page touched, at least


# (b) CPU -----------------------------------------------------------------------------------------

SPIN = """
import os, sys, time
start_at, cpu_s, report = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
time.sleep(max(start_at - time.time(), 0))
began, before = time.time(), time.process_time()
while time.process_time() < cpu_s:  # a fixed amount of CPU work, whatever the machine's load
    pass
ended, after = time.time(), time.process_time()
with open(report, "w") as f:
    f.write(f"{began} {ended} {after - before}")
time.sleep(0.5)
"""

SPAWN = """
import os, subprocess, sys, time
n, directory = int(sys.argv[1]), sys.argv[2]
start_at = time.time() + 2.0  # every worker started (interpreter up) before any spins, even when busy
workers = [
    subprocess.Popen([sys.executable, "-c", sys.argv[3], str(start_at), "2.0", f"{directory}/{i}"])
    for i in range(n)
]
for worker in workers:
    worker.wait()
t = os.times()  # itself and every worker it reaped: the tree's whole CPU time
with open(f"{directory}/total", "w") as f:
    f.write(str(t.user + t.system + t.children_user + t.children_system))
time.sleep(0.5)
"""


@pytest.mark.parametrize("busy", [1, 2])
def test_cpu_seconds_and_busy_cores_are_what_the_processes_measured(busy: int, tmp_path: Path) -> None:
    result = watch([PYTHON, "-c", SPAWN, str(busy), str(tmp_path), SPIN], interval_s=0.05)
    assert result.exit_code == 0
    reported = float((tmp_path / "total").read_text())
    sampled = result.total.cpu_s[-2]  # the last sample before the command was reaped: all reported
    assert abs(sampled - reported) < 0.1 * reported, (sampled, reported)
    assert abs(result.kernel_cpu_s - reported) < 0.1 * reported
    assert len(result.processes) == 1 + busy
    # Busy cores while the workers spun: the CPU time they reported over the wall time it took.
    windows = [tuple(map(float, (tmp_path / str(i)).read_text().split())) for i in range(busy)]
    began, ended = min(w[0] for w in windows), max(w[1] for w in windows)
    began, ended = began - result.started_at, ended - result.started_at
    truth = sum(w[2] for w in windows) / (ended - began)  # outside their windows they sleep
    recorded = (
        interpolate(result.t, result.total.cpu_s, ended) - interpolate(result.t, result.total.cpu_s, began)
    ) / (ended - began)
    assert abs(recorded - truth) < 0.1 * truth, (recorded, truth)
    busy_cores = [c for c in result.cpu_cores() if c is not None]
    assert max(busy_cores) <= psutil.cpu_count() + 0.5  # no sample reads more cores than exist


@pytest.mark.concurrent
def test_a_child_reaped_while_the_tree_is_read_moves_no_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race, injected: the parent is read before its child is reaped (its reaped children's time
    without the child's 5 s), then the child is gone. Read once, the sample's total would drop by the
    child's 5 s and jump back at the next sample (tens of cores over one interval); the tree is read
    again instead, the parent's counters then holding the child's time."""
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        parent, child = (psutil.Process(c.pid) for c in children)
        sampler = sampler_module.TreeSampler(os.getpid(), interval_s=0.1)
        sampler.followed = {parent.pid: parent, child.pid: child}
        monkeypatch.setattr(sampler, "discover", lambda: None)
        script = {  # per sample, the reads in order: (pid, tree CPU seconds or None when gone)
            0: [(parent.pid, 1.0), (child.pid, 5.0)],
            1: [(parent.pid, 1.1), (child.pid, None), (parent.pid, 6.2)],
        }
        reads: list[tuple[int, float | None, int]] = []  # (pid, tree CPU, sample)

        def scripted(process: psutil.Process, full: bool) -> Any:
            pid, cpu = script[sampler.samples][sum(1 for r in reads if r[2] == sampler.samples)]
            assert pid == process.pid
            reads.append((pid, cpu, sampler.samples))
            if cpu is None:
                return None
            values = {name: 0 for name in SERIES_KINDS} | {"cpu_s": cpu}
            return dict(values), dict(values)

        monkeypatch.setattr(sampler_module, "read_process", scripted)
        sampler.sample()
        sampler.sample()
    finally:
        for c in children:
            c.kill()
            c.wait()
    assert sampler.total.cpu_s == [6.0, 6.2]
    assert len(reads) == 5  # the second sample read the parent again


# (c) exit code, bad input --------------------------------------------------------------------------


@pytest.mark.concurrent
def test_the_exit_code_passes_through() -> None:
    result = watch([PYTHON, "-c", "import sys; sys.exit(3)"])
    assert (result.end, result.exit_code, result.signal, result.shell_exit_code) == ("exited", 3, None, 3)
    assert result.marks.t == [] and result.step_s() == []


@pytest.mark.concurrent
@pytest.mark.parametrize(
    ("argv", "interval", "message"),
    [
        ([], 0.1, "needs a command"),
        (["dnnperf-no-such-command-here"], 0.1, "cannot run 'dnnperf-no-such-command-here'"),
        (["true"], 0.0, "interval"),
        (["true"], math.nan, "interval"),
    ],
)
def test_bad_input_is_one_usage_error(argv: list[str], interval: float, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        watch(argv, interval_s=interval)


# (d) killed mid-run --------------------------------------------------------------------------------


@pytest.mark.concurrent
def test_a_command_killed_from_outside_leaves_a_valid_result_with_its_samples() -> None:
    def kill_after_five(result: WatchResult) -> None:
        if len(result.t) == 5:
            os.kill(result.processes[0].pid, signal.SIGKILL)

    result = watch([PYTHON, "-c", "import time; time.sleep(60)"], interval_s=0.05, on_sample=kill_after_five)
    assert (result.end, result.exit_code, result.signal, result.shell_exit_code) == (
        "signalled",
        None,
        9,
        137,
    )
    assert len(result.t) >= 6 and result.total.rss_bytes[3] > 0
    document = json.loads(json.dumps(result.to_dict()))
    assert WatchResult.from_dict(document).to_dict() == document


# (e) step marks ------------------------------------------------------------------------------------

MARKING = """
import time
from dnnperf.watch.marks import mark_step
for step in range(5):
    time.sleep(0.05 * step)
    mark_step(step)
"""


@pytest.mark.concurrent
def test_five_marks_give_five_marks_and_the_time_between_them() -> None:
    result = watch([PYTHON, "-c", MARKING], interval_s=0.05)
    assert result.exit_code == 0, result
    assert result.marks.step == [0, 1, 2, 3, 4] and result.marks.ignored == 0
    assert 0 <= result.marks.t[0] <= result.wall_s
    steps = result.step_s()
    assert len(steps) == 4 and len(result.step_rss_growth_bytes()) == 4
    for step, seconds in enumerate(steps, start=1):
        assert seconds >= 0.05 * step - 0.001  # it slept that long before marking (time.time's resolution)


@pytest.mark.concurrent
def test_marks_parse_lines_and_count_what_is_not_a_mark() -> None:
    marks = parse_marks(b"100.5\n101.0 7\nnot a mark\n102 -1\n103 1 2\nnan\n", started_at=100.0)
    assert (marks.t, marks.step, marks.ignored) == ([0.5, 1.0], [None, 7], 4)


@pytest.mark.concurrent
def test_mark_step_does_nothing_outside_watch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(marks_module.ENV_MARKS, raising=False)
    marks_module.mark_step(1)
    monkeypatch.setenv(marks_module.ENV_MARKS, str(tmp_path / "missing" / "marks"))
    marks_module.mark_step(2)  # a watcher gone: no error, no file
    assert not (tmp_path / "missing").exists()
    monkeypatch.setenv(marks_module.ENV_MARKS, str(tmp_path / "marks"))
    (tmp_path / "marks").write_text("")
    marks_module.mark_step(3)
    marks_module.mark_step()
    assert [line.split()[1:] for line in (tmp_path / "marks").read_text().splitlines()] == [["3"], []]


@pytest.mark.concurrent
def test_importing_the_marks_module_imports_no_framework() -> None:
    code = (
        "import sys; from dnnperf.watch.marks import mark_step; mark_step(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'psutil')))"
    )
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.concurrent
def test_the_keras_callback_marks_every_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keras = pytest.importorskip("keras")
    import numpy as np

    from dnnperf.watch.keras import StepCallback

    monkeypatch.setenv(marks_module.ENV_MARKS, str(tmp_path / "marks"))
    (tmp_path / "marks").write_text("")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(
        np.zeros((32, 4)), np.zeros((32, 1)), batch_size=8, epochs=2, verbose=0, callbacks=[StepCallback()]
    )
    steps = [int(line.split()[1]) for line in (tmp_path / "marks").read_text().splitlines()]
    assert steps == list(range(8))  # 4 batches an epoch, 2 epochs, counted across epochs


# (f) signals ---------------------------------------------------------------------------------------

WATCHER = """
import json, sys
from dnnperf.watch.run import watch
result = watch(sys.argv[2:], interval_s=0.05)
with open(sys.argv[1], "w") as f:
    json.dump(result.to_dict(), f)
"""

STOPPABLE = """
import pathlib, signal, sys, time
directory = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    with open(directory / "got", "a") as f:
        f.write(f"{signum}\\n")
    time.sleep(0.3)  # a second copy of the signal would arrive here
    sys.exit(5)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
(directory / "ready").write_text(str(time.time()))
time.sleep(60)
"""


@pytest.mark.concurrent
@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_watcher_reaches_the_command_once_and_keeps_the_samples(
    sent: signal.Signals, tmp_path: Path
) -> None:
    out = tmp_path / "result.json"
    # Its own session, as under a scheduler: no terminal, so a SIGINT can only have come from kill.
    watcher = subprocess.Popen(
        [PYTHON, "-c", WATCHER, str(out), PYTHON, "-c", STOPPABLE, str(tmp_path)], start_new_session=True
    )
    try:
        wait_for(tmp_path / "ready")
        time.sleep(0.3)  # a few samples with the command running
        watcher.send_signal(sent)
        assert watcher.wait(timeout=60) == 0
    finally:
        watcher.kill()
    assert (tmp_path / "got").read_text() == f"{int(sent)}\n"
    result = WatchResult.from_dict(json.loads(out.read_text()))
    assert (result.end, result.stop_signal, result.exit_code) == ("interrupted", int(sent), 5)
    ready_at = float((tmp_path / "ready").read_text()) - result.started_at
    assert sum(1 for t in result.t if t >= ready_at) >= 3  # sampled while it ran and while it stopped


@pytest.mark.concurrent
def test_ctrl_c_at_a_terminal_reaches_the_command_once(tmp_path: Path) -> None:
    import pty

    out = tmp_path / "result.json"
    pid, terminal = pty.fork()  # the child leads a session whose controlling terminal is the pty
    if pid == 0:
        os.execv(PYTHON, [PYTHON, "-c", WATCHER, str(out), PYTHON, "-c", STOPPABLE, str(tmp_path)])
    try:
        wait_for(tmp_path / "ready")
        os.write(terminal, b"\x03")  # Ctrl-C: the terminal signals its foreground group, watcher and command
        deadline = time.monotonic() + 60
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # keep the pty drained
                select.select([terminal], [], [], 0.1) and os.read(terminal, 65536)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(terminal)
    assert (tmp_path / "got").read_text() == f"{int(signal.SIGINT)}\n"  # once: the watcher did not add one
    result = WatchResult.from_dict(json.loads(out.read_text()))
    assert (result.end, result.stop_signal, result.exit_code) == ("interrupted", int(signal.SIGINT), 5)


# (g) nothing left behind ---------------------------------------------------------------------------


def marks_files_open() -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [link for link in links if "dnnperf-watch-marks" in link]


@pytest.mark.concurrent
def test_processes_that_outlive_the_command_are_reported_and_ended(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    leave = (
        f"import subprocess, time; "
        f"a = subprocess.Popen(['sleep', '60']); b = subprocess.Popen(['sleep', '1']); "
        f"open({str(pids)!r}, 'w').write(f'{{a.pid}} {{b.pid}}'); "
        f"time.sleep(0.3)"  # sampled with its children: a process is followed from its first sample
    )
    temporary = set(Path(tempfile.gettempdir()).glob("dnnperf-watch-marks*"))
    result = watch([PYTHON, "-c", leave], interval_s=0.05, outlive_grace_s=3.0)
    stays, goes = map(int, pids.read_text().split())
    assert result.exit_code == 0
    assert {o.pid: (o.name, o.fate) for o in result.outlived} == {
        stays: ("sleep", "terminated"),
        goes: ("sleep", "exited"),
    }
    assert not psutil.pid_exists(stays) or psutil.Process(stays).status() == psutil.STATUS_ZOMBIE
    assert marks_files_open() == []
    assert set(Path(tempfile.gettempdir()).glob("dnnperf-watch-marks*")) == temporary


@pytest.mark.concurrent
def test_a_killed_watcher_takes_its_command_with_it(tmp_path: Path) -> None:
    child = f"import os, time; open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    watcher = subprocess.Popen(
        [PYTHON, "-c", WATCHER, str(tmp_path / "out.json"), PYTHON, "-c", child], start_new_session=True
    )
    try:
        pid = int(wait_for(tmp_path / "pid"))
        watcher.kill()
        watcher.wait()
        _, alive = psutil.wait_procs([psutil.Process(pid)], timeout=30)
        assert alive == []
    finally:
        watcher.kill()


@pytest.mark.concurrent
def test_an_error_in_the_watcher_does_not_leave_the_command_running() -> None:
    seen: list[int] = []

    def fail(result: WatchResult) -> None:
        seen.append(result.processes[0].pid)
        raise RuntimeError("on_sample failed")

    with pytest.raises(RuntimeError):
        watch([PYTHON, "-c", "import time; time.sleep(60)"], on_sample=fail)
    assert not psutil.pid_exists(seen[0])
    assert marks_files_open() == []


# the record ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def document() -> dict:
    result = watch([PYTHON, "-c", "import time; time.sleep(0.3)"], interval_s=0.05)
    return json.loads(json.dumps(result.to_dict()))


@pytest.mark.concurrent
def test_a_result_survives_its_json_form(document: dict) -> None:
    result = WatchResult.from_dict(document)
    assert result.to_dict() == document
    assert document["summary"]["samples"] == len(document["t"]) >= 2
    assert len(result.cost.cpu_s) == len(result.t) and result.sampling_share is not None


@pytest.mark.concurrent
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["total"]["rss_bytes"].__setitem__(0, -1), r"watch.total.rss_bytes\[0\]"),
        (lambda d: d["total"]["cpu_s"].__setitem__(0, math.inf), "finite"),
        (lambda d: d["total"]["threads"].append(1), "watch.total.threads holds"),
        (lambda d: d.__setitem__("end", "vanished"), "end 'vanished'"),
        (lambda d: d.__setitem__("t", list(reversed(d["t"]))), "backwards"),
        (lambda d: d.pop("cost"), "watch.cost is missing"),
        (lambda d: d["processes"][0].__setitem__("first", 10**6), "past the"),
        (lambda d: d.__setitem__("signal", 9), "both an exit_code and a signal"),
        (lambda d: d["marks"]["step"].append(1), "watch.marks.step holds"),
        (lambda d: d["config"].__setitem__("argv", "python"), "not a list"),
    ],
)
def test_a_bad_document_is_a_record_error_naming_the_field(document: dict, edit, message: str) -> None:
    broken = json.loads(json.dumps(document))
    edit(broken)
    with pytest.raises(RecordError, match=message):
        WatchResult.from_dict(broken)


# GPUs ----------------------------------------------------------------------------------------------


class FakeNvml(SimpleNamespace):
    """Two devices; the second supports neither PCIe throughput nor power."""

    class NVMLError(Exception):
        pass

    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"Fake GPU"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=40 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=3 * MIB)

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        if handle == 1:
            raise self.NVMLError("not supported")
        return 1000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 2000

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1:
            raise self.NVMLError("not supported")
        return 250_500

    def nvmlShutdown(self) -> None:
        self.shut = True


@pytest.mark.concurrent
def test_gpu_counters_come_in_bytes_per_second_and_watts_and_none_where_unsupported() -> None:
    nvml = FakeNvml()
    sampler = GpuSampler(nvml)
    sampler.sample()
    first, second = sampler.series
    assert (first.name, first.utilization_pct, first.memory_used_bytes) == ("Fake GPU", [40.0], [3 * MIB])
    assert (first.pcie_rx_bytes_per_s, first.pcie_tx_bytes_per_s, first.power_w) == (
        [1024e3],
        [2048e3],
        [250.5],
    )
    assert (second.pcie_rx_bytes_per_s, second.power_w, second.utilization_pct) == ([None], [None], [41.0])
    sampler.close()
    assert nvml.shut


@pytest.mark.concurrent
def test_without_nvidia_ml_py_there_are_no_gpu_series_and_the_result_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as when the package is absent
    sampler, note = open_gpus()
    assert sampler is None and "nvidia-ml-py" in note


EXEC_ITSELF = """
import os, sys, time
time.sleep(0.3)
os.execv("/bin/sleep", ["/bin/sleep", "0.5"])
"""


@pytest.mark.concurrent
def test_a_process_that_execs_is_named_by_the_program_it_became() -> None:
    """A launcher that execs its program (a pyenv shim, ``bash -c``, ``exec`` in a script): the
    process's name and command line are those of the program it ran last."""
    result = watch([PYTHON, "-c", EXEC_ITSELF], interval_s=0.05)
    (process,) = result.processes
    assert (process.name, process.cmdline) == ("sleep", ["/bin/sleep", "0.5"])


# the watcher's own failures and leftovers -----------------------------------------------------------


@pytest.mark.concurrent
def test_a_daemon_reparented_before_its_first_sample_is_reported_and_ended(tmp_path: Path) -> None:
    """The subshell forks a new-session sleep and exits at once: the sleep belongs to init before
    any sample sees it; only its DNNPERF_WATCH_ID says it is the command's."""
    pid_file = tmp_path / "pid"
    result = watch(
        ["bash", "-c", f"(setsid sleep 60 & echo $! > {pid_file})"], interval_s=0.5, outlive_grace_s=0.2
    )
    daemon = int(pid_file.read_text())
    assert {o.pid: (o.name, o.fate) for o in result.outlived} == {daemon: ("sleep", "terminated")}
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE


@pytest.mark.concurrent
def test_a_daemon_the_first_scan_misses_is_found_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process read mid-exec shows no environment: the first scan for the watch's id is made to see
    nothing, as then; the daemon is still reported and ended."""
    from dnnperf.watch import run as run_module

    scans = []

    def first_blind(variable: str, value: str) -> list:
        scans.append(value)
        return [] if len(scans) == 1 else job_processes(variable, value)

    monkeypatch.setattr(run_module, "job_processes", first_blind)
    pid_file = tmp_path / "pid"
    result = watch(
        ["bash", "-c", f"(setsid sleep 60 & echo $! > {pid_file})"], interval_s=0.5, outlive_grace_s=0.2
    )
    daemon = int(pid_file.read_text())
    assert len(scans) >= 2
    assert {o.pid: (o.name, o.fate) for o in result.outlived} == {daemon: ("sleep", "terminated")}


@pytest.mark.concurrent
def test_a_constructor_failing_right_after_the_start_does_not_leave_the_command_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnnperf.watch import run as run_module

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("sampler failed")

    started = []

    def start(*args: object, **kwargs: object) -> tuple[subprocess.Popen, str]:
        process, watch_id = real_start(*args, **kwargs)
        started.append(process)
        return process, watch_id

    real_start = run_module.start
    monkeypatch.setattr(run_module, "start", start)
    monkeypatch.setattr(run_module, "TreeSampler", fail)
    with pytest.raises(RuntimeError):
        watch([PYTHON, "-c", "import time; time.sleep(60)"])
    (process,) = started
    assert process.poll() is not None  # ended and reaped, not left running
    assert marks_files_open() == []


class FailingGpus:
    """A GPU reader that fails partway through its third sample (after one series got its value)."""

    def __init__(self) -> None:
        from dnnperf.results.watch import GpuSeries

        self.series = [GpuSeries(index=0, name="fake"), GpuSeries(index=1, name="fake")]
        self.calls = 0

    def sample(self) -> None:
        self.calls += 1
        for number, series in enumerate(self.series):
            if self.calls == 3 and number == 1:
                raise RuntimeError("the driver went away")
            for values in (series.utilization_pct, series.memory_used_bytes, series.power_w):
                values.append(1)
            series.pcie_rx_bytes_per_s.append(1.0)
            series.pcie_tx_bytes_per_s.append(1.0)

    def close(self) -> None:
        pass


@pytest.mark.concurrent
def test_a_watcher_failing_mid_sample_saves_a_record_that_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from dnnperf.cli import watch as command
    from dnnperf.watch import run as run_module

    monkeypatch.setattr(run_module, "open_gpus", lambda: (FailingGpus(), None))
    args = argparse.Namespace(
        watched=["--", PYTHON, "-c", "import time; time.sleep(60)"],
        interval=0.05,
        grace=30.0,
        leftover_grace=5.0,
        runs_dir=tmp_path,
        json=False,
        no_report=True,
    )
    with pytest.raises(RuntimeError, match="driver went away"):
        command.run(args, SimpleNamespace(), ["dnnperf", "watch"])
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "failed"
    result = WatchResult.from_dict(record["watch"])
    assert len(result.t) == 2  # the two whole samples; the broken third is not kept
    assert [len(g.power_w) for g in result.gpus] == [2, 2]


class FakeClocks:
    """A wall clock and a CPU clock that only a save moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0


@pytest.mark.concurrent
def test_saves_are_spaced_by_twenty_times_the_last_save() -> None:
    from dnnperf.watch.recording import Saver

    clocks = FakeClocks()
    saved: list[float] = []

    def slow_save() -> None:  # 0.25 s of wall time (0.125 s of CPU): the next save 20 x 0.25 s after it ends
        saved.append(clocks.now)
        clocks.now += 0.25
        clocks.cpu += 0.125

    saver = Saver(slow_save, clock=lambda: clocks.now, cpu_clock=lambda: clocks.cpu)
    costs = []
    for _ in range(128):  # a sample every 0.125 s (exact in binary) for 16 s
        costs.append(saver.maybe_save())
        clocks.now += 0.125
    assert saved == [0.0, 5.25, 10.5, 15.75]
    assert costs.count(0.125) == 4 and sum(costs) == 0.5  # each save's CPU, to count into the cost


@pytest.mark.concurrent
def test_fast_saves_are_spaced_by_one_second() -> None:
    from dnnperf.watch.recording import Saver

    clocks = FakeClocks()
    saved: list[float] = []
    saver = Saver(lambda: saved.append(clocks.now), clock=lambda: clocks.now, cpu_clock=lambda: clocks.cpu)
    for _ in range(50):
        saver.maybe_save()
        clocks.now += 0.125
    assert saved == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
