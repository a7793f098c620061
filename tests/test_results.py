import json
import math

import pytest

from dnnperf.errors import UsageError
from dnnperf.results.record import SCHEMA_VERSION, Point, RecordError, RunRecord
from dnnperf.results.store import RunStore, read_record


def make_record(**changes) -> RunRecord:
    record = RunRecord(
        id="r1",
        kind="bench",
        workload={"name": "basic_cnn", "preset": "tiny"},
        settings={"device": "cpu", "data": "memory"},
        environment={"machine": {}, "software": {}},
        points=[
            Point(batch_size=4, status="complete", warmup_s=[0.5], step_s=[0.1, 0.2, 0.4], loss=[2.0, 1.5])
        ],
    )
    for key, value in changes.items():
        setattr(record, key, value)
    return record


def test_round_trip_keeps_raw_samples_and_recomputes_summary(tmp_path):
    store = RunStore(tmp_path)
    path = store.save(make_record())
    document = json.loads(path.read_text())
    assert document["schema_version"] == SCHEMA_VERSION
    summary = document["points"][0]["summary"]
    assert summary["step_time_s"]["median"] == pytest.approx(0.2)
    # Throughput is batch / step time: median 4/0.2; p10 of throughput from p90 of time.
    assert summary["throughput"]["median"] == pytest.approx(20.0)
    assert summary["throughput"]["p10"] == pytest.approx(4 / (0.2 + 0.8 * 0.2))
    loaded = read_record(path)
    assert loaded.points[0].step_s == [0.1, 0.2, 0.4]
    assert loaded.points[0].loss == [2.0, 1.5]


def test_nan_is_stored_as_null_so_the_file_stays_valid_json(tmp_path):
    record = make_record(points=[Point(batch_size=2, status="oom")])
    path = RunStore(tmp_path).save(record)
    document = json.loads(path.read_text())  # would fail on a bare NaN token
    assert document["points"][0]["summary"]["step_time_s"]["median"] is None
    assert document["points"][0]["summary"]["throughput"] is None
    assert math.isnan(read_record(path).points[0].step_time.median)


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    store = RunStore(tmp_path)
    for _ in range(3):
        store.save(make_record())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1.json"]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.update(schema="other"), "schema"),
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
        (lambda d: d.update(status="weird"), "status"),
        (lambda d: d["points"][0].update(batch_size=0), "batch_size"),
        (lambda d: d["points"][0].update(step_s=["fast"]), "step_s"),
        (lambda d: d.pop("workload"), "workload"),
    ],
)
def test_invalid_documents_are_rejected_with_a_reason(mutate, reason):
    document = make_record().to_dict()
    mutate(document)
    with pytest.raises(RecordError, match=reason):
        RunRecord.from_dict(document)


def test_scan_skips_corrupt_files_and_says_why(tmp_path):
    store = RunStore(tmp_path)
    store.save(make_record())
    (tmp_path / "truncated.json").write_text('{"schema": "dnnperf.run", "id": ')
    (tmp_path / "foreign.json").write_text('{"hello": 1}')
    records, skipped = store.scan()
    assert [r.id for r in records] == ["r1"]
    reasons = {s.path.name: s.reason for s in skipped}
    assert "not valid JSON" in reasons["truncated.json"]
    assert "not a dnnperf run record" in reasons["foreign.json"]


def test_unwritable_runs_directory_is_a_usage_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="not writable"):
        RunStore(blocker / "runs")


def test_load_by_prefix_and_ambiguity(tmp_path):
    store = RunStore(tmp_path)
    store.save(make_record(id="abc-1"))
    store.save(make_record(id="abc-2"))
    assert store.load("abc-1").id == "abc-1"
    with pytest.raises(UsageError, match="ambiguous"):
        store.load("abc")
    with pytest.raises(UsageError, match="no run"):
        store.load("zzz")
