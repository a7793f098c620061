"""The command line as a user meets it: help, version, JSON discipline, and one-line errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import run_cli, run_cli_batch

import dnnperf

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

SUBCOMMANDS = ("list", "bench", "profile", "hw", "runs", "show")


def assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"dnnperf {dnnperf.__version__}"


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    """Every help and bad-input command line of this module, run in one fresh process."""
    home = tmp_path_factory.mktemp("batched")
    argvs = [[c, "--help"] for c in SUBCOMMANDS] + [list(args) for args, _ in BAD_INPUT]
    env = {"DNNPERF_RUNS_DIR": str(home / "runs"), "DNNPERF_DATA_DIR": str(home / "data")}
    env["DNNPERF_CACHE_DIR"] = str(home / "cache")
    return {tuple(r.args[1:]): r for r in run_cli_batch(argvs, env=env)}


def test_a_batch_sees_what_a_process_of_its_own_sees(batched):
    """The batch is a faithful stand-in: one bad input gives the same exit code and streams either way."""
    args = BAD_INPUT[0][0]
    alone = run_cli(*args)
    assert (batched[args].returncode, batched[args].stdout, batched[args].stderr) == (
        alone.returncode,
        alone.stdout,
        alone.stderr,
    )


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command, batched):
    result = batched[(command, "--help")]
    assert result.returncode == 0
    assert "usage: dnnperf " + command in result.stdout
    assert "--json" in result.stdout


def test_bench_json_is_a_single_document_and_nothing_else(isolated_dirs):
    result = run_cli("bench", "basic_cnn", "--steps", "3", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # the whole of stdout parses as one document
    record = document["record"]
    assert record["status"] == "complete"
    assert len(record["points"][0]["step_s"]) == 3
    assert len(record["points"][0]["warmup_s"]) == 1
    saved = json.loads(Path(document["record_path"]).read_text())
    assert saved["id"] == record["id"]
    assert os.path.dirname(document["record_path"]) == str(isolated_dirs["runs"])


def test_list_json_covers_the_suite():
    result = run_cli("list", "--preset", "tiny", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["workloads"]
    from dnnperf.workloads import all_workloads

    assert [r["name"] for r in rows] == [w.name for w in all_workloads()]
    for row in rows:
        assert row["presets"]["tiny"]["parameters"] > 0
        assert row["presets"]["tiny"]["train_flops_per_sample"] > 0, row["name"]


BAD_INPUT = [
    (("bench", "resnet5"), ("unknown workload 'resnet5'", "resnet50")),
    (("bench", "basic_cnn", "--batch-size", "0"), ("--batch-size", "positive integer")),
    (("bench", "basic_cnn", "--batch-size", "-3"), ("--batch-size", "positive integer")),
    (("bench", "basic_cnn", "--batch-size", "2.5"), ("--batch-size", "positive integer")),
    (("bench", "basic_cnn", "--sweep", "1,x,4"), ("--sweep",)),
    (("bench", "basic_cnn", "--preset", "huge"), ("unknown preset 'huge'", "tiny, small, full")),
    (("bench", "basic_cnn", "--device", "tpu"), ("device",)),
    (("bench", "a3c", "--data", "disk"), ("--data disk does not apply",)),
    (("show", "no-such-run"), ("no run 'no-such-run'",)),
    (("list", "--preset", "medium"), ("unknown preset 'medium'",)),
    (("show", "*"), ("no run",)),
    (("show", "/nonexistent/run.json"), ("no record file",)),
    (("show", ""), ("give a run id",)),
    (("bench", "basic_cnn", "--seed", str(2**64)), ("--seed",)),
    (("bench", "basic_cnn", "--device", "cpu:5"), ("no device index",)),
    (("bench", "basic_cnn", "--steps", "0"), ("--steps", "positive integer")),
    (("bench", "basic_cnn", "--sweep", "1,,2"), ("--sweep", "positive integers")),
    (("bench", "basic_cnn", "--sweep", "2,2"), ("--sweep", "repeated")),
    (("bench", "basic_cnn", "--runs-dir", ""), ("--runs-dir", "an empty path")),
    # Outputs are checked before any work: a directory where a file goes, a directory it cannot write in.
    (("report", "no-such-run", "-o", "/"), ("--output /", "is a directory")),
    (("report", "no-such-run", "-o", "/proc/report.html"), ("cannot write in /proc",)),
    (("export", "no-such-run", "--trace", "/"), ("--trace /", "is a directory")),
    (("export", "no-such-run", "--csv", "/proc/version/csv"), ("--csv", "/proc/version is not a directory")),
    (("hw", "--output", "/"), ("--output /", "is a directory")),
    (("reproduce", "tbd", "--size", "smoke", "--output", "/"), ("--output /", "is a directory")),
    (("profile", "basic_cnn", "--nproc", "2", "--save-params", "/"), ("--save-params /", "is a directory")),
    (("predict", "basic_cnn", "--machine", "a100-ib", "--device", "bogus"), ("unknown device 'bogus'",)),
    (("predict", "basic_cnn", "--sweep", "nodes=1,2", "--sweep", "nodes=4"), ("nodes is given twice",)),
    (("predict", "basic_cnn", "--sweep", "nodes=2,2"), ("--sweep nodes", "repeated")),
    # An option that only another makes meaningful is refused, not ignored.
    (("profile", "basic_cnn", "--microbatches", "4", "--link-mbit", "100"), ("--microbatches, --link-mbit",)),
    (("profile", "basic_cnn", "--hw", "hw.json"), ("--hw", "add --layers")),
    (("bench", "basic_cnn", "--workers", "2"), ("--workers and --data-dir apply to --data disk",)),
    (("hw", "--show", "--quick"), ("--show calibrates nothing",)),
    (("predict", "basic_cnn", "--machine", "a100-ib", "--strategy", "dp", "--schedule", "gpipe"), ("pp's",)),
    (
        ("predict", "basic_cnn", "--machine", "a100-ib", "--strategy", "dp", "--no-reshard-after-forward"),
        ("--reshard-after-forward is fsdp's",),
    ),
    (
        ("validate", "basic_cnn", "--distributed", "dp", "--reshard-after-forward"),
        ("add --distributed fsdp",),
    ),
]


@pytest.mark.parametrize(("args", "needles"), BAD_INPUT)
def test_bad_input_is_one_line_and_exit_code_2(args, needles, batched):
    assert_one_line_error(batched[args], *needles)


def test_cuda_without_a_gpu_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_one_line_error(run_cli("bench", "basic_cnn", "--device", "cuda"), "no CUDA GPU")


def test_unwritable_runs_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("bench", "basic_cnn", "--runs-dir", str(blocker / "runs"))
    assert_one_line_error(result, "not writable")


def test_file_paths_where_directories_belong(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(run_cli("runs", "--runs-dir", str(blocker)), "not a directory")
    result = run_cli("bench", "basic_cnn", "--data", "disk", "--data-dir", str(blocker))
    assert_one_line_error(result, "not a directory")


def test_runs_lists_records_and_skips_corrupt_ones(isolated_dirs):
    # one measured step: its spread is undefined (NaN), which must still give valid JSON
    assert run_cli("bench", "basic_cnn", "--steps", "1", "--warmup", "0", "-q").returncode == 0
    (isolated_dirs["runs"] / "broken.json").write_text("{not json")
    result = run_cli("runs", "--json")
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert [r["workload"] for r in document["runs"]] == ["basic_cnn"]
    assert document["runs"][0]["points"][0]["step_time_s"]["std"] is None
    assert document["skipped"][0]["path"].endswith("broken.json")
    assert "skipped broken.json" in result.stderr and "Traceback" not in result.stderr
    table = run_cli("runs")
    assert table.returncode == 0 and "basic_cnn" in table.stdout


def test_sigint_keeps_a_valid_partial_record(isolated_dirs):
    runs = isolated_dirs["runs"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dnnperf",
            "bench",
            "basic_cnn",
            "--steps",
            "100000",
            "--warmup",
            "1",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen = torn = 0
    try:
        deadline = time.monotonic() + 120
        while seen < 3 and time.monotonic() < deadline:  # wait for a checkpoint holding >= 3 steps
            time.sleep(0.2)
            for path in runs.glob("*.json"):
                try:
                    seen = len(json.loads(path.read_text())["points"][0]["step_s"])
                except ValueError:  # a torn file: must never happen, writes are atomic
                    torn += 1
                except (KeyError, IndexError):  # the first save, before the first point exists
                    pass
        assert seen >= 3, "no checkpoint with measured steps appeared"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert torn == 0
    assert "partial" in stderr and "Traceback" not in stderr
    printed = json.loads(stdout)["record"]  # --json still prints the partial record
    assert printed["status"] == "partial" and len(printed["points"][0]["step_s"]) >= seen
    [path] = list(runs.glob("*.json"))
    from dnnperf.results.store import read_record

    record = read_record(path)
    assert record.status == "partial"
    assert record.points[0].status == "partial"
    assert len(record.points[0].step_s) >= seen
    assert record.finished is not None


def test_hw_quick_calibrates_saves_and_shows(tmp_path):
    profile_path = tmp_path / "hw.json"
    result = run_cli("hw", "--quick", "--output", str(profile_path), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["profile_path"] == str(profile_path) and profile_path.is_file()
    shown = run_cli("hw", "--show", "--output", str(profile_path))
    assert shown.returncode == 0 and "peak matmul float32" in shown.stdout
    background = document["profile"]["background_cores"]
    assert f"{background:.2f} cores" in " ".join(shown.stdout.split())


def test_hw_show_without_a_profile_is_a_usage_error(tmp_path):
    assert_one_line_error(
        run_cli("hw", "--show", "--output", str(tmp_path / "none.json")), "no saved hardware"
    )


def test_a_record_with_nothing_measured_says_so_and_exports_nothing(tmp_path, capsys):
    """A failed run's record (no point): show says so in one line (before: nothing at all); export
    refuses to write an empty trace or CSV directory, and writes neither. A validate record (its rows
    and no point) shows measured beside predicted (before: nothing at all)."""
    from dnnperf.cli import main
    from dnnperf.results.record import RunRecord
    from dnnperf.results.store import RunStore
    from dnnperf.results.validation import ValidationResult

    def record(**fields):
        base = {"workload": {"name": "basic_cnn", "preset": "tiny"}, "environment": {}, "points": []}
        settings = {"device": "cpu", "data": "memory"}
        return RunStore(tmp_path / "runs").save(RunRecord(settings=settings, **base, **fields))

    failed = record(id="r-failed", kind="bench", status="failed", error="boom")
    assert main(["show", str(failed)]) == 0
    assert capsys.readouterr().out.strip() == "r-failed: bench of basic_cnn, failed, no measured point: boom"
    trace, csv = tmp_path / "t.json", tmp_path / "csv"
    assert main(["export", str(failed), "--trace", str(trace), "--csv", str(csv)]) == 2
    assert "has no measured step to trace" in capsys.readouterr().err
    assert main(["export", str(failed), "--csv", str(csv)]) == 2
    assert "has no stages or layers" in capsys.readouterr().err
    assert not trace.exists() and not csv.exists()
    row = {"workload": "basic_cnn", "batch": 2, "strategy": "single"}
    row.update(measured_s=2e-3, predicted_s=1.5e-3)
    result = ValidationResult(runs=[row])
    validated = record(id="r-valid", kind="validate", status="complete", validation=result)
    assert main(["show", str(validated)]) == 0
    shown = capsys.readouterr().out
    assert "step time, measured vs predicted (1 rows)" in shown
    assert all(cell in shown for cell in ("basic_cnn", "single", "2.0", "1.5", "-25.0%"))


def test_tables_written_to_a_pipe_take_columns_from_the_environment(monkeypatch) -> None:
    """Off a terminal (pytest captures stdout) rich would assume 80 columns: 140, or $COLUMNS where it
    asks for more (pytest-xdist's workers have COLUMNS=80)."""
    from dnnperf.cli.output import Output

    for columns, width in ((None, 140), ("220", 220), ("80", 140), ("wide", 140)):
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", columns)
        assert Output(json_mode=False, quiet=False).stdout.width == width, columns
