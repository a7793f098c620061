"""The planner: a policy per unit that meets a memory budget with the least predicted overhead.

The model, per unit i in forward order (from one profiled step, docs/memsave.md):

- ``saved`` s_i: bytes its forward saves for backward (the memory profiler's per-layer ``saved``);
- ``inputs`` x_i: bytes a checkpoint of a segment starting at i keeps (the previous unit's output);
- ``forward_s`` f_i: its forward time (what recomputing it costs);
- ``gradients`` g_i: its parameters' gradient bytes (alive once its backward ran).

Memory is simulated at the end of forward and at every unit's backward, walking backward from the
last unit: alive = rest + gradients so far + what earlier units keep (s for keep, the segment input
for recompute, nothing for offload) + the unit's own saved bytes (recomputed segments: the whole
segment's so far: one large recomputed segment recreates the peak) + what is prefetched for earlier
offloaded units (those ending within ``prefetch_bytes`` of saved bytes before it). ``rest``
(parameters, optimizer state, input, workspace) is fitted so that the
all-keep plan predicts the measured peak.

Cost: a recomputed unit costs its forward time; an offloaded byte costs ``offload_s_per_byte``, the
exposed (not overlapped) time per byte measured by an offload-everything step. A greedy search adds
the change with the best peak reduction per second until the budget holds, then drops changes that
are no longer needed; it is repeated with several caps on a segment's size and the cheapest wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from dnnperf.memsave.policy import KEEP, OFFLOAD, RECOMPUTE, Plan, Unit, segments_of


@dataclass(frozen=True)
class UnitCost:
    name: str
    saved: int
    inputs: int
    forward_s: float
    gradients: int


@dataclass
class PlanResult:
    """The chosen plan with its predictions, or why no plan meets the budget."""

    plan: Plan
    budget: int
    feasible: bool
    predicted_peak: int
    predicted_overhead_s: float
    reason: str = ""
    #: Per unit: policy, saved bytes, predicted cost (seconds).
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


class MemoryModel:
    """Predicted peak and overhead of a plan over profiled units (see the module doc)."""

    def __init__(
        self,
        units: Sequence[Unit],
        costs: Sequence[UnitCost],
        measured_peak: int,
        offload_s_per_byte: float,
        prefetch_bytes: int,
        recompute_factor: float = 1.0,
    ) -> None:
        self.units, self.costs = list(units), list(costs)
        self.offload_s_per_byte, self.prefetch_bytes = offload_s_per_byte, prefetch_bytes
        self.recompute_factor = recompute_factor
        self._outputs = [c.inputs for c in self.costs[1:]] + [0]  # a unit's output: the next one's input
        self._position = [0]  # bytes saved before each unit in forward (the stores' clock)
        for c in self.costs:
            self._position.append(self._position[-1] + c.saved)
        keep_all = self._alive_peak({}, [])
        self.rest = measured_peak - keep_all

    def cost(self, policies: dict[str, str]) -> float:
        total = 0.0
        for c in self.costs:
            policy = policies.get(c.name, KEEP)
            if policy == RECOMPUTE:
                total += c.forward_s * self.recompute_factor
            elif policy == OFFLOAD:
                total += c.saved * self.offload_s_per_byte
        return total

    def peak(self, policies: dict[str, str], segments: list[list[str]]) -> int:
        return self.rest + self._alive_peak(policies, segments)

    def _alive_peak(self, policies: dict[str, str], segments: list[list[str]]) -> int:
        n = len(self.costs)
        segment_of: dict[int, int] = {}
        index = {c.name: i for i, c in enumerate(self.costs)}
        for s, segment in enumerate(segments):
            for name in segment:
                segment_of[index[name]] = s
        first = {s: index[seg[0]] for s, seg in enumerate(segments)}
        # What each unit keeps from forward to its backward.
        kept = []
        for i, c in enumerate(self.costs):
            policy = policies.get(c.name, KEEP)
            if policy == KEEP:
                kept.append(c.saved)
            elif policy == RECOMPUTE:
                kept.append(c.inputs if first.get(segment_of.get(i, -1)) == i else 0)
            else:
                kept.append(0)
        offloaded = [c.saved if policies.get(c.name, KEEP) == OFFLOAD else 0 for c in self.costs]
        # End of forward: everything kept, and the last offloaded unit's write still in flight.
        last_offload = next((o for o in reversed(offloaded) if o), 0)
        peak = sum(kept) + last_offload
        prefix = [0]
        for k in kept:
            prefix.append(prefix[-1] + k)
        gradients = 0
        for j in range(n - 1, -1, -1):
            c = self.costs[j]
            gradients += c.gradients
            s = segment_of.get(j)
            if s is not None:  # the segment is recomputed at once; its units' saved bytes come back
                start = first[s]
                own = sum(self.costs[k].saved for k in range(start, j + 1))
                # The recomputed forward also holds each unit's output while the next one runs.
                own += max(self._outputs[k] for k in range(start, j + 1))
                before = prefix[start]
            else:
                own = c.saved
                before = prefix[j]
            # Read back ahead of use: offloaded units ending within prefetch_bytes of this one.
            ahead, i = 0, j - 1
            while i >= 0 and self._position[i + 1] >= self._position[j] - self.prefetch_bytes:
                ahead += offloaded[i]
                i -= 1
            peak = max(peak, before + own + ahead + gradients)
        return peak


def plan_budget(
    units: Sequence[Unit],
    costs: Sequence[UnitCost],
    measured_peak: int,
    budget: int,
    offload_s_per_byte: float,
    prefetch_bytes: int = 64 * 2**20,
    min_bytes: int = 64 * 1024,
    allow: Sequence[str] = (OFFLOAD, RECOMPUTE),
    margin: float = 0.05,
) -> PlanResult:
    """The cheapest plan predicted to stay within ``budget * (1 - margin)`` (the margin covers what
    the model leaves out: recomputation's temporaries, allocator rounding)."""
    model = MemoryModel(units, costs, measured_peak, offload_s_per_byte, prefetch_bytes)
    target = int(budget * (1 - margin))
    total_saved = sum(c.saved for c in costs) or 1
    best: tuple[float, dict[str, str], list[list[str]]] | None = None
    caps = (math.inf, total_saved / 4, total_saved / 16, total_saved / 64)
    for cap in caps:
        policies, segments = _greedy(model, units, costs, target, allow, cap)
        if model.peak(policies, segments) <= target:
            cost = model.cost(policies)
            if best is None or cost < best[0]:
                best = (cost, policies, segments)
    settings = {"min_bytes": min_bytes, "prefetch_bytes": prefetch_bytes}
    if best is None:
        floor, policies, segments = min(
            (
                (model.peak(p, s), p, s)
                for p, s in (_greedy(model, units, costs, 0, allow, cap) for cap in caps)
            ),
            key=lambda found: found[0],
        )
        largest = max(costs, key=lambda c: c.saved)
        reason = (
            f"infeasible: the smallest predicted peak is {floor:,} bytes > {target:,} (budget less "
            f"{margin:.0%} margin); parameters, optimizer state, input and workspace alone take "
            f"{model.rest:,} bytes, gradients {sum(c.gradients for c in costs):,}, and the largest layer "
            f"({largest.name}) needs its {largest.saved:,} saved bytes back in backward"
        )
        plan = Plan(policies=policies, segments=segments, **settings)
        return PlanResult(plan, budget, False, floor, model.cost(policies), reason, _table(model, plan))
    cost, policies, segments = best
    plan = Plan(policies={k: v for k, v in policies.items() if v != KEEP}, segments=segments, **settings)
    return PlanResult(plan, budget, True, model.peak(policies, segments), cost, "", _table(model, plan))


def _greedy(
    model: MemoryModel,
    units: Sequence[Unit],
    costs: Sequence[UnitCost],
    target: int,
    allow: Sequence[str],
    cap: float,
) -> tuple[dict[str, str], list[list[str]]]:
    saved = {c.name: c.saved for c in costs}

    def evaluate(policies: dict[str, str]) -> tuple[int, list[list[str]]]:
        segments = segments_of(list(units), policies, cap, saved)
        return model.peak(policies, segments), segments

    # Moves: one unit offloaded or recomputed, or a run of up to _RUN units of one Sequential
    # recomputed together (recomputing one unit alone keeps its input: no gain by itself).
    moves: list[tuple[list[str], str]] = []
    for i, c in enumerate(costs):
        if c.saved > 0 and OFFLOAD in allow:
            moves.append(([c.name], OFFLOAD))
        if RECOMPUTE in allow:
            for length in range(1, _RUN + 1):
                run = list(units[i : i + length])
                if len(run) < length or (length > 1 and not _one_sequential(run)):
                    break
                moves.append(([u.name for u in run], RECOMPUTE))
    policies: dict[str, str] = {}
    peak, segments = evaluate(policies)
    while peak > target:
        best = None
        for names, policy in moves:
            if all(policies.get(n, KEEP) == policy for n in names):
                continue
            trial = {**policies, **dict.fromkeys(names, policy)}
            trial_peak, trial_segments = evaluate(trial)
            gain = peak - trial_peak
            if gain <= 0:
                continue
            added = model.cost(trial) - model.cost(policies)
            score = gain / max(added, 1e-9)
            if best is None or score > best[0]:
                best = (score, trial, trial_peak, trial_segments)
        if best is None:
            break
        _, policies, peak, segments = best
    # Drop changes the budget no longer needs, most expensive first.
    for c in sorted(costs, key=lambda c: -model.cost({c.name: policies.get(c.name, KEEP)})):
        if policies.get(c.name, KEEP) == KEEP:
            continue
        trial = {**policies, c.name: KEEP}
        trial_peak, trial_segments = evaluate(trial)
        if trial_peak <= target:
            policies, peak, segments = trial, trial_peak, trial_segments
    return policies, segments


_RUN = 8


def _one_sequential(run: Sequence[Unit]) -> bool:
    parent = run[0].sequential
    return parent is not None and all(
        u.sequential == parent and u.index == run[0].index + k for k, u in enumerate(run)
    )


def _table(model: MemoryModel, plan: Plan) -> pd.DataFrame:
    rows = []
    for c in model.costs:
        policy = plan.policy(c.name)
        rows.append(
            {
                "unit": c.name,
                "policy": policy,
                "saved_bytes": c.saved,
                "forward_s": c.forward_s,
                "predicted_cost_s": model.cost({c.name: policy}),
            }
        )
    return pd.DataFrame(rows)


def sqrt_checkpointing(units: Sequence[Unit]) -> Plan:
    """Chen et al.'s sqrt(n) checkpointing: the units in about sqrt(n) consecutive segments, each
    recomputed (only segment inputs kept); a segment is also cut where units leave one Sequential."""
    n = len(units)
    size = max(1, math.ceil(n / max(1, round(math.sqrt(n)))))
    policies = {u.name: RECOMPUTE for u in units}
    segments: list[list[str]] = []
    for start in range(0, n, size):
        chunk = list(units[start : start + size])
        segments.extend(segments_of(chunk, policies))
    return Plan(policies=policies, segments=segments, min_bytes=0)
