"""What a measurement ran on: the machine, the device and the software versions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from dnnperf.version import __version__


def _cpuinfo() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (Linux); empty elsewhere."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first CPU's block ends at a blank line
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform reports."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_revision() -> str | None:
    """An x86 CPU's family, model and stepping (/proc/cpuinfo, Linux), which tell apart processors of
    one marketing name (a VM often reports only "AMD EPYC"); None elsewhere."""
    info = _cpuinfo()
    fields = [info.get(f) for f in ("cpu family", "model", "stepping")]
    if not all(fields):
        return None
    family, model, stepping = fields
    return f"family {family} model {model} stepping {stepping}"


def gpu_info() -> list[dict[str, Any]]:
    """Name, memory and compute capability of every visible CUDA device."""
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_bytes": int(props.total_memory),
                "compute_capability": f"{props.major}.{props.minor}",
                "multiprocessors": int(props.multi_processor_count),
            }
        )
    return gpus


@cache
def machine() -> dict[str, Any]:
    """The host: CPU, cores, memory, GPUs. Cached: it does not change during a process."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_revision": cpu_revision(),
        "architecture": platform.machine(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_usable": len(affinity) if affinity is not None else psutil.cpu_count(logical=True),
        "memory_bytes": int(psutil.virtual_memory().total),
        "gpus": gpu_info(),
    }


def software() -> dict[str, Any]:
    """Versions that change results: Python, torch and its backends, numpy, dnnperf, the OS."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "dnnperf": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "numpy": np.__version__,
        "os": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }


def describe() -> dict[str, Any]:
    """Everything a run record stores about where it ran."""
    return {"machine": machine(), "software": software()}


def source_commit() -> str:
    """The commit of the dnnperf checkout this code runs from, marked when the package's own files
    differ from it (what a run writes elsewhere, docs included, does not count); "unknown" for an
    installed copy outside git."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=here
        ).stdout.strip()
        changed = ["git", "diff", "--quiet", "HEAD", "--", "."]  # the package's own files only
        dirty = subprocess.run(changed, capture_output=True, cwd=here).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} with local changes" if dirty else commit
