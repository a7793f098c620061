"""Two runs side by side: the step, every stage and every layer phase, flagged only where the change is
larger than the noise the runs themselves recorded.

Each run keeps its per-step samples (``step_s``, ``stages.steps``, ``layers.layer_seconds``), so a row
compares two samples of one quantity, A (before) and B (after).

Two kinds of noise are in the records. *Step to step*: the spread of one run's samples. *Run to run*:
on a shared machine a whole run can be slower than the next (on the 2-core machine dnnperf is tested
on, repeated runs of one configuration differ by up to 45% in step time, with every stage and layer
stretched alike). So, per batch size:

- the **common factor** ``k`` of a part is what the rest of the run changed by: for a stage, B's
  median step over A's, this stage left out of both; for a layer phase (they come from other steps),
  B's summed layer medians over A's, this one left out;
- a **stage or layer** is flagged when it changed *relative to that factor*, B against k x A: the
  part that changed, whatever the machine did meanwhile;
- the **step** is flagged on its own change, with ``min_run_relative`` (50%) in place of
  ``min_relative``: a change of machine, library or batch size shows there, and only beyond what a
  loaded machine drifts between runs (lower it for runs on a quiet, dedicated machine).

A row is flagged when all of:

1. the samples differ beyond chance: a two-sided Mann–Whitney U test on the per-step values gives
   p < ``alpha`` / m, m the rows of the pair of points (rank-based, so a few preempted steps do not
   carry it; Bonferroni, because a pair compares tens of rows: at ``alpha`` each, two repeated runs of
   basic_cnn flagged the 0.9 ms update stage 18% "faster", p = 0.008);
2. the difference of medians is larger than either run's step-to-step noise (half its interquartile
   range);
3. it is at least ``min_relative`` of A's median;
4. it is at least ``min_step_share`` of A's median step (a layer of a few microseconds can double
   without mattering).

A run on the CPU whose training process got less than ``min_cpu_share`` of the cores it ran threads
on (``stages.cpu.process_cores`` per thread: other processes held them) mostly measured the
scheduler; its rows are marked inconclusive, never flagged.

Only runs whose steps were timed alike are compared (``comparable``): a bench or profile run with
another, or two runs of one other kind.

Two watch records (``compare_watches``) compare their median step time between ``mark_step`` calls
by the same rule as a step (Mann–Whitney, ``min_run_relative``) when both have steps, and state peak
RSS, mean busy cores and each GPU's peak memory side by side (one value per run: no noise to judge
them against, so never flagged).

Points are paired by batch size; runs with no batch size in common are paired in order (a change of
batch size: the rows then compare per-step times). The layer timer's own row, ``(profiler)``, is no
work of the model and is left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from dnnperf.analysis.layers import LAYER_PHASES
from dnnperf.probes.layers import PROFILER
from dnnperf.results.record import Point, RunRecord
from dnnperf.stats import Samples

COLUMNS = [
    "batch_a", "batch_b", "kind", "name", "phase", "a_median_s", "b_median_s", "delta_s", "delta_rel",
    "common_factor", "excess_rel", "a_noise_s", "b_noise_s", "p_value", "n_a", "n_b", "flagged", "change",
]  # fmt: skip


@dataclass(frozen=True)
class CompareSettings:
    """The thresholds of the rule in the module docstring."""

    alpha: float = 0.01
    min_relative: float = 0.15
    min_step_share: float = 0.01
    #: The step's own change must be at least this (see the module docstring).
    min_run_relative: float = 0.50
    #: Below this share of its cores (CPU runs), a run mostly measured the scheduler: inconclusive.
    min_cpu_share: float = 0.85

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def half_spread(values: np.ndarray) -> float:
    """Half the interquartile range: the step-to-step noise of one run's samples (the p10–p90 range
    would be set by the one or two steps in ten that a loaded machine preempts)."""
    return Samples.of(values).iqr / 2


def compare_samples(
    a: Sequence[float],
    b: Sequence[float],
    step_s: float,
    settings: CompareSettings,
    factor: float = 1.0,
    min_relative: float | None = None,
    tests: int = 1,
) -> dict[str, Any]:
    """The columns of one row: medians, the change, each run's noise, the Mann–Whitney p-value of B
    against ``factor`` x A, and whether B changed beyond ``factor`` (flagged, see the module; ``tests``:
    the rows compared with this one, whose p-values share ``alpha``)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    row: dict[str, Any] = {"n_a": len(a), "n_b": len(b), "common_factor": factor, "flagged": False}
    if not len(a) or not len(b):
        return row | {
            "a_median_s": float(np.median(a)) if len(a) else np.nan,
            "b_median_s": float(np.median(b)) if len(b) else np.nan,
            "change": "only in B" if not len(a) else "only in A",
        }
    median_a, median_b = float(np.median(a)), float(np.median(b))
    scaled = a * factor
    excess = median_b - median_a * factor
    noise_a, noise_b = half_spread(scaled), half_spread(b)
    same = np.array_equal(np.sort(scaled), np.sort(b))
    p_value = 1.0 if same else float(mannwhitneyu(scaled, b, alternative="two-sided").pvalue)
    flagged = (
        p_value < settings.alpha / tests
        and abs(excess) > max(noise_a, noise_b)
        and abs(excess)
        >= (settings.min_relative if min_relative is None else min_relative) * median_a * factor
        and abs(excess) >= settings.min_step_share * step_s * factor
    )
    return row | {
        "a_median_s": median_a,
        "b_median_s": median_b,
        "delta_s": median_b - median_a,
        "delta_rel": (median_b - median_a) / median_a if median_a > 0 else np.nan,
        "excess_rel": excess / (median_a * factor) if median_a > 0 else np.nan,
        "a_noise_s": noise_a,
        "b_noise_s": noise_b,
        "p_value": p_value,
        "flagged": bool(flagged),
        "change": ("slower" if excess > 0 else "faster") if flagged else "",
    }


#: Kinds whose points time the same training steps the same way (a profile adds stage marks to a
#: bench's steps). A memsave run's points are plain steps timed between its variants' steps: another
#: measurement, comparable with another memsave run only.
STEP_KINDS = ("bench", "profile")


def comparable(a: RunRecord, b: RunRecord) -> bool:
    """Whether A's and B's step times measure the same thing (see STEP_KINDS)."""
    return a.kind == b.kind or (a.kind in STEP_KINDS and b.kind in STEP_KINDS)


def paired_points(a: RunRecord, b: RunRecord) -> list[tuple[Point, Point]]:
    """Points of A and B at the same batch size; in order when they share none."""
    measured_a = [p for p in a.points if p.step_s]
    measured_b = {p.batch_size: p for p in b.points if p.step_s}
    common = [(p, measured_b[p.batch_size]) for p in measured_a if p.batch_size in measured_b]
    return common or list(zip(measured_a, measured_b.values(), strict=False))


def _parts(pa: Point, pb: Point) -> Iterator[tuple[str, str, str, list[float], list[float]]]:
    """(kind, name, phase, A's samples, B's samples) of every stage and layer phase either measured."""
    stages_a = pa.stages.steps if pa.stages is not None else {}
    stages_b = pb.stages.steps if pb.stages is not None else {}
    for name in dict.fromkeys([*stages_a, *stages_b]):
        yield "stage", name, "", stages_a.get(name, []), stages_b.get(name, [])
    layers_a = pa.layers.layer_seconds if pa.layers is not None else {}
    layers_b = pb.layers.layer_seconds if pb.layers is not None else {}
    for module in dict.fromkeys([*layers_a, *layers_b]):
        if module == PROFILER:
            continue
        for phase in LAYER_PHASES:
            sa, sb = layers_a.get(module, {}).get(phase, []), layers_b.get(module, {}).get(phase, [])
            if sa or sb:
                yield "layer", module, phase, sa, sb


def common_factor(total_a: float, total_b: float, a: Sequence[float], b: Sequence[float]) -> float:
    """What the rest of the run changed by: the totals over A's and B's medians without this part's
    own (a changed part must not move the yardstick it is measured against); 1.0 without a rest."""
    rest_a = total_a - (float(np.median(a)) if len(a) and len(b) else 0.0)
    rest_b = total_b - (float(np.median(b)) if len(a) and len(b) else 0.0)
    return rest_b / rest_a if rest_a > 0 and rest_b > 0 else 1.0


def _totals(parts: Sequence[tuple[Any, ...]]) -> tuple[float, float]:
    """A's and B's summed medians over the parts both runs measured."""
    both = [(float(np.median(sa)), float(np.median(sb))) for *_, sa, sb in parts if len(sa) and len(sb)]
    return sum(a for a, _ in both), sum(b for _, b in both)


def cpu_share(record: RunRecord, point: Point) -> float | None:
    """Cores the training process used per thread it ran (1.0: it never waited for a core); None
    without a CPU measurement or off the CPU (a GPU run's host thread waits by design)."""
    if point.stages is None or not str(record.settings.get("device", "cpu")).startswith("cpu"):
        return None
    cores = point.stages.cpu.get("process_cores")
    threads = min(record.settings.get("torch_threads") or 1, point.stages.cpu.get("usable_cores") or 1)
    return None if cores is None else float(cores) / threads


def _starved(a: RunRecord, pa: Point, b: RunRecord, pb: Point, settings: CompareSettings) -> str | None:
    """Why the pair is inconclusive (a run that waited for cores), or None."""
    for name, record, point in (("A", a, pa), ("B", b, pb)):
        share = cpu_share(record, point)
        if share is not None and share < settings.min_cpu_share:
            return f"inconclusive: {name} had {share:.0%} of its cores"
    return None


def compare_runs(a: RunRecord, b: RunRecord, settings: CompareSettings | None = None) -> pd.DataFrame:
    """One row per (batch size, step / stage / layer phase): A's and B's medians, the change, the common
    factor, the change beyond it, each run's noise, the Mann–Whitney p-value, and ``flagged``."""
    settings = settings or CompareSettings()
    rows = []
    for pa, pb in paired_points(a, b):
        step_s = float(np.median(pa.step_s))
        parts = list(_parts(pa, pb))
        # One yardstick per source of samples: stages are parts of the measured steps (whose sum is
        # the step), layers of other steps.
        totals = {
            "stage": (step_s, float(np.median(pb.step_s))),
            "layer": _totals([p for p in parts if p[0] == "layer"]),
        }
        keys = {"batch_a": pa.batch_size, "batch_b": pb.batch_size}
        tests = len(parts) + 1  # the pair's rows share alpha (Bonferroni)
        step = compare_samples(
            pa.step_s, pb.step_s, step_s, settings, min_relative=settings.min_run_relative, tests=tests
        )
        rows.append(keys | {"kind": "step", "name": "step", "phase": ""} | step)
        for kind, name, phase, sa, sb in parts:
            row = compare_samples(sa, sb, step_s, settings, common_factor(*totals[kind], sa, sb), tests=tests)
            rows.append(keys | {"kind": kind, "name": name, "phase": phase} | row)
        starved = _starved(a, pa, b, pb, settings)
        if starved is not None:
            for row in rows[-len(parts) - 1 :]:
                row["flagged"], row["change"] = False, starved
    return pd.DataFrame(rows, columns=COLUMNS)


WATCH_COLUMNS = ["kind", "name", "a", "b", "delta_rel", "p_value", "n_a", "n_b", "flagged", "change"]


def compare_watches(a: RunRecord, b: RunRecord, settings: CompareSettings | None = None) -> pd.DataFrame:
    """Two watch records: the step time row (seconds; judged as the module says) when both have steps,
    then peak RSS (bytes), mean busy cores and each GPU's peak memory (bytes), unjudged."""
    settings = settings or CompareSettings()
    wa, wb = a.watch, b.watch
    assert wa is not None and wb is not None
    rows = []
    steps_a, steps_b = wa.step_s(), wb.step_s()
    if steps_a and steps_b:
        row = compare_samples(
            steps_a, steps_b, float(np.median(steps_a)), settings, min_relative=settings.min_run_relative
        )
        rows.append(
            {"kind": "step", "name": "median step time (s)", "a": row["a_median_s"], "b": row["b_median_s"]}
            | {k: row[k] for k in ("delta_rel", "p_value", "n_a", "n_b", "flagged", "change")}
        )
    summary_a, summary_b = wa.summary(), wb.summary()
    values = [
        ("memory", "peak RSS (bytes)", summary_a["peak_rss_bytes"], summary_b["peak_rss_bytes"]),
        ("cpu", "mean busy cores", summary_a["mean_cpu_cores"], summary_b["mean_cpu_cores"]),
    ]
    gpus_b = {g.index: g for g in wb.gpus}
    for gpu in wa.gpus:
        if gpu.index in gpus_b:
            peaks = [
                max((v for v in g.memory_used_bytes if v is not None), default=None)
                for g in (gpu, gpus_b[gpu.index])
            ]
            values.append(("gpu", f"GPU {gpu.index} peak memory (bytes)", *peaks))
    for kind, name, value_a, value_b in values:
        relative = (value_b - value_a) / value_a if value_a and value_b is not None else np.nan
        rows.append(
            {"kind": kind, "name": name, "a": value_a, "b": value_b, "delta_rel": relative, "p_value": np.nan}
            | {"n_a": 1, "n_b": 1, "flagged": False, "change": ""}
        )
    return pd.DataFrame(rows, columns=WATCH_COLUMNS)
