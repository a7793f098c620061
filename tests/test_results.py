import json
import math
import os
import re

import pytest

from dnnperf.errors import UsageError
from dnnperf.results.record import SCHEMA_VERSION, Point, RecordError, RunRecord
from dnnperf.results.store import RunStore, read_record

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


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


def test_a_record_that_load_would_refuse_is_refused_by_save_with_the_same_reason(tmp_path):
    """A record built by hand for a user's own loop, without the settings' device: saving it says why,
    as loading it would, and writes nothing (before, it was written and then skipped by every reader)."""
    store = RunStore(tmp_path)
    with pytest.raises(UsageError, match=r"record r1 cannot be saved: settings\.device missing"):
        store.save(make_record(settings={"data": "memory"}))
    with pytest.raises(UsageError, match="status 'done' is not one of"):
        store.save(make_record(status="done"))
    assert list(tmp_path.iterdir()) == []
    assert store.load(store.save(make_record()).stem).settings["device"] == "cpu"


def test_a_save_that_fails_midway_leaves_the_previous_record_intact(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    path = store.save(make_record())
    before = path.read_text()

    real_fsync = os.fsync

    def disk_full(fd):  # the new text is in the temporary file, then the disk fills
        real_fsync(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        store.save(make_record(status="complete"))
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1.json"]


def test_stored_summaries_are_ignored_and_recomputed_from_raw_samples(tmp_path):
    document = make_record().to_dict()
    document["points"][0]["summary"]["step_time_s"]["median"] = 99.0  # hand-edited, inconsistent
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(document))
    assert read_record(path).to_dict()["points"][0]["summary"]["step_time_s"]["median"] == pytest.approx(0.2)


def test_a_dead_running_record_reads_interrupted():
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(finished.stdout)
    import platform

    record = make_record(
        status="running", pid=dead_pid, environment={"machine": {"hostname": platform.node()}}
    )
    assert record.effective_status() == "interrupted"
    assert make_record(status="running", pid=None).effective_status() == "running"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.update(schema="other"), "schema"),
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
        (lambda d: d.update(status="weird"), "status"),
        (lambda d: d["points"][0].update(batch_size=0), "batch_size"),
        (lambda d: d["points"][0].update(step_s=["fast"]), "step_s"),
        (lambda d: d.pop("workload"), "workload"),
        (lambda d: d["points"][0].update(step_s=[0.0]), "positive"),
        (lambda d: d["points"][0].update(step_s=[-0.5]), "positive"),
        (lambda d: d["workload"].pop("name"), "workload.name"),
        (lambda d: d["settings"].pop("device"), "settings.device"),
        (lambda d: d.update(command=5), "command"),
        (lambda d: d.update(error=3), "error"),
        (lambda d: d.update(schema_version=0), r"schema_version 0 is not one this dnnperf reads \(1 to"),
        (lambda d: d.update(schema_version=True), "schema_version True"),
        (lambda d: d.update(kind="weird"), "kind 'weird' is not one of bench, profile, memsave"),
        (lambda d: d.update(created="notadate"), r"created 'notadate' is not a date and time"),
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
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "deep.json").write_text('{"a":' * 100_000)
    huge = make_record().to_dict()
    huge["points"][0]["step_s"] = [10**400]
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    records, skipped = store.scan()
    assert [r.id for r in records] == ["r1"]
    reasons = {s.path.name: s.reason for s in skipped}
    assert "not valid JSON" in reasons["truncated.json"]
    assert "not a dnnperf run record" in reasons["foreign.json"]
    assert "not a text file" in reasons["binary.json"]
    assert set(reasons) == {"truncated.json", "foreign.json", "binary.json", "deep.json", "huge.json"}


def test_unwritable_runs_directory_is_a_usage_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="not writable"):
        RunStore(blocker / "runs")
    with pytest.raises(UsageError, match="a-file is not a directory"):
        RunStore(blocker)


def test_load_by_prefix_and_ambiguity(tmp_path):
    store = RunStore(tmp_path)
    store.save(make_record(id="abc-1"))
    store.save(make_record(id="abc-2"))
    assert store.load("abc-1").id == "abc-1"
    with pytest.raises(UsageError, match="ambiguous"):
        store.load("abc")
    with pytest.raises(UsageError, match="no run"):
        store.load("zzz")
    for odd in ("*", "[", "**/x"):
        with pytest.raises(UsageError):
            store.load(odd)
    with pytest.raises(UsageError, match="no record file"):
        store.load(str(tmp_path / "missing.json"))
    with pytest.raises(UsageError, match="give a run id"):
        store.load("")


def test_a_runs_path_that_is_a_file_is_an_error_not_an_empty_list(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        RunStore(blocker, create=False).scan()


def test_a_new_run_id_has_nothing_a_shell_or_a_file_name_trips_on() -> None:
    from dnnperf.results.record import new_run_id

    run_id = new_run_id("gpt2 dp+gpt2 pp/x", "tiny")
    assert re.fullmatch(r"\d{8}-\d{6}-gpt2-dp\+gpt2-pp-x-tiny-[0-9a-f]{6}", run_id), run_id


def test_a_started_record_stores_the_documented_settings():
    """The truth: the settings block docs/run-record.md documents for a profile run."""
    from dnnperf.results.settings import BenchRunSettings

    settings = BenchRunSettings(
        workload="resnet18", preset="tiny", batch_sizes=[8], steps=20, warmup=5, device="cpu",
        data="memory", workers=None, seed=0, data_dir=None, stages=True, layers=False, memory=False,
        requested_device="auto", torch_threads=2,
    )  # fmt: skip
    record = RunRecord.start("profile", {"name": "resnet18", "preset": "tiny"}, settings)
    documented = {
        "workload": "resnet18", "preset": "tiny", "batch_sizes": [8], "steps": 20, "warmup": 5,
        "device": "cpu", "requested_device": "auto", "data": "memory", "workers": None, "seed": 0,
        "data_dir": None, "stages": True, "layers": False, "memory": False, "torch_threads": 2,
    }  # fmt: skip
    assert record.to_dict()["settings"] == documented
    assert record.pid == os.getpid() and record.status == "running" and "-resnet18-tiny-" in record.id
    assert RunRecord.from_dict(json.loads(json.dumps(record.to_dict()))).settings == documented


def test_a_validation_records_distributed_is_the_strategies_as_typed(tmp_path):
    """`dnnperf validate --distributed dp,pp` stores the strategies as typed; a distributed run's
    `settings.distributed` is the layout its ranks ran under, an object: each kind is checked as its."""
    from dnnperf.results.settings import ValidateSettings

    settings = ValidateSettings(
        device="cpu", data="memory", batch_sizes=[8], steps=2, distributed="dp,pp", memory=False,
        collectives=False, hw=None,
    )  # fmt: skip
    record = RunRecord.start("validate", {"name": "basic_cnn", "preset": "tiny"}, settings)
    store = RunStore(tmp_path)
    assert read_record(store.save(record)).settings["distributed"] == "dp,pp"
    document = make_record().to_dict()
    document["settings"]["distributed"] = "dp"
    with pytest.raises(RecordError, match=r"settings\.distributed"):
        RunRecord.from_dict(document)
