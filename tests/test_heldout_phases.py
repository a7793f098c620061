"""The held-out validation's measured phases (benchmarks/heldout_validation.py) against delays injected
into a step's phases. Timed: run alone (pyproject: markers)."""

from __future__ import annotations

import benchmarks.heldout_validation as heldout
from tests.test_heldout_validation import _StagedTask


def test_each_rounds_phases_hold_the_delays_injected_into_them():
    """A step that sleeps 30 ms in forward, 15 in backward and 5 in update: each round's phase takes at
    least its own sleep (a sleep lasts at least its seconds), and the phases, timed inside the step,
    add up to no more than it (one step a round: its medians are that step's)."""
    task = _StagedTask(0.030, 0.015, 0.005)
    (rounds,) = heldout.measure_steps([(task, {})], warmup=1, rounds=3, steps=1)
    assert len(rounds) == 3
    for step_s, phases in rounds:
        assert set(phases) == {"forward", "backward", "update"}
        assert phases["forward"] >= 0.030 and phases["backward"] >= 0.015 and phases["update"] >= 0.005
        assert sum(phases.values()) <= step_s
