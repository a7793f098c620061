"""The held-out validation's summaries (benchmarks/heldout_validation.py) on synthetic rows whose
medians and extremes are known, and its reading of a validation page's error column."""

from __future__ import annotations

import math
import time

import benchmarks.heldout_validation as heldout
import pytest
import torch
from benchmarks.heldout_validation import (
    DOCS,
    IN_SAMPLE,
    MODEL,
    error_summary,
    markdown,
    predict_variants,
    summaries,
    table_errors,
)

from dnnperf.workloads.base import SupervisedTask, no_stages
from test_model_formulas import toy_machine

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def test_an_error_summary_has_the_known_medians_and_extreme():
    """Errors -0.30, -0.10, +0.05, +0.20, +0.60: |errors| sorted 0.05, 0.10, 0.20, 0.30, 0.60 (median
    0.20, max 0.60); signed median +0.05 (the mean would be +0.09)."""
    summary = error_summary([0.20, -0.10, 0.60, -0.30, 0.05])
    assert summary["count"] == 5
    assert summary["median_abs"] == pytest.approx(0.20)
    assert summary["max_abs"] == pytest.approx(0.60)
    assert summary["median_signed"] == pytest.approx(0.05)


def test_an_even_count_takes_the_mean_of_the_middle_two_and_nan_rows_are_left_out():
    """-0.08, -0.02, +0.04, +0.30 (a NaN row: a configuration that did not run): signed median
    (-0.02 + 0.04) / 2 = +0.01 (the mean would be +0.06); |errors| 0.02, 0.04, 0.08, 0.30: median
    0.06."""
    summary = error_summary([0.30, math.nan, -0.02, 0.04, -0.08])
    assert summary["count"] == 4
    assert summary["median_signed"] == pytest.approx(0.01)
    assert summary["median_abs"] == pytest.approx(0.06)
    assert summary["max_abs"] == pytest.approx(0.30)


def test_nothing_measured_summarises_to_nan_not_to_zero():
    summary = error_summary([math.nan])
    assert summary["count"] == 0 and math.isnan(summary["median_abs"])


def test_step_and_memory_are_summarised_apart():
    rows = [
        {"step_error": 0.1, "memory_error": -0.01},
        {"step_error": -0.3, "memory_error": 0.02},
        {"step_error": 0.2, "memory_error": 0.0},
    ]
    result = summaries(rows)
    assert result["step"]["median_signed"] == pytest.approx(0.1)
    assert result["step"]["max_abs"] == pytest.approx(0.3)
    assert result["memory"]["median_signed"] == pytest.approx(0.0)
    assert result["memory"]["median_abs"] == pytest.approx(0.01)


PAGE = """# A page

## Other section

| workload | error |
|---|---:|
| x | +90.0% |

## The section

Some text.

| workload | batch | measured ms | error |
|---|---:|---:|---:|
| a | 4 | 1.00 | -15.6% |
| a | 8 | 2.00 | +1.4% |
| b | 4 | 3.00 | +0.0% |

| variant | error |
|---|---:|
| y | +50.0% |
"""


def test_the_error_column_is_read_from_the_first_table_of_the_section_only():
    assert table_errors(PAGE, "## The section") == pytest.approx([-0.156, 0.014, 0.0])
    with pytest.raises(ValueError, match="no section"):
        table_errors(PAGE, "## Missing")


def test_the_markdown_shows_every_row_and_both_summaries():
    rows = [
        {
            "workload": "hf:vit",
            "family": "vision transformer",
            "preset": "small",
            "batch": 4,
            "measured_s": 0.100,
            "predicted_s": 0.110,
            "predicted_spread": 0.01,
            "step_error": 0.10,
            "measured_bytes": 2.0 * 2**20,
            "predicted_bytes": 2.1 * 2**20,
            "memory_error": 0.05,
        }
    ]
    document = {
        "machine": "cpu",
        "finished": "now",
        "load_average": (1.0, 1.0, 1.0),
        "rows": rows,
        "summary": summaries(rows),
        "in_sample": [],
    }
    table = markdown(document)
    assert (
        "| hf:vit | vision transformer | small | 4 | 100.0 | 110.0 (1.0%) | +10.0% | 2.00 | 2.10 | +5.0% |"
        in table
    )
    assert "| held-out | step time | 1 | 10.0% | 10.0% | +10.0% |" in table
    assert "| held-out | memory | 1 | 5.0% | 5.0% | +5.0% |" in table


def test_the_validation_pages_in_sample_tables_are_readable():
    """The script summarises the suite's figures from the pages themselves: each section it names
    exists and its first table has an error column with rows."""
    for _, page, heading, _ in IN_SAMPLE:
        assert len(table_errors((DOCS / page).read_text(), heading)) >= 10, page


def test_the_host_speed_is_the_probes_work_over_their_injected_times(monkeypatch: pytest.MonkeyPatch):
    """Timed calls injected at 2 ms for the product and 8 ms for the copy: 2 x 512^3 FLOP / 2 ms =
    134.2 GFLOP/s, and 64 MiB read and written / 8 ms = 16.8 GB/s."""
    from dnnperf.calibration import speed as probe

    injected = iter([[0.002] * 3, [0.008] * 3])
    monkeypatch.setattr(probe, "time_samples", lambda *a, **k: next(injected))
    speed = probe.host_speed("cpu", repeats=3)
    assert speed["matmul_flops"] == pytest.approx(2 * 512**3 / 0.002)
    assert speed["copy_bytes_per_s"] == pytest.approx(2 * 64 * 2**20 / 0.008)


class _StagedTask:
    """A training step that sleeps known seconds in each phase and multiplies matrices: ``products``
    calls of ``torch.mm`` and one of ``torch.addmm`` in its forward."""

    def __init__(self, forward_s: float, backward_s: float, update_s: float, products: int = 0) -> None:
        self.seconds = {"forward": forward_s, "backward": backward_s, "update": update_s}
        self.products = products
        self.a = torch.randn(64, 64)

    def step(self, batch: object, stages: object = no_stages) -> None:
        for phase, seconds in self.seconds.items():
            with stages(phase):  # type: ignore[operator]
                time.sleep(seconds)
                if phase == "forward" and self.products:
                    for _ in range(self.products):
                        torch.mm(self.a, self.a)
                    torch.addmm(self.a, self.a, self.a)


def test_the_profiled_products_are_the_steps_mm_and_addmm_calls():
    """Four torch.mm and one torch.addmm a step: five product calls a step, whatever the steps."""
    seconds, calls = heldout.products_in_step(_StagedTask(0.0, 0.0, 0.0, products=4), {}, steps=2)
    assert calls == 5
    assert seconds > 0
    assert heldout.products_in_step(_StagedTask(0.0, 0.0, 0.0), {}, steps=2) == (0.0, 0.0)


def test_the_markdown_shows_each_phase_and_the_products_measured_against_predicted():
    row = {
        "workload": "hf:vit",
        "family": "vision transformer",
        "preset": "small",
        "batch": 4,
        "measured_s": 0.100,
        "predicted_s": 0.080,
        "predicted_spread": 0.0,
        "step_error": -0.2,
        "measured_bytes": 2.0 * 2**20,
        "predicted_bytes": 2.0 * 2**20,
        "memory_error": 0.0,
        "measured_phases_s": {"forward": 0.040, "backward": 0.050, "update": 0.010},
        "predicted_phases_s": {"forward": 0.020, "backward": 0.045, "update": 0.015},
        "measured_products_s": 0.025,
        "predicted_products_s": 0.010,
    }
    document = {
        "machine": "cpu",
        "finished": "now",
        "load_average": (1.0, 1.0, 1.0),
        "rows": [row],
        "summary": summaries([row]),
        "in_sample": [],
    }
    table = markdown(document)
    # 20/40 - 1 = -50%, 45/50 - 1 = -10%, 15/10 - 1 = +50%; products 10/25 - 1 = -60%.
    assert "| hf:vit | 4 | 40.0 / 20.0 (-50.0%) | 50.0 / 45.0 (-10.0%) | 10.0 / 15.0 (+50.0%) " in table
    assert "| 25.0 / 10.0 (-60.0%) |" in table
    assert "| median signed error | | -50.0% | -10.0% | +50.0% | -60.0% |" in table


def test_a_row_takes_its_fastest_rounds_step_and_phases_and_the_errors_against_it():
    row = {"predicted_s": 0.090, "variants_s": {"model": 0.090, "other": 0.120}}
    rounds = [(0.110, {"forward": 0.05}), (0.100, {"forward": 0.04}), (0.130, {"forward": 0.07})]
    heldout.record_rounds(row, rounds)
    assert row["measured_s"] == 0.100 and row["measured_rounds_s"] == [0.110, 0.100, 0.130]
    assert row["measured_phases_s"] == {"forward": 0.04}
    assert row["step_error"] == pytest.approx(-0.1)
    assert row["variant_errors"] == {"model": pytest.approx(-0.1), "other": pytest.approx(0.2)}


def test_memory_only_predicts_each_row_from_other_batches_against_the_profilers_peak():
    """``--memory-only`` on a suite CNN: each row described at 3B/2 and 3B/4 and interpolated to B, beside
    the memory profiler's peak of a step at B (an independent count, made by the allocator's hooks):
    the two agree within the held-out target, and the batches described are not the one predicted."""
    import argparse

    args = argparse.Namespace(preset=None, batch_scale=1, device="cpu")
    document = heldout.memory_run((("basic_cnn", "tiny", (4, 8), "CNN"),), args)
    assert document["memory_only"] and len(document["rows"]) == 2
    for row in document["rows"]:
        assert row["example_batch"] == row["batch"] * 3 // 2 != row["batch"]
        assert row["measured_bytes"] > 0
        assert abs(row["predicted_bytes"] / row["measured_bytes"] - 1) <= 0.10
        assert row["memory_error"] == pytest.approx(row["predicted_bytes"] / row["measured_bytes"] - 1)


def test_every_model_of_the_own_module_sets_is_one_the_benchmark_builds() -> None:
    import benchmarks.own_models as own

    built = {model.name for model in own.MODELS}
    for models in (
        heldout.FOURTEENTH_MODELS,
        heldout.FIFTEENTH_MODELS,
        heldout.SIXTEENTH_MODELS,
        heldout.SEVENTEENTH_MODELS,
        *(getattr(heldout, f"{n}_MODELS") for n in ("EIGHTEENTH", "NINETEENTH", "TWENTIETH")),
        *(getattr(heldout, f"TWENTY_{n}_MODELS") for n in ("FIRST", "SECOND", "THIRD", "FOURTH")),
        *(getattr(heldout, f"TWENTY_{n}_MODELS") for n in ("FIFTH", "SIXTH", "SEVENTH", "EIGHTH")),
    ):
        names = {name for name, _, _, _ in models if not name.startswith(("hf:", "timm:"))}
        assert names and names <= built
    assert len(built) == len(own.MODELS)  # no name twice


class _TwoAttentions(torch.nn.Module):
    """Two self-attentions through ``scaled_dot_product_attention`` without dropout: on the CPU, two
    calls of the fused kernel forward and two of its backward a step."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in (self.first, self.second):
            heads = layer(x).view(x.shape[0], 8, 2, 8).transpose(1, 2)  # 2 heads of 8 over 8 tokens
            x = (
                torch.nn.functional.scaled_dot_product_attention(heads, heads, heads)
                .transpose(1, 2)
                .flatten(2)
            )
        return x


def test_a_row_counts_the_fused_attention_calls_its_step_makes():
    model = _TwoAttentions()
    task = SupervisedTask(
        model, lambda m, b: m(b["x"]).square().mean(), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    example = {"x": torch.randn(6, 8, 16)}
    predictions, _, _, attention_calls = predict_variants(task, example, {MODEL: toy_machine()}, 4)
    assert attention_calls == 4  # two forward, two backward
    assert predictions[MODEL].step_s > 0
