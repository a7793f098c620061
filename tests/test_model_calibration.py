"""The model's host-cost calibrations against an injected known delay."""

from __future__ import annotations

import time

import pytest
import torch

from dnnperf.perfmodel import calibrate
from dnnperf.perfmodel.issue import gap_seconds

SPIN_S = 40e-3  # tens of times the tiny network's whole step (~1-2 ms): a loaded host's drift of a
# millisecond or two in any phase stays a small share of it


def _spin(*_args: object) -> None:
    """SPIN_S on the host (a forward hook)."""
    started = time.perf_counter()
    while time.perf_counter() - started < SPIN_S:
        pass


def _spin_in_the_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny network spins SPIN_S on the host once a step, in its forward: a hook on the whole
    network, between the last block's calls and the loss's sum."""
    tiny_step = calibrate.tiny_step

    def slowed(device: torch.device | str = "cpu") -> tuple:
        model, step = tiny_step(device)
        model.register_forward_hook(_spin)
        return model, step

    monkeypatch.setattr(calibrate, "tiny_step", slowed)


def test_a_delay_injected_into_one_phase_is_that_phases_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    plain = calibrate.measure_phase_call_cost(repeats=15, passes=2)
    _spin_in_the_forward(monkeypatch)
    slow = calibrate.measure_phase_call_cost(repeats=15, passes=2)
    # The spin, spread over the forward's kernel calls: each block's linear layer and ReLU, and the
    # loss's sum.
    forward_calls = 2 * calibrate.BLOCKS + 1
    assert (slow["forward"] - plain["forward"]) * forward_calls == pytest.approx(SPIN_S, rel=0.15)
    # The other phases do not take it (their whole step's change, a small share of the spin).
    calls = {"backward": 4 * calibrate.BLOCKS, "update": 6 * calibrate.BLOCKS}  # per parameter: SGD's 3
    for phase, count in calls.items():
        assert (slow[phase] - plain[phase]) * count < 0.1 * SPIN_S


def test_known_cold_costs_come_out_of_the_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each call's seconds replaced by known ones: a hot call (the operands of the call before) 1 us
    # plus 0.01 ns a counted byte, a cold one 30 us and 0.05 ns a byte more. The pairs' differences
    # and their fit give back exactly the cold excess, whatever the host does meanwhile.
    call_s, byte_s = 30e-6, 0.05e-9
    last: list[int] = []

    def known(a: torch.Tensor, b: torch.Tensor) -> float:
        counted = 4.0 * (a.numel() + b.numel() + a.shape[0] * b.shape[1])
        hot = 1e-6 + 0.01e-9 * counted
        cold = bool(last) and last[-1] != a.data_ptr()
        last.append(a.data_ptr())
        return hot + (call_s + byte_s * counted if cold else 0.0)

    monkeypatch.setattr(calibrate, "timed_product", known)
    assert calibrate.measure_cold_product_cost(repeats=3, passes=1) == pytest.approx(
        (call_s, byte_s), rel=1e-6
    )


def test_known_rates_of_few_rows_come_out_as_their_fractions(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each product's seconds replaced by known ones: its FLOPs at 50 GFLOP/s times a known fraction
    # for its smallest dimension, the same for the forward and the weight gradient's form. The
    # calibration gives back those fractions against the many-rows products' rate.
    fraction = {1: 0.1, 2: 0.15, 4: 0.3, 8: 0.45, 16: 0.7, 32: 0.85, calibrate.MANY_PRODUCT_ROWS: 1.0}

    def known(a: torch.Tensor, b: torch.Tensor) -> float:
        rows = min(a.shape[0], a.shape[1], b.shape[1])
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / (50e9 * fraction[rows])

    monkeypatch.setattr(calibrate, "timed_product", known)
    found = calibrate.measure_product_rows_efficiency(repeats=2, passes=1)
    assert found == pytest.approx({str(r): f for r, f in fraction.items() if r in calibrate.PRODUCT_ROWS})


def test_python_injected_between_calls_is_charged_as_the_gap_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.set_num_threads(1)
    plain = calibrate.measure_gap_call_cost(passes=2)
    tiny_step = calibrate.tiny_step
    _spin_in_the_forward(monkeypatch)
    slow = calibrate.measure_gap_call_cost(passes=2)
    _, step = tiny_step("cpu")
    calls = gap_seconds(step, warm=1, counted=1)
    # The spin, spread over the forward's operator calls (views included); the backward does not take it.
    assert (slow["forward"] - plain["forward"]) * calls["forward"][1] == pytest.approx(SPIN_S, rel=0.15)
    assert (slow["backward"] - plain["backward"]) * calls["backward"][1] < 0.1 * SPIN_S


def test_a_delay_injected_into_the_compiled_calls_forward_is_spread_over_their_inner_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.set_num_threads(1)
    plain = calibrate.measure_inner_call_cost(repeats=9, passes=2)
    scored_forward = calibrate.scored_forward

    def slowed(scores: tuple) -> tuple:
        model, x = scored_forward(scores)
        if scores is calibrate.COMPOSITE_SCORES:
            model.register_forward_hook(_spin)
        return model, x

    monkeypatch.setattr(calibrate, "scored_forward", slowed)
    slow = calibrate.measure_inner_call_cost(repeats=9, passes=2)
    # The spin, once a forward of the network of compiled calls, spread over the inner calls it adds
    # (counted here by hand: the compiled losses' kernels after their first, the twins' none).
    inner = 0
    for score, twin in zip(calibrate.COMPOSITE_SCORES, calibrate.TWIN_SCORES, strict=True):
        x, w, t = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True), torch.ones(2)
        inner += (_kernels_of(score, x, w, t) - _kernels_of(twin, x, w, t)) * calibrate.BLOCKS // 2
    assert inner > 10 * calibrate.BLOCKS
    assert (slow - plain) * inner == pytest.approx(SPIN_S, rel=0.15)


def _kernels_of(score: object, x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> int:
    """Kernels of one score, counted by a dispatch mode of the test's own."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Kernels(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            # Views and allocations without initialisation launch no kernel.
            Kernels.count += not (func.is_view or func.overloadpacket.__name__.startswith("empty"))
            return out

    with Kernels():
        score(x, w, t)
    return Kernels.count


def test_each_compiled_loss_and_its_twin_run_the_same_outer_calls() -> None:
    """The calibration takes the twin's forward off the compiled one's whole: their kernels other
    than the compiled calls' later ones must match, or it would charge the difference to them."""
    (composite, x), (twin, y) = (
        calibrate.scored_forward(calibrate.COMPOSITE_SCORES),
        calibrate.scored_forward(calibrate.TWIN_SCORES),
    )
    calls_c, inner_c = calibrate.forward_calls(composite, x)
    calls_t, inner_t = calibrate.forward_calls(twin, y)
    assert inner_t == 0 and inner_c > 10 * calibrate.BLOCKS
    assert calls_c - inner_c == calls_t - inner_t


def test_the_update_calibrated_after_a_backward_runs_one_before_every_timed_step(monkeypatch) -> None:
    """Each timed optimizer step of the update's calibration follows one backward of the lead network
    where ``after_backward`` (the default) and none otherwise: counted against the steps the
    calibration times (sets x 3 optimizers x repeats x passes)."""
    from dnnperf.perfmodel import calibrate
    from dnnperf.perfmodel.machine import preset

    leads = []
    monkeypatch.setattr(calibrate, "lead_network", lambda: lambda: leads.append(1))
    machine = preset("seed002")
    sets = ((4, 64), (2, 256))
    found = calibrate.update_samples(machine, repeats=2, passes=1, sets=sets)
    call_s, share = calibrate.update_cost_fit(*found.fitted(step_sets=False))
    assert len(leads) == 2 * 3 * 2 * 1 and call_s >= 0 and share >= 0
    calibrate.update_samples(machine, repeats=2, passes=1, after_backward=False, sets=sets)
    assert len(leads) == 12


def test_the_update_calibration_finds_a_fixed_cost_injected_into_every_optimizer_step(monkeypatch) -> None:
    """Every optimizer step of the update's calibration made 2 ms slower (a sleep after its own work):
    the fit with a fixed cost a step (update_step_fit) finds at least those 2 ms a step, whatever the
    step's size, and gives neither calls nor bytes the delay."""
    from dnnperf.perfmodel import calibrate
    from dnnperf.perfmodel.machine import preset

    delay = 2e-3
    made = calibrate.update_optimizers

    def slowed(params):
        found = made(params)
        for optimizer in found.values():
            step = optimizer.step

            def slow_step(*args, _step=step, **kwargs):
                result = _step(*args, **kwargs)
                time.sleep(delay)
                return result

            optimizer.step = slow_step
        return found

    monkeypatch.setattr(calibrate, "update_optimizers", slowed)
    sets = ((16, 64), (2, 256), (4, 4096))
    found = calibrate.update_samples(preset("seed002"), repeats=3, passes=1, after_backward=False, sets=sets)
    step_s, call_s, _ = calibrate.update_step_fit(*found.fitted(step_sets=True))
    assert step_s >= 0.9 * delay
    # The delay is not read as calls: a step's calls at the fitted cost stay below a step's delay.
    assert max(found.calls) * call_s < delay
