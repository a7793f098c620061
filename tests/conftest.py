"""Shared fixtures: every test gets its own runs and dataset directories, and a small thread count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Two cores here and in CI: one intra-op thread per test process keeps timings stable and leaves a
# core for DataLoader workers and subprocesses.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    runs, data = tmp_path / "runs", tmp_path / "datasets"
    monkeypatch.setenv("DNNPERF_RUNS_DIR", str(runs))
    monkeypatch.setenv("DNNPERF_DATA_DIR", str(data))
    monkeypatch.setenv("DNNPERF_CACHE_DIR", str(tmp_path / "cache"))
    return {"runs": runs, "data": data}


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Run ``python -m dnnperf ARGS`` in a fresh process, as a user would, capturing both streams."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dnnperf", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
