"""dnnperf: measure, explain, predict and reduce the cost of training deep neural networks.

The Python API: workloads of the suite (:func:`get_workload`), the measuring runner (:func:`bench`)
and the run records it produces (:class:`RunRecord`, :class:`RunStore`), and the stage profiler for
your own training loop (:class:`StageProfiler`), the per-layer profiler (:class:`LayerProfiler`, tables in
:mod:`dnnperf.analysis.layers`), the memory profiler (:class:`MemoryProfiler`) and the calibrated machine
(:func:`load_profile`, ``dnnperf hw``).
"""

__version__ = "0.1.0"

from dnnperf.hardware import HardwareProfile, calibrate, load_profile
from dnnperf.probes.layers import LayerProfile, LayerProfiler
from dnnperf.probes.memory import StepMemory
from dnnperf.probes.memory_loop import MemoryProfiler
from dnnperf.probes.stages import StageBreakdown, StageProfiler
from dnnperf.results import Point, RunRecord, RunStore, read_record
from dnnperf.runner import BenchSettings, bench
from dnnperf.stats import Samples
from dnnperf.workloads import Task, Workload, all_workloads, get_workload

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
    "read_record",
]
