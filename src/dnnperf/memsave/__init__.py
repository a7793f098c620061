"""Memory saving: keep, offload or recompute each layer's saved activations, and the training state off the
device (docs/memsave.md)."""

from dnnperf.memsave.budget import Budget
from dnnperf.memsave.policy import Unit, find_units, plan_of
from dnnperf.memsave.saver import MemorySaver
from dnnperf.memsave.state import StateSaver
from dnnperf.memsave.user import plan_for
from dnnperf.results.memsave import KEEP, OFFLOAD, POLICIES, RECOMPUTE, Plan

__all__ = [
    "KEEP",
    "OFFLOAD",
    "POLICIES",
    "RECOMPUTE",
    "Budget",
    "MemorySaver",
    "Plan",
    "StateSaver",
    "Unit",
    "find_units",
    "plan_for",
    "plan_of",
]
