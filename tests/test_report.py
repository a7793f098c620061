"""The HTML report against the record it shows: every section with data is drawn (and none without),
the figures in its tables are the record's raw samples, user names are escaped, no URL anywhere."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli
from dnnperf import calibration
from dnnperf.report import html as report
from dnnperf.results.record import RunRecord
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, bench

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

EVIL = "<script>alert(1)</script>"


def profile_record(root: Path, **settings) -> RunRecord:
    """A real profile of resnet18 tiny at two batch sizes, one thread, few steps."""
    torch.set_num_threads(1)
    defaults = dict(preset="tiny", batch_sizes=(2, 4), steps=3, warmup=1, stages=True)
    return bench(BenchSettings("resnet18", **(defaults | settings)), RunStore(root))


def full_profile(root: Path) -> RunRecord:
    """Stages, layers (against a quick calibration of this machine) and memory, in a cache of its own."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DNNPERF_CACHE_DIR", str(root / "cache"))
        calibrated = calibration.calibrate("cpu", quick=True)
        return profile_record(root / "runs", layers=True, memory=True, hardware=calibrated.to_dict())


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> RunRecord:
    return full_profile(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def page(full) -> str:
    return report.render(full)


class Cells(HTMLParser):
    """Every table as rows of (text, data-v) cells, and every section id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, str | None]]]] = []
        self.sections: list[str] = []
        self._cell: list | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs["id"])
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ["", attrs.get("data-v")]

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(tuple(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0] += data


def parse(page: str) -> Cells:
    cells = Cells()
    cells.feed(page)
    return cells


def rows_of(table: list[list[tuple[str, str | None]]]) -> list[dict[str, tuple[str, str | None]]]:
    head = [text for text, _ in table[0]]
    return [dict(zip(head, row, strict=True)) for row in table[1:]]


def find_table(cells: Cells, *headings: str) -> list[dict]:
    for table in cells.tables:
        if all(h in [text for text, _ in table[0]] for h in headings):
            return rows_of(table)
    raise AssertionError(f"no table with {headings}")


def test_every_section_with_data_is_drawn(full, page):
    cells = parse(page)
    assert cells.sections == ["summary", "stages", "layers", "roofline", "memory", "memory-scaling"]
    # stages 1, per batch size: top layers 1 + roofline 1 + timeline 1; memory bars 1; scaling 1
    assert page.count('<figure class="chart"><svg') == 1 + 3 * len(full.points) + 1 + 1


def test_sections_without_data_are_left_out(tmp_path):
    stages_only = profile_record(tmp_path, batch_sizes=(2,), steps=2)
    assert parse(report.render(stages_only)).sections == ["summary", "stages"]
    plain = profile_record(tmp_path, batch_sizes=(2,), steps=2, stages=False)
    assert parse(report.render(plain)).sections == ["summary"]


def test_stage_and_layer_figures_are_the_records_samples(full, page):
    cells = parse(page)
    stages = find_table(cells, "stage", "median ms")
    assert len(stages) == sum(len(p.stages.steps) for p in full.points)
    for row in stages:
        point = next(p for p in full.points if p.batch_size == int(row["batch"][0]))
        raw = point.stages.steps[row["stage"][0]]
        assert float(row["median ms"][1]) == pytest.approx(np.median(raw), rel=1e-12)
        assert float(row["p90 ms"][1]) == pytest.approx(np.percentile(raw, 90), rel=1e-12)
    summary = find_table(cells, "step ms (median)")
    assert [float(r["step ms (median)"][1]) for r in summary] == [
        pytest.approx(np.median(p.step_s)) for p in full.points
    ]
    # The per-layer tables, in batch-size order: each (layer, phase) median of its layer-timed steps.
    layer_tables = [
        rows_of(t) for t in cells.tables if [x for x, _ in t[0]][:3] == ["layer", "type", "phase"]
    ]
    assert len(layer_tables) == len(full.points)
    for point, rows in zip(full.points, layer_tables, strict=True):
        seconds = point.layers.layer_seconds
        timed = {(m, p) for m, phases in seconds.items() for p in phases if p in ("forward", "backward")}
        assert timed <= {(r["layer"][0], r["phase"][0]) for r in rows}
        for row in rows:  # a row with operators but no layer-timed time (work between layers) has 0
            module, phase = row["layer"][0], row["phase"][0]
            truth = np.median(seconds[module][phase]) if (module, phase) in timed else 0.0
            assert float(row["ms"][1]) == pytest.approx(truth, rel=1e-12, abs=1e-15)


def test_memory_figures_are_the_records_bytes(full, page):
    cells = parse(page)
    rows = find_table(cells, "activations", "measured peak")
    for row, point in zip(rows, full.points, strict=True):
        assert int(row["batch"][0]) == point.batch_size
        assert float(row["activations"][1]) == point.memory.peak["activations"]
        assert float(row["measured peak"][1]) == point.memory.measured_peak
    fit = {r["data structure"][0]: r for r in find_table(cells, "per sample", "fixed")}
    # Two batch sizes: the fitted line passes through both peaks.
    (b1, p1), (b2, p2) = [
        (p.batch_size, p.memory.measured_peak or p.memory.tracked_peak) for p in full.points
    ]
    assert float(fit["peak"]["per sample"][1]) == pytest.approx((p2 - p1) / (b2 - b1), abs=0.1)


def test_the_page_names_no_url(page):
    assert not re.search(
        r"https?:|ftp:|//[\w.-]+\.\w|\bsrc=|@import|url\((?!#)", page.replace("http-equiv", "")
    )
    assert not re.search(r'href="(?!#)', page)  # only in-page anchors and references


def _renamed(record: RunRecord, old: str, new: str) -> RunRecord:
    """The record with a module renamed everywhere a module name appears (as a user could name one)."""
    document = record.to_dict()
    for point in document["points"]:
        layers, memory = point["layers"], point["memory"]
        layers["modules"] = {(new if k == old else k): v for k, v in layers["modules"].items()}
        layers["layer_seconds"] = {(new if k == old else k): v for k, v in layers["layer_seconds"].items()}
        for op in layers["ops"]:
            op["module"] = new if op["module"] == old else op["module"]
        memory["layers"] = {(new if k == old else k): v for k, v in memory["layers"].items()}
        memory["peak_module"] = new
    document["workload"]["name"] = new
    document["command"] = ["dnnperf", "profile", new]
    return RunRecord.from_dict(json.loads(json.dumps(document)))


def test_user_names_are_escaped(full):
    slowest = max(full.points[0].layers.layer_seconds, key=lambda m: np.median(
        full.points[0].layers.layer_seconds[m].get("forward", [0])))  # fmt: skip
    page = report.render(_renamed(full, slowest, EVIL))
    assert EVIL not in page
    assert page.count("<script") == 2  # the page's own two scripts
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # title, tables, bars, memory
    cells = parse(page)
    names = [r["layer"][0] for r in find_table(cells, "layer", "type", "phase")]
    assert EVIL in names  # shown as the text it is


def test_cli_profile_and_report_write_the_report(tmp_path):
    result = run_cli("profile", "basic_cnn", "--steps", "2", "--warmup", "0", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    record_path, written = Path(document["record_path"]), Path(document["report_path"])
    assert written == record_path.with_suffix(".html")
    assert parse(written.read_text()).sections == ["summary", "stages"]
    assert document["record"]["id"] in written.read_text()
    result = run_cli("report", str(record_path), "-o", str(tmp_path / "again.html"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["report_path"] == str(tmp_path / "again.html")
    assert (tmp_path / "again.html").read_text().count("<section") == 2
    result = run_cli("report", str(record_path), "-o", str(tmp_path / "missing" / "r.html"))
    assert result.returncode == 2 and "no directory" in result.stderr and "Traceback" not in result.stderr
    plain = run_cli("profile", "basic_cnn", "--steps", "1", "--warmup", "0", "--no-report", "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout)["report_path"] is None


@pytest.mark.slow
def test_resnet50_small_full_profile_report_is_under_5_mb(tmp_path):
    record = bench(
        BenchSettings(
            "resnet50",
            preset="small",
            batch_sizes=(2, 4),
            steps=2,
            warmup=1,
            stages=True,
            layers=True,
            memory=True,
            hardware=calibration.calibrate("cpu", quick=True).to_dict(),
        ),
        RunStore(tmp_path),
    )
    path = report.write_report(record, tmp_path / "report.html")
    size = path.stat().st_size
    assert parse(path.read_text()).sections == [
        "summary", "stages", "layers", "roofline", "memory", "memory-scaling"
    ]  # fmt: skip
    assert 100_000 < size < 5 * 2**20, size


def with_ranks(record: RunRecord) -> RunRecord:
    """The record as a 2-rank run would have it: rank 0 the measured steps, rank 1 the same 20% slower."""
    from dnnperf.results.ranks import RankBreakdown, RankSteps

    record = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    for point in record.points:
        stages = point.stages
        point.ranks = RankBreakdown(
            strategy="dp",
            world_size=2,
            backend="gloo",
            ranks=[
                RankSteps(
                    rank=r,
                    host="h",
                    wall_s=[w * (1 + 0.2 * r) for w in stages.wall_s],
                    stages={n: [v * (1 + 0.2 * r) for v in vs] for n, vs in stages.steps.items()},
                    buckets=[[] for _ in stages.wall_s],
                )
                for r in (0, 1)
            ],
        )
    return record


def test_ranks_section_shows_every_rank(full):
    two = with_ranks(full)
    cells = parse(report.render(two))
    assert cells.sections[-1] == "ranks"
    table = find_table(cells, "rank 0", "rank 1")
    forward = next(r for r in table if r[""][0] == "forward")
    truth = np.median(full.points[0].stages.steps["forward"])
    assert float(forward["rank 0"][1]) == pytest.approx(truth)
    assert float(forward["rank 1"][1]) == pytest.approx(1.2 * truth)


def test_milliseconds_read_without_exponents():
    from dnnperf.report.html import ms

    assert [ms(1.1106), ms(0.0781), ms(1.23e-5), ms(None)] == ["1,111", "78.1", "0.0123", ""]
