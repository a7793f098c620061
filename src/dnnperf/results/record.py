"""The run record: one self-describing JSON document per run (schema in docs/run-record.md).

Raw per-step samples are the source of truth; the summaries stored beside them are recomputed from
them on load, so a record edited by hand cannot disagree with itself.
"""

from __future__ import annotations

import math
import os
import platform
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psutil

from dnnperf.errors import RecordError
from dnnperf.results.fields import FieldError, check_record_fields
from dnnperf.results.layers import LayerProfile
from dnnperf.results.memory import StepMemory, step_memory_from_document
from dnnperf.results.memsave import MemsaveResult
from dnnperf.results.prediction import SweepResult
from dnnperf.results.ranks import RankBreakdown
from dnnperf.results.settings import RunSettings
from dnnperf.results.stages import StageBreakdown
from dnnperf.results.validation import ValidationResult
from dnnperf.results.watch import WatchResult
from dnnperf.stats import Samples

SCHEMA = "dnnperf.run"
SCHEMA_VERSION = 1
#: What made the record: bench (step times), profile (with stages, layers or memory), memsave,
#: predict (a sweep), validate, watch (any command's process tree, sampled).
RUN_KINDS = ("bench", "profile", "memsave", "predict", "validate", "watch")

RUN_STATUSES = ("running", "complete", "partial", "failed")
POINT_STATUSES = ("running", "complete", "partial", "oom", "failed")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id(workload: str, preset: str) -> str:
    """A new record's id: time, workload and preset (any character a shell or a file name would trip
    on made a dash: a validation of "gpt2 dp" and "gpt2 pp" is "gpt2-dp+gpt2-pp"), and 6 random hex."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.+-]", "-", f"{workload}-{preset}")
    return f"{stamp}-{name}-{secrets.token_hex(3)}"


@dataclass
class Point:
    """The measurements at one batch size."""

    batch_size: int
    status: str = "running"
    warmup_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    #: Loss after every step, warm-up steps first (None where a step produced none).
    loss: list[float | None] = field(default_factory=list)
    error: str | None = None
    #: The stage breakdown of the measured steps, when stages were profiled.
    stages: StageBreakdown | None = None
    #: Per-operator, per-layer times of further instrumented steps, when layers were profiled.
    layers: LayerProfile | None = None
    #: One more step's memory by data structure, when memory was profiled.
    memory: StepMemory | None = None
    #: Distributed runs: every rank's measured steps, gathered on rank 0 (the fields above are rank 0's).
    ranks: RankBreakdown | None = None

    @property
    def step_time(self) -> Samples:
        return Samples.of(self.step_s)

    def summary(self) -> dict[str, Any]:
        """Step time statistics and the throughput they imply (samples/s; p10 of throughput comes
        from p90 of step time)."""
        times = self.step_time
        if not len(times):
            return {"step_time_s": times.summary(), "throughput": None}
        b = self.batch_size
        return {
            "step_time_s": times.summary(),
            "throughput": {"median": b / times.median, "p10": b / times.p90, "p90": b / times.p10},
        }


@dataclass
class RunRecord:
    """Everything one invocation measured, and what it ran on."""

    id: str
    kind: str
    workload: dict[str, Any]
    settings: dict[str, Any]
    environment: dict[str, Any]
    command: list[str] = field(default_factory=list)
    created: str = field(default_factory=utc_now)
    finished: str | None = None
    status: str = "running"
    error: str | None = None
    points: list[Point] = field(default_factory=list)
    #: The process that wrote the record (to tell a live "running" record from one whose process died).
    pid: int | None = None
    #: ``dnnperf memsave``: the plan, the baselines and their measured peaks and overheads.
    memsave: MemsaveResult | None = None
    #: ``dnnperf predict --sweep``: the what-if table the performance model predicted.
    prediction: SweepResult | None = None
    #: ``dnnperf validate``: every run and collective, measured beside predicted.
    validation: ValidationResult | None = None
    #: ``dnnperf watch``: the command's process tree and GPUs, sampled until it ended.
    watch: WatchResult | None = None

    @classmethod
    def start(
        cls,
        kind: str,
        workload: dict[str, Any],
        settings: RunSettings,
        *,
        command: Sequence[str] = (),
        name: str | None = None,
    ) -> RunRecord:
        """A new record, "running", written by this process on this machine: ``workload`` is its
        workload section (a name and a preset at least), ``name`` what its id calls the run (default:
        the workload's name)."""
        from dnnperf import environment  # lazily: it imports torch

        return cls(
            id=new_run_id(name if name is not None else workload["name"], workload["preset"]),
            kind=kind,
            command=list(command),
            workload=workload,
            settings=settings.to_dict(),
            environment=environment.describe(),
            pid=os.getpid(),
        )

    def to_dict(self) -> dict[str, Any]:
        points = []
        for point in self.points:
            points.append(
                {
                    "batch_size": point.batch_size,
                    "status": point.status,
                    "error": point.error,
                    "warmup_s": point.warmup_s,
                    "step_s": point.step_s,
                    "loss": point.loss,
                    "summary": point.summary(),
                    **({"stages": point.stages.to_dict()} if point.stages is not None else {}),
                    **({"layers": point.layers.to_dict()} if point.layers is not None else {}),
                    **({"memory": point.memory.to_dict()} if point.memory is not None else {}),
                    **({"ranks": point.ranks.to_dict()} if point.ranks is not None else {}),
                }
            )
        document = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "error": self.error,
            "created": self.created,
            "finished": self.finished,
            "pid": self.pid,
            "command": self.command,
            "workload": self.workload,
            "settings": self.settings,
            "environment": self.environment,
            "points": points,
            **({"memsave": self.memsave.to_dict()} if self.memsave is not None else {}),
            **({"prediction": self.prediction.to_dict()} if self.prediction is not None else {}),
            **({"validation": self.validation.to_dict()} if self.validation is not None else {}),
            **({"watch": self.watch.to_dict()} if self.watch is not None else {}),
        }
        return json_safe(document)

    def effective_status(self) -> str:
        """The status, except that a "running" record whose writer died on this host reads
        "interrupted": a hard kill (SIGKILL, the OOM killer) leaves no chance to mark it."""
        if self.status != "running" or self.pid is None:
            return self.status
        if self.environment.get("machine", {}).get("hostname") != platform.node():
            return self.status
        return self.status if _process_alive(self.pid) else "interrupted"

    @classmethod
    def from_dict(cls, document: Any) -> RunRecord:
        """Validate a parsed JSON document and build the record; RecordError says what is wrong."""
        if not isinstance(document, dict):
            raise RecordError("not a JSON object")
        if document.get("schema") != SCHEMA:
            raise RecordError(f"schema is {document.get('schema')!r}, expected {SCHEMA!r}")
        version = document.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
            raise RecordError(
                f"schema_version {version!r} is not one this dnnperf reads (1 to {SCHEMA_VERSION})"
            )
        try:  # every number and known field, before anything computes with them
            check_record_fields(document)
        except FieldError as error:
            raise RecordError(str(error)) from None
        _expect(document, "id", str)
        _expect(document, "kind", str)
        if document["kind"] not in RUN_KINDS:
            raise RecordError(f"kind {document['kind']!r} is not one of {', '.join(RUN_KINDS)}")
        _expect(document, "created", str)
        try:
            datetime.fromisoformat(document["created"])
        except ValueError:
            raise RecordError(f"created {document['created']!r} is not a date and time (ISO 8601)") from None
        for key in ("workload", "settings", "environment"):
            _expect(document, key, dict)
        _expect(document, "points", list)
        if document.get("status") not in RUN_STATUSES:
            raise RecordError(f"status {document.get('status')!r} is not one of {', '.join(RUN_STATUSES)}")
        for section, keys in (("workload", ("name", "preset")), ("settings", ("device", "data"))):
            for key in keys:
                if not isinstance(document[section].get(key), str):
                    raise RecordError(f"{section}.{key} missing or not a string")
        command = document.get("command", [])
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise RecordError("field 'command' is not a list of strings")
        points = [_point_from_dict(p, i) for i, p in enumerate(document["points"])]
        watch = WatchResult.from_dict(document["watch"]) if document.get("watch") is not None else None
        if document["kind"] == "watch" and watch is None:
            raise RecordError("a watch record needs its 'watch' section")
        if watch is not None and document["status"] in ("complete", "partial") and not watch.ended:
            raise RecordError(f"a {document['status']} watch needs watch.exit_code or watch.signal")
        return cls(
            id=document["id"],
            kind=document["kind"],
            workload=document["workload"],
            settings=document["settings"],
            environment=document["environment"],
            command=list(command),
            created=document["created"],
            finished=_optional_str(document, "finished"),
            status=document["status"],
            error=_optional_str(document, "error"),
            points=points,
            pid=document.get("pid"),
            memsave=_memsave_from_dict(document.get("memsave")),
            prediction=_prediction_from_dict(document.get("prediction")),
            validation=_validation_from_dict(document.get("validation")),
            watch=watch,
        )


def _expect(document: dict[str, Any], key: str, kind: type) -> None:
    if not isinstance(document.get(key), kind):
        raise RecordError(f"field {key!r} missing or not a {kind.__name__}")


def _numbers(values: Any, where: str, allow_none: bool = False, positive: bool = False) -> list[Any]:
    """A list of finite numbers (``positive``: > 0; ``allow_none``: nulls allowed)."""
    if not isinstance(values, list):
        raise RecordError(f"{where} is not a list")
    checked: list[Any] = []
    for value in values:
        if value is None and allow_none:
            checked.append(None)
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RecordError(f"{where} holds {value!r}, not a number")
        number = float(value)  # OverflowError for huge integers is turned into a RecordError by callers
        if not math.isfinite(number) or (positive and number <= 0):
            kind = "positive finite" if positive else "finite"
            raise RecordError(f"{where} holds {value!r}, not a {kind} number")
        checked.append(number)
    return checked


def _optional_str(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    if value is not None and not isinstance(value, str):
        raise RecordError(f"field {key!r} is not a string")
    return value


def _point_from_dict(data: Any, index: int) -> Point:
    where = f"points[{index}]"
    if not isinstance(data, dict):
        raise RecordError(f"{where} is not an object")
    batch_size = data.get("batch_size")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise RecordError(f"{where}.batch_size is {batch_size!r}, not a positive integer")
    if data.get("status") not in POINT_STATUSES:
        raise RecordError(f"{where}.status {data.get('status')!r} is not one of {', '.join(POINT_STATUSES)}")
    step_s = _numbers(data.get("step_s", []), f"{where}.step_s", positive=True)
    return Point(
        batch_size=batch_size,
        stages=_stages_from_dict(data.get("stages"), len(step_s), where),
        layers=_layers_from_dict(data.get("layers"), where),
        memory=_memory_from_dict(data.get("memory"), where),
        ranks=_ranks_from_dict(data.get("ranks"), len(step_s), where),
        status=data["status"],
        warmup_s=_numbers(data.get("warmup_s", []), f"{where}.warmup_s", positive=True),
        step_s=step_s,
        loss=_numbers(data.get("loss", []), f"{where}.loss", allow_none=True),
        error=_optional_str(data, "error"),
    )


def _stages_from_dict(data: Any, steps: int, where: str) -> StageBreakdown | None:
    if data is None:
        return None
    where = f"{where}.stages"
    if not isinstance(data, dict) or not isinstance(data.get("steps"), dict):
        raise RecordError(f"{where} is not an object with per-stage 'steps'")
    worker = data.get("worker") or {}
    if not isinstance(worker, dict) or not isinstance(data.get("cpu") or {}, dict):
        raise RecordError(f"{where}.worker and .cpu must be objects")
    if any(not isinstance(v, (int, float)) for v in (data.get("cpu") or {}).values()):
        raise RecordError(f"{where}.cpu holds a value that is not a number")
    if _numbers(data.get("wall_s"), f"{where}.wall_s", positive=True) and len(data["wall_s"]) != steps:
        raise RecordError(f"{where}.wall_s needs {steps} values, one per measured step")
    lists = {"wall_s": data.get("wall_s")} | {f"steps.{k}": v for k, v in data["steps"].items()}
    lists |= {f"worker.{k}": v for k, v in worker.items()}
    for name, values in lists.items():
        checked = _numbers(values, f"{where}.{name}")
        if len(checked) != steps or any(v < 0 for v in checked):
            raise RecordError(f"{where}.{name} needs {steps} non-negative values, one per measured step")
    return StageBreakdown.from_dict(data)


def _layers_from_dict(data: Any, where: str) -> LayerProfile | None:
    if data is None:
        return None
    where = f"{where}.layers"
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise RecordError(f"{where} is not an object with a list of 'ops'")
    if not isinstance(data.get("modules"), dict) or not isinstance(data.get("steps"), int):
        raise RecordError(f"{where} needs 'modules' (an object) and 'steps' (an integer)")
    steps = data["steps"]
    op_steps = data.get("op_steps", steps)
    if not isinstance(op_steps, int) or isinstance(op_steps, bool) or op_steps < 0:
        raise RecordError(f"{where}.op_steps must be a non-negative integer")
    layer_seconds = data.get("layer_seconds", {})
    if not isinstance(layer_seconds, dict):
        raise RecordError(f"{where}.layer_seconds is not an object")
    for module, phases in layer_seconds.items():
        for phase, values in phases.items() if isinstance(phases, dict) else [(None, None)]:
            checked = _numbers(values, f"{where}.layer_seconds[{module!r}][{phase!r}]")
            if len(checked) != steps or any(v < 0 for v in checked):
                raise RecordError(f"{where}.layer_seconds[{module!r}] needs {steps} non-negative values")
    for index, op in enumerate(data["ops"]):
        here = f"{where}.ops[{index}]"
        if not isinstance(op, dict) or not all(isinstance(op.get(k), str) for k in ("module", "phase", "op")):
            raise RecordError(f"{here} needs string 'module', 'phase' and 'op'")
        seconds = _numbers(op.get("seconds"), f"{here}.seconds")
        if len(seconds) != op_steps or any(v < 0 for v in seconds):
            raise RecordError(
                f"{here}.seconds needs {op_steps} non-negative values, one per operator-timed step"
            )
        for key in ("calls", "bytes_read", "bytes_written"):
            if not isinstance(op.get(key), (int, float)) or op[key] < 0:
                raise RecordError(f"{here}.{key} must be a non-negative number")
        if op.get("flops") is not None and (not isinstance(op["flops"], (int, float)) or op["flops"] < 0):
            raise RecordError(f"{here}.flops must be null or a non-negative number")
    for name, info in data["modules"].items():
        if not isinstance(info, dict) or not {"type", "category", "calls"} <= info.keys():
            raise RecordError(f"{where}.modules[{name!r}] needs 'type', 'category' and 'calls'")
    _numbers(data.get("step_s", []), f"{where}.step_s", positive=True)
    try:
        profile = LayerProfile.from_dict(data)
        profile.hardware_profile()  # validates the embedded hardware profile
    except (KeyError, TypeError, ValueError) as error:
        raise RecordError(f"{where}: {error}") from None
    return profile


def _memory_from_dict(data: Any, where: str) -> StepMemory | None:
    try:
        return step_memory_from_document(data, where)
    except ValueError as error:
        raise RecordError(str(error)) from None


def _memsave_from_dict(data: Any) -> MemsaveResult | None:
    if data is None:
        return None
    try:
        return MemsaveResult.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise RecordError(f"memsave: {error}") from None


def _prediction_from_dict(data: Any) -> SweepResult | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise RecordError("prediction: not an object")
    try:
        return SweepResult.from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise RecordError(f"prediction: {error}") from None


def _validation_from_dict(data: Any) -> ValidationResult | None:
    if data is None:
        return None
    try:
        return ValidationResult.from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise RecordError(f"validation: {error}") from None


def _ranks_from_dict(data: Any, steps: int, where: str) -> RankBreakdown | None:
    if data is None:
        return None
    try:
        return RankBreakdown.from_dict(data, steps)
    except (KeyError, TypeError, ValueError) as error:
        raise RecordError(f"{where}.ranks: {error}") from None


def json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) with null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _process_alive(pid: int) -> bool:
    """Whether a process runs: a zombie (killed, not yet reaped by its parent) does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
