"""`dnnperf reproduce` at its smallest size, end to end through the CLI: every claim is filled from
the runs it made (figures in the text, a verdict, the commands that produced them, which made records),
and the markdown summary is written section by section."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from conftest import run_cli
from dnnperf.reproduce import PAPERS, PENDING, Reproduction, render_markdown, update_document
from dnnperf.reproduce.base import Claim
from dnnperf.results.store import RunStore

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


@pytest.mark.slow
# Every paper's commands in fresh processes: about 2 minutes on 2 idle cores, past 5 with a busy loop
# and other jobs beside it. The timeout is there to catch a hang, not to time the run.
@pytest.mark.timeout(1200)
def test_every_paper_reproduces_at_smoke_size(tmp_path):
    # Two lanes at once (the suite's time on 2 cores): the parallelism paper (its 2-rank validation is
    # most of its time) beside the other four in turn, each lane with its summary and runs directory.
    lanes = {"a": ["parallelism"], "b": [key for key in PAPERS if key != "parallelism"]}
    outputs = {lane: tmp_path / f"reproductions-{lane}.md" for lane in lanes}
    runs_dirs = {lane: tmp_path / f"runs-{lane}" for lane in lanes}

    def argv(lane: str, key: str) -> list[str]:
        return ["reproduce", key, "--size", "smoke", "--output", str(outputs[lane]),
                "--runs-dir", str(runs_dirs[lane]), "--json"]  # fmt: skip

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out, err = tmp_path / "a.out", tmp_path / "a.err"  # files, not pipes: nothing waits on a full pipe
    with out.open("w") as stdout, err.open("w") as stderr:
        beside = subprocess.Popen(
            [sys.executable, "-m", "dnnperf", *argv("a", "parallelism")],
            stdout=stdout,
            stderr=stderr,
            env=env,
        )
        try:
            documents = []
            for key in lanes["b"]:
                done = run_cli(*argv("b", key), timeout=600)
                assert done.returncode == 0, done.stderr
                documents.append(json.loads(done.stdout))
            beside.wait(timeout=600)
        finally:
            if beside.poll() is None:
                beside.kill()
                beside.wait()
    assert beside.returncode == 0, err.read_text()
    documents.append(json.loads(out.read_text()))
    reproductions = {r["paper"]: r for d in documents for r in d["reproductions"]}
    lane_of = {key: lane for lane, keys in lanes.items() for key in keys}
    assert set(reproductions) == set(PAPERS)
    records = []
    for runs in runs_dirs.values():
        found, skipped = RunStore(runs).scan()
        assert found and not skipped
        records += found
    # The parallelism paper's 2-rank validation (`validate --distributed dp`, read back from its JSON)
    # kept its runs: dp on two ranks, measured and predicted.
    (validation,) = [r for r in records if r.kind == "validate"]
    assert validation.validation is not None and validation.validation.runs
    for run in validation.validation.runs:
        assert run["strategy"] == "dp" and run["measured_s"] > 0 and run["predicted_s"] > 0
    ran = {" ".join(r.command) for r in records}
    texts = {lane: path.read_text() for lane, path in outputs.items()}
    for key, reproduction in reproductions.items():
        text = texts[lane_of[key]]
        assert reproduction["claims"], key
        for claim in reproduction["claims"]:
            assert claim["verdict"] in ("holds", "differs")
            assert re.search(r"\d", claim["measured"]), claim  # figures, not words alone
            assert claim["why"] and claim["commands"]
            for command in claim["commands"]:
                assert re.match(r"(\w+=\S+ )*dnnperf ", command), command  # env settings, then dnnperf
                if command.startswith("dnnperf profile"):  # each profile command left its record
                    assert any(r.startswith(command) for r in ran), command
        for table in reproduction["tables"].values():
            assert table  # rows measured
        assert f"<!-- paper:{key} -->" in text
    # What it printed is what the summary says: every claim's measurement is in the markdown.
    for key, reproduction in reproductions.items():
        for claim in reproduction["claims"]:
            assert claim["measured"].replace("|", "\\|") in texts[lane_of[key]]


def _reproduction(key: str, measured: str) -> Reproduction:
    reproduction = Reproduction(key, "999", f"paper {key}", "smoke")
    reproduction.claims = [Claim("a claim", measured, "holds", "because", ["dnnperf list"])]
    reproduction.tables = [("numbers", pd.DataFrame({"a": [1.5], "b": ["x|y"]}))]
    return reproduction


def test_a_paper_section_is_replaced_and_the_others_are_kept(tmp_path):
    path = tmp_path / "r.md"
    update_document(path, [_reproduction("one", "first 1"), _reproduction("two", "second 2")])
    update_document(path, [_reproduction("one", "again 3")])
    text = path.read_text()
    assert "again 3" in text and "first 1" not in text and "second 2" in text
    assert text.count("<!-- paper:one -->") == 1
    assert ("Not reproduced yet" in text) == bool(PENDING)  # said only while a paper is pending
    assert "x\\|y" in render_markdown(_reproduction("one", "1")) or "x|y" in render_markdown(
        _reproduction("one", "1")
    )


def test_an_unknown_or_pending_paper_is_a_one_line_error(tmp_path):
    for name, words in (("nope", "unknown paper"), ("999", "unknown paper")):
        done = run_cli("reproduce", name, "--output", str(tmp_path / "r.md"))
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1
