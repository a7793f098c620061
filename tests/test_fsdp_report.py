"""The distributed section of ``dnnperf show``'s tables and of the HTML report for an fsdp run: the
strategy's settings (resharding, mixed precision) and each rank's exposed exchange beside its compute,
against a record built by hand with known values."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from dnnperf.report.html import render
from dnnperf.report.terminal import ranks_tables, strategy_settings
from dnnperf.results.record import RunRecord
from test_hostile_input import DISTRIBUTED

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

#: Per rank, every step: forward, backward, update and the exposed exchange, in ms.
STAGES_MS = {0: (10.0, 20.0, 5.0, 40.0), 1: (10.0, 20.0, 10.0, 30.0)}


def fsdp_record(reshard: bool = False, mixed_precision: str | None = "bf16") -> RunRecord:
    per_rank = []
    for rank, (forward, backward, update, exchange) in STAGES_MS.items():
        stages = {"forward": forward, "backward": backward, "update": update, "exchange": exchange}
        per_rank.append(
            {
                "rank": rank,
                "host": "h",
                "pid": 100 + rank,
                "device": "cpu",
                "wall_s": [sum(stages.values()) / 1e3] * 3,
                "stages": {name: [ms / 1e3] * 3 for name, ms in stages.items()},
                "detail": {},
                "buckets": [[], [], []],
            }
        )
    distributed = {
        **DISTRIBUTED,
        "reshard_after_forward": reshard,
        "mixed_precision": mixed_precision,
        "netns": None,
    }
    return RunRecord.from_dict(
        {
            "schema": "dnnperf.run",
            "schema_version": 1,
            "id": "r-fsdp",
            "kind": "bench",
            "status": "complete",
            "created": "2026-11-27T05:00:00+00:00",
            "workload": {"name": "gpt2", "preset": "tiny"},
            "settings": {
                "device": "cpu",
                "data": "memory",
                "steps": 3,
                "warmup": 1,
                "distributed": distributed,
            },
            "environment": {"machine": {}, "software": {}},
            "points": [
                {
                    "batch_size": 8,
                    "status": "complete",
                    "warmup_s": [0.5],
                    "step_s": [0.075] * 3,
                    "ranks": {"strategy": "fsdp", "world_size": 2, "backend": "gloo", "per_rank": per_rank},
                }
            ],
        }
    )


def row_values(text: str, name: str) -> list[float]:
    """The numbers of the table row labelled ``name`` in rendered text."""
    line = next(line for line in text.splitlines() if re.search(rf"[│|]\s*{name}\s*[│|]", line))
    return [float(v) for v in re.findall(r"\d+\.\d+", line)]


def test_show_names_fsdps_settings_and_each_ranks_exchange_beside_its_compute():
    record = fsdp_record()
    console = Console(record=True, width=200)
    for table in ranks_tables(8, record.points[0].ranks, record.settings["distributed"]):
        console.print(table)
    text = console.export_text()
    title = " ".join(text.split())  # the title wraps to the table's width
    assert "fsdp over 2 ranks (gloo, host-clock; kept gathered after forward, mixed precision bf16)" in title
    # rank 0, rank 1, max - min: the exposed exchange and the compute (busy: forward + backward + update).
    assert row_values(text, "exchange") == [40.0, 30.0, 10.0]
    assert row_values(text, "busy") == [35.0, 40.0, 5.0]
    assert row_values(text, "update") == [5.0, 10.0, 5.0]


def test_the_html_report_names_fsdps_settings_and_each_ranks_exchange():
    page = render(fsdp_record(reshard=True, mixed_precision=None))
    section = page[page.index('<section id="ranks">') :]
    assert "fsdp over 2 ranks (gloo; resharded after forward, mixed precision none)" in section
    table = section[section.index("<table") :]
    # rank 0 and rank 1, in ms and as stored seconds: the exposed exchange and the compute (busy).
    for name, values in (("exchange", ("40", "30")), ("busy", ("35", "40"))):
        row = table[table.index(f"<td>{name}</td>") :]
        row = row[: row.index("</tr>")]
        assert re.findall(r">([\d.]+)</td>", row) == list(values), name
    seconds = re.findall(r'data-v="([\d.]+)"', table[table.index("<td>exchange</td>") :])[:2]
    assert [float(v) for v in seconds] == [0.04, 0.03]


@pytest.mark.parametrize(
    ("distributed", "text"),
    [
        (
            {"strategy": "fsdp", "reshard_after_forward": True, "mixed_precision": None},
            "resharded after forward, mixed precision none",
        ),
        ({"strategy": "dp", "bucket_cap_mb": 4.0}, "bucket cap 4 MiB"),
        ({"strategy": "zero1", "bucket_cap_mb": None}, "bucket cap DDP default"),
        ({"strategy": "pp", "schedule": "gpipe", "microbatches": 8}, "gpipe schedule, 8 micro-batches"),
        ({"strategy": "tp"}, ""),
        (None, ""),  # a record without the block (a run of the user's own torchrun)
    ],
)
def test_strategy_settings_phrase(distributed, text):
    assert strategy_settings(distributed) == text


def test_dnnperf_show_passes_the_settings_to_the_ranks_title(tmp_path):
    from conftest import run_cli
    from dnnperf.results.store import RunStore

    path = RunStore(tmp_path).save(fsdp_record())
    result = run_cli("show", str(path), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "kept gathered after forward, mixed precision bf16" in " ".join(result.stdout.split())
