"""What-if sweeps kept as records: the crossovers against hand-made tables, the record round trip, and
``predict --sweep`` writing a record whose report draws every axis."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from dnnperf.cli import main
from dnnperf.perfmodel.whatif import best_per_configuration, crossovers
from dnnperf.results.prediction import SweepResult
from dnnperf.results.record import RecordError, RunRecord

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def _row(nodes: int, link: float, strategy: str, throughput: float, fits: bool = True) -> dict:
    step = 64 / throughput
    return {
        "nodes": nodes,
        "link_gbps": link,
        "strategy": strategy,
        "step_s": step,
        "compute_s": step,
        "communication_s": 0.0,
        "bubble_s": 0.0,
        "other_s": 0.0,
        "throughput": throughput,
        "memory_bytes": 1e9,
        "fits": fits,
        "reason": None,
    }


def _table() -> pd.DataFrame:
    """dp scales with nodes on the fast link, not on the slow one; pp is flat at 250; at 8 nodes on the
    slow link dp would be fastest but does not fit, and tp cannot apply."""
    rows = []
    for link in (1.0, 100.0):
        for nodes in (1, 2, 4, 8):
            dp = 100 * nodes if link == 100.0 else 400 / nodes if nodes < 8 else 1000
            rows.append(_row(nodes, link, "dp", dp, fits=not (link == 1.0 and nodes == 8)))
            rows.append(_row(nodes, link, "pp", 250))
            tp = {**_row(nodes, link, "tp", 1.0), "reason": "no splittable layer"} if nodes == 8 else None
            rows.append(tp or _row(nodes, link, "tp", 10))
    return pd.DataFrame(rows)


def test_best_strategy_skips_rows_that_do_not_fit_or_cannot_apply() -> None:
    best = best_per_configuration(_table(), ["nodes", "link_gbps"])
    by = {(r.nodes, r.link_gbps): (r.best, r.throughput) for r in best.itertuples()}
    assert by[(1, 1.0)] == ("dp", 400)
    assert by[(4, 100.0)] == ("dp", 400)
    assert by[(2, 1.0)] == ("pp", 250)  # dp 200 < pp 250
    assert by[(8, 1.0)] == ("pp", 250)  # dp's 1000 does not fit, tp cannot apply
    assert by[(2, 100.0)] == ("pp", 250)  # dp 200


def test_crossovers_along_each_axis_with_the_others_held() -> None:
    found = crossovers(_table(), ["nodes", "link_gbps"])
    along_nodes = found[found["axis"] == "nodes"]
    slow = along_nodes[along_nodes["held"] == "link_gbps=1"]
    fast = along_nodes[along_nodes["held"] == "link_gbps=100"]
    # slow link: dp 400 > pp 250 at 1 node, 200 < 250 at 2 nodes, then pp stays best.
    assert slow[["below", "above", "before", "after"]].values.tolist() == [[1, 2, "dp", "pp"]]
    # fast link: dp 100 and 200 < pp 250 at 1 and 2 nodes, 400 > 250 at 4 nodes.
    assert fast[["below", "above", "before", "after"]].values.tolist() == [[2, 4, "pp", "dp"]]
    along_link = found[found["axis"] == "link_gbps"].set_index("held")
    # 1 node: dp 400 on the slow link, pp on the fast one (dp 100); 2 nodes: pp on both;
    # 4 and 8 nodes: pp on the slow link, dp on the fast one.
    assert sorted(along_link.index) == ["nodes=1", "nodes=4", "nodes=8"]
    assert tuple(along_link.loc["nodes=1", ["before", "after"]]) == ("dp", "pp")
    assert tuple(along_link.loc["nodes=4", ["before", "after"]]) == ("pp", "dp")
    assert tuple(along_link.loc["nodes=8", ["before", "after"]]) == ("pp", "dp")


def test_the_sweep_survives_the_record_round_trip_and_a_broken_one_is_refused() -> None:
    frame = _table()
    result = SweepResult(
        "basic_cnn", "tiny", "two", 64, {"nodes": [1, 2, 4, 8], "link_gbps": [1.0, 100.0]},
        ["dp", "pp", "tp"], frame.to_dict("records"),
    )  # fmt: skip
    record = RunRecord(
        id="x", kind="predict", workload={"name": "basic_cnn", "preset": "tiny"},
        settings={"device": "predicted: two", "data": "none"}, environment={}, status="complete",
        prediction=result,
    )  # fmt: skip
    again = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again.prediction is not None
    assert crossovers(again.prediction.frame(), ["nodes", "link_gbps"]).equals(
        crossovers(frame, ["nodes", "link_gbps"])
    )
    broken = record.to_dict()
    del broken["prediction"]["rows"][3]["throughput"]
    with pytest.raises(RecordError, match=r"prediction: rows\[3\] has neither a reason"):
        RunRecord.from_dict(broken)


def test_predict_sweep_writes_a_record_whose_report_draws_every_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["predict", "basic_cnn", "--preset", "tiny", "--machine", "a100-ib", "-b", "64"]
    argv += ["--sweep", "nodes=1,2,4", "--sweep", "link_gbps=1,100", "--runs-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    rows = pd.DataFrame(document["rows"])
    assert len(rows) == 3 * 2 * 3  # nodes x link x (dp, pp, tp)
    assert document["crossovers"] == crossovers(rows, ["nodes", "link_gbps"]).to_dict("records")
    page = Path(document["report_path"]).read_text()
    # One chart along nodes per link value, one along the link per node count.
    charts = re.findall(r'<figure class="chart">.*?<figcaption>(.*?)</figcaption>', page, re.S)
    assert sorted(c.split(":")[0] for c in charts) == sorted(
        [f"along nodes (link_gbps={v})" for v in ("1", "100")]
        + [f"along link_gbps (nodes={n})" for n in (1, 2, 4)]
    )
    assert main(["show", document["record_path"]]) == 0
    shown = capsys.readouterr().out
    assert "crossovers" in shown and "what-if" in shown


def test_a_configuration_where_nothing_fits_is_a_crossing_only_where_something_does() -> None:
    from rich.console import Console

    from dnnperf.report.terminal import crossover_table

    frame = pd.DataFrame(
        [
            {"nodes": n, "strategy": "dp", "reason": None, "fits": n == 2, "throughput": 1.0}
            for n in (1, 2, 4, 8)
        ]
    )
    found = crossovers(frame, ["nodes"])
    # nothing -> dp between 1 and 2, dp -> nothing between 2 and 4; none between 4 and 8
    assert [(r.below, r.above) for r in found.itertuples()] == [(1, 2), (2, 4)]
    console = Console(width=120, record=True)
    console.print(crossover_table(found))
    text = console.export_text()
    assert text.count("none fits") == 2 and "dp" in text


def test_the_sweep_table_says_why_a_strategy_cannot_apply_and_no_crossover_is_one_line() -> None:
    from rich.console import Console

    from dnnperf.report.terminal import crossover_table, sweep_table

    rows = []
    for n in (1, 2, 4):
        rows.append({"nodes": n, "strategy": "dp", "reason": None, "fits": True, "throughput": 10.0 * n})
        reason = None if n == 1 else f"pp needs {n} stages of the model's 1 unit"
        rows.append({"nodes": n, "strategy": "pp", "reason": reason, "fits": True, "throughput": 1.0})
    frame = pd.DataFrame(rows)
    console = Console(width=200, record=True)
    console.print(sweep_table(frame, ["nodes"], "toy"))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    # Two configurations refused pp, each for its own reason: the first named, the other counted.
    assert "pp -: pp needs 2 stages of the model's 1 unit (and 1 more)" in text
    assert "dp -:" not in text  # dp applied everywhere
    assert crossover_table(crossovers(frame, ["nodes"])) == (
        "crossovers: the best strategy does not change along the sweep"
    )


def test_a_sweep_says_what_it_is_doing_configuration_by_configuration():
    """The truth: a sweep over 3 node counts x 2 link speeds has 6 configurations; the first describes
    the workload (counted once, then cached), each later one predicts, the fraction rising from 0."""
    from dnnperf.perfmodel.machine import preset
    from dnnperf.perfmodel.predict import sweep

    heard: list[tuple[str, float]] = []
    axes = {"nodes": [1, 2, 4], "link_gbps": [10.0, 100.0]}
    frame = sweep("basic_cnn", preset("a100-ib"), 8, axes, ("dp",), lambda w, f: heard.append((w, f)))
    assert len(frame) == 6 and len(heard) == 6
    assert "describing basic_cnn" in heard[0][0] and heard[0][1] == 0.0
    assert [w for w, _ in heard[1:]] == [f"predicting configuration {i} of 6" for i in range(2, 7)]
    assert [f for _, f in heard] == [i / 6 for i in range(6)]
