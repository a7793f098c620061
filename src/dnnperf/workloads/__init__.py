"""The workload suite: one module per application domain, each registering its workloads, and the
third-party models (``zoo``: timm and transformers, imported only when such a name is asked for)."""

from dnnperf.workloads import (  # noqa: F401 - imported to register their workloads
    adversarial,
    classification,
    detection,
    language,
    recommendation,
    reinforcement,
    speech,
    translation,
    zoo,
)
from dnnperf.workloads.base import Batch, Stages, SupervisedTask, Task, Workload, count_parameters
from dnnperf.workloads.registry import all_workloads, get_workload, register

__all__ = [
    "Batch",
    "Stages",
    "SupervisedTask",
    "Task",
    "Workload",
    "all_workloads",
    "count_parameters",
    "get_workload",
    "register",
]
