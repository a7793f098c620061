"""Memory bandwidth: copy and triad from sizes well inside the caches to well beyond them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import torch

from dnnperf.calibration.plans import Plan
from dnnperf.calibration.timing import (
    Tracker,
    bytes_text,
    calls_per_sample,
    free_memory,
    measure,
    release,
    time_samples,
    warm_up,
)
from dnnperf.devices import is_out_of_memory
from dnnperf.hardware import (
    BYTES_MOVED_FACTOR,
    DRAM_FACTOR,
    TENSORS_TOUCHED,
    BandwidthCurve,
    CacheLevel,
    KernelTiming,
    bytes_moved,
)


class MemorySweeps:
    """Copy and triad at every size, in ``plan.memory_sweeps`` sweeps over the sizes (largest first,
    then smallest first, alternately), run one at a time by :meth:`sweep` so that the calibration can
    spread them between its compute curves: a neighbour's burst of memory traffic then lands on some
    of every size's samples, not on all of them. Within a sweep both kernels time the same float32
    tensors, allocated and touched once per size before any timing; a size keeps its calls per
    sample from its first sweep, and its samples from every sweep are pooled.

    :meth:`probe` adds one triad sample of the smallest size that counts as DRAM (working set at least
    DRAM_FACTOR x the last-level cache of ``caches``) whenever it is called: the calibration calls it
    between compute rounds, so the DRAM plateau, whose speed a neighbour's memory traffic moves by
    tens of percent for seconds at a time, is sampled all along the calibration."""

    def __init__(
        self, device: torch.device, plan: Plan, tracker: Tracker, caches: Sequence[CacheLevel] = ()
    ) -> None:
        self.device, self.plan, self.tracker = device, plan, tracker
        self.sweeps = max(1, plan.memory_sweeps)
        self.done = 0
        #: Progress weight of one kernel at one size in one sweep.
        self.weight = (plan.memory_s + self.sweeps * plan.memory_warmup_s) / self.sweeps
        limit = free_memory(device) // 4  # leave room for everything else on the machine
        self.sizes = [n for n in plan.memory_sizes if max(TENSORS_TOUCHED.values()) * n <= limit]
        self.skipped = set(plan.memory_sizes) - set(self.sizes)
        tracker.skip(2 * len(self.skipped) * self.sweeps * self.weight)
        self.calls: dict[tuple[str, int], int] = {}
        self.seconds: dict[tuple[str, int], list[float]] = {}
        last_level = max((c.capacity for c in caches), default=0)
        dram = [
            n for n in self.sizes if last_level and TENSORS_TOUCHED["triad"] * n >= DRAM_FACTOR * last_level
        ]
        #: The size :meth:`probe` times, None when no size is known to be beyond the caches.
        self.probe_size: int | None = min(dram, default=None)
        self._probe: Callable[[], object] | None = None

    def probe(self) -> None:
        """One more triad sample at :attr:`probe_size` (its tensors allocated at the first call)."""
        if self.probe_size is None or self.probe_size in self.skipped:
            return
        key = ("triad", self.probe_size)
        if self._probe is None:
            numel = self.probe_size // 4
            try:
                a, b, c = (
                    torch.empty(numel, device=self.device, dtype=torch.float32).fill_(1.0) for _ in range(3)
                )
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                self.probe_size = None
                release(self.device)
                return
            self._probe = partial(torch.add, b, c, alpha=0.5, out=a)
            per_call = warm_up(self._probe, self.device, self.plan.memory_warmup_s)
            self.calls.setdefault(key, calls_per_sample(per_call, self.plan))
        self._probe()  # untimed: brings the pages back into the TLB after the compute kernels
        samples = time_samples(self._probe, self.device, self.calls[key], 1)
        self.seconds.setdefault(key, []).extend(samples)

    def release_probe(self) -> None:
        self._probe = None
        release(self.device)

    def sweep(self) -> None:
        """The next sweep over every size."""
        plan, device, index = self.plan, self.device, self.done
        self.done += 1
        for nbytes in self.sizes[::-1] if index % 2 == 0 else self.sizes:
            if nbytes in self.skipped:
                self.tracker.skip(2 * self.weight)
                continue
            numel = nbytes // 4
            try:
                a, b, c = (
                    torch.empty(numel, device=device, dtype=torch.float32).fill_(1.0) for _ in range(3)
                )
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                self.skipped.add(nbytes)
                self.tracker.skip(2 * self.weight)
                release(device)
                continue
            kernels = {
                "copy": partial(a.copy_, b),
                "triad": partial(torch.add, b, c, alpha=0.5, out=a),
            }
            for kernel, fn in kernels.items():
                key = (kernel, nbytes)
                text = f"memory {kernel} {bytes_text(nbytes)} sweep {index + 1}/{self.sweeps}"
                with self.tracker.step(text, self.weight):
                    self.calls[key], samples = measure(
                        fn,
                        device,
                        plan,
                        plan.memory_s / self.sweeps,
                        plan.memory_warmup_s,
                        calls=self.calls.get(key),
                        min_repeats=math.ceil(plan.min_repeats / self.sweeps),
                    )
                self.seconds.setdefault(key, []).extend(samples)
            del a, b, c, kernels
            release(device)

    def curves(self, notes: list[str]) -> tuple[BandwidthCurve, ...]:
        """The curves of every sweep and probe (the sweeps not run yet run first)."""
        self.release_probe()
        while self.done < self.sweeps:
            self.sweep()
        if self.skipped:
            sizes = ", ".join(map(bytes_text, sorted(self.skipped)))
            notes.append(f"memory sizes skipped for lack of free memory: {sizes}")
        curves = []
        for kernel in BYTES_MOVED_FACTOR:
            points = []
            for nbytes in self.plan.memory_sizes:
                key = (kernel, nbytes)
                if nbytes in self.skipped or key not in self.seconds:
                    continue
                params = {"nbytes": nbytes, "footprint": TENSORS_TOUCHED[kernel] * nbytes, "dtype": "float32"}
                moved = float(bytes_moved(kernel, nbytes))
                label = f"{kernel} {bytes_text(nbytes)}"
                points.append(
                    KernelTiming(label, moved, "B", self.calls[key], tuple(self.seconds[key]), params)
                )
            curves.append(BandwidthCurve(kernel, tuple(points)))
        return tuple(curves)
