"""The ``validation`` section of a run record (docs/run-record.md): ``dnnperf validate``'s runs,
collectives and memory, each measured beside predicted."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ValidationResult:
    """``dnnperf validate`` as a record section: every run and collective, measured beside predicted."""

    #: workload, batch, strategy ("single" for one process), measured_s, predicted_s
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: op, bytes, measured_s (median of the slowest rank), predicted_s, held_out (the fit never saw it)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    #: ``--memory``: workload, batch, measured_bytes (the memory profiler's peak), predicted_bytes,
    #: both phases and both sides' bytes per category at their peaks (``validate_memory``'s columns).
    #: Absent from records made before it.
    memory: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {"runs": self.runs, "collectives": self.collectives}
        if self.memory:
            document["memory"] = self.memory
        return document

    @classmethod
    def from_dict(cls, data: Any) -> ValidationResult:
        """Validated: ValueError or TypeError says what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        for part, keys in (("runs", ("workload", "strategy")), ("collectives", ("op",))):
            rows = data.get(part, [])
            if not isinstance(rows, list):
                raise ValueError(f"{part} must be a list")
            for i, row in enumerate(rows):
                if not isinstance(row, dict) or any(not isinstance(row.get(k), str) for k in keys):
                    raise ValueError(f"{part}[{i}] lacks {', '.join(keys)}")
                for key in ("measured_s", "predicted_s"):
                    _positive(row, key, f"{part}[{i}]")
        memory = data.get("memory", [])
        if not isinstance(memory, list):
            raise ValueError("memory must be a list")
        for i, row in enumerate(memory):
            if not isinstance(row, dict) or not isinstance(row.get("workload"), str):
                raise ValueError(f"memory[{i}] lacks workload")
            for key in ("measured_bytes", "predicted_bytes"):
                _positive(row, key, f"memory[{i}]")
        return cls(
            runs=list(data.get("runs", [])),
            collectives=list(data.get("collectives", [])),
            memory=list(memory),
        )


def _positive(row: dict[str, Any], key: str, where: str) -> None:
    value = row.get(key)
    if isinstance(value, bool) or not (
        isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{where}.{key} must be a positive number, got {value!r}")
