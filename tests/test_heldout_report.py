"""The held-out pages' generated tables against hand-computed figures of known rows."""

from __future__ import annotations

import json

import benchmarks.heldout_report as report
import pytest

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def row(name: str, error: float, memory: float, phases: tuple[float, float, float]) -> dict:
    measured = {"forward": 0.010, "backward": 0.020, "update": 0.005}
    predicted = dict(zip(report.PHASES, phases, strict=True))
    return {
        "workload": name,
        "preset": "small",
        "batch": 2,
        "measured_s": 0.040,
        "predicted_s": 0.040 * (1 + error),
        "predicted_spread": 0.01,
        "step_error": error,
        "variant_errors": {v: error / 2 for v in report.SHOWN},
        "measured_bytes": 2**20,
        "predicted_bytes": 2**20 * (1 + memory),
        "memory_error": memory,
        "measured_phases_s": measured,
        "predicted_phases_s": predicted,
        "measured_products_s": 0.020,
        "predicted_products_s": 0.022,
        "measured_product_calls": 10.0,
        "counted_product_calls": 10.0 if name != "c" else 9.0,
    }


DOCUMENT = {
    "rows": [
        row("a", -0.10, 0.01, (0.008, 0.020, 0.010)),
        row("b", 0.02, 0.20, (0.010, 0.022, 0.010)),
        row("c", 0.30, 0.00, (0.012, 0.018, 0.010)),
    ],
    "finished": "2026-11-28 09:30 UTC",
    "host_speed": {
        "start": {"matmul_flops": 1e11, "copy_bytes_per_s": 2.5e10},
        "end": {"matmul_flops": 0.9e11, "copy_bytes_per_s": 2.0e10},
    },
}


def test_the_summary_row_bolds_the_targets_met() -> None:
    line = report.summary_row("first set", DOCUMENT)
    cells = [c.strip() for c in line.strip("|").split("|")]
    # |errors| 10%, 2%, 30%: median 10% (met), max 30% (not), signed median +2% (met); the variants
    # half of each; memory 1%, 20%, 0%: two of three within 10%.
    assert cells[:5] == ["first set (3 models)", "3", "**10.0%**", "30.0%", "**+2.0%**"]
    assert cells[5] == "5.0%, 15.0%, +1.0%"
    assert cells[-1] == "2 of 3"


def test_the_phases_row_gives_each_phases_median_error_and_miss_over_the_step() -> None:
    table = report.phases({"first": DOCUMENT})
    cells = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    # forward: predicted 8, 10, 12 ms of 10: errors -20%, 0, +20% (median 0), misses over the 40 ms
    # step -5%, 0, +5%; backward 20, 22, 18 of 20: 0, +10%, -10%; update 10 of 5: +100%, misses
    # +12.5%; products 22 of 20 ms: +10%, +5% of the step, half of it; calls as counted in a, b.
    assert cells == [
        "first set",
        "3",
        "+0.0% (+0.0%)",
        "+0.0% (+0.0%)",
        "+100.0% (+12.5%)",
        "+10.0% (+5.0%)",
        "50%",
        "2 of 3",
    ]


def test_a_page_without_the_markers_is_refused() -> None:
    with pytest.raises(SystemExit, match="heldout_report:summary"):
        report.replace_between("no markers here", "summary", "x")
    page = "a\n<!-- heldout_report:summary -->\nold\n<!-- /heldout_report -->\nb"
    new = "a\n<!-- heldout_report:summary -->\nnew\n<!-- /heldout_report -->\nb"
    assert report.replace_between(page, "summary", "new") == new
    # An empty part is filled too, and the next run replaces what the last one wrote.
    empty = "a\n<!-- heldout_report:summary -->\n<!-- /heldout_report -->\nb"
    assert report.replace_between(empty, "summary", "new") == new
    assert report.replace_between(new, "summary", "new") == new
    # Each part up to its own end marker, the next part left alone.
    two = empty + "\n<!-- heldout_report:sets -->\n<!-- /heldout_report -->\n"
    assert report.replace_between(two, "summary", "new") == (
        new + "\n<!-- heldout_report:sets -->\n<!-- /heldout_report -->\n"
    )


def test_the_run_line_names_the_day_of_the_last_set_only_where_it_changed() -> None:
    base = {"machine": "host", "rows": []}
    same = {"a": {**base, "finished": "2026-11-28 16:18 UTC", "commit": "x"}}
    same["b"] = {**base, "finished": "2026-11-28 18:59 UTC", "commit": "y"}
    assert "from 2026-11-28 16:18 UTC to 18:59 UTC" in report.run_line(same)
    later = {**same, "c": {**base, "finished": "2026-11-29 01:29 UTC", "commit": "y"}}
    line = report.run_line(later)
    assert "from 2026-11-28 16:18 UTC to 2026-11-29 01:29 UTC;" in line and "`y`: b, c" in line


def test_the_calibration_spread_table_gives_each_figures_median_and_range() -> None:
    import benchmarks.calibration_spread as spread

    repeats = [
        {"elementwise/forward": v, spread.UPDATE_SHARE: s} for v, s in [(0.5, 0.7), (0.6, 0.6), (0.8, 0.65)]
    ]
    table = spread.markdown(
        {"repeats": repeats, "finished": "now", "machine": "host", "torch": "2", "commit": "abc"}
    )
    # Median 0.6, range 0.5-0.8: 0.3 / 0.6 = 50%; the share: median 0.65, range 0.1 / 0.65 = 15%.
    assert "| elementwise/forward | 0.600 | 0.500-0.800 | 50% |" in table
    assert f"| {spread.UPDATE_SHARE} | 0.650 | 0.600-0.700 | 15% |" in table
    assert "memory/forward" not in table  # a family no repeat measured


def test_every_set_has_its_rows_on_one_page_and_every_page_has_its_markers() -> None:
    pages = report.sets_by_page()
    assert [key for keys in pages.values() for key in keys] == [key for key, _, _ in report.SETS]
    assert pages["validation-heldout-sets.md"][-1] == "seventh"
    assert pages["validation-heldout-sets-2.md"][0] == "eighth"
    for name, _ in report.SETS_PAGES:
        text = (report.DOCS / name).read_text()
        assert text.count("<!-- heldout_report:sets -->") == 1, name


def first_and_twelfth(tmp_path, machine: str):
    """A folder of two sets' JSON files (DOCUMENT's rows, run on ``machine``), as heldout_report reads."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for key in ("first", "twelfth"):
        document = {**DOCUMENT, "machine": machine, "commit": "abc", "summary": {}}
        (runs / f"{key}.json").write_text(json.dumps(document))
    return runs


def test_each_page_gets_only_its_own_sets(tmp_path, monkeypatch) -> None:
    for name, _ in report.SETS_PAGES:
        (tmp_path / name).write_text("<!-- heldout_report:sets -->\n<!-- /heldout_report -->\n")
    for name in ("validation-heldout.md", "validation-heldout-phases.md"):
        markers = ("run", "summary", "attention") if name == "validation-heldout.md" else ("phases",)
        (tmp_path / name).write_text(
            "".join(f"<!-- heldout_report:{m} -->\n<!-- /heldout_report -->\n" for m in markers)
        )
    runs = first_and_twelfth(tmp_path, "host")
    monkeypatch.setattr(report, "DOCS", tmp_path)
    monkeypatch.setattr("sys.argv", ["heldout_report", str(runs)])
    report.main()
    first, later = ((tmp_path / name).read_text() for name, _ in report.SETS_PAGES)
    assert "### The first set" in first and "### The twelfth set" not in first
    assert "### The twelfth set" in later and "### The first set" not in later


def test_the_attention_table_judges_the_replays_on_the_rows_that_run_the_kernel() -> None:
    """Three rows, two running the fused kernel: their |errors| 10% and 2% become 4% and 8% with the
    replays (median 6% against 6%, one grown by 6 points); the row without the kernel is left out of
    those figures."""
    rows = []
    for name, error, replayed, calls in (
        ("a", -0.10, -0.04, 2.0),
        ("b", 0.02, 0.08, 2.0),
        ("c", 0.30, 0.30, 0.0),
    ):
        r = row(name, error, 0.0, (0.01, 0.02, 0.005))
        r["variant_errors"][report.REPLAYED] = replayed
        r["fused_attention_calls"] = calls
        rows.append(r)
    # A later set, run with the replays the model's: the same figures from the other variant.
    later = []
    for r in rows:
        flipped = json.loads(json.dumps(r))
        flipped["step_error"] = r["variant_errors"][report.REPLAYED]
        flipped["variant_errors"] = {report.AS_PRODUCTS: r["step_error"]}
        later.append(flipped)
    table = report.attention({"sixteenth": {"rows": rows}, "first": DOCUMENT, "not-a-set": {"rows": later}})
    lines = table.splitlines()
    assert len(lines) == 3  # the first set ran no such variant; "not-a-set" is none of SETS
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == [
        "sixteenth set",
        "3",
        "10.0%, 30.0%, +2.0%",
        "8.0%, 30.0%, +8.0%",
        "2",
        "6.00% / 6.00%",
        "1",
    ]
    later_table = report.attention({"seventeenth": {"rows": later}})
    assert later_table.splitlines()[2].replace("seventeenth", "sixteenth") == lines[2]


def test_the_few_rows_table_judges_the_price_on_the_rows_it_changes() -> None:
    """Three rows against the same measured steps: the price moves the first two predictions by
    12.5% and 16% (|errors| 20% and 5% become 10% and 10.4%: median 12.5% against 10.2%, the second
    grown by 5.4 points) and the third by 1%, under the 2% that counts as a change: it stays out of
    those two figures."""
    rows = []
    for name, any_rows, few in (("a", -0.20, -0.10), ("b", -0.05, 0.104), ("c", 0.10, 0.111)):
        r = row(name, few, 0.0, (0.01, 0.02, 0.005))
        r["variant_errors"][report.ANY_ROWS] = any_rows
        rows.append(r)
    table = report.few_rows({"eighteenth": {"rows": rows}, "first": DOCUMENT})
    lines = table.splitlines()
    assert len(lines) == 3  # the first set ran no such variant
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == [
        "eighteenth set",
        "3",
        "10.0%, 20.0%, -5.0%",
        "10.4%, 11.1%, +10.4%",
        "2",
        "12.50% / 10.20%",
        "1",
    ]
    # A later set, run with every product at its FLOPs' rate the model's: the same figures from the
    # other variant.
    later = []
    for r in rows:
        flipped = json.loads(json.dumps(r))
        flipped["step_error"] = r["variant_errors"][report.ANY_ROWS]
        flipped["variant_errors"] = {report.AT_RATE: r["step_error"], report.ANY_ROWS: flipped["step_error"]}
        later.append(flipped)
    assert report.few_rows({"eighteenth": {"rows": later}}).splitlines()[2] == lines[2]


def test_the_compiled_calls_table_reads_both_variants_whichever_the_model_was() -> None:
    """Two rows: the price moves the first's prediction by 10% (|error| 20% to 8%), the second's by
    1% (no change). Run while the model left the price off (the step error is without it) or after it
    went on (the step error is with it), the table is the same."""
    errors = {"a": (0.20, 0.08), "b": (-0.05, -0.0405)}
    off_runs, on_runs = [], []
    for name, (without, with_price) in errors.items():
        both = {report.EVERY_CALL: without, report.AT_COST: with_price}
        for runs, model in ((off_runs, without), (on_runs, with_price)):
            r = row(name, model, 0.0, (0.01, 0.02, 0.005))
            r["variant_errors"].update(both)
            runs.append(r)
    table = report.compiled_calls({"twentieth": {"rows": off_runs}})
    cells = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    assert cells == [
        "twentieth set",
        "2",
        "12.5%, 20.0%, +7.5%",
        "6.0%, 8.0%, +2.0%",
        "1",
        "20.00% / 8.00%",
        "0",
    ]
    assert report.compiled_calls({"twentieth": {"rows": on_runs}}) == table


def test_another_hosts_sets_go_to_their_own_page_and_nowhere_else(tmp_path, monkeypatch) -> None:
    markers = ("run", "summary", "sets", "phases")
    (tmp_path / "host.md").write_text(
        "# Host\n" + "".join(f"<!-- heldout_report:{m} -->\n<!-- /heldout_report -->\n" for m in markers)
    )
    runs = first_and_twelfth(tmp_path, "other host")
    monkeypatch.setattr(report, "DOCS", tmp_path)
    monkeypatch.setattr("sys.argv", ["heldout_report", str(runs), "--host-page", "host.md"])
    report.main()
    page = (tmp_path / "host.md").read_text()
    # Both sets' rows on the one page, whichever page of sets they have on the first host.
    assert "### The first set" in page and "### The twelfth set" in page
    assert page.count("| first set (3 models) | 3 |") == 1 and "| twelfth set | 3 |" in page
    assert "other host; the sets one after another" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host.md", "runs"]  # no other page written
    monkeypatch.setattr("sys.argv", ["heldout_report", str(runs), "--host-page", "missing.md"])
    with pytest.raises(SystemExit):
        report.main()


def test_the_norms_tables_judge_only_the_sets_that_ran_both_pricings() -> None:
    """The model does not stand in for a pricing of normalization and pooling: a set that ran the
    per-element variant without the in-cache one (or the reverse) has no row in its table; one that
    ran both is judged on the rows it changes (|error| 20% to 5%, and 4% to 10%: grown 6 points)."""
    both, one = [], []
    for name, in_cache, per_element in (("a", -0.20, -0.05), ("b", -0.04, -0.10)):
        r = row(name, in_cache, 0.0, (0.01, 0.02, 0.005))
        r["variant_errors"].update({report.NORMS_IN_CACHE: in_cache, report.NORMS_PER_ELEMENT: per_element})
        both.append(r)
        r = row(name, in_cache, 0.0, (0.01, 0.02, 0.005))
        r["variant_errors"][report.NORMS_PER_ELEMENT] = per_element
        one.append(r)
    lines = report.norms({"twenty-first": {"rows": both}, "twenty-second": {"rows": one}}).splitlines()
    assert len(lines) == 3  # the header, its rule and the twenty-first set alone
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "twenty-first set" and cells[4:] == ["2", "12.00% / 7.50%", "1"]


def test_another_hosts_rows_can_go_to_a_page_of_their_own(tmp_path, monkeypatch) -> None:
    """With --host-sets-page the host page keeps its summary and the sets' rows go to the other page."""
    (tmp_path / "host.md").write_text(
        "# Host\n"
        + "".join(
            f"<!-- heldout_report:{m} -->\n<!-- /heldout_report -->\n" for m in ("run", "summary", "phases")
        )
    )
    (tmp_path / "rows.md").write_text("# Rows\n<!-- heldout_report:sets -->\n<!-- /heldout_report -->\n")
    runs = first_and_twelfth(tmp_path, "other host")
    monkeypatch.setattr(report, "DOCS", tmp_path)
    arguments = ["heldout_report", str(runs), "--host-page", "host.md", "--host-sets-page", "rows.md"]
    monkeypatch.setattr("sys.argv", arguments)
    report.main()
    host, rows = (tmp_path / "host.md").read_text(), (tmp_path / "rows.md").read_text()
    assert "| twelfth set | 3 |" in host and "### The twelfth set" not in host
    assert "### The first set" in rows and "### The twelfth set" in rows
    monkeypatch.setattr("sys.argv", ["heldout_report", str(runs), "--host-sets-page", "rows.md"])
    with pytest.raises(SystemExit):
        report.main()


def test_the_subnormal_phases_table_judges_each_row_s_phases_it_changes() -> None:
    """Measured phases 10, 20 and 5 ms. Unpriced 8, 10 and 5 ms (-20%, -50%, 0%); priced 8, 20 and
    6.5 ms (-20%, 0%, +30%). The forward does not move and stays out; the backward (|error| 50% to
    0%) and the update (0% to 30%, grown 30 points) are the two pairs it changes: medians 25% and
    15%, one grown. A row of the same set without the variants' phases adds nothing, and a set
    without any has no line."""
    priced = row("a", 0.0, 0.0, (0.01, 0.02, 0.005))
    priced["variants_phases_s"] = {
        report.SUBNORMALS_UNPRICED: {"forward": 0.008, "backward": 0.010, "update": 0.005},
        report.SUBNORMALS_PRICED: {"forward": 0.008, "backward": 0.020, "update": 0.0065},
    }
    plain = row("b", 0.0, 0.0, (0.01, 0.02, 0.005))
    table = report.subnormal_phases({"twenty-fifth": {"rows": [priced, plain]}, "first": DOCUMENT})
    lines = table.splitlines()
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["twenty-fifth set", "3", "2", "25.00% / 15.00%", "1"]


def test_another_host_s_sets_split_between_pages_at_the_named_set() -> None:
    """Three sets present: the first page holds those before the second page's named set, the second
    the rest; a page that names no set present, or pages out of order, stop the report."""
    documents = {key: {} for key in ("first", "twenty-fourth", "twenty-seventh")}
    pages = report.host_sets_pages(["a.md", "b.md:twenty-fourth"], documents)
    assert pages == {"a.md": ["first"], "b.md": ["twenty-fourth", "twenty-seventh"]}
    assert report.host_sets_pages(["a.md"], documents) == {
        "a.md": ["first", "twenty-fourth", "twenty-seventh"]
    }
    with pytest.raises(SystemExit):
        report.host_sets_pages(["a.md", "b.md:eighth"], documents)
    with pytest.raises(SystemExit):
        report.host_sets_pages(["a.md", "b.md:twenty-seventh", "c.md:twenty-fourth"], documents)
