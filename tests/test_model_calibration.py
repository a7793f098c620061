"""The model's host-cost calibrations against an injected known delay."""

from __future__ import annotations

import time

import pytest
import torch

from dnnperf.perfmodel import calibrate

SPIN_S = 40e-3  # tens of times the tiny network's whole step (~1-2 ms): a loaded host's drift of a
# millisecond or two in any phase stays a small share of it


def test_a_delay_injected_into_one_phase_is_that_phases_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    plain = calibrate.measure_phase_call_cost(repeats=15, passes=2)
    tiny_step = calibrate.tiny_step

    def slowed(device: torch.device | str = "cpu") -> tuple:
        model, step = tiny_step(device)

        def spin(*_args: object) -> None:
            started = time.perf_counter()
            while time.perf_counter() - started < SPIN_S:
                pass

        model.register_forward_hook(spin)  # once a step, in the forward phase
        return model, step

    monkeypatch.setattr(calibrate, "tiny_step", slowed)
    slow = calibrate.measure_phase_call_cost(repeats=15, passes=2)
    # The spin, spread over the forward's kernel calls: each block's linear layer and ReLU, and the
    # loss's sum.
    forward_calls = 2 * calibrate.BLOCKS + 1
    assert (slow["forward"] - plain["forward"]) * forward_calls == pytest.approx(SPIN_S, rel=0.15)
    # The other phases do not take it (their whole step's change, a small share of the spin).
    calls = {"backward": 4 * calibrate.BLOCKS, "update": 6 * calibrate.BLOCKS}  # per parameter: SGD's 3
    for phase, count in calls.items():
        assert (slow[phase] - plain[phase]) * count < 0.1 * SPIN_S


def test_a_delay_injected_into_each_cold_product_is_its_call_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    plain = calibrate.measure_cold_product_cost(repeats=5, passes=1)
    timed = calibrate.timed_product
    delay_s = 5e-3  # a hundred times a generic product's own cold excess (20-80 microseconds)

    def slowed(a: torch.Tensor, b: torch.Tensor) -> float:
        return timed(a, b) + delay_s  # as if every cold call took 5 ms longer

    monkeypatch.setattr(calibrate, "timed_product", slowed)
    slow = calibrate.measure_cold_product_cost(repeats=5, passes=1)
    # The delay is the same whatever the product's bytes: the call cost takes it, the byte cost not
    # (at most a fifth of it on the largest product: the host's own per-byte excess is 0.02-0.08 ns).
    assert slow[0] - plain[0] == pytest.approx(delay_s, rel=0.1)
    largest = 4.0 * (256 * 1024 + 1024 * 1024 + 256 * 1024)
    assert abs(slow[1] - plain[1]) * largest < 0.2 * delay_s
