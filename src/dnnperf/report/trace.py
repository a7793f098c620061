"""A run as a Chrome trace (Trace Event Format JSON, opened by Perfetto and chrome://tracing).

One process (``pid``) per rank. In each: thread 1 holds the measured steps, each a span with its
stages inside; thread 2 the layer-timed steps, each with its forward and backward and every layer's
own time inside. A record keeps per-step durations, not clock readings, so steps are laid end to end
and, within a step, stages in data-flow order and layers in the model's order (backward reversed):
every span has its measured duration, the gaps between steps are not shown. Times are whole
nanoseconds written as microseconds, so nesting is exact.

A watch record is a different trace: counter tracks ("C" events) at the sample instants, one process
per watched process (its pid) with a counter per metric, the tree's totals as process 0, one process
per GPU, and an instant event per step mark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnperf.analysis.layers import LAYER_PHASES
from dnnperf.jsonio import write_json_atomic
from dnnperf.results.fields import GPU_KINDS, SERIES_KINDS
from dnnperf.results.layers import LayerProfile
from dnnperf.results.record import RunRecord
from dnnperf.results.watch import WatchResult

STEPS_TID, LAYERS_TID = 1, 2
#: A watch trace's process for the tree's totals, and the first of its GPUs' (above any Linux pid).
TREE_PID, GPU_PID = 0, 10_000_000


@dataclass
class TrackPoint:
    """One rank's measurements at one batch size."""

    batch_size: int
    #: Wall seconds of each measured step, and stage name -> seconds in each step.
    wall_s: list[float]
    stages: dict[str, list[float]]
    layers: LayerProfile | None = None


@dataclass
class Track:
    """One rank: a process in the trace."""

    rank: int
    points: list[TrackPoint] = field(default_factory=list)
    host: str = ""


def tracks_of(record: RunRecord) -> list[Track]:
    """One track per rank. A distributed point's ``ranks`` section gives every rank's own stages;
    otherwise the one process that measured is rank 0. Layers were profiled on rank 0."""
    host = record.environment.get("machine", {}).get("hostname", "")
    tracks: dict[int, Track] = {}
    for point in record.points:
        layers = point.layers if point.layers is not None and point.layers.steps else None
        ranks = getattr(point, "ranks", None)  # a RankBreakdown (dnnperf.distributed.ranks), if any
        if ranks is not None and ranks.ranks:
            for rank in ranks.ranks:
                track = tracks.setdefault(rank.rank, Track(rank=rank.rank, host=rank.host))
                track.points.append(
                    TrackPoint(
                        point.batch_size,
                        list(rank.wall_s),
                        dict(rank.stages),
                        layers if rank.rank == 0 else None,
                    )
                )
            continue
        stages = point.stages
        track = tracks.setdefault(0, Track(rank=0, host=host))
        track.points.append(
            TrackPoint(
                batch_size=point.batch_size,
                wall_s=list(stages.wall_s) if stages is not None else list(point.step_s),
                stages={n: stages.steps[n] for n in stages.names() if n in stages.steps} if stages else {},
                layers=layers,
            )
        )
    return [tracks[rank] for rank in sorted(tracks)]


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _span(name: str, cat: str, pid: int, tid: int, start_ns: int, dur_ns: int, **args: Any) -> dict:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": start_ns / 1000,
        "dur": dur_ns / 1000,
        "args": args,
    }


def _sequence(
    parts: Sequence[tuple[str, int]], cat: str, pid: int, tid: int, start: int, **args: Any
) -> tuple[list[dict], int]:
    """Spans laid one after the other from ``start``; returns them and their end."""
    events, at = [], start
    for name, dur in parts:
        events.append(_span(name, cat, pid, tid, at, dur, **args))
        at += dur
    return events, at


def _step_events(point: TrackPoint, pid: int, start: int) -> tuple[list[dict], int]:
    events: list[dict] = []
    at = start
    for i, wall in enumerate(point.wall_s):
        parts = [(name, _ns(values[i])) for name, values in point.stages.items()]
        children, end = _sequence(parts, "stage", pid, STEPS_TID, at, batch_size=point.batch_size, step=i)
        dur = max(_ns(wall), end - at)  # the step holds its stages even where they close a hair over
        events.append(_span(f"step {i}", "step", pid, STEPS_TID, at, dur, batch_size=point.batch_size))
        events += children
        at += dur
    return events, at


def _layer_events(profile: LayerProfile, batch_size: int, pid: int, start: int) -> tuple[list[dict], int]:
    order = [m for m in profile.modules if m in profile.layer_seconds]
    order += [m for m in profile.layer_seconds if m not in profile.modules]
    events: list[dict] = []
    at = start
    for step in range(profile.steps):
        phase_start = at
        phase_events = []
        for phase in LAYER_PHASES:
            modules = order if phase == "forward" else order[::-1]
            parts = [
                (m, _ns(profile.layer_seconds[m][phase][step]))
                for m in modules
                if phase in profile.layer_seconds[m]
            ]
            children, end = _sequence(
                parts, "layer", pid, LAYERS_TID, phase_start, batch_size=batch_size, phase=phase, step=step
            )
            phase_events.append(_span(phase, "phase", pid, LAYERS_TID, phase_start, end - phase_start))
            phase_events += children
            phase_start = end
        wall = _ns(profile.step_s[step]) if step < len(profile.step_s) else 0
        dur = max(wall, phase_start - at)
        events.append(
            _span(f"layer-timed step {step}", "step", pid, LAYERS_TID, at, dur, batch_size=batch_size)
        )
        events += phase_events
        at += dur
    return events, at


def _metadata(track: Track) -> Iterator[dict]:
    label = f"rank {track.rank}" + (f" ({track.host})" if track.host else "")
    yield {"name": "process_name", "ph": "M", "pid": track.rank, "tid": 0, "args": {"name": label}}
    yield {
        "name": "process_sort_index",
        "ph": "M",
        "pid": track.rank,
        "tid": 0,
        "args": {"sort_index": track.rank},
    }
    for tid, name in ((STEPS_TID, "measured steps: stages"), (LAYERS_TID, "layer-timed steps: layers")):
        yield {"name": "thread_name", "ph": "M", "pid": track.rank, "tid": tid, "args": {"name": name}}


def trace_events(tracks: Sequence[Track]) -> list[dict]:
    """The Trace Event Format events of every rank. Batch sizes follow one another; each starts
    where the slowest rank finished the previous one."""
    events = [event for track in tracks for event in _metadata(track)]
    start = 0
    sizes = max((len(t.points) for t in tracks), default=0)
    for index in range(sizes):
        end = start
        for track in tracks:
            if index >= len(track.points):
                continue
            point = track.points[index]
            steps, at = _step_events(point, track.rank, start)
            if steps:
                events.append(
                    _span(f"batch {point.batch_size}", "batch", track.rank, STEPS_TID, start, at - start)
                )
            events += steps
            if point.layers is not None:
                layers, at = _layer_events(point.layers, point.batch_size, track.rank, at)
                events += layers
            end = max(end, at)
        start = end
    return events


def counter_events(pid: int, times: Sequence[float], series: dict[str, list[Any]]) -> Iterator[dict]:
    """One counter track per metric of ``series`` on process ``pid``; values that are None left out."""
    for metric, values in series.items():
        for at, value in zip(times, values, strict=False):
            if value is not None:
                yield {"name": metric, "ph": "C", "pid": pid, "ts": _ns(at) / 1e3, "args": {metric: value}}


def process_name(pid: int, name: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}


def watch_events(result: WatchResult) -> list[dict]:
    """A watch's counter tracks and step marks (see the module)."""
    t = result.t
    totals = result.total.series_dict() | {
        "processes": result.total.processes,
        "cpu_cores": result.cpu_cores(),
    }
    events = [process_name(TREE_PID, "process tree (total)"), *counter_events(TREE_PID, t, totals)]
    for process in result.processes:
        times = t[process.first : process.first + len(process)]
        series = process.series_dict() | {"cpu_cores": result.cpu_cores(process)}
        events.append(process_name(process.pid, f"{process.name} ({process.pid})"))
        events += counter_events(process.pid, times, series)
    for gpu in result.gpus:
        pid = GPU_PID + gpu.index
        events.append(process_name(pid, f"GPU {gpu.index} ({gpu.name})"))
        events += counter_events(pid, t, {kind: getattr(gpu, kind) for kind in GPU_KINDS})
    for at, step in zip(result.marks.t, result.marks.step, strict=True):
        name = "step" if step is None else f"step {step}"
        events.append({"name": name, "ph": "i", "s": "g", "pid": TREE_PID, "tid": 0, "ts": _ns(at) / 1e3})
    return events


def trace_document(record: RunRecord, tracks: Sequence[Track] | None = None) -> dict[str, Any]:
    """The whole trace file: events plus what it was made from."""
    if record.watch is not None:
        return {
            "traceEvents": watch_events(record.watch),
            "displayTimeUnit": "ms",
            "otherData": {
                "record": record.id,
                "command": list(record.watch.config.argv),
                "layout": "counters at the sample instants, seconds since the command started; "
                f"metrics {', '.join(SERIES_KINDS)}, cpu_cores",
            },
        }
    tracks = tracks_of(record) if tracks is None else tracks
    return {
        "traceEvents": trace_events(tracks),
        "displayTimeUnit": "ms",
        "otherData": {
            "record": record.id,
            "workload": f"{record.workload.get('name')} ({record.workload.get('preset')})",
            "device": str(record.settings.get("device")),
            "layout": "steps end to end; stages in data-flow order; layers in model order",
        },
    }


def write_trace(record: RunRecord, path: Path, tracks: Sequence[Track] | None = None) -> Path:
    write_json_atomic(Path(path), trace_document(record, tracks))
    return Path(path)
