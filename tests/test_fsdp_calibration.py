"""FSDP's host-work calibration (perfmodel/fsdp_calibration.py): the fit against costs injected into
synthetic timings, and the 2-rank microbenchmark's counts of groups, tensors and update calls against
a hand count of its stacks."""

from __future__ import annotations

import tempfile

import pytest

from dnnperf.perfmodel import fsdp_calibration
from dnnperf.perfmodel.fsdp_calibration import CONFIGS, FsdpCost, Sample, fit

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def _synthetic(cost: FsdpCost, calls_per_tensor: int = 10) -> list[Sample]:
    """The samples a host with exactly ``cost`` gives for the microbenchmark's configurations."""
    samples = []
    for units, layers in CONFIGS:
        groups, tensors = units + 1, 2 * units * layers + 2
        calls = calls_per_tensor * tensors
        seconds = cost.step_s + groups * cost.unit_s + tensors * cost.param_s
        samples.append(Sample(groups, tensors, calls, seconds, calls * cost.update_call_s))
    return samples


@pytest.mark.parametrize(
    "cost",
    [
        FsdpCost(2e-4, 1.2e-3, 1e-4, 2e-5),
        FsdpCost(0.0, 5e-4, 0.0, 0.0),  # per group only: the tensors' figure is not invented
        FsdpCost(0.0, 0.0, 3e-4, 1e-6),
    ],
)
def test_the_fit_recovers_injected_costs(cost):
    found = fit(_synthetic(cost))
    for name in FsdpCost._fields:
        assert getattr(found, name) == pytest.approx(getattr(cost, name), abs=1e-12), name


def test_a_negative_intercept_is_refitted_through_the_origin():
    """Steps that grow faster than the groups and tensors (a busy host in the large stacks): the
    intercept would be negative; the fit then goes through 0 and keeps the slopes non-negative."""
    samples = [s._replace(step_s=s.step_s - 1e-3) for s in _synthetic(FsdpCost(0.0, 1e-3, 1e-4, 0.0))]
    found = fit(samples)
    assert found.step_s == 0.0 and found.unit_s > 0 and found.param_s >= 0


def test_the_microbenchmark_counts_its_stacks_by_hand(tmp_path, monkeypatch):
    """2 gloo ranks, one timed round: per configuration the units and the root, 2 tensors a layer
    (the head's included), and AdamW's 10 calls a tensor on the CPU's per-tensor path (the step
    count's add_, the decay's mul_, the moments' lerp_, mul_ and addcmul_, then _local_scalar_dense,
    sqrt, div, the epsilon's add_ and addcdiv_). The scratch directory is gone afterwards."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    samples = fsdp_calibration.measure(repeats=1, timeout_s=240.0)
    assert [(s.groups, s.tensors) for s in samples] == [(u + 1, 2 * u * k + 2) for u, k in CONFIGS]
    assert [s.update_calls for s in samples] == [10 * s.tensors for s in samples]
    assert list(scratch.iterdir()) == []


def test_a_rank_that_fails_or_overruns_is_named_with_its_last_line():
    import subprocess
    import sys

    from dnnperf.distributed.lifeline import wait_for_ranks
    from dnnperf.errors import DnnperfError

    def rank(code: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)

    failing = [rank("pass"), rank("import sys; sys.exit('no gloo here')")]
    with pytest.raises(DnnperfError, match=r"^bench: rank 1 failed: no gloo here$"):
        wait_for_ranks(failing, 60.0, "bench")
    slow = [rank("import time; time.sleep(30)")]
    try:
        with pytest.raises(DnnperfError, match=r"^bench: rank 0 did not finish in 0.5 s$"):
            wait_for_ranks(slow, 0.5, "bench")
    finally:
        slow[0].kill()
        slow[0].wait()
