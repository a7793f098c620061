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
