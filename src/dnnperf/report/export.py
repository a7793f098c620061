"""Tables of a run as plain data: the stage and layer tables as DataFrames (the Python API) and as CSV
files (one per table, every batch size in one file with a ``batch_size`` column); a watch's samples
(the tree's totals and GPUs, one row per sample) and its processes' samples (one row per process and
sample)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dnnperf.analysis import layers
from dnnperf.jsonio import write_text_atomic
from dnnperf.results.fields import GPU_KINDS
from dnnperf.results.record import RunRecord


def stage_table(record: RunRecord) -> pd.DataFrame:
    """One row per (batch size, stage): median, p10, p90 seconds per step and share of the step."""
    rows = []
    for point in record.points:
        if point.stages is None or not point.stages.wall_s:
            continue
        for name, stats in point.stages.summary()["stages"].items():
            rows.append(
                {
                    "batch_size": point.batch_size,
                    "stage": name,
                    "median_s": stats["median"],
                    "p10_s": stats["p10"],
                    "p90_s": stats["p90"],
                    "share": stats["share"],
                    "steps": len(point.stages.wall_s),
                }
            )
    return pd.DataFrame(rows, columns=["batch_size", "stage", "median_s", "p10_s", "p90_s", "share", "steps"])


#: The layer table's columns that go to CSV (the per-step lists stay in the record).
LAYER_COLUMNS = (
    "module", "type", "category", "phase", "time_s", "time_p10_s", "time_p90_s", "share", "op_time_s",
    "calls", "flops", "bytes", "intensity", "achieved_flops", "peak_flops", "efficiency",
    "attainable_flops", "bound", "library", "dtype",
)  # fmt: skip


def layer_table(record: RunRecord) -> pd.DataFrame:
    """Every batch size's per-layer table (``analysis.layers.layer_table``) with a batch_size column."""
    frames = []
    for point in record.points:
        if point.layers is None or not point.layers.steps:
            continue
        frame = layers.layer_table(point.layers, point.layers.hardware_profile())
        frame = frame[[c for c in LAYER_COLUMNS if c in frame]]
        frames.append(frame.assign(batch_size=point.batch_size)[["batch_size", *frame.columns]])
    if not frames:
        return pd.DataFrame(columns=["batch_size", *LAYER_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def samples_table(record: RunRecord) -> pd.DataFrame:
    """A watch's samples: ``t`` (seconds since the start), the tree's totals, its busy cores, and
    ``gpuN_METRIC`` per GPU; empty for other records."""
    result = record.watch
    if result is None:
        return pd.DataFrame()
    columns = {"t": result.t, **result.total.series_dict(), "processes": result.total.processes}
    columns["cpu_cores"] = result.cpu_cores()
    for gpu in result.gpus:
        for kind in GPU_KINDS:
            columns[f"gpu{gpu.index}_{kind}"] = getattr(gpu, kind)
    return pd.DataFrame(columns)


def process_samples_table(record: RunRecord) -> pd.DataFrame:
    """A watch's per-process samples: one row per (process, sample it was alive at)."""
    result = record.watch
    if result is None:
        return pd.DataFrame()
    frames = []
    for process in result.processes:
        series = process.series_dict() | {"cpu_cores": result.cpu_cores(process)}
        frame = pd.DataFrame({"t": result.t[process.first : process.first + len(process)], **series})
        frame.insert(0, "name", process.name)
        frame.insert(0, "pid", process.pid)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def csv_tables(record: RunRecord) -> dict[str, pd.DataFrame]:
    """The record's tables that have rows, by file name: ``stages`` and ``layers``; ``samples`` and
    ``processes`` for a watch."""
    tables = {"stages": stage_table(record), "layers": layer_table(record)}
    tables |= {"samples": samples_table(record), "processes": process_samples_table(record)}
    return {name: frame for name, frame in tables.items() if not frame.empty}


def write_csv(tables: dict[str, pd.DataFrame], directory: Path) -> list[Path]:
    """``NAME.csv`` for each of ``tables`` (``csv_tables``) under ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        path = directory / f"{name}.csv"
        write_text_atomic(path, inert(frame).to_csv(index=False))
        written.append(path)
    return written


#: What a spreadsheet reads as the start of a formula in a text cell.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell a spreadsheet would run as a formula (a module or command named
    ``=HYPERLINK(...)``) quoted by a leading apostrophe; numbers as they are."""
    frame = frame.copy()
    for column in frame.select_dtypes(include="object").columns:
        frame[column] = [
            f"'{cell}" if isinstance(cell, str) and cell.startswith(FORMULA_STARTS) else cell
            for cell in frame[column]
        ]
    return frame
