"""``bench_framework``: one workload trained in one framework, in a child process under ``watch``.

The child (``dnnperf.frameworks.child``) times every step with the host's wall clock, warm-up kept
apart, and marks each one; the watcher samples its process tree. The record is a ``bench`` record
like the in-process bench's (points with raw step samples and losses), with the ``watch`` section,
``settings.framework`` and ``settings.limitations``: what dnnperf cannot see in that framework.

The data is the PyTorch workload's own: ``DataFormat.synthesize`` with the run's seed, two batches per
batch size, as the in-memory source cycles them; images handed over channels-last (NHWC). It reaches
the child through an anonymous memory file (nothing left on disk, even if dnnperf is killed), as the
child's result comes back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from dnnperf.errors import DnnperfError, UsageError
from dnnperf.frameworks import FRAMEWORKS, KERAS_FRAMEWORKS, KERAS_WORKLOADS
from dnnperf.results.record import Point, RunRecord, utc_now
from dnnperf.results.settings import FrameworkBenchSettings
from dnnperf.results.store import RunStore
from dnnperf.results.watch import WatchResult
from dnnperf.runner import BenchSettings, Interrupted, RunFailed, workload_section
from dnnperf.watch.run import MarksFile, watch
from dnnperf.workloads import get_workload
from dnnperf.workloads.base import Workload

#: Seconds between the watcher's samples: a tiny preset's batch size lasts well under a second.
WATCH_INTERVAL_S = 0.05
#: The in-memory source's pool: batches generated per batch size and cycled.
POOL = 2
#: The packages each framework needs, as imported.
PACKAGES = {"torch": ("torch",), "tensorflow": ("keras", "tensorflow"), "jax": ("keras", "jax")}

_KERAS_UNSEEN = (
    "step time, throughput and the process tree's figures (watch) only: no stages, no layers and no "
    "memory by data structure (dnnperf's probes hook PyTorch modules and its allocator); a step is one "
    "Keras train_on_batch call, the batch already a backend tensor, compiled after the first call"
)
LIMITATIONS = {
    "torch": (
        "the in-process bench run in a child process under watch: step times as `dnnperf bench` takes "
        "them; stages, layers and memory need `dnnperf profile`"
    ),
    "tensorflow": _KERAS_UNSEEN,
    "jax": _KERAS_UNSEEN
    + "; on JAX each call also copies the model's state between Keras variables and the jitted step",
}


class FrameworkError(DnnperfError):
    """The framework's child process failed (its error, from the result it wrote)."""


def missing_packages(framework: str) -> list[str]:
    """The packages ``framework`` needs that are not importable here."""
    return [name for name in PACKAGES[framework] if importlib.util.find_spec(name) is None]


def check_request(workload: str, framework: str, device: str) -> None:
    """Refuse, with a UsageError, a framework or workload this module cannot run."""
    if framework not in FRAMEWORKS:
        raise UsageError(f"unknown framework {framework!r}: use one of {', '.join(FRAMEWORKS)}")
    if framework in KERAS_FRAMEWORKS:
        if workload not in KERAS_WORKLOADS:
            raise UsageError(
                f"{workload} has no Keras version: --framework {framework} runs {', '.join(KERAS_WORKLOADS)}"
            )
        if device not in ("auto", "cpu"):
            raise UsageError(f"--framework {framework} runs on the CPU (the frameworks extra's wheels)")
    missing = missing_packages(framework)
    if missing:
        raise UsageError(
            f"--framework {framework} needs {', '.join(missing)}: pip install 'dnnperf[frameworks]'"
        )


def write_data(workload: Workload, preset: str, batch_sizes: Sequence[int], seed: int, path: str) -> None:
    """The in-memory source's batches for every batch size, NHWC images and int32 labels, as .npz."""
    fmt = workload.data(preset)
    arrays = {}
    for batch_size in dict.fromkeys(batch_sizes):
        sample = fmt.synthesize(batch_size * POOL, seed)
        arrays[f"image_{batch_size}"] = np.ascontiguousarray(sample["image"].numpy().transpose(0, 2, 3, 1))
        arrays[f"label_{batch_size}"] = sample["label"].numpy().astype(np.int32)
    with open(path, "wb") as file:
        np.savez(file, **arrays)


def read_result(file: MarksFile) -> dict[str, Any] | None:
    """The child's result, None when it wrote none (or was stopped while writing it)."""
    try:
        document = json.loads(file.read() or b"null")
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def bench_framework(
    workload: str,
    framework: str,
    preset: str = "tiny",
    batch_sizes: Sequence[int] | None = None,
    steps: int = 20,
    warmup: int = 5,
    *,
    seed: int = 0,
    device: str = "auto",
    interval_s: float = WATCH_INTERVAL_S,
    store: RunStore | None = None,
    command: Sequence[str] = (),
) -> RunRecord:
    """Train ``workload`` in ``framework`` and time ``steps`` steps at each batch size; the record
    (saved to ``store`` when given). A failed child raises ``RunFailed``, a stop ``Interrupted``,
    each carrying the record saved with what was measured."""
    check_request(workload, framework, device)
    settings = BenchSettings(
        workload=workload,
        preset=preset,
        batch_sizes=tuple(batch_sizes) if batch_sizes else None,
        steps=steps,
        warmup=warmup,
        device=device,
        seed=seed,
    )
    settings.validate()
    suite = get_workload(workload)
    sizes = list(settings.batch_sizes or (suite.batch_size(preset),))
    keras = framework in KERAS_FRAMEWORKS
    # Keras trains on the CPU here; a torch child reports its device and threads when it ends.
    common = settings.record_settings(sizes, "cpu" if keras else device, None)
    record = RunRecord.start(
        "bench",
        workload_section(suite, preset),
        FrameworkBenchSettings(
            **vars(common),
            framework=framework,
            limitations=LIMITATIONS[framework],
            watch_interval_s=interval_s,
        ),
        command=command,
        name=f"{suite.name}-{framework}",
    )
    data, result_file = MarksFile(), MarksFile()
    try:
        spec = {
            "framework": framework,
            "workload": suite.name,
            "preset": preset,
            "config": record.workload["config"],
            "batch_sizes": sizes,
            "steps": steps,
            "warmup": warmup,
            "seed": seed,
            "device": device,
            "data": data.path,
            "result": result_file.path,
        }
        if keras:
            write_data(suite, preset, sizes, seed, data.path)
        if store is not None:
            store.save(record)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        if keras:
            env["KERAS_BACKEND"] = framework
        argv = [sys.executable, "-m", "dnnperf.frameworks.child", json.dumps(spec)]
        record.watch = watch(argv, interval_s, env=env, stdout=subprocess.DEVNULL)
        conclude(record, read_result(result_file), record.watch)
    except BaseException as error:  # before the child's end was known: the record says why it stopped
        if record.status == "running":
            record.status = "partial" if isinstance(error, KeyboardInterrupt) else "failed"
            record.error = f"{type(error).__name__}: {error}"
        raise
    finally:
        data.close()
        result_file.close()
        record.finished = utc_now()
        if store is not None:
            with contextlib.suppress(UsageError):  # an unsavable record is not worth hiding the error
                store.save(record)
    if record.status == "partial":
        raise Interrupted(record)
    if record.status == "failed":
        raise RunFailed(record, FrameworkError(record.error or "the child failed"))
    return record


def conclude(record: RunRecord, result: dict[str, Any] | None, watched: WatchResult) -> None:
    """Fill the record's points and status from the child's result and how the child ended."""
    result = result or {}
    if "record" in result:  # torch: the child's own bench record
        child = RunRecord.from_dict(result["record"])
        record.points = child.points
        record.settings["torch_threads"] = child.settings.get("torch_threads")
        record.settings["device"] = child.settings["device"]
        record.error = child.error
    else:
        record.points = [point_from(p) for p in result.get("points", [])]
        software = record.environment.setdefault("software", {})
        software.update(result.get("software", {}))
        if "threads" in result:
            record.settings["framework_threads"] = json.dumps(result["threads"])
    for point in record.points:
        if point.status == "running":
            point.status = "partial"
    failed = [p for p in record.points if p.status == "failed"]
    if watched.end == "interrupted":
        record.status = "partial"
    elif failed or result.get("error") or watched.shell_exit_code != 0:
        record.status = "failed"
        reason = result.get("error") or (failed[0].error if failed else None)
        record.error = reason or f"the {record.settings['framework']} child exited {watched.shell_exit_code}"
    else:
        record.status = "complete"


def point_from(document: dict[str, Any]) -> Point:
    return Point(
        batch_size=int(document["batch_size"]),
        status=str(document["status"]),
        warmup_s=[float(v) for v in document["warmup_s"]],
        step_s=[float(v) for v in document["step_s"]],
        loss=[None if v is None else float(v) for v in document["loss"]],
        error=document.get("error"),
    )


def system_figures(record: RunRecord) -> list[dict[str, Any]]:
    """Per batch size, what the watcher sampled while it ran (None where no sample falls in it):
    peak resident memory of the process tree, minor and major page faults over the batch size's
    whole window (model building and compiling included), and cores busy over its measured steps.

    A batch size's window runs from the previous one's last step mark (or the start) to its own last
    mark; its measured steps start at its last warm-up step's mark. Marks are numbered globally."""
    watched = record.watch
    if watched is None:
        return []
    per_point = int(record.settings["warmup"]) + int(record.settings["steps"])
    warmup = int(record.settings["warmup"])
    at = {step: t for t, step in zip(watched.marks.t, watched.marks.step, strict=True) if step is not None}
    figures, start = [], 0.0
    for index, point in enumerate(record.points):
        first, last = index * per_point, (index + 1) * per_point - 1
        mine = [at[s] for s in range(first, last + 1) if s in at]
        end = mine[-1] if mine else start
        measured_from = at.get(first + warmup - 1, start) if warmup else start
        figures.append({"batch_size": point.batch_size, **window_figures(watched, start, end, measured_from)})
        start = end
    return figures


def window_figures(watched: WatchResult, start: float, end: float, measured_from: float) -> dict[str, Any]:
    """Peak RSS, page faults and busy cores between ``start`` and ``end`` (seconds since the start)."""
    t, total = watched.t, watched.total

    def held(when: float) -> int | None:  # the last sample taken at or before ``when``
        found = [i for i, v in enumerate(t) if v <= when]
        return found[-1] if found else None

    inside = [i for i, v in enumerate(t) if start < v <= end]
    # Before the first sample nothing ran yet: the counters start from it.
    before, after = (held(start) if start > 0 else 0) if t else None, held(end)
    rss = [total.rss_bytes[i] for i in inside] or ([total.rss_bytes[after]] if after is not None else [])

    def delta(series: list[Any]) -> int | None:
        if before is None or after is None or after <= before:
            return None
        a, b = series[before], series[after]
        return None if a is None or b is None else b - a

    cores = None
    began = held(measured_from)
    if began is not None and after is not None and t[after] - t[began] >= watched.config.interval_s:
        cores = max(total.cpu_s[after] - total.cpu_s[began], 0.0) / (t[after] - t[began])
    return {
        "peak_rss_bytes": max(rss) if rss else None,
        "minor_faults": delta(total.minor_faults),
        "major_faults": delta(total.major_faults),
        "cpu_cores": cores,
        "window_s": end - start,
        "samples": len(inside),
    }
