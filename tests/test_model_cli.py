"""``dnnperf predict`` as a user meets it: one JSON document whose parts add up, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.conftest import run_cli

from dnnperf.cli import main


def test_predict_json_on_a_preset_machine(tmp_path: Path) -> None:
    machine = {
        "name": "two",
        "peak_flops": {"float32": 1e12},
        "memory_bandwidth": 1e11,
        "memory_bytes": 1e9,
        "link_bandwidth": 1e9,
        "link_latency": 1e-5,
        "intra_bandwidth": 1e10,
        "intra_latency": 1e-6,
        "devices_per_node": 2,
    }
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(machine))
    result = run_cli("predict", "basic_cnn", "--preset", "tiny", "-b", "8", "--machine", str(path), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    rows = {p["strategy"]: p for p in document["predictions"]}
    assert set(rows) | set(document["refused"]) == {"dp", "pp", "tp"}
    for p in rows.values():
        parts = p["compute_s"] + p["communication_s"] + p["bubble_s"] + p["other_s"]
        assert p["step_s"] == pytest.approx(parts)
        assert p["throughput"] == pytest.approx(8 / p["step_s"])
        assert p["devices"] == 2
    fitting = [p for p in rows.values() if p["fits"]]
    assert document["best"] == min(fitting, key=lambda p: p["step_s"])["strategy"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--machine", "nowhere-9000"], "is not hw, a preset"),
        (["--sweep", "colour=1,2"], "unknown sweep axis 'colour'"),
        (["--sweep", "nodes=1,x"], "values must be numbers"),
        (["--sweep", "nodes"], "expects AXIS=V1,V2"),
        (["--machine", "a100-ib", "--strategy", "dp", "-b", "3"], "does not split evenly"),
        (["--preset", "medium"], "no preset 'medium'"),
        (["--machine", "hw", "--device", "gpu"], "unknown device 'gpu'"),
    ]
    + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "no CUDA GPU is available")]),
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture
) -> None:
    code = main(["predict", "basic_cnn", *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in captured.err


def test_bad_machine_file_names_the_missing_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "x", "peak_flops": {"float32": 1e12}}))
    assert main(["predict", "basic_cnn", "--machine", str(path)]) == 2
    assert "lacks intra_bandwidth, intra_latency, link_bandwidth" in capsys.readouterr().err


@pytest.mark.concurrent
def test_validate_json_errors_follow_from_its_own_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from dnnperf import calibration, hardware

    path = hardware.save_profile(calibration.calibrate("cpu", quick=True), tmp_path / "hw.json")
    code = main(
        [
            "validate",
            "basic_cnn",
            "--preset",
            "tiny",
            "--batch-sizes",
            "2",
            "--steps",
            "2",
            "--processes",
            "2",
            "--hw",
            str(path),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        ]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    (row,) = document["rows"]
    assert row["workload"] == "basic_cnn" and row["batch"] == 2 and row["measured_s"] > 0
    # Two fresh runs: the measured figure is their medians' median, between the two.
    assert row["measured_min_s"] <= row["measured_s"] <= row["measured_max_s"]
    assert row["measured_s"] == pytest.approx((row["measured_min_s"] + row["measured_max_s"]) / 2)
    assert row["err[model]"] == pytest.approx(row["pred[model]"] / row["measured_s"] - 1)
    model = next(a for a in document["ablation"] if a["variant"] == "model")
    assert model["median_abs_error"] == pytest.approx(abs(row["err[model]"]))
    # The record keeps the run measured beside predicted; its report draws them with the error.
    from dnnperf.results.record import RecordError, RunRecord
    from dnnperf.results.store import read_record

    record = read_record(Path(document["record_path"]))
    assert record.kind == "validate" and record.validation is not None
    (kept,) = record.validation.runs
    assert kept["measured_s"] == row["measured_s"] and kept["predicted_s"] == row["pred[model]"]
    page = Path(document["report_path"]).read_text()
    assert 'id="validation"' in page
    assert f"median |error| {100 * abs(row['err[model]']):.1f}%" in page
    broken = record.to_dict()
    broken["validation"]["runs"][0]["measured_s"] = -1.0
    message = r"validation\.runs\[0\]\.measured_s is -1.0, not a non-negative number"
    with pytest.raises(RecordError, match=message):
        RunRecord.from_dict(broken)


def test_validate_refuses_a_profile_of_another_thread_count(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from dnnperf import calibration, hardware

    profile = calibration.calibrate("cpu", quick=True)
    other = hardware.HardwareProfile(**{**profile.__dict__, "threads": profile.threads + 1})
    path = hardware.save_profile(other, tmp_path / "hw.json")
    assert main(["validate", "basic_cnn", "--preset", "tiny", "--hw", str(path)]) == 2
    assert "calibrated with" in capsys.readouterr().err


def test_ranking_agreement_on_a_hand_made_table() -> None:
    import pandas as pd

    from dnnperf.perfmodel.validate import ranking_agrees

    rows = [
        ("a", 8, "dp", 0.010, 0.012),
        ("a", 8, "pp", 0.030, 0.020),
        ("a", 8, "tp", 0.020, 0.025),
        ("b", 8, "dp", 0.010, 0.011),
        ("b", 8, "pp", 0.020, 0.021),
    ]
    frame = pd.DataFrame(rows, columns=["workload", "batch", "strategy", "measured_s", "predicted_s"])
    frame["reason"] = None
    ranking = ranking_agrees(frame).set_index("workload")
    assert ranking.loc["a", "measured"] == "dp < tp < pp" and ranking.loc["a", "predicted"] == "dp < pp < tp"
    assert not ranking.loc["a", "agrees"] and ranking.loc["b", "agrees"]


def test_a_ranking_is_judged_only_on_the_pairs_the_launches_separate() -> None:
    """Three launches each: pp and tp overlap (neither measured faster), dp is apart from both."""
    import pandas as pd

    from dnnperf.perfmodel.validate import ranking_agrees

    rows = [
        # workload, strategy, measured median, min, max, predicted
        ("a", "dp", 0.010, 0.009, 0.011, 0.012),
        ("a", "pp", 0.020, 0.018, 0.024, 0.026),  # predicted after tp: a miss of the whole order
        ("a", "tp", 0.022, 0.019, 0.025, 0.021),
        ("b", "dp", 0.010, 0.009, 0.011, 0.031),  # predicted after pp, which the launches put later
        ("b", "pp", 0.020, 0.018, 0.024, 0.026),
    ]
    columns = ["workload", "strategy", "measured_s", "measured_min_s", "measured_max_s", "predicted_s"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["batch"], frame["reason"] = 8, None
    ranking = ranking_agrees(frame).set_index("workload")
    assert not ranking.loc["a", "agrees"] and ranking.loc["a", "agrees_where_separated"]
    assert ranking.loc["a", "separated"] == 2  # dp-pp and dp-tp; pp-tp overlap
    assert not ranking.loc["b", "agrees"] and not ranking.loc["b", "agrees_where_separated"]
    assert ranking.loc["b", "separated"] == 1
    # One launch each: every distinct pair is separated, and the two rankings are the same.
    single = ranking_agrees(frame.drop(columns=["measured_min_s", "measured_max_s"])).set_index("workload")
    assert list(single["agrees_where_separated"]) == list(single["agrees"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "needs workloads to run, --collectives, or both"),
        (["basic_cnn", "--distributed", "dp,zz"], "--distributed takes strategies among dp, pp, tp"),
        (["basic_cnn", "--device", "tpu"], "unknown device 'tpu'"),
        (["basic_cnn", "--device", "cpu:1"], "the CPU has no device index"),
    ]
    + (
        [] if torch.cuda.is_available() else [(["basic_cnn", "--device", "cuda"], "no CUDA GPU is available")]
    ),
)
def test_validate_bad_input_is_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_a_shaped_link_caps_every_collective_at_its_rate() -> None:
    import dataclasses

    from dnnperf.perfmodel import collectives
    from dnnperf.perfmodel.machine import preset
    from dnnperf.perfmodel.predict import link_for
    from dnnperf.perfmodel.validate import LOOPBACK, shaped_link

    fits = {"allreduce": {"alpha": 1e-4, "bandwidth": 2e9}, "send_recv": {"alpha": 1e-4, "bandwidth": 1e8}}
    machine = dataclasses.replace(preset("a100-ib"), collectives=fits)

    def wire(collectives: dict) -> dict:  # without the CPU's part (test_model_predict checks it)
        return {op: {k: fit[k] for k in ("alpha", "bandwidth")} for op, fit in collectives.items()}

    for unshaped in (None, LOOPBACK):
        assert wire(shaped_link(machine, unshaped).collectives) == fits
    shaped = shaped_link(machine, 100.0)  # 100 Mbit/s: 12.5e6 bytes/s
    assert (shaped.devices_per_node, shaped.nodes) == (2, 1)
    assert wire(shaped.collectives)["allreduce"] == {"alpha": 1e-4, "bandwidth": 12.5e6}
    assert shaped.collectives["allreduce"]["cpu_bandwidth"] == 2e9
    assert shaped.collectives["send_recv"]["bandwidth"] == 12.5e6 and shaped.intra_bandwidth == 12.5e6
    # 2-rank ring allreduce of n bytes: each rank sends n/2 twice, n bytes over the shaped wire.
    n = 8e6
    seconds = collectives.allreduce(n, 2, link_for(shaped, 2))
    assert seconds == pytest.approx(n / 12.5e6, rel=0.02)


def test_validate_runs_each_link_in_its_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs and the link's collective microbenchmarks are faked (the namespaces themselves are
    tests/test_netns.py's): each rate's runs ask `dnnperf profile` for --netns and that rate, and each
    is predicted with the collectives fitted over that link, capped at its rate."""
    import subprocess

    from dnnperf.perfmodel import collective_calibration, validate
    from dnnperf.perfmodel.machine import preset

    launched: list[list[str]] = []
    calibrated: list[float | None] = []

    def fake_run(argv, env=None, **kwargs):
        launched.append(list(argv))
        document = {"record": {"points": [{"step_s": [0.5, 0.7, 0.6]}]}}
        return subprocess.CompletedProcess(argv, 0, json.dumps(document), "")

    def fake_fits(mbit):
        calibrated.append(mbit)
        bandwidth = 1e9 if mbit is None else mbit * 1e6 / 8 * 0.9  # TCP's share of the rate
        return {"allreduce": {"alpha": 2e-4, "bandwidth": bandwidth}}

    monkeypatch.setattr(validate, "run_child", fake_run)
    monkeypatch.setattr(collective_calibration, "shaped_fits", fake_fits)
    frame = validate.validate_distributed(
        ["basic_cnn"], [8], ["dp"], "tiny", 2, preset("a100-ib"), links=[None, 10.0]
    ).set_index("link")
    assert [a[a.index("--netns") :] for a in launched] == [
        ["--netns"],
        ["--netns", "--link-mbit", "10"],
    ]
    assert sorted(calibrated, key=str) == [10.0, None]  # each link timed once
    assert frame.loc["unshaped veth", "measured_s"] == 0.6
    # basic_cnn tiny's 84 kB of gradients take ~75 ms at 90% of 10 Mbit/s: the shaped prediction pays them.
    slower = frame.loc["10 Mbit/s", "predicted_s"] - frame.loc["unshaped veth", "predicted_s"]
    assert slower > 0.03


def test_distributed_launches_go_in_rounds_and_the_median_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """--processes 3 with --distributed: every configuration once per round (A B A B A B, not A A A B
    B B), and the measured step is the median of the launches' median steps, with their range."""
    import subprocess

    from dnnperf.perfmodel import validate
    from dnnperf.perfmodel.machine import preset
    from dnnperf.report.terminal import distributed_validation_table, measured_ms

    launched: list[str] = []
    # Per strategy, the median step of its 1st, 2nd and 3rd launch.
    medians = {"dp": [0.9, 0.5, 0.6], "pp": [0.4, 0.45, 0.8]}

    def fake_run(argv, env=None, **kwargs):
        strategy = argv[argv.index("--strategy") + 1]
        launched.append(strategy)
        median = medians[strategy][launched.count(strategy) - 1]
        document = {"record": {"points": [{"step_s": [median - 0.01, median, median + 0.02]}]}}
        return subprocess.CompletedProcess(argv, 0, json.dumps(document), "")

    monkeypatch.setattr(validate, "run_child", fake_run)
    frame = validate.validate_distributed(
        ["basic_cnn"], [8], ["dp", "pp"], "tiny", 3, preset("a100-ib"), processes=3
    ).set_index("strategy")
    assert launched == ["dp", "pp"] * 3
    assert frame.loc["dp", "measured_s"] == pytest.approx(0.6)
    assert (frame.loc["dp", "measured_min_s"], frame.loc["dp", "measured_max_s"]) == (0.5, 0.9)
    assert frame.loc["pp", "measured_s"] == pytest.approx(0.45)
    predicted = frame.loc["pp", "predicted_s"]
    assert frame.loc["pp", "error"] == pytest.approx(predicted / 0.45 - 1)
    assert measured_ms(frame.reset_index().iloc[0].to_dict()) == "600.0 (500.0-900.0)"
    assert measured_ms({"measured_s": 0.6, "measured_min_s": 0.6, "measured_max_s": 0.6}) == "600.0"
    distributed_validation_table(frame.reset_index(), validate.ranking_agrees(frame.reset_index()))


def test_distributed_rounds_predict_again_and_the_median_round_counts(monkeypatch) -> None:
    """Each round re-predicts every configuration inside its own replays (kernels.remeasured), and the
    row takes the round whose predicted step is the median, its parts with it."""
    import contextlib
    import subprocess
    from types import SimpleNamespace

    from dnnperf.perfmodel import predict as predict_module
    from dnnperf.perfmodel import validate
    from dnnperf.perfmodel.machine import preset

    steps = iter([0.42, 0.25, 0.40])  # rounds 1-3
    replays: list[str] = []

    def fake_predict(*args, **kwargs):
        step = next(steps)
        replays.append(f"predict {step}")
        return SimpleNamespace(step_s=step, compute_s=step / 2, communication_s=step / 4, bubble_s=0.0)

    @contextlib.contextmanager
    def fake_remeasured():
        replays.append("round")
        yield

    def fake_run(argv, env=None, **kwargs):
        document = {"record": {"points": [{"step_s": [0.5]}]}}
        return subprocess.CompletedProcess(argv, 0, json.dumps(document), "")

    monkeypatch.setattr(predict_module, "predict", fake_predict)
    monkeypatch.setattr(validate, "remeasured", fake_remeasured)
    monkeypatch.setattr(validate, "run_child", fake_run)
    machine = preset("a100-ib")
    frame = validate.validate_distributed(["basic_cnn"], [8], ["dp"], "tiny", 3, machine, processes=3)
    rounds = ["round", "predict 0.42", "round", "predict 0.25", "round", "predict 0.4"]
    assert replays == rounds  # no prediction outside a round
    row = frame.iloc[0]
    assert (row["predicted_s"], row["compute_s"], row["communication_s"]) == (0.40, 0.20, 0.10)
    assert row["error"] == pytest.approx(0.40 / 0.5 - 1)
    assert validate.median_prediction([SimpleNamespace(step_s=s) for s in (3, 1, 2, 4)]).step_s == 2


def test_a_strategy_that_cannot_apply_is_said_and_never_run(monkeypatch) -> None:
    """The first round's prediction refuses tp: its row gives the reason, no tp rank is launched and
    later rounds do not ask again; dp is predicted and run in every round."""
    import subprocess
    from types import SimpleNamespace

    from dnnperf.errors import UsageError
    from dnnperf.perfmodel import predict as predict_module
    from dnnperf.perfmodel import validate
    from dnnperf.perfmodel.machine import preset

    asked: list[str] = []
    launched: list[str] = []

    def fake_predict(name, machine, batch, strategy, **kwargs):
        asked.append(strategy)
        if strategy == "tp":
            raise UsageError("tp has no split here")
        return SimpleNamespace(step_s=0.4, compute_s=0.2, communication_s=0.1, bubble_s=0.0)

    def fake_run(argv, env=None, **kwargs):
        launched.append(argv[argv.index("--strategy") + 1])
        document = {"record": {"points": [{"step_s": [0.5]}]}}
        return subprocess.CompletedProcess(argv, 0, json.dumps(document), "")

    monkeypatch.setattr(predict_module, "predict", fake_predict)
    monkeypatch.setattr(validate, "run_child", fake_run)
    frame = validate.validate_distributed(
        ["basic_cnn"], [8], ["dp", "tp"], "tiny", 3, preset("a100-ib"), processes=3
    ).set_index("strategy")
    assert asked == ["dp", "tp", "dp", "dp"] and launched == ["dp"] * 3
    assert frame.loc["tp", "reason"] == "tp has no split here"
    assert frame.loc["dp", "predicted_s"] == 0.4


def test_link_mbit_bad_input_is_one_line(capsys: pytest.CaptureFixture) -> None:
    for args, needle in (
        (["basic_cnn", "--link-mbit", "100"], "add --distributed"),
        (["basic_cnn", "--distributed", "dp", "--link-mbit", "fast"], "positive rates in Mbit/s"),
        (["basic_cnn", "--distributed", "dp", "--link-mbit", "0"], "positive rates in Mbit/s"),
    ):
        assert main(["validate", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_a_calibrated_gpu_without_a_measured_link_predicts_one_device_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import dataclasses

    from dnnperf.cli import predict as command
    from dnnperf.perfmodel.machine import preset

    gpu = dataclasses.replace(
        preset("h100-ib"), devices_per_node=1, asynchronous=True, sources={"link": "default"}
    )
    monkeypatch.setattr(command, "load_machine", lambda spec, device, **asked: gpu)
    assert main(["predict", "basic_cnn", "--preset", "tiny", "--nodes", "2"]) == 2
    assert "measured no link between devices" in capsys.readouterr().err
    assert main(["predict", "basic_cnn", "--preset", "tiny", "-b", "4", "--json"]) == 0  # one device: fine


def test_the_drift_warning_follows_the_hosts_speed_against_its_profile(monkeypatch: pytest.MonkeyPatch):
    """A product injected at half the profile's rate is said, with its change; one 10% off is not
    (the threshold, DRIFT, is 15%); `dnnperf predict` passes the profile's rate at the probe's size
    from its machine's matmul curve."""
    from types import SimpleNamespace

    from dnnperf.calibration import speed as probe
    from dnnperf.cli import predict as command
    from dnnperf.perfmodel.machine import Curve

    now = {"flops": 50e9}
    monkeypatch.setattr(probe, "product_rate", lambda *a, **k: now["flops"])
    text = probe.drift_warning(100e9, "cpu", "2026-12-07T03:08")
    assert text is not None and "50 GFLOP/s now" in text and "100 when profiled" in text and "-50%" in text
    now["flops"] = 110e9
    assert probe.drift_warning(100e9, "cpu", "2026-12-07T03:08") is None
    said: list[str] = []
    machine = SimpleNamespace(compute_curves={"matmul": Curve((1e6, 1e12), (200e9, 200e9))})
    profile = SimpleNamespace(created="2026-12-07T03:08")
    command.warn_if_drifted(profile, machine, "cpu", SimpleNamespace(warn=said.append))
    assert len(said) == 1 and "-45%" in said[0]  # 110 against the curve's 200 GFLOP/s
