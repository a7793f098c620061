"""A child dnnperf command stopped with this process gets SIGTERM and time to clean up, not SIGKILL."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from dnnperf.interrupts import run_child, stop_on_signals

CHILD = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def cleanup(*_):
    marker.write_text("cleaned up")  # what a dnnperf child does: remove its ranks, namespaces, files
    sys.exit(3)
signal.signal(signal.SIGTERM, cleanup)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_stopped_parent_lets_its_child_clean_up(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    # As `kill` from a shell would: to the process, which the main thread (waiting on the child) gets.
    main = threading.main_thread().ident
    timer = threading.Timer(1.5, signal.pthread_kill, (main, signal.SIGTERM))
    started = time.monotonic()
    with stop_on_signals():
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            run_child([sys.executable, "-c", CHILD, str(marker)], grace_s=10)
    timer.join()
    assert marker.read_text() == "cleaned up"
    assert time.monotonic() - started < 10


def test_a_child_that_overruns_is_stopped_the_same_way(tmp_path: Path) -> None:
    import subprocess

    marker = tmp_path / "marker"
    with pytest.raises(subprocess.TimeoutExpired):
        run_child([sys.executable, "-c", CHILD, str(marker)], timeout_s=1.5, grace_s=10)
    assert marker.read_text() == "cleaned up"


def test_output_and_exit_code_come_back() -> None:
    done = run_child(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)"]
    )
    assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err\n")


#: A child that says it started, then waits up to 20 s for the other child of its pair to start.
WAITS_FOR_ITS_PAIR = """
import pathlib, sys, time
here, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
here.write_text("started")
deadline = time.monotonic() + float(sys.argv[3])
while not other.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
print("met" if other.exists() else "alone")
"""


def test_children_run_side_by_side_up_to_the_limit(tmp_path: Path) -> None:
    from dnnperf.interrupts import run_children

    a, b = tmp_path / "a", tmp_path / "b"
    pair = [[sys.executable, "-c", WAITS_FOR_ITS_PAIR, str(a), str(b), "20"]]
    pair.append([sys.executable, "-c", WAITS_FOR_ITS_PAIR, str(b), str(a), "20"])
    assert [done.stdout for done in run_children(pair, parallel=2)] == ["met\n", "met\n"]
    a.unlink()
    b.unlink()
    # One at a time: the first waits (here 2 s) and never meets the second, which starts after it.
    pair[0][-1] = pair[1][-1] = "2"
    assert [done.stdout for done in run_children(pair, parallel=1)] == ["alone\n", "met\n"]


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    import subprocess

    pids = tmp_path / "pids"
    parent = f"""
import sys
from dnnperf.interrupts import run_children
child = "import os, time; open({str(pids)!r}, 'a').write(str(os.getpid()) + chr(10)); time.sleep(60)"
run_children([[sys.executable, "-c", child]] * 2, parallel=2)
"""
    process = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
        time.sleep(0.05)
    children = [int(p) for p in pids.read_text().split()]
    process.kill()  # SIGKILL: no handler of the parent runs
    process.wait()
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    assert len(children) == 2 and alive == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_children_beside_other_work_stop_when_that_work_fails(tmp_path: Path) -> None:
    from dnnperf.interrupts import children_beside

    pids = tmp_path / "pids"
    child = f"import os, time; open({str(pids)!r}, 'a').write(str(os.getpid()) + chr(10)); time.sleep(60)"
    with (
        pytest.raises(ValueError, match="the description failed"),
        children_beside([[sys.executable, "-c", child]] * 2, parallel=2),
    ):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.05)
        raise ValueError("the description failed")
    assert [p for p in map(int, pids.read_text().split()) if _alive(p)] == []
    assert not any(t.name == "dnnperf-children" for t in threading.enumerate())
    with children_beside([[sys.executable, "-c", "print('counted')"]]) as wait:
        assert [done.stdout for done in wait()] == ["counted\n"]


EXITING = """
import atexit, gc, pathlib, sys, weakref
import torch
from dnnperf.interrupts import exit_now

out = pathlib.Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text(f"ran, {gc.get_freeze_count()} objects frozen"))
class Held: pass
held = Held()
weakref.finalize(held, lambda: (out / "finalizer").write_text("ran"))
print("printed", end="")
exit_now(3)
"""


def test_a_quick_exit_still_runs_exit_handlers_and_finalizers_and_keeps_its_code(tmp_path) -> None:
    """exit_now skips only the last garbage collections (the objects alive are frozen out of them):
    what a process registered to run at exit (an atexit handler, a live object's finalizer) runs,
    buffered output is written, the code is kept."""
    done = run_child([sys.executable, "-c", EXITING, str(tmp_path)], timeout_s=120)
    assert done.returncode == 3 and done.stdout == "printed"
    assert (tmp_path / "finalizer").read_text() == "ran"
    ran, frozen = (tmp_path / "atexit").read_text().split(", ")
    assert ran == "ran" and int(frozen.split()[0]) > 10_000  # torch's import alone makes more
