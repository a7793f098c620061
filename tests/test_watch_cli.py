"""``dnnperf watch`` end to end: the record, the exit code, bad input, show, report, export, compare and
a SIGKILLed watcher, each checked against what the watched command did (a known allocation, a known
exit code, marks at known steps) or against what it must leave (no process, an interrupted record)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

MIB = 1024 * 1024
ALLOCATED = 300 * MIB
PYTHON = sys.executable

#: Allocates ALLOCATED bytes page by page (resident, not just reserved), holds them, marks 6 steps.
ALLOCATE = f"""
import time
from dnnperf import mark_step
time.sleep(0.4)
block = bytearray({ALLOCATED})
for i in range(0, len(block), 4096):
    block[i] = 1
for step in range(6):
    time.sleep(0.2)
    mark_step(step)
del block
time.sleep(0.4)
"""


def dnnperf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "dnnperf", *args], capture_output=True, text=True, timeout=timeout)


def record_of(runs: Path) -> dict:
    (path,) = runs.glob("*.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """One watch of the allocating command: its runs directory, its record and the finished process."""
    runs = tmp_path_factory.mktemp("runs")
    done = dnnperf(
        "watch", "--interval", "0.05", "--runs-dir", str(runs), "--json", "--", PYTHON, "-c", ALLOCATE
    )
    assert done.returncode == 0, done.stderr
    return runs, json.loads(done.stdout), done


def rise(record: dict) -> int:
    rss = record["watch"]["total"]["rss_bytes"]
    return max(rss) - rss[0]


def test_the_record_holds_the_allocation_and_how_the_command_ended(watched) -> None:
    runs, document, _ = watched
    record = document["record"]
    assert record == record_of(runs) and document["record_path"].endswith(".json")
    assert (record["kind"], record["status"], record["workload"]) == (
        "watch",
        "complete",
        {"name": Path(PYTHON).name, "preset": "watch"},
    )
    assert record["settings"]["data"] == "external" and record["settings"]["interval_s"] == 0.05
    assert abs(rise(record) - ALLOCATED) <= 0.10 * ALLOCATED, rise(record) / MIB
    assert (record["watch"]["end"], record["watch"]["exit_code"]) == ("exited", 0)
    assert record["watch"]["marks"]["step"] == list(range(6))
    assert Path(document["report_path"]).is_file()


def test_show_prints_the_figures_of_the_record(watched) -> None:
    runs, document, _ = watched
    shown = dnnperf("show", document["record_path"])
    assert shown.returncode == 0, shown.stderr
    watch = document["record"]["watch"]
    peak = max(watch["total"]["rss_bytes"])
    assert f"{peak / MIB:.1f} MiB" in shown.stdout
    assert "exited with code 0" in shown.stdout
    assert "steps (mark_step)" in shown.stdout and "\u2502     5 \u2502" in shown.stdout  # 6 marks, 5 steps
    assert "pynvml" in shown.stdout or "GPU" in shown.stdout
    listed = dnnperf("runs", "--runs-dir", str(runs), "--json")
    assert [r["status"] for r in json.loads(listed.stdout)["runs"]] == ["complete"]


def test_the_report_draws_the_timelines_and_the_step_histogram(watched) -> None:
    _, document, _ = watched
    page = Path(document["report_path"]).read_text()
    assert '<section id="watch">' in page
    # 7 tree timelines (no GPU here) and the histogram of the 5 steps between the 6 marks.
    assert page.count('<figure class="chart"><svg') == 8
    assert "5 steps, median" in page and "ms of CPU per sample" in page


def test_the_trace_counters_and_marks_are_the_allocation_and_the_steps(watched, tmp_path: Path) -> None:
    _, document, _ = watched
    trace, tables = tmp_path / "t.json", tmp_path / "csv"
    done = dnnperf("export", document["record_path"], "--trace", str(trace), "--csv", str(tables))
    assert done.returncode == 0, done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    tree = [
        e["args"]["rss_bytes"]
        for e in events
        if e["ph"] == "C" and e["pid"] == 0 and e["name"] == "rss_bytes"
    ]
    assert abs(max(tree) - tree[0] - ALLOCATED) <= 0.10 * ALLOCATED
    assert [e["name"] for e in events if e["ph"] == "i"] == [f"step {i}" for i in range(6)]
    watch = document["record"]["watch"]
    child = watch["processes"][0]["pid"]
    assert any(e["ph"] == "C" and e["pid"] == child for e in events)  # the process's own tracks
    samples = (tables / "samples.csv").read_text().splitlines()
    assert len(samples) == 1 + len(watch["t"])
    column = samples[0].split(",").index("rss_bytes")
    assert max(int(line.split(",")[column]) for line in samples[1:]) == max(watch["total"]["rss_bytes"])


def test_compare_states_the_figures_and_refuses_a_bench_record(watched, tmp_path: Path) -> None:
    _, document, _ = watched
    path = document["record_path"]
    done = dnnperf("compare", path, path, "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)["rows"]}
    step = rows["median step time (s)"]
    assert (step["n_a"], step["delta_rel"], step["flagged"]) == (5, 0.0, False)  # a run against itself
    assert rows["peak RSS (bytes)"]["a"] == max(document["record"]["watch"]["total"]["rss_bytes"])
    bench = dict(document["record"], kind="bench", id="bench-like")
    del bench["watch"]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    refused = dnnperf("compare", path, str(tmp_path / "bench.json"))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "measured their steps differently" in refused.stderr


GIB = 1024 * MIB


def with_a_gpu(record: dict) -> dict:
    """The record with one GPU series: memory rising from 1 GiB to 5 GiB (a 4 GiB allocation), 50%
    utilisation, PCIe rx peaking at 50 GB/s, 300 W; one value left unread (None)."""
    samples = len(record["watch"]["t"])
    memory = [GIB] * (samples // 2) + [5 * GIB] * (samples - samples // 2)
    gpu = {
        "index": 0,
        "name": "Fake GPU",
        "utilization_pct": [50.0] * samples,
        "memory_used_bytes": memory,
        "pcie_rx_bytes_per_s": [None] + [50e9] * (samples - 1),
        "pcie_tx_bytes_per_s": [1e9] * samples,
        "power_w": [300.0] * samples,
    }
    watch = dict(record["watch"], gpus=[gpu], gpu_note=None)
    return dict(record, watch=watch, settings=dict(record["settings"], device="cuda"))


def test_gpu_series_are_shown_drawn_traced_and_compared(watched, tmp_path: Path) -> None:
    _, document, _ = watched
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(with_a_gpu(document["record"])))
    shown = dnnperf("show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "5120.0 MiB" in shown.stdout and "50%" in shown.stdout and "50 GB/s" in shown.stdout
    assert "300 W" in shown.stdout
    report = tmp_path / "gpu.html"
    assert dnnperf("report", str(path), "-o", str(report)).returncode == 0
    assert report.read_text().count('<figure class="chart"><svg') == 8 + 4  # four per GPU
    trace = tmp_path / "t.json"
    assert dnnperf("export", str(path), "--trace", str(trace)).returncode == 0
    memory = [
        e["args"]["memory_used_bytes"]
        for e in json.loads(trace.read_text())["traceEvents"]
        if e["ph"] == "C" and e["name"] == "memory_used_bytes"
    ]
    assert max(memory) - min(memory) == 4 * GIB
    compared = dnnperf("compare", str(path), str(path), "--json")
    rows = {r["name"]: r for r in json.loads(compared.stdout)["rows"]}
    assert rows["GPU 0 peak memory (bytes)"]["a"] == 5 * GIB


def test_a_stopped_watch_is_partial_and_exits_as_its_command(tmp_path: Path) -> None:
    """SIGTERM to the watcher: forwarded to the command, which dies of it; the record is partial."""
    sleeper = [PYTHON, "-c", "import time; time.sleep(600)"]
    watcher = subprocess.Popen(
        [PYTHON, "-m", "dnnperf", "watch", "--runs-dir", str(tmp_path), "--no-report", "-q", "--", *sleeper]
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("*.json")):
            time.sleep(0.05)
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        watcher.kill()
        watcher.wait()
    record = record_of(tmp_path)
    assert (record["status"], record["watch"]["end"], record["watch"]["signal"]) == (
        "partial",
        "interrupted",
        signal.SIGTERM,
    )


def test_a_process_left_behind_is_shown_with_its_fate(tmp_path: Path) -> None:
    """The shell starts a 60 s sleep in the background and exits; the sleep outlives it, gets
    --leftover-grace to end, does not, and is terminated (sleep ends on SIGTERM)."""
    shell = "sleep 60 & sleep 3"  # 3 s: sampled many times before the shell exits
    done = dnnperf(
        "watch",
        "--runs-dir",
        str(tmp_path),
        "--no-report",
        "--leftover-grace",
        "0.2",
        "--",
        "bash",
        "-c",
        shell,
    )
    assert done.returncode == 0, done.stderr
    (outlived,) = record_of(tmp_path)["watch"]["outlived"]
    assert (outlived["name"], outlived["cmdline"], outlived["fate"]) == (
        "sleep",
        ["sleep", "60"],
        "terminated",
    )
    assert "processes that outlived the command" in done.stdout and "terminated" in done.stdout
    assert not psutil.pid_exists(outlived["pid"]) or psutil.Process(outlived["pid"]).cmdline() != [
        "sleep",
        "60",
    ]


def test_the_command_exit_code_passes_through(tmp_path: Path) -> None:
    done = dnnperf(
        "watch",
        "--runs-dir",
        str(tmp_path),
        "--no-report",
        "-q",
        "--",
        PYTHON,
        "-c",
        "import sys; sys.exit(3)",
    )
    assert done.returncode == 3, done.stderr
    record = record_of(tmp_path)
    assert (record["status"], record["watch"]["exit_code"], record["watch"]["end"]) == (
        "complete",
        3,
        "exited",
    )
    assert not list(tmp_path.glob("*.html"))  # --no-report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0", "--", "true"], "--interval"),
        (["--interval", "nan", "--", "true"], "--interval"),
        (["--interval", "-1", "--", "true"], "--interval"),
        (["--"], "needs a command"),
        ([], "needs a command"),
        (["--", "/nonexistent/dnnperf-no-such-program"], "cannot run"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = dnnperf("watch", "--runs-dir", str(tmp_path), *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.json"))  # nothing measured, no record


def test_markup_in_the_command_name_is_shown_literally(tmp_path: Path) -> None:
    script = tmp_path / "[bold red]train[blink].py"
    script.write_text("print('ran')\n")
    runs = tmp_path / "runs"
    done = dnnperf("watch", "--runs-dir", str(runs), "--no-report", "--", PYTHON, str(script))
    assert done.returncode == 0, done.stderr
    assert "[bold red]train[blink].py" in done.stdout
    record = record_of(runs)
    assert record["workload"]["name"] == "[bold red]train[blink].py"
    shown = dnnperf("show", str(next(runs.glob("*.json"))))
    assert "[bold red]train[blink].py" in shown.stdout


GRANDCHILD = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(600)
"""


def test_a_sigkilled_watcher_takes_the_whole_tree_and_leaves_an_interrupted_record(tmp_path: Path) -> None:
    """bash runs python as a grandchild of the watcher (bash does not exec it: a command follows)."""
    pid_file, runs = tmp_path / "pid", tmp_path / "runs"
    script = tmp_path / "child.py"
    script.write_text(GRANDCHILD)
    shell = f"{PYTHON} {script} {pid_file}; echo done"
    watcher = subprocess.Popen(
        [PYTHON, "-m", "dnnperf", "watch", "--runs-dir", str(runs), "--", "bash", "-c", shell],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    grandchild = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text()):
            time.sleep(0.05)
        grandchild = psutil.Process(int(pid_file.read_text()))
        while time.monotonic() < deadline and not list(runs.glob("*.json")):
            time.sleep(0.05)
        assert grandchild.is_running() and list(runs.glob("*.json"))
        watcher.kill()
        watcher.wait()
        _, alive = psutil.wait_procs([grandchild], timeout=60)
        assert not alive, "the grandchild outlived its SIGKILLed watcher"
        listed = dnnperf("runs", "--runs-dir", str(runs), "--json")
        assert [r["status"] for r in json.loads(listed.stdout)["runs"]] == ["interrupted"]
    finally:
        watcher.kill()
        watcher.wait()
        if grandchild is not None:  # a failed test must not leave it sleeping
            with contextlib.suppress(psutil.Error):
                grandchild.kill()


def test_importing_the_watch_record_module_loads_no_torch() -> None:
    code = "import sys, dnnperf.results.watch, dnnperf.keras, dnnperf; dnnperf.mark_step; "
    code += "print(sorted(m for m in ('torch', 'keras') if m in sys.modules))"
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_command_ignoring_sigterm_is_killed_after_the_grace_and_the_record_is_partial(
    tmp_path: Path,
) -> None:
    """The command ignores the forwarded SIGTERM; --grace 0.5 later the watcher kills it (SIGKILL),
    keeps the partial record and exits as the command ended: 128 + SIGKILL."""
    ready = tmp_path / "ready"
    stubborn = [
        PYTHON,
        "-c",
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(600)",
        str(ready),
    ]
    runs = tmp_path / "runs"
    options = ["--runs-dir", str(runs), "--no-report", "-q", "--grace", "0.5"]
    watcher = subprocess.Popen(
        [PYTHON, "-m", "dnnperf", "watch", *options, "--", *stubborn],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ready.exists():
            time.sleep(0.05)
        watcher.send_signal(signal.SIGTERM)
        code = watcher.wait(timeout=120)
    finally:
        watcher.kill()
        watcher.wait()
    assert code == 128 + signal.SIGKILL, watcher.stderr.read() if watcher.stderr else ""
    record = record_of(runs)
    assert (record["status"], record["watch"]["end"], record["watch"]["signal"]) == (
        "partial",
        "interrupted",
        signal.SIGKILL,
    )
    assert record["watch"]["stop_signal"] == signal.SIGTERM
