"""Trace and CSV exports against the record: valid Trace Event Format, the record's stage and layer
times span for span, one process per rank; CSV tables with the record's medians."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import run_cli
from dnnperf.report.trace import Track, TrackPoint, trace_document, tracks_of
from dnnperf.results.record import RunRecord
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

SPAN_KEYS = {
    "name": str,
    "cat": str,
    "ph": str,
    "pid": int,
    "tid": int,
    "ts": (int, float),
    "dur": (int, float),
}


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> RunRecord:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("trace")
    settings = BenchSettings(
        "basic_cnn", batch_sizes=(2, 4), steps=3, warmup=1, stages=True, layers=True, memory=False
    )
    return bench(settings, RunStore(root))


def check_trace_event_format(document: dict) -> list[dict]:
    """The JSON Object Format of the Trace Event Format: complete (X) and metadata (M) events with
    their required fields and types, and complete events on one thread nest (no partial overlap)."""
    assert isinstance(document, dict) and isinstance(document["traceEvents"], list)
    assert document.get("displayTimeUnit") in (None, "ms", "ns")
    json.loads(json.dumps(document, allow_nan=False))  # strict JSON: no NaN or infinity
    spans = []
    for event in document["traceEvents"]:
        assert event["ph"] in ("X", "M"), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            assert isinstance(event["pid"], int) and isinstance(event["args"], dict), event
            continue
        for key, kind in SPAN_KEYS.items():
            assert isinstance(event[key], kind) and not isinstance(event[key], bool), (key, event)
        assert event["ts"] >= 0 and event["dur"] >= 0 and isinstance(event.get("args", {}), dict)
        spans.append(event)
    by_thread = defaultdict(list)
    for span in spans:
        by_thread[(span["pid"], span["tid"])].append(span)
    for thread in by_thread.values():
        stack: list[float] = []  # ends of the open spans
        for span in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            end = span["ts"] + span["dur"]
            while stack and stack[-1] <= span["ts"] + 1e-9:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-9, f"{span['name']} overlaps its parent"
            stack.append(end)
    return spans


def test_the_trace_is_valid_and_carries_the_records_stage_times(record):
    document = json.loads(json.dumps(trace_document(record)))
    spans = check_trace_event_format(document)
    stages = defaultdict(list)
    for span in spans:
        if span["cat"] == "stage":
            stages[(span["args"]["batch_size"], span["name"])].append(span["dur"] / 1e6)
    expected = {(p.batch_size, n): v for p in record.points for n, v in p.stages.steps.items()}
    assert stages.keys() == expected.keys()
    for key, values in expected.items():
        assert stages[key] == pytest.approx(values, abs=1e-9), key
    steps = [s for s in spans if s["cat"] == "step" and s["tid"] == 1]
    walls = [w for p in record.points for w in p.stages.wall_s]
    assert [s["dur"] / 1e6 for s in steps] == pytest.approx(walls, rel=1e-3)  # stages close the step


def test_layer_spans_are_each_layers_own_time(record):
    spans = check_trace_event_format(trace_document(record))
    layers = defaultdict(list)
    for span in spans:
        if span["cat"] == "layer":
            layers[(span["args"]["batch_size"], span["name"], span["args"]["phase"])].append(
                span["dur"] / 1e6
            )
    expected = {
        (p.batch_size, module, phase): values
        for p in record.points
        for module, phases in p.layers.layer_seconds.items()
        for phase, values in phases.items()
        if phase in ("forward", "backward")
    }
    assert layers.keys() == expected.keys()
    for key, values in expected.items():
        assert layers[key] == pytest.approx(values, abs=1e-9), key
    forward = [s for s in spans if s["cat"] == "phase" and s["name"] == "forward"]
    assert len(forward) == sum(p.layers.steps for p in record.points)


def test_one_process_per_rank(record):
    """Tracks as a distributed run's ranks would give them: one pid each, named, side by side."""
    rank0 = tracks_of(record)[0]
    slower = [
        TrackPoint(
            p.batch_size,
            [w * 1.5 for w in p.wall_s],
            {k: [v * 1.5 for v in vs] for k, vs in p.stages.items()},
        )
        for p in rank0.points
    ]
    document = trace_document(record, [rank0, Track(rank=1, points=slower, host="other")])
    spans = check_trace_event_format(document)
    assert {s["pid"] for s in spans} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
    assert names[1] == "rank 1 (other)" and names[0].startswith("rank 0")
    # Each batch size starts where the slowest rank finished the previous one.
    batches = {(s["pid"], s["name"]): s for s in spans if s["cat"] == "batch"}
    second = f"batch {record.points[1].batch_size}"
    assert batches[(0, second)]["ts"] == batches[(1, second)]["ts"]
    first = batches[(1, f"batch {record.points[0].batch_size}")]
    assert batches[(0, second)]["ts"] >= first["ts"] + first["dur"]


def test_cli_export_writes_the_trace_and_the_tables(record, tmp_path):
    path = RunStore(tmp_path).save(record)
    result = run_cli("export", str(path), "--trace", str(tmp_path / "t.json"), "--csv", str(tmp_path / "csv"))
    assert result.returncode == 0, result.stderr
    check_trace_event_format(json.loads((tmp_path / "t.json").read_text()))
    stages = pd.read_csv(tmp_path / "csv" / "stages.csv")
    for point in record.points:
        rows = stages[stages["batch_size"] == point.batch_size].set_index("stage")
        for name, values in point.stages.steps.items():
            assert rows.loc[name, "median_s"] == pytest.approx(np.median(values), rel=1e-9)
    layers = pd.read_csv(tmp_path / "csv" / "layers.csv", keep_default_na=False)
    assert set(layers["batch_size"]) == {p.batch_size for p in record.points}
    conv = layers[
        (layers["batch_size"] == 2) & (layers["module"] == "conv1") & (layers["phase"] == "forward")
    ]
    truth = np.median(record.points[0].layers.layer_seconds["conv1"]["forward"])
    assert float(conv["time_s"].iloc[0]) == pytest.approx(truth, rel=1e-9)
    result = run_cli("export", str(path))
    assert result.returncode == 2 and "--trace" in result.stderr and "Traceback" not in result.stderr


def test_a_distributed_records_ranks_are_its_tracks(record):
    from test_report import with_ranks

    spans = check_trace_event_format(trace_document(with_ranks(record)))
    for rank, scale in ((0, 1.0), (1, 1.2)):
        forward = [
            s["dur"] / 1e6
            for s in spans
            if s["pid"] == rank and s["cat"] == "stage" and s["name"] == "forward"
        ]
        truth = [v * scale for p in record.points for v in p.stages.steps["forward"]]
        assert forward == pytest.approx(truth, abs=1e-9)
    assert {s["pid"] for s in spans if s["cat"] == "layer"} == {0}  # layers were profiled on rank 0


def test_csv_cells_a_spreadsheet_would_run_are_quoted(tmp_path):
    """A module named like a formula (a hostile or unlucky name) is text in the CSV, not a formula a
    spreadsheet runs; numbers, negative ones included, stay numbers."""
    from dnnperf.report.export import write_csv

    frame = pd.DataFrame(
        {"module": ['=HYPERLINK("http://x")', "+1", "-a", "@SUM(A1)", "conv1"], "delta_s": [-0.5, 1, 2, 3, 4]}
    )
    write_csv({"layers": frame}, tmp_path)
    read = pd.read_csv(tmp_path / "layers.csv")
    assert list(read["module"]) == ['\'=HYPERLINK("http://x")', "'+1", "'-a", "'@SUM(A1)", "conv1"]
    assert list(read["delta_s"]) == [-0.5, 1, 2, 3, 4]
