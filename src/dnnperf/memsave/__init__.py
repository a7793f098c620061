"""Memory saving: keep, offload or recompute each layer's saved activations (docs/memsave.md)."""

from dnnperf.memsave.policy import KEEP, OFFLOAD, POLICIES, RECOMPUTE, Plan, Unit, find_units, plan_of
from dnnperf.memsave.saver import MemorySaver

__all__ = [
    "KEEP",
    "OFFLOAD",
    "POLICIES",
    "RECOMPUTE",
    "MemorySaver",
    "Plan",
    "Unit",
    "find_units",
    "plan_of",
]
