"""Each launched rank's heartbeat: a small JSON file the launcher reads to tell a crashed or hung rank
from the ranks waiting for it. A thread rewrites it every ``interval`` seconds (atomically), so a
frozen process is seen as a stale beat, and a live one stuck in the same place as no progress."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnperf.jsonio import write_json_atomic

RUNNING_STATES = ("starting", "running")
FINAL_STATES = ("done", "failed", "usage", "interrupted")


def heartbeat_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.json"


class Heartbeat:
    """Writes ``rank-R.json``: pid, state, steps done, current stage, when progress was last made."""

    def __init__(self, directory: Path, rank: int, interval: float = 0.25) -> None:
        self.path = heartbeat_path(directory, rank)
        self.interval = interval
        self.state: dict[str, Any] = {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "state": "starting",
            "step": 0,
            "stage": "starting",
            "collectives": 0,
            "progress_at": time.time(),
            "error": None,
            "failed_at": None,
        }
        #: Where the rank is now: (stage name, collectives launched); polled by the thread.
        self.where: Callable[[], tuple[str, int]] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"dnnperf-heartbeat-{rank}", daemon=True)

    def start(self) -> Heartbeat:
        self._write()
        self._thread.start()
        return self

    def step_done(self) -> None:
        with self._lock:
            self.state["step"] += 1
            self.state["state"] = "running"
            self.state["progress_at"] = time.time()

    def _poll(self) -> None:
        if self.where is None:
            return
        try:
            stage, collectives = self.where()
        except Exception:  # the step's objects changing under us: try again next beat
            return
        with self._lock:
            if (stage, collectives) != (self.state["stage"], self.state["collectives"]):
                self.state.update(stage=stage, collectives=collectives, progress_at=time.time())

    def _write(self) -> None:
        with self._lock:
            document = {**self.state, "beat": time.time()}
        with contextlib.suppress(OSError):  # the launcher removed the directory: it no longer listens
            write_json_atomic(self.path, document)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()
            self._write()

    def finish(self, state: str, error: str | None = None) -> None:
        """Stop the thread and write the final state (done, failed, usage, interrupted)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self.state.update(state=state, error=error)
            if state != "done":
                self.state["failed_at"] = time.time()
        self._write()
