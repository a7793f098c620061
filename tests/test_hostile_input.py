"""Hostile input to records and the command line: refused in one line with exit code 2 (or shown as
plain text), never a traceback, an internal error, a numpy warning or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import cli_env, run_cli
from dnnperf.cli import main
from dnnperf.results.record import RecordError, RunRecord
from dnnperf.results.store import RunStore
from dnnperf.stats import Samples

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

HUGE = "1" + "0" * 400  # an integer no float holds, spliced into the JSON text

MEMSAVE = {
    "budget": 1000,
    "budget_text": "50%",
    "baseline_peak": 2000,
    "feasible": False,
    "reason": "infeasible: the smallest predicted peak is 1,500 bytes",
    "plan": {"policies": {}, "segments": [], "min_bytes": 0, "prefetch_bytes": 0, "training_state": "keep"},
    "plan_table": [
        {"unit": "conv1", "policy": "keep", "saved_bytes": 0, "forward_s": 0.001, "predicted_cost_s": 0.0}
    ],
    "variants": [
        {
            "name": "none",
            "peak": 2000,
            "step_s": [0.010, 0.011],
            "plain_s": [0.010, 0.012],
            "overhead": 0.0,
            "bytes_written": 0,
            "predicted_peak": None,
            "predicted_overhead": None,
            "timeline": [[0.0, 100.0], [0.001, 2000.0]],
        }
    ],
    "offload_s_per_byte": 1e-9,
    "bandwidth": {},
}


def document(kind: str = "bench", **workload) -> dict:
    """A valid record document of ``kind`` with three measured steps of 0.1, 0.2 and 0.4 s."""
    doc = {
        "schema": "dnnperf.run",
        "schema_version": 1,
        "id": f"r-{kind}",
        "kind": kind,
        "status": "complete",
        "created": "2026-11-27T05:00:00+00:00",
        "workload": {"name": "basic_cnn", "preset": "tiny", "parameters": 20922} | workload,
        "settings": {"device": "cpu", "data": "memory", "steps": 3, "warmup": 1},
        "environment": {"machine": {"cores_usable": 2, "memory_bytes": 2**34}, "software": {}},
        "points": [{"batch_size": 4, "status": "complete", "warmup_s": [0.5], "step_s": [0.1, 0.2, 0.4]}],
    }
    if kind == "memsave":
        doc["memsave"] = json.loads(json.dumps(MEMSAVE))
        doc["points"][0]["step_s"] = [0.01, 0.012, 0.011]
    return doc


def write(path: Path, doc: dict, huge_at: str | None = None) -> Path:
    """Write ``doc``; ``huge_at``: a value to replace (as JSON text) with the 401-digit integer."""
    text = json.dumps(doc)
    if huge_at is not None:
        assert huge_at in text
        text = text.replace(huge_at, HUGE, 1)
    path.write_text(text)
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused(code: int, out: str, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


# 1 and 8: numbers that do not fit, or are of the wrong type or range, in any section of the record

BAD_FIELDS = [
    ("huge batch size", "bench", ("points", 0, "batch_size"), "HUGE", "points[0].batch_size"),
    ("NaN steps setting", "bench", ("settings", "steps"), float("nan"), "settings.steps"),
    ("fractional steps", "bench", ("settings", "steps"), 2.5, "settings.steps"),
    ("infinite memory", "bench", ("environment", "machine", "memory_bytes"), float("inf"), "memory_bytes"),
    ("negative cores", "bench", ("environment", "machine", "cores_usable"), -3, "cores_usable"),
    ("parameters as text", "bench", ("workload", "parameters"), "12", "workload.parameters"),
    ("huge step", "bench", ("points", 0, "step_s"), [1e308, 1e308, 1e308], "points[0].step_s"),
    ("negative warm-up", "bench", ("points", 0, "warmup_s"), [-1.0], "points[0].warmup_s"),
    ("pid as text", "bench", ("pid",), "123", "pid"),
    ("machine not an object", "bench", ("environment", "machine"), None, "environment.machine"),
    ("huge budget", "memsave", ("memsave", "budget"), "HUGE", "memsave.budget"),
    ("peak as text", "memsave", ("memsave", "variants", 0, "peak"), "2000", "memsave.variants[0].peak"),
    ("negative written", "memsave", ("memsave", "variants", 0, "bytes_written"), -1, "bytes_written"),
    ("name a number", "memsave", ("memsave", "plan_table", 0, "unit"), 7, "memsave.plan_table[0].unit"),
]


def mutated(kind: str, path: tuple, value) -> tuple[dict, str | None]:
    doc = document(kind)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value == "HUGE":
        target[path[-1]] = "__HUGE__"
        return doc, '"__HUGE__"'
    target[path[-1]] = value
    return doc, None


@pytest.mark.parametrize(
    ("kind", "path", "value", "field"), [c[1:] for c in BAD_FIELDS], ids=[c[0] for c in BAD_FIELDS]
)
def test_a_bad_number_is_refused_naming_the_file_and_field(tmp_path, capsys, kind, path, value, field):
    doc, huge_at = mutated(kind, path, value)
    record = write(tmp_path / "bad.json", doc, huge_at)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warning on the way to the refusal
        for command in (["show"], ["report"], ["compare", str(record)]):
            code, out, err = cli(capsys, command[0], str(record), *command[1:])
            assert_refused(code, out, err, str(record), field)
            assert len(err) < 400  # a 401-digit integer is described, not echoed


def test_the_valid_documents_the_refusals_start_from_are_read(tmp_path):
    for kind in ("bench", "memsave"):
        assert RunRecord.from_dict(document(kind)).kind == kind


def test_a_record_of_a_real_run_passes_every_check(tmp_path):
    """The checks describe what dnnperf writes: a profile with stages, layers and memory is read back."""
    import torch

    from dnnperf.runner import BenchSettings, bench

    torch.set_num_threads(1)
    settings = BenchSettings(
        "basic_cnn", preset="tiny", batch_sizes=(2,), steps=2, warmup=1, stages=True, layers=True, memory=True
    )
    record = bench(settings, RunStore(tmp_path))
    again = RunStore(tmp_path).load(record.id)
    assert again.points[0].memory is not None and again.points[0].layers is not None


#: ``settings.distributed`` as a 2-rank fsdp run over a shaped link writes it (distributed/worker.py),
#: with pp's and dp's own settings beside (each present only for its strategy; checked all the same).
DISTRIBUTED = {
    "strategy": "fsdp",
    "world_size": 2,
    "backend": "gloo",
    "batch": "global",
    "rank_threads": 1,
    "timeout_s": 300.0,
    "bucket_cap_mb": None,
    "reshard_after_forward": True,
    "mixed_precision": "bf16",
    "schedule": "1f1b",
    "microbatches": 4,
    "netns": {"link_mbit": 100.0, "link_delay_ms": 0.0},
}

BAD_DISTRIBUTED = [
    ("strategy", "zero9"),
    ("world_size", 0),
    ("backend", 7),
    ("batch", "local"),
    ("rank_threads", 1.5),
    ("timeout_s", -1.0),
    ("bucket_cap_mb", 0),
    ("reshard_after_forward", "yes"),
    ("mixed_precision", "fp8"),
    ("schedule", "interleaved"),
    ("microbatches", -4),
    ("netns", "veth"),
    ("netns.link_mbit", 0.0),
    ("netns.link_delay_ms", -2.0),
]


@pytest.mark.parametrize(("field", "value"), BAD_DISTRIBUTED, ids=[f for f, _ in BAD_DISTRIBUTED])
def test_a_bad_distributed_setting_is_refused_naming_it(tmp_path, capsys, field, value):
    doc = document()
    doc["settings"]["distributed"] = json.loads(json.dumps(DISTRIBUTED))
    *outer, last = ["settings", "distributed", *field.split(".")]
    target = doc
    for key in outer:
        target = target[key]
    target[last] = value
    record = write(tmp_path / "bad.json", doc)
    for command in ("show", "report"):
        code, out, err = cli(capsys, command, str(record))
        assert_refused(code, out, err, str(record), f"settings.distributed.{field} is {value!r}")


def test_the_distributed_settings_every_strategy_writes_are_read(tmp_path, capsys):
    """The valid block, null where null is allowed, and each strategy and schedule dnnperf has."""
    from dnnperf.distributed import SCHEDULES, STRATEGIES
    from dnnperf.results.fields import DISTRIBUTED_STRATEGIES, PIPELINE_SCHEDULES

    assert (DISTRIBUTED_STRATEGIES, PIPELINE_SCHEDULES) == (STRATEGIES, SCHEDULES)
    for strategy, schedule in zip(STRATEGIES, [*SCHEDULES, *SCHEDULES, SCHEDULES[0]], strict=True):
        doc = document()
        doc["settings"]["distributed"] = {
            **DISTRIBUTED,
            "strategy": strategy,
            "schedule": schedule,
            "mixed_precision": None,
            "netns": None,
        }
        assert RunRecord.from_dict(doc).settings["distributed"]["strategy"] == strategy


def test_runs_skips_and_names_a_record_with_a_huge_integer_and_lists_the_rest(tmp_path, capsys):
    write(tmp_path / "good.json", document())
    doc, huge_at = mutated("bench", ("points", 0, "batch_size"), "HUGE")
    write(tmp_path / "huge.json", doc, huge_at)
    code, out, err = cli(capsys, "runs", "--runs-dir", str(tmp_path))
    assert code == 0, err
    assert "r-bench" in out
    assert "skipped huge.json" in err and "points[0].batch_size" in err
    code, out, err = cli(capsys, "runs", "--runs-dir", str(tmp_path), "--json")
    listed = json.loads(out)
    assert [r["id"] for r in listed["runs"]] == ["r-bench"]
    assert [Path(s["path"]).name for s in listed["skipped"]] == ["huge.json"]


def test_statistics_of_huge_values_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = Samples.of([1e308, 1e308, 1e308]).summary()
    assert summary["n"] == 3 and summary["median"] == 1e308


# 2 and the strings of a record: shown as they are, never read as markup, escapes or a page of text

MARKUP = "[/bold][red]x"


def test_markup_in_stored_names_is_shown_as_text(tmp_path, capsys):
    doc = document("memsave", name=MARKUP)
    doc["memsave"]["reason"] = "[/red]infeasible"
    doc["memsave"]["plan_table"][0]["unit"] = "[/i]conv1"
    doc["settings"]["device"] = "[bold]cpu"
    record = write(tmp_path / "markup.json", doc)
    code, out, err = cli(capsys, "show", str(record))
    assert code == 0, err
    for text in (MARKUP, "[/red]infeasible", "[/i]conv1", "[bold]cpu"):
        assert text in out
    code, out, err = cli(capsys, "runs", "--runs-dir", str(tmp_path))
    assert code == 0, err
    assert MARKUP in out


def test_control_characters_and_long_names_do_not_reach_the_terminal(tmp_path, capsys):
    doc = document(name="\x1b[2J\x1b[31mred\x07" + "x" * 100_000)
    record = write(tmp_path / "escapes.json", doc)
    for argv in (["show", str(record)], ["runs", "--runs-dir", str(tmp_path)]):
        code, out, err = cli(capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in out and "\x07" not in out
        assert "red" in out
        assert "x" * 1000 not in out  # cut, not a page of x's


# 3: only regular files are read


def test_a_fifo_in_the_runs_directory_is_skipped_not_waited_on(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write(runs / "good.json", document())
    os.mkfifo(runs / "pipe.json")
    result = run_cli("runs", "--runs-dir", str(runs), timeout=120)  # a hang fails here, not forever
    assert result.returncode == 0, result.stderr
    assert "r-bench" in result.stdout
    assert "skipped pipe.json" in result.stderr and "not a regular file" in result.stderr


def test_show_of_a_fifo_is_refused_in_one_line(tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe.json")
    assert_refused(*cli(capsys, "show", str(tmp_path / "pipe.json")), "pipe.json")


# 6 and 11: Ctrl-C and SIGTERM while the command line starts up

INTERRUPTED_IMPORT = """
import importlib.abc, os, signal, sys
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == sys.argv[1]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        return None
sys.meta_path.insert(0, Interrupt())
from dnnperf.cli import main  # as the console script does
sys.exit(main(["list"]))
"""


@pytest.mark.parametrize("module", ["rich", "numpy", "torch"])
@pytest.mark.parametrize(("signame", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_signal_while_importing_prints_one_line(module, signame, code):
    """The signal arrives exactly when ``module`` is first imported (a finder sends it), so the test
    does not depend on how long the import takes."""
    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, module, signame],
        capture_output=True,
        text=True,
        env=cli_env(None),
        timeout=240,
    )
    assert result.returncode == code, result.stderr
    assert result.stderr.strip().splitlines() == ["dnnperf: interrupted"], result.stderr
    assert result.stdout == ""


def test_package_names_stay_importable():
    import dnnperf

    assert callable(dnnperf.bench) and dnnperf.RunStore is RunStore
    from dnnperf import BenchSettings, Samples  # noqa: F401

    assert set(dnnperf.__all__) <= set(dir(dnnperf))
    with pytest.raises(AttributeError):
        dnnperf.no_such_name  # noqa: B018


# 9 and 11: runs directories that are not one


def test_a_missing_runs_directory_given_is_named(tmp_path, capsys):
    missing = tmp_path / "typo"
    for argv in (["runs"], ["show", "some-id"], ["compare", "a", "b"]):
        assert_refused(*cli(capsys, *argv, "--runs-dir", str(missing)), str(missing), "no such directory")


def test_a_runs_directory_nothing_can_be_written_in_says_so(capsys):
    code, out, err = cli(capsys, "bench", "basic_cnn", "--runs-dir", "/proc/self", "--steps", "1")
    assert_refused(code, out, err, "/proc/self", "is not writable: cannot make a file in it")


# 10: runs of different kinds


def test_compare_of_a_bench_and_a_memsave_run_is_refused_naming_both_kinds(tmp_path, capsys):
    bench_run = write(tmp_path / "bench.json", document("bench"))
    memsave_run = write(tmp_path / "memsave.json", document("memsave"))
    assert_refused(*cli(capsys, "compare", str(bench_run), str(memsave_run)), "bench", "memsave")


def test_compare_of_a_bench_and_a_profile_run_compares(tmp_path, capsys):
    bench_run = write(tmp_path / "bench.json", document("bench"))
    profile_run = write(tmp_path / "profile.json", document("profile"))
    code, out, err = cli(capsys, "compare", str(bench_run), str(profile_run), "--json")
    assert code == 0, err
    assert json.loads(out)["rows"][0]["name"] == "step"


# 11: echoed input is cut


def test_a_huge_argument_is_not_echoed_in_full(capsys):
    name = "a" * 100_000
    code, out, err = cli(capsys, "bench", name)
    assert_refused(code, out, err, "unknown workload", "…")
    assert len(err) < 1000
    with pytest.raises(SystemExit) as stop:  # argparse's own errors too
        main(["bench", "basic_cnn", "--steps", "9" * 100_000 + "x"])
    assert stop.value.code == 2
    assert len(capsys.readouterr().err) < 1000


def test_a_record_error_is_a_record_error():
    with pytest.raises(RecordError, match="points"):
        RunRecord.from_dict(document() | {"points": [{"batch_size": True, "status": "complete"}]})


def test_a_reproduction_table_shows_its_verdict_styled_and_its_sentences_whole():
    """dnnperf's own sentences are not cut like stored names, and its styling is not shown as text."""
    from rich.console import Console

    from dnnperf.report.terminal import reproduction_table
    from dnnperf.reproduce.base import Claim, Reproduction

    long = "measured " + " ".join(f"figure{i}" for i in range(40)) + " END"
    claim = Claim("a [bold]claim[/bold]", long, "holds", "because " + long, ["dnnperf bench x"])
    table = reproduction_table(Reproduction("k", "000", "t", "smoke", claims=[claim]))
    console = Console(width=400, record=True, color_system="truecolor", force_terminal=True)
    console.print(table)
    text = console.export_text(clear=False)
    assert "[green]" not in text and "holds: because measured" in text
    assert text.count("END") == 2 and "a [bold]claim[/bold]" in text  # whole, and markup literal
    assert "\x1b[32m" in console.export_text(styles=True)  # the verdict is green
