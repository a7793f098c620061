"""The numbers and names of a run record, checked before any section is built from them.

Two passes over the parsed document: every number anywhere must be finite and of a size dnnperf could
have stored (an integer of 400 digits or a step of 1e308 s overflows whatever computes with it), and
every field this module knows must have its type and range (counts are non-negative integers, times
and bytes non-negative numbers, names strings). A record that fails either is a RecordError naming
the field, so ``show``, ``runs``, ``report``, ``compare`` and ``export`` never meet it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

#: No quantity dnnperf stores comes near this (FLOP counts and bytes stay below 1e20), and sums,
#: means and variances of any number of values this size stay far from a float's overflow (1.8e308).
MAGNITUDE_LIMIT = 1e30


class FieldError(ValueError):
    """A stored value of the wrong type or out of range; the message names the field."""


@dataclass(frozen=True)
class Kind:
    """What one stored value must be: ``test`` accepts it, ``expected`` says what was wanted."""

    expected: str
    test: Callable[[Any], bool]
    nullable: bool = False


@dataclass(frozen=True)
class Maybe:
    """A section (an object or a list) that may also be null."""

    spec: Any


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def nullable(kind: Kind) -> Kind:
    return replace(kind, expected=f"{kind.expected} or null", nullable=True)


COUNT = Kind("a non-negative integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
POSITIVE_COUNT = Kind(
    "a positive integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0
)
AMOUNT = Kind("a non-negative number", lambda v: is_number(v) and v >= 0)
POSITIVE_AMOUNT = Kind("a positive number", lambda v: is_number(v) and v > 0)
NUMBER = Kind("a number", is_number)
TEXT = Kind("a string", lambda v: isinstance(v, str))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))


def one_of(*names: str) -> Kind:
    """A name from ``names``."""
    return Kind(f"one of {', '.join(names)}", lambda v: isinstance(v, str) and v in names)


#: A step's memory: a point's ``memory`` section and each rank's (docs/run-record.md).
MEMORY = Maybe(
    {
        "device": TEXT,
        "peak": {"*": NUMBER},  # "unattributed" may be negative; results.memory checks the rest
        "category_max": {"*": AMOUNT},
        "tracked_peak": nullable(AMOUNT),
        "measured_peak": nullable(AMOUNT),
        "measured_by": nullable(TEXT),
        "peak_at_s": nullable(AMOUNT),
        "peak_module": nullable(TEXT),
        "peak_phase": nullable(TEXT),
        "timeline": [(AMOUNT, {"*": NUMBER})],
        "stages": [(AMOUNT, TEXT)],
        "layers": {"*": {"*": AMOUNT}},
        "subsystem": Maybe(
            {
                "rss_bytes": nullable(COUNT),
                "peak_rss_bytes": nullable(COUNT),
                "minor_faults": nullable(COUNT),
                "major_faults": nullable(COUNT),
            }
        ),
        "wall_s": nullable(AMOUNT),
    }
)

STAGES = Maybe(
    {
        "status": TEXT,
        "timing": TEXT,
        "data_workers": COUNT,
        "samples_per_step": [COUNT],
        "cpu": {"*": nullable(AMOUNT)},
    }
)

LAYERS = Maybe(
    {
        "status": TEXT,
        "timing": TEXT,
        "steps": COUNT,
        "op_steps": COUNT,
        "modules": {"*": {"type": TEXT, "category": TEXT, "calls": COUNT}},
        "formula_errors": {"*": TEXT},
        "ops": [
            {
                "module": TEXT,
                "phase": TEXT,
                "op": TEXT,
                "family": nullable(TEXT),
                "calls": AMOUNT,
                "flops": nullable(AMOUNT),
                "bytes_read": AMOUNT,
                "bytes_written": AMOUNT,
                "library": nullable(TEXT),
                "dtype": nullable(TEXT),
                "seconds": [AMOUNT],
            }
        ],
    }
)

RANKS = Maybe(
    {
        "strategy": TEXT,
        "world_size": POSITIVE_COUNT,
        "backend": TEXT,
        "timing": TEXT,
        "per_rank": [
            {
                "rank": COUNT,
                "host": TEXT,
                "pid": nullable(COUNT),
                "device": TEXT,
                "wall_s": [AMOUNT],
                "stages": {"*": [AMOUNT]},
                "detail": {"*": [AMOUNT]},
                "buckets": [[{"index": COUNT, "bytes": AMOUNT, "*": AMOUNT}]],
                "memory": MEMORY,
            }
        ],
    }
)

MEMSAVE = Maybe(
    {
        "budget": POSITIVE_COUNT,
        "budget_text": TEXT,
        "baseline_peak": POSITIVE_COUNT,
        "feasible": FLAG,
        "reason": TEXT,
        "plan": {
            "policies": {"*": TEXT},
            "segments": [[TEXT]],
            "min_bytes": COUNT,
            "prefetch_bytes": COUNT,
            "training_state": TEXT,
        },
        "plan_table": [
            {
                "unit": TEXT,
                "policy": TEXT,
                "saved_bytes": AMOUNT,
                "forward_s": AMOUNT,
                "predicted_cost_s": AMOUNT,
            }
        ],
        "variants": [
            {
                "name": TEXT,
                "peak": POSITIVE_COUNT,
                "step_s": [POSITIVE_AMOUNT],
                "plain_s": [POSITIVE_AMOUNT],
                "overhead": nullable(NUMBER),
                "bytes_written": COUNT,
                "forward_held": nullable(COUNT),
                "predicted_peak": nullable(COUNT),
                "predicted_overhead": nullable(NUMBER),
                "timeline": [(AMOUNT, AMOUNT)],
            }
        ],
        "offload_s_per_byte": nullable(AMOUNT),
        "recompute_factor": nullable(AMOUNT),
        "state_offload_s_per_byte": nullable(AMOUNT),
        "bandwidth": {"*": nullable(AMOUNT)},
    }
)

PREDICTION = Maybe(
    {
        "workload": TEXT,
        "preset": TEXT,
        "machine": TEXT,
        "batch_size": POSITIVE_COUNT,
        "axes": {"*": [NUMBER]},
        "strategies": [TEXT],
        "rows": [
            {
                "strategy": TEXT,
                "devices": nullable(COUNT),
                "step_s": nullable(AMOUNT),
                "compute_s": nullable(AMOUNT),
                "communication_s": nullable(AMOUNT),
                "bubble_s": nullable(AMOUNT),
                "other_s": nullable(AMOUNT),
                "throughput": nullable(AMOUNT),
                "memory_bytes": nullable(AMOUNT),
                "fits": nullable(FLAG),
                "reason": nullable(TEXT),
            }
        ],
    }
)

_VALIDATION_ROW = {
    "workload": TEXT,
    "strategy": TEXT,
    "op": TEXT,
    "batch": POSITIVE_COUNT,
    "bytes": COUNT,
    "measured_s": AMOUNT,
    "predicted_s": AMOUNT,
    "measured_bytes": AMOUNT,
    "predicted_bytes": AMOUNT,
    "held_out": FLAG,
}
VALIDATION = Maybe({"runs": [_VALIDATION_ROW], "collectives": [_VALIDATION_ROW], "memory": [_VALIDATION_ROW]})

#: The per-sample fields a process and the whole tree share, and the kind of each value.
SERIES_KINDS = {
    "cpu_s": AMOUNT,
    "rss_bytes": COUNT,
    "pss_bytes": nullable(COUNT),
    "uss_bytes": nullable(COUNT),
    "minor_faults": nullable(COUNT),
    "major_faults": nullable(COUNT),
    "read_bytes": nullable(COUNT),
    "write_bytes": nullable(COUNT),
    "voluntary_switches": COUNT,
    "involuntary_switches": COUNT,
    "threads": COUNT,
}
GPU_KINDS = {
    "utilization_pct": nullable(AMOUNT),
    "memory_used_bytes": nullable(COUNT),
    "pcie_rx_bytes_per_s": nullable(AMOUNT),
    "pcie_tx_bytes_per_s": nullable(AMOUNT),
    "power_w": nullable(AMOUNT),
}


def series_lists(kinds: dict[str, Any]) -> dict[str, Any]:
    return {name: [kind] for name, kind in kinds.items()}


#: ``dnnperf watch``'s section of a run record (``dnnperf.results.watch``).
WATCH = {
    "config": {"argv": [TEXT], "interval_s": AMOUNT},
    "started_at": AMOUNT,
    "wall_s": AMOUNT,
    "t": [AMOUNT],
    "total": {**series_lists(SERIES_KINDS), "processes": [COUNT]},
    "processes": [
        {"pid": POSITIVE_COUNT, "ppid": nullable(COUNT), "name": TEXT, "cmdline": [TEXT], "first": COUNT}
        | series_lists(SERIES_KINDS)
    ],
    "gpus": [{"index": COUNT, "name": TEXT} | series_lists(GPU_KINDS)],
    "gpu_note": nullable(TEXT),
    "marks": {"t": [NUMBER], "step": [nullable(COUNT)], "ignored": COUNT},
    "end": TEXT,
    "exit_code": nullable(COUNT),
    "signal": nullable(POSITIVE_COUNT),
    "stop_signal": nullable(POSITIVE_COUNT),
    "outlived": [{"pid": POSITIVE_COUNT, "name": TEXT, "cmdline": [TEXT], "fate": TEXT}],
    "cost": {"cpu_s": [AMOUNT]},
    "kernel": Maybe({"cpu_s": nullable(AMOUNT), "peak_rss_bytes": nullable(COUNT)}),
}


#: The strategies and pp schedules a distributed run records (``dnnperf.distributed``'s, which this
#: layer cannot import: tests/test_hostile_input.py holds them equal).
DISTRIBUTED_STRATEGIES = ("dp", "fsdp", "zero1", "pp", "tp")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")

#: ``settings.distributed`` of ``dnnperf profile --nproc N`` (docs/run-record.md): the layout the
#: ranks ran under, each strategy's own settings present only for it.
DISTRIBUTED = Maybe(
    {
        "strategy": one_of(*DISTRIBUTED_STRATEGIES),
        "world_size": POSITIVE_COUNT,
        "backend": TEXT,
        "batch": one_of("global"),
        "rank_threads": POSITIVE_COUNT,
        "timeout_s": POSITIVE_AMOUNT,
        "bucket_cap_mb": nullable(POSITIVE_AMOUNT),  # dp, zero1; null: DDP's default
        "reshard_after_forward": FLAG,  # fsdp
        "mixed_precision": nullable(one_of("bf16")),  # fsdp
        "schedule": one_of(*PIPELINE_SCHEDULES),  # pp
        "microbatches": POSITIVE_COUNT,  # pp
        "netns": Maybe({"link_mbit": nullable(POSITIVE_AMOUNT), "link_delay_ms": AMOUNT}),
    }
)

#: The record's known fields (docs/run-record.md); others are checked by the first pass only.
RECORD = {
    "pid": nullable(COUNT),
    "workload": {
        "name": TEXT,
        "preset": TEXT,
        "domain": TEXT,
        "sample_unit": TEXT,
        "parameters": nullable(COUNT),
        "config": Maybe({}),
    },
    "settings": {
        "workload": TEXT,
        "preset": TEXT,
        "device": TEXT,
        "requested_device": nullable(TEXT),
        "data": TEXT,
        "batch_sizes": Maybe([POSITIVE_COUNT]),
        "steps": COUNT,
        "warmup": COUNT,
        "workers": nullable(COUNT),
        "seed": nullable(COUNT),
        "data_dir": nullable(TEXT),
        "stages": FLAG,
        "layers": FLAG,
        "torch_threads": nullable(POSITIVE_COUNT),
        "distributed": DISTRIBUTED,
    },
    "environment": {
        "machine": {
            "hostname": nullable(TEXT),
            "cpu_model": nullable(TEXT),
            "architecture": nullable(TEXT),
            "cores_physical": nullable(COUNT),
            "cores_logical": nullable(COUNT),
            "cores_usable": nullable(COUNT),
            "memory_bytes": nullable(COUNT),
            "gpus": [
                {
                    "index": COUNT,
                    "name": TEXT,
                    "memory_bytes": COUNT,
                    "compute_capability": nullable(TEXT),
                    "multiprocessors": nullable(COUNT),
                }
            ],
        },
        "software": {
            "*": Kind("a string, number, true/false or null", lambda v: not isinstance(v, (list, dict)), True)
        },
    },
    "points": [
        {
            "batch_size": POSITIVE_COUNT,
            "warmup_s": [POSITIVE_AMOUNT],
            "step_s": [POSITIVE_AMOUNT],
            "loss": [nullable(NUMBER)],
            "stages": STAGES,
            "layers": LAYERS,
            "memory": MEMORY,
            "ranks": RANKS,
        }
    ],
    "memsave": MEMSAVE,
    "prediction": PREDICTION,
    "validation": VALIDATION,
    "watch": Maybe(WATCH),
}


def shown(value: Any, limit: int = 40) -> str:
    """A stored value as a message quotes it: its repr, cut (an integer of 400 digits says so)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def where_of(path: tuple[Any, ...]) -> str:
    """``("points", 0, "step_s")`` -> ``points[0].step_s``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "the record"


def check_numbers(document: Any) -> None:
    """Every number anywhere in the document is finite and within MAGNITUDE_LIMIT (iterative: a
    deeply nested document must not exhaust the interpreter's stack)."""
    pending: list[tuple[Any, tuple[Any, ...]]] = [(document, ())]
    while pending:
        value, path = pending.pop()
        if isinstance(value, dict):
            pending.extend((v, (*path, k)) for k, v in value.items())
        elif isinstance(value, list):
            pending.extend((v, (*path, i)) for i, v in enumerate(value))
        elif is_number(value) and not (
            abs(value) <= MAGNITUDE_LIMIT and (isinstance(value, int) or math.isfinite(value))
        ):
            raise FieldError(
                f"{where_of(path)} is {shown(value)}, not a finite number within ±{MAGNITUDE_LIMIT:g}"
            )


def check_fields(value: Any, spec: Any, path: tuple[Any, ...] = ()) -> None:
    """``value`` against ``spec``: a Kind; an object's known keys (``"*"``: every other key); a list of
    one spec (every item) or a tuple (one spec per position); Maybe (null allowed). Absent keys pass:
    which fields are required is the section readers' business."""
    if isinstance(spec, Maybe):
        if value is not None:
            check_fields(value, spec.spec, path)
        return
    if isinstance(spec, Kind):
        if not ((value is None and spec.nullable) or (value is not None and spec.test(value))):
            raise FieldError(f"{where_of(path)} is {shown(value)}, not {spec.expected}")
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise FieldError(f"{where_of(path)} is {shown(value)}, not an object")
        for key, item in value.items():
            inner = spec.get(key, spec.get("*"))
            if inner is not None:
                check_fields(item, inner, (*path, key))
        return
    if not isinstance(value, list):
        raise FieldError(f"{where_of(path)} is {shown(value)}, not a list")
    if isinstance(spec, tuple):
        if len(value) != len(spec):
            raise FieldError(f"{where_of(path)} holds {len(value)} values, not {len(spec)}")
        for index, (item, inner) in enumerate(zip(value, spec, strict=True)):
            check_fields(item, inner, (*path, index))
        return
    for index, item in enumerate(value):
        check_fields(item, spec[0], (*path, index))


#: A validation record's ``settings.distributed`` is the strategies it was asked for, as typed.
VALIDATE_RECORD = {**RECORD, "settings": {**RECORD["settings"], "distributed": nullable(TEXT)}}


def check_record_fields(document: dict[str, Any]) -> None:
    """Both passes over a parsed record; a FieldError names the first bad field."""
    check_numbers(document)
    validation = isinstance(document, dict) and document.get("kind") == "validate"
    check_fields(document, VALIDATE_RECORD if validation else RECORD)
