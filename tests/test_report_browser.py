"""The report of a real profile in headless Chromium: it loads with no console error, fetches
nothing, and every chart draws. The screenshot is kept in test-artifacts/ (`make test` installs
Debian's chromium when it is missing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dnnperf.report.html import write_report
from test_report import full_profile

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

pytestmark = [
    pytest.mark.concurrent,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)"),
]


def chromium(page: Path, profile_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a local file, offline, with console messages logged to stderr."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing resolves: a fetch could only fail
            f"--user-data-dir={profile_dir}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def body_marks(dom: str) -> dict[str, str]:
    """The attributes the page's own script set on <body> once loaded."""
    match = re.search(r"<body([^>]*)>", dom)
    assert match, dom[:500]
    return dict(re.findall(r'data-([\w-]+)="([^"]*)"', match[1]))


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def load(page: Path, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    result = chromium(page, tmp_path / "chromium", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    return body_marks(result.stdout), console_lines(result.stderr)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> tuple[Path, int]:
    """The report of a real profile (stages, layers, memory; two batch sizes) and its chart count."""
    root = tmp_path_factory.mktemp("browser")
    record = full_profile(root)
    path = write_report(record, root / "report.html")
    return path, path.read_text().count('<figure class="chart">')


def test_the_report_loads_without_errors_and_every_chart_draws(report_page, tmp_path):
    page, charts = report_page
    marks, console = load(page, tmp_path)
    assert charts == 9
    assert marks["charts"] == str(charts) and marks["charts-drawn"] == str(charts), marks
    assert marks["errors"] == "0", marks.get("error-text")
    assert console == []  # the page logs nothing: any console line is an error or a blocked load
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    result = chromium(
        page, tmp_path / "chromium", "--hide-scrollbars", "--window-size=1280,5000", f"--screenshot={shot}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_the_check_sees_errors_blocked_loads_and_blank_charts(report_page, tmp_path):
    """The same check on a broken copy: a script error, a console error, an external image, and a
    chart whose drawing was removed are all caught (the check above can fail)."""
    page, charts = report_page
    text = page.read_text()
    broken = text.replace(
        "<nav>",
        '<img src="https://example.com/x.png"><script>console.error("boom"); missing();</script><nav>',
        1,
    )
    start = broken.index('<figure class="chart"><svg') + len('<figure class="chart">')
    end = broken.index("</svg>", start) + len("</svg>")
    broken = broken[:start] + "<svg></svg>" + broken[end:]
    bad = tmp_path / "broken.html"
    bad.write_text(broken)
    marks, console = load(bad, tmp_path)
    assert marks["charts-drawn"] == str(charts - 1)
    assert marks["errors"] == "3", marks.get("error-text")
    assert (
        "boom" in marks["error-text"]
        and "missing" in marks["error-text"]
        and "blocked" in marks["error-text"]
    )
    assert len(console) >= 3


def test_prediction_and_validation_reports_load_and_every_chart_draws(tmp_path):
    """The what-if sweep's and the validation's charts (records made from hand-made tables)."""
    from dnnperf.results.prediction import SweepResult
    from dnnperf.results.record import RunRecord
    from dnnperf.results.validation import ValidationResult
    from test_model_whatif import _table

    sweep = SweepResult(
        "basic_cnn", "tiny", "toy", 64, {"nodes": [1, 2, 4, 8], "link_gbps": [1.0, 100.0]},
        ["dp", "pp", "tp"], _table().to_dict("records"),
    )  # fmt: skip
    runs = [
        {"workload": "w", "batch": b, "strategy": s, "measured_s": 0.01 * b, "predicted_s": 0.011 * b}
        for b in (4, 8)
        for s in ("dp", "pp")
    ]
    collectives = [
        {
            "op": "allreduce",
            "bytes": n,
            "measured_s": 1e-9 * n,
            "predicted_s": 1.1e-9 * n,
            "held_out": n > 4096,
        }
        for n in (4096, 65536)
    ]
    memory = [  # predicted 5% over, 20% under: median |error| 12.5%, max 20.0%, 1 within 10%
        {"workload": "w", "batch": 4, "measured_bytes": 2e6, "predicted_bytes": 2.1e6,
         "measured_phase": "backward", "predicted_phase": "backward"},
        {"workload": "w", "batch": 8, "measured_bytes": 4e6, "predicted_bytes": 3.2e6,
         "measured_phase": "update", "predicted_phase": "backward"},
    ]  # fmt: skip
    for kind, section in (("predict", {"prediction": sweep}), ("validate", {})):
        validation = ValidationResult(runs, collectives, memory) if kind == "validate" else None
        record = RunRecord(
            id=kind, kind=kind, workload={"name": "w", "preset": "tiny"},
            settings={"device": "cpu", "data": "none"}, environment={}, status="complete",
            validation=validation, **section,
        )  # fmt: skip
        page = write_report(record, tmp_path / f"{kind}.html")
        charts = page.read_text().count('<figure class="chart">')
        assert charts == (
            4 + 2 if kind == "predict" else 3
        )  # nodes per link, link per node; memory, runs, collectives
        if kind == "validate":
            assert "peak memory of one device, 2 runs: median |error| 12.5%, max 20.0%, 1 within 10%" in (
                page.read_text()
            )
        marks, console = load(page, tmp_path)
        assert marks["charts-drawn"] == str(charts) and marks["errors"] == "0", marks
        assert console == []
