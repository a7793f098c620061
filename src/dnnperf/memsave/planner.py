"""The planner: a policy per unit that meets a memory budget with the least predicted overhead.

The model (docs/memsave.md), from one profiled step: per unit its forward time ``forward_s`` (what
recomputing it costs) and its parameters' ``gradients`` (alive once its backward ran); and, from
``storages.profile_storages``, every tensor saved for backward with the unit that saved it and the
storage it lies on, and each unit's input and output storages. (``saved``, the bytes of the storages a
unit is the first to save, is only shown and caps segment sizes.)

The saved-tensor hook is replayed for a plan (packs inside recomputed segments bypass it; a segment
saves its input where it starts; a storage offloaded once is reused by every later saver), so a
storage is freed in forward only when every unit saving it drops it. Memory is simulated at each
unit's forward (what is kept so far, the write in flight, and what the model does not see there: how
far the unoptimised step's measured bytes during that unit's forward, ``UnitCost.forward_peak``,
exceed the model's), at the end of forward, and at every unit's backward, walking backward from the
last unit: kept storages (until
their earliest keeper's backward), read-back buffers (from when backward comes within
``prefetch_bytes`` of them on the hook's clock, or their first use, until their earliest user's
backward), a recomputed segment's storages (recreated at once at its last unit) and its largest
unsaved output, the gradients of the unit's output and input, the parameters' gradients so far, and
what the model does not see there (a convolution's backward workspace): how far the unoptimised step's
measured bytes during that unit's backward (``UnitCost.backward_peak``) exceed the model's.
``rest`` (parameters, optimizer state, input, what the model does not see anywhere) is fitted so that
neither the all-keep plan nor any measured ``calibration`` plan is predicted below its measured peak.

Cost: a recomputed unit costs its forward time; an offloaded byte costs ``offload_s_per_byte``, the
exposed (not overlapped) time per byte measured by an offload-everything step.

The training state (``state.StateSaver``: each update fused into backward, the optimizer state off the
device) is a second mode, searched beside the first when its baseline was measured: a unit's backward
then holds its own parameters' gradients only (not every gradient so far), ``rest`` is fitted on the
measured state baseline (which has no optimizer state), and every plan pays that baseline's measured
added time. A greedy search adds
the change with the best peak reduction per second until the budget holds, then drops changes that
are no longer needed; it is repeated with several caps on a segment's size and the cheapest wins.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from dnnperf.memsave.policy import Unit, segments_of
from dnnperf.memsave.storages import StorageProfile, profile_from_units
from dnnperf.results.memsave import KEEP, OFFLOAD, RECOMPUTE, Plan


@dataclass(frozen=True)
class UnitCost:
    name: str
    saved: int
    inputs: int
    forward_s: float
    gradients: int
    #: The unoptimised step's most bytes alive while the unit's backward allocated (memory profiler's
    #: ``backward_peak``; 0: not measured).
    backward_peak: int = 0
    #: The same while its forward allocated (``forward_peak``).
    forward_peak: int = 0


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan already run: its measured peak and added seconds a step."""

    name: str
    plan: Plan
    peak: int
    overhead_s: float


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


def read_ahead_window(profile: StorageProfile, min_bytes: int) -> int:
    """How far backward reads ahead, in bytes of the saved-tensor hook's clock: one unit's worth (the
    most any unit packs that could be offloaded). Enough to read the next unit's tensors back while
    this one's backward runs, without bringing back so much at once that backward's start recreates
    the peak. The one definition: the offload-everything run that calibrates the planner and the
    planner's own plans (and its model of them) all use it."""
    per_unit: dict[int, int] = {}
    for p in profile.packs:
        if p.unit is not None and p.storage is not None and p.nbytes >= min_bytes:
            per_unit[p.unit] = per_unit.get(p.unit, 0) + p.nbytes
    return max(per_unit.values(), default=0)


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
        profile: StorageProfile | None = None,
        min_bytes: int = 0,
        calibration: Sequence[tuple[Plan, int]] = (),
        fused_update: bool = False,
        baseline_peak: int | None = None,
    ) -> None:
        self.units, self.costs = list(units), list(costs)
        self.offload_s_per_byte, self.prefetch_bytes = offload_s_per_byte, prefetch_bytes
        self.recompute_factor, self.min_bytes = recompute_factor, min_bytes
        if profile is None:
            profile = profile_from_units([c.saved for c in costs], [c.inputs for c in costs])
        self.profile = profile
        n = len(self.costs)
        self._index = {c.name: i for i, c in enumerate(self.costs)}
        size = [s.nbytes for s in profile.storages]
        self._size = size
        self._external = [s.external for s in profile.storages]
        # Per unit: the storages its forward saves (each once, in order).
        self._saves: list[list[int]] = [[] for _ in range(n)]
        for p in profile.packs:
            if p.unit is not None and p.storage is not None and p.storage not in self._saves[p.unit]:
                self._saves[p.unit].append(p.storage)

        def live(storages: Iterable[int]) -> int:
            return sum(size[k] for k in storages if not self._external[k])

        # Backward at unit j holds the gradient of its output, then also that of its input (which a
        # recomputation before it does not overlap: its temporaries are gone by then).
        self._output_gradient = [live(profile.outputs[j]) for j in range(n)]
        self._input_gradient = [live(set(profile.inputs[j]) - set(profile.outputs[j])) for j in range(n)]
        # The parameters' gradients alive at unit j's backward: every one so far, or (the update fused
        # into backward) the unit's own until they are applied.
        every_so_far = [0] * (n + 1)
        for j in range(n - 1, -1, -1):
            every_so_far[j] = every_so_far[j + 1] + self.costs[j].gradients
        own = [c.gradients for c in self.costs]
        # What the model does not see at each unit's backward (a convolution's workspace): how far the
        # unoptimised step's measured bytes there exceed the model's, with ``rest`` fitted on that
        # step's peak (``baseline_peak``, measured without the update fused); never below zero, so the
        # unoptimised step is still predicted at its measured peak.
        # The same in forward, at each unit (its temporaries beside what is kept so far).
        self._workspace = [0] * n
        self._forward_workspace = [0] * n
        self._parameter_gradients = every_so_far
        if any(c.backward_peak or c.forward_peak for c in self.costs):
            forward, _, at, ahead = self._simulate({}, [])
            base_rest = (measured_peak if baseline_peak is None else baseline_peak) - max([forward, *at])
            self._workspace = [
                max(0, c.backward_peak - base_rest - a) if c.backward_peak else 0
                for c, a in zip(self.costs, at, strict=True)
            ]
            self._forward_workspace = [
                max(0, c.forward_peak - base_rest - a) if c.forward_peak else 0
                for c, a in zip(self.costs, ahead, strict=True)
            ]
        if fused_update:
            self._parameter_gradients = own
        # ``rest`` (parameters, optimizer state, input, workspace, what the model leaves out) is fitted
        # so that no measured plan is predicted below its measured peak: the unoptimised step, and the
        # baselines measured before planning (their peaks fall where this one's do not: at an early
        # layer's backward, whose temporaries the model does not see).
        self.rest = measured_peak - self._alive({}, [])
        for plan, peak in calibration:
            self.rest = max(self.rest, peak - self._alive(plan.policies, plan.segments))

    # -- the model -----------------------------------------------------------------------------------

    def _alive(self, policies: dict[str, str], segments: list[list[str]]) -> int:
        """The predicted alive bytes at the peak, less ``rest``."""
        forward, _, at, _ = self._simulate(policies, segments)
        return max([forward, *at])

    def _simulate(
        self, policies: dict[str, str], segments: list[list[str]]
    ) -> tuple[int, list[int], list[int], list[int]]:
        """Less ``rest``: the predicted alive bytes at forward's highest (at its end, or at a unit's
        forward with what the model does not see there), the bytes each unit writes, the alive bytes at
        each unit's backward, and at each unit's forward what is kept so far and the write in flight."""
        profile, size, external = self.profile, self._size, self._external
        n = len(self.costs)
        recompute = [policies.get(c.name, KEEP) == RECOMPUTE for c in self.costs]
        offload = [policies.get(c.name, KEEP) == OFFLOAD for c in self.costs]
        spans = [(self._index[seg[0]], self._index[seg[-1]]) for seg in segments]
        # A checkpointed segment saves its input through the hook (as kept) where its forward starts.
        inserted: dict[int, list[tuple[int, int]]] = {}
        for start, _ in spans:
            for k in profile.inputs[start]:
                inserted.setdefault(profile.packs_before[start], []).append((start, k))
        inf = math.inf
        hold: dict[int, int] = {}  # storage -> the earliest unit keeping it (alive until its backward)
        handle_end: dict[int, int] = {}  # offloaded storage -> where it ends on the hook's clock
        users: dict[int, list[int]] = {}  # offloaded storage -> [earliest, latest] unit using it
        order: list[int] = []
        written = [0] * n
        first_position = [inf] * (n + 1)  # per unit (n: outside units): its first pack on the clock
        clock = 0
        kept_now = 0  # forward: bytes kept so far
        ahead = [0] * n  # forward, at each unit: kept so far and the write in flight

        def in_flight() -> int:
            last = order[-1] if order else None
            return size[last] if last is not None and last not in hold and not external[last] else 0

        def pack(u: int, k: int | None, nbytes: int, may_write: bool) -> None:
            nonlocal clock, kept_now
            offloadable = k is not None and nbytes >= self.min_bytes
            position = clock
            if offloadable:
                clock += nbytes
            first_position[u] = min(first_position[u], position)
            if k is None:
                return
            if offloadable and k in handle_end:  # saved again after it was offloaded: the handle
                pair = users[k]
                pair[0], pair[1] = min(pair[0], u), max(pair[1], u)
            elif offloadable and may_write:
                handle_end[k] = position + nbytes
                users[k] = [u, u]
                order.append(k)
                written[u] += nbytes
            else:
                if k not in hold and not external[k]:
                    kept_now += size[k]
                hold[k] = min(hold.get(k, n), u)

        for i, p in enumerate(profile.packs):
            for start, k in inserted.get(i, ()):
                pack(start, k, size[k], False)
            u = n if p.unit is None else p.unit
            if u < n and not recompute[u]:  # a recomputed unit's packs go to the checkpoint's hooks
                pack(u, p.storage, p.nbytes, offload[u])
            elif u == n:
                pack(u, p.storage, p.nbytes, False)
            if u < n:
                ahead[u] = max(ahead[u], kept_now + in_flight())
        for start, k in inserted.get(len(profile.packs), ()):
            pack(start, k, size[k], False)
        for u in range(1, n):  # a unit that saves nothing runs beside what the one before left
            ahead[u] = ahead[u] or ahead[u - 1]

        # End of forward: what is kept, and the last write still in flight; and each unit's forward.
        forward = sum(size[k] for k in hold if not external[k]) + in_flight()
        forward = max([forward, *(a + w for a, w in zip(ahead, self._forward_workspace, strict=True))])
        # Backward: bytes alive over unit ranges [lo, hi], as a difference array.
        diff = [0] * (n + 1)

        def alive(lo: int, hi: int, nbytes: int) -> None:
            hi = min(hi, n - 1)
            if lo <= hi:
                diff[lo] += nbytes
                diff[hi + 1] -= nbytes

        for k, earliest in hold.items():
            if not external[k]:
                alive(earliest, n - 1, size[k])
        # Read back: when backward first reaches a clock position within the window after the
        # storage's end (or at its first use), until its earliest user's backward is done.
        reached = [inf] * (n + 1)
        for j in range(n, -1, -1):
            reached[j] = min(first_position[j], reached[j + 1] if j < n else inf)
        for k, end in handle_end.items():
            prefetched = bisect.bisect_right(reached, end + self.prefetch_bytes) - 1
            alive(users[k][0], max(users[k][1], prefetched), size[k])
        # Recomputed segments: at once, at the segment's last unit; each storage kept until the
        # backward of the earliest unit of the segment saving it; the largest output unsaved inside.
        temporary = [0] * n
        for start, end in spans:
            copies: dict[int, int] = {}
            kept = profile.inputs[start]  # the checkpoint's input: recomputed in place, not copied
            for u in range(start, end + 1):
                for k in self._saves[u]:
                    if k not in copies and not external[k] and k not in kept:
                        copies[k] = u
            for k, u in copies.items():
                alive(u, end, size[k])
            temporary[end] = max(
                (
                    sum(size[k] for k in profile.outputs[u] if k not in copies and k not in kept)
                    for u in range(start, end + 1)
                ),
                default=0,
            )
        at, running = [0] * n, 0
        for j in range(n):
            running += diff[j]
            gradients = self._parameter_gradients[j] + self._output_gradient[j]
            at[j] = running + gradients + max(temporary[j], self._input_gradient[j]) + self._workspace[j]
        return forward, written, at, ahead

    def evaluate(self, policies: dict[str, str], segments: list[list[str]]) -> tuple[int, float]:
        """Predicted peak (bytes) and added seconds of a plan."""
        forward, written, at, _ = self._simulate(policies, segments)
        return self.rest + max([forward, *at]), sum(self._unit_costs(policies, written))

    def _unit_costs(self, policies: dict[str, str], written: list[int]) -> list[float]:
        out = []
        for c, nbytes in zip(self.costs, written, strict=True):
            policy = policies.get(c.name, KEEP)
            if policy == RECOMPUTE:
                out.append(c.forward_s * self.recompute_factor)
            else:
                out.append(nbytes * self.offload_s_per_byte)
        return out

    def unit_costs(self, policies: dict[str, str], segments: list[list[str]]) -> list[float]:
        """Per unit: its forward time if recomputed, the bytes it writes times the exposed seconds per
        offloaded byte (a storage already kept by an earlier unit is written anyway, and read back
        beside it)."""
        return self._unit_costs(policies, self._simulate(policies, segments)[1])

    def cost(self, policies: dict[str, str], segments: list[list[str]] | None = None) -> float:
        return self.evaluate(policies, segments or [])[1]

    def peak(self, policies: dict[str, str], segments: list[list[str]]) -> int:
        return self.evaluate(policies, segments)[0]


def plan_budget(
    units: Sequence[Unit],
    costs: Sequence[UnitCost],
    measured_peak: int,
    budget: int,
    offload_s_per_byte: float,
    prefetch_bytes: int | None = None,
    min_bytes: int = 64 * 1024,
    allow: Sequence[str] = (OFFLOAD, RECOMPUTE),
    margin: float = 0.02,
    profile: StorageProfile | None = None,
    calibration: Sequence[tuple[Plan, int]] = (),
    measured: Sequence[MeasuredPlan] = (),
    recompute_factor: float = 1.0,
    state: MeasuredPlan | None = None,
    state_only: bool = False,
    state_offload_s_per_byte: float | None = None,
) -> PlanResult:
    """The cheapest plan predicted to stay within ``budget * (1 - margin)`` (the margin covers what
    the model leaves out: recomputation's temporaries, allocator rounding; small, since ``memsave``
    measures every plan and replans one that misses). ``profile``: which units
    save each storage (``storages.profile_storages``; without it each unit's saved bytes are taken as
    its own storage). ``prefetch_bytes``: the read-ahead window (default ``read_ahead_window``).
    ``calibration``: (plan, measured peak) of plans already measured; none is predicted below it.
    ``measured``: plans already run (the baselines): one whose measured peak is within the budget is a
    candidate at its measured cost, so the plan chosen is never costlier than a baseline known to fit
    (the model, fitted to never predict below a measured peak, cannot promise less than sqrt(n)'s
    own peak for any plan: at that budget the choice is between sqrt(n) and what the model finds).
    ``recompute_factor``: a recomputed unit costs its forward time times this (``run.recompute_factor``).
    ``state``: the measured training-state baseline (``Plan(training_state=OFFLOAD)``, nothing else):
    plans with the training state offloaded are searched too, each paying its measured added time;
    ``state_only``: only those; ``state_offload_s_per_byte``: an offloaded byte's cost in that mode
    (measured beside the state's own reads and writes; default ``offload_s_per_byte``)."""
    if profile is None:
        profile = profile_from_units([c.saved for c in costs], [c.inputs for c in costs])
    if prefetch_bytes is None:
        prefetch_bytes = read_ahead_window(profile, min_bytes)
    # (training-state mode, its model, the added seconds every plan of that mode pays)
    wanted = [(KEEP, measured_peak, 0.0, offload_s_per_byte)] if state is None or not state_only else []
    if state is not None:
        per_byte = offload_s_per_byte if state_offload_s_per_byte is None else state_offload_s_per_byte
        wanted.append((OFFLOAD, state.peak, state.overhead_s, per_byte))
    modes = [
        (
            mode,
            MemoryModel(
                units,
                costs,
                peak,
                per_byte,
                prefetch_bytes,
                recompute_factor=recompute_factor,
                profile=profile,
                min_bytes=min_bytes,
                calibration=[(p, m) for p, m in calibration if p.training_state == mode],
                fused_update=mode == OFFLOAD,
                baseline_peak=measured_peak,
            ),
            extra,
        )
        for mode, peak, extra, per_byte in wanted
    ]
    target = int(budget * (1 - margin))
    total_saved = sum(c.saved for c in costs) or 1
    caps = (math.inf, total_saved / 4, total_saved / 16, total_saved / 64)
    best: tuple[float, str, MemoryModel, dict[str, str], list[list[str]]] | None = None
    for mode, model, extra in modes:
        for cap in caps:
            policies, segments = _greedy(model, units, costs, target, allow, cap)
            peak, cost = model.evaluate(policies, segments)
            if peak <= target and (best is None or cost + extra < best[0]):
                best = (cost + extra, mode, model, policies, segments)
    settings = {"min_bytes": min_bytes, "prefetch_bytes": prefetch_bytes}
    candidates = [*measured, *([state] if state is not None else [])]
    allowed = {mode for mode, _, _ in modes}
    fits = [m for m in candidates if m.peak <= budget and m.plan.training_state in allowed]
    known = min(fits, key=lambda m: m.overhead_s, default=None)
    if known is not None and (best is None or known.overhead_s < best[0]):
        model = next(model for mode, model, _ in modes if mode == known.plan.training_state)
        table = _table(model, known.plan, state)
        reason = (
            f"the measured {known.name} plan: {known.peak:,} bytes, within the budget, at "
            f"{known.overhead_s * 1e3:.1f} ms a step"
        )
        if best is not None:
            reason += f", cheaper than the model's best plan ({best[0] * 1e3:.1f} ms predicted)"
        return PlanResult(known.plan, budget, True, known.peak, known.overhead_s, reason, table)
    if best is None:
        floor, mode, model, policies, segments = min(
            (
                (model.peak(p, s), mode, model, p, s)
                for mode, model, _ in modes
                for p, s in (_greedy(model, units, costs, 0, allow, cap) for cap in caps)
            ),
            key=lambda found: found[0],
        )
        largest = max(costs, key=lambda c: c.saved)
        keep_model = next((model for mode, model, _ in modes if mode == KEEP), None)
        reason = (
            f"infeasible: the smallest predicted peak is {floor:,} bytes > {target:,} (budget less "
            f"{margin:.0%} margin)"
        )
        if keep_model is not None:
            reason += (
                f"; parameters, optimizer state, input and workspace alone take {keep_model.rest:,} bytes, "
                f"gradients {sum(c.gradients for c in costs):,}"
            )
        if state is not None:
            reason += (
                f"; with the training state off the device, parameters, input and workspace take "
                f"{next(m for k, m, _ in modes if k == OFFLOAD).rest:,} bytes"
            )
        reason += (
            f"; the largest layer ({largest.name}) needs its {largest.saved:,} saved bytes back in backward"
        )
        plan = Plan(policies=policies, segments=segments, training_state=mode, **settings)
        cost = model.evaluate(policies, segments)[1] + (
            state.overhead_s if mode == OFFLOAD and state else 0.0
        )
        return PlanResult(plan, budget, False, floor, cost, reason, _table(model, plan, state))
    cost, mode, model, policies, segments = best
    plan = Plan(
        policies={k: v for k, v in policies.items() if v != KEEP},
        segments=segments,
        training_state=mode,
        **settings,
    )
    return PlanResult(
        plan, budget, True, model.peak(policies, segments), cost, "", _table(model, plan, state)
    )


def _greedy(
    model: MemoryModel,
    units: Sequence[Unit],
    costs: Sequence[UnitCost],
    target: int,
    allow: Sequence[str],
    cap: float,
) -> tuple[dict[str, str], list[list[str]]]:
    saved = {c.name: c.saved for c in costs}

    def evaluate(policies: dict[str, str]) -> tuple[int, float, list[list[str]]]:
        segments = segments_of(list(units), policies, cap, saved)
        return (*model.evaluate(policies, segments), segments)

    # Moves: one unit offloaded or recomputed, or a run of up to _RUN units of one Sequential
    # recomputed together (recomputing one unit alone keeps its input: no gain by itself).
    moves: list[tuple[list[str], str]] = []
    for i, c in enumerate(costs):
        if OFFLOAD in allow:
            moves.append(([c.name], OFFLOAD))
        if RECOMPUTE in allow:
            for length in range(1, _RUN + 1):
                run = list(units[i : i + length])
                if len(run) < length or (length > 1 and not _one_sequential(run)):
                    break
                moves.append(([u.name for u in run], RECOMPUTE))
    policies: dict[str, str] = {}
    peak, cost, segments = evaluate(policies)
    while peak > target:
        best = None
        for names, policy in moves:
            if all(policies.get(n, KEEP) == policy for n in names):
                continue
            trial = {**policies, **dict.fromkeys(names, policy)}
            trial_peak, trial_cost, trial_segments = evaluate(trial)
            gain = peak - trial_peak
            if gain <= 0:
                continue
            score = gain / max(trial_cost - cost, 1e-9)
            if best is None or score > best[0]:
                best = (score, trial, trial_peak, trial_cost, trial_segments)
        if best is None:
            break
        _, policies, peak, cost, segments = best
    # Drop changes the budget no longer needs, most expensive first.
    each = dict(zip((c.name for c in costs), model.unit_costs(policies, segments), strict=True))
    for c in sorted(costs, key=lambda c: -each[c.name]):
        if policies.get(c.name, KEEP) == KEEP:
            continue
        trial = {**policies, c.name: KEEP}
        trial_peak, trial_cost, trial_segments = evaluate(trial)
        if trial_peak <= target:
            policies, peak, cost, segments = trial, trial_peak, trial_cost, trial_segments
    return policies, segments


_RUN = 8


def _one_sequential(run: Sequence[Unit]) -> bool:
    parent = run[0].sequential
    return parent is not None and all(
        u.sequential == parent and u.index == run[0].index + k for k, u in enumerate(run)
    )


def _table(model: MemoryModel, plan: Plan, state: MeasuredPlan | None = None) -> pd.DataFrame:
    rows = []
    each = model.unit_costs(plan.policies, plan.segments)
    for c, cost in zip(model.costs, each, strict=True):
        rows.append(
            {
                "unit": c.name,
                "policy": plan.policy(c.name),
                "saved_bytes": c.saved,
                "forward_s": c.forward_s,
                "predicted_cost_s": cost,
            }
        )
    if plan.training_state == OFFLOAD:
        rows.append(
            {
                "unit": "(training state: update fused into backward)",
                "policy": OFFLOAD,
                "saved_bytes": 0,
                "forward_s": 0.0,
                "predicted_cost_s": state.overhead_s if state is not None else 0.0,
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
