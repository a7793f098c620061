"""One training step's memory by data structure, as a value: the peak by category, a timeline, per-layer
bytes and the subsystem's figures (measured by ``dnnperf.probes.memory.MemoryTracker``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: What each byte of a step's memory is (the tracker's documentation says how each is told apart).
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "input",
    "temporaries",
    "other",
)
#: Measured beside the categories: the allocator's cache (CUDA) and what no category explains.
EXTRA = ("allocator_cache", "unattributed")


@dataclass
class StepMemory:
    """One step's memory: the peak by category, a timeline, per-layer bytes and the subsystem."""

    device: str
    #: Bytes per category at the moment of the tracked peak (see CATEGORIES, EXTRA).
    peak: dict[str, int]
    #: The measured peak (allocator on CUDA; resident-memory growth + bytes alive at the start on CPU).
    measured_peak: int
    #: How ``measured_peak`` was measured.
    measured_by: str
    #: Seconds from the step's start to the tracked peak, and where it fell.
    peak_at_s: float
    peak_module: str
    peak_phase: str
    #: (seconds from the start, bytes per category) at every allocation and release.
    timeline: list[tuple[float, dict[str, int]]]
    #: Stage boundaries: (seconds from the start, stage name entered).
    stages: list[tuple[float, str]]
    #: module -> {parameters, gradients, outputs, saved} bytes.
    layers: dict[str, dict[str, int]]
    #: Resident memory, page faults, device utilisation, counters (see MemoryProfile.subsystem).
    subsystem: dict[str, Any] = field(default_factory=dict)
    #: Each category's own largest value over the step (the saved activations peak at the end of
    #: forward, the gradients at the update: not necessarily at the moment of the overall peak).
    category_max: dict[str, int] = field(default_factory=dict)
    #: Wall time of the tracked step (the tracking's overhead, beside the plain steps' times).
    wall_s: float = 0.0

    @property
    def tracked_peak(self) -> int:
        return sum(v for k, v in self.peak.items() if k in CATEGORIES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "peak": self.peak,
            "tracked_peak": self.tracked_peak,
            "measured_peak": self.measured_peak,
            "measured_by": self.measured_by,
            "peak_at_s": self.peak_at_s,
            "peak_module": self.peak_module,
            "peak_phase": self.peak_phase,
            "timeline": [[t, by] for t, by in self.timeline],
            "stages": [[t, name] for t, name in self.stages],
            "layers": self.layers,
            "subsystem": self.subsystem,
            "category_max": self.category_max,
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepMemory:
        return cls(
            device=str(data["device"]),
            peak={k: int(v) for k, v in data["peak"].items()},
            measured_peak=int(data["measured_peak"]),
            measured_by=str(data["measured_by"]),
            peak_at_s=float(data["peak_at_s"]),
            peak_module=str(data["peak_module"]),
            peak_phase=str(data["peak_phase"]),
            timeline=[(float(t), {k: int(v) for k, v in by.items()}) for t, by in data["timeline"]],
            stages=[(float(t), str(name)) for t, name in data["stages"]],
            layers={m: {k: int(v) for k, v in d.items()} for m, d in data["layers"].items()},
            subsystem=dict(data.get("subsystem", {})),
            category_max={k: int(v) for k, v in data.get("category_max", {}).items()},
            wall_s=float(data.get("wall_s", 0.0)),
        )


def step_memory_from_document(data: Any, where: str) -> StepMemory | None:
    """A stored step's memory, checked (``where`` names it in the ``ValueError``); None for null. Run
    records and each rank of a distributed one read theirs through this."""
    if data is None:
        return None
    where = f"{where}.memory"
    if not isinstance(data, dict) or not isinstance(data.get("peak"), dict):
        raise ValueError(f"{where} is not an object with a 'peak' by category")
    for name, value in data["peak"].items():
        if not isinstance(value, int) or isinstance(value, bool) or (value < 0 and name != "unattributed"):
            raise ValueError(f"{where}.peak.{name} must be a byte count, got {value!r}")
    if not isinstance(data.get("timeline"), list) or not isinstance(data.get("layers"), dict):
        raise ValueError(f"{where} needs a 'timeline' list and a 'layers' object")
    try:
        return StepMemory.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{where}: {error}") from None
