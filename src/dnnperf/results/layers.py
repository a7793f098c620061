"""Per-layer operator times of real training steps, as a value: one row per (module, phase, operator)
with that row's time in every timed step and the FLOPs, bytes and library of each (measured by
``dnnperf.probes.layers``; the tables people read are functions over it in
:mod:`dnnperf.analysis.layers`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OpTiming:
    """One (module, phase, operator) of the step: what one step of it costs, and its time per step."""

    module: str
    phase: str
    op: str
    family: str
    calls: int
    #: FLOPs per step; None when the operator has no formula (or was not seen in the counted step).
    flops: float | None
    bytes_read: float
    bytes_written: float
    library: str | None
    dtype: str | None
    #: Seconds per timed step (0 in a step where it did not run).
    seconds: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "phase": self.phase,
            "op": self.op,
            "family": self.family,
            "calls": self.calls,
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "library": self.library,
            "dtype": self.dtype,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpTiming:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass
class ModuleInfo:
    """A module of the model as the layer tables name it."""

    type: str
    category: str
    #: Forward calls per step (a module called twice counts 2; 0 when it never ran).
    calls: int = 0


@dataclass
class LayerProfile:
    """Per-module times of ``steps`` layer-timed steps; per-operator times of ``op_steps`` operator-timed
    steps with the FLOPs, bytes and libraries of one counted step."""

    steps: int
    timing: str  # "host-clock" or "cuda-kernels"
    ops: list[OpTiming] = field(default_factory=list)
    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    #: Wall time of each layer-timed step: beside the uninstrumented steps, the overhead.
    step_s: list[float] = field(default_factory=list)
    #: module -> phase ("forward", "backward") -> seconds in each layer-timed step (see LayerTimer).
    layer_seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: Steps whose every operator was timed (the length of each ``ops[].seconds``).
    op_steps: int = 0
    #: Operator -> formula error, for formulas that failed (their calls count as uncovered).
    formula_errors: dict[str, str] = field(default_factory=dict)
    status: str = "complete"
    #: The calibrated hardware profile efficiencies are computed against (``dnnperf hw``), as saved.
    hardware: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "steps": self.steps,
            "timing": self.timing,
            "step_s": self.step_s,
            "op_steps": self.op_steps,
            "layer_seconds": self.layer_seconds,
            "modules": {name: vars(info) for name, info in self.modules.items()},
            "formula_errors": self.formula_errors,
            "hardware": self.hardware,
            "ops": [op.to_dict() for op in self.ops],
        }

    def hardware_profile(self) -> Any:
        """The embedded :class:`~dnnperf.hardware.HardwareProfile`, or None."""
        from dnnperf.hardware import HardwareProfile

        return HardwareProfile.from_dict(self.hardware) if self.hardware is not None else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerProfile:
        return cls(
            steps=int(data["steps"]),
            timing=str(data["timing"]),
            ops=[OpTiming.from_dict(op) for op in data["ops"]],
            modules={name: ModuleInfo(**info) for name, info in data["modules"].items()},
            step_s=list(data.get("step_s", [])),
            op_steps=int(data.get("op_steps", 0)),
            layer_seconds={
                m: {phase: list(v) for phase, v in phases.items()}
                for m, phases in data.get("layer_seconds", {}).items()
            },
            formula_errors=dict(data.get("formula_errors", {})),
            status=str(data.get("status", "complete")),
            hardware=data.get("hardware"),
        )
