"""dnnperf: measure, explain, predict and reduce the cost of training deep neural networks.

The Python API: workloads of the suite (:func:`get_workload`), the measuring runner (:func:`bench`)
and the run records it produces (:class:`RunRecord`, :class:`RunStore`), and the stage profiler for
your own training loop (:class:`StageProfiler`), the per-layer profiler (:class:`LayerProfiler`, tables in
:mod:`dnnperf.analysis.layers`), the memory profiler (:class:`MemoryProfiler`) and the calibrated machine
(:func:`load_profile`, ``dnnperf hw``); :func:`mark_step` marks a training step for ``dnnperf watch``.

Each name is imported on first use (PEP 562): ``import dnnperf`` does not import torch, so the command
line answers Ctrl-C and SIGTERM in one line from its first moment, while torch is still loading.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dnnperf.version import __version__

#: Public name -> the module that defines it.
_EXPORTS = {
    "BenchSettings": "dnnperf.runner",
    "HardwareProfile": "dnnperf.hardware",
    "LayerProfile": "dnnperf.results.layers",
    "LayerProfiler": "dnnperf.probes.layers",
    "MemoryProfiler": "dnnperf.probes.memory_loop",
    "Point": "dnnperf.results",
    "RunRecord": "dnnperf.results",
    "RunStore": "dnnperf.results",
    "Samples": "dnnperf.stats",
    "StageBreakdown": "dnnperf.results.stages",
    "StageProfiler": "dnnperf.probes.stages",
    "StepMemory": "dnnperf.results.memory",
    "Task": "dnnperf.workloads",
    "Workload": "dnnperf.workloads",
    "all_workloads": "dnnperf.workloads",
    "bench": "dnnperf.runner",
    "calibrate": "dnnperf.calibration",
    "get_workload": "dnnperf.workloads",
    "load_profile": "dnnperf.hardware",
    "mark_step": "dnnperf.watch.marks",
    "predict": "dnnperf.perfmodel.user",
    "read_record": "dnnperf.results",
}

__all__ = [
    "BenchSettings",
    "HardwareProfile",
    "LayerProfile",
    "LayerProfiler",
    "MemoryProfiler",
    "Point",
    "RunRecord",
    "RunStore",
    "Samples",
    "StageBreakdown",
    "StageProfiler",
    "StepMemory",
    "Task",
    "Workload",
    "__version__",
    "all_workloads",
    "bench",
    "calibrate",
    "get_workload",
    "load_profile",
    "mark_step",
    "predict",
    "read_record",
]

if TYPE_CHECKING:
    from dnnperf.calibration import calibrate
    from dnnperf.hardware import HardwareProfile, load_profile
    from dnnperf.perfmodel.user import predict
    from dnnperf.probes.layers import LayerProfiler
    from dnnperf.probes.memory_loop import MemoryProfiler
    from dnnperf.probes.stages import StageProfiler
    from dnnperf.results import Point, RunRecord, RunStore, read_record
    from dnnperf.results.layers import LayerProfile
    from dnnperf.results.memory import StepMemory
    from dnnperf.results.stages import StageBreakdown
    from dnnperf.runner import BenchSettings, bench
    from dnnperf.stats import Samples
    from dnnperf.watch.marks import mark_step
    from dnnperf.workloads import Task, Workload, all_workloads, get_workload


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dnnperf' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
