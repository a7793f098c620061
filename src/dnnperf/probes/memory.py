"""Memory of one training step by data structure, over time and per layer.

Every storage the step's operators create is seen by the operator counter's dispatch mode (an
observer on :class:`~dnnperf.analysis.opcount.OpCounter`): its bytes, when it was made, in which module
and phase. Whether it is still alive is asked of torch before each new allocation (a weak reference to
the storage), so the live bytes are known at every allocation, which is when a peak can happen.
What each storage *was* is decided when the step ends:

- parameters: the model's parameters (before the step);
- gradients: ``.grad`` of a parameter when the update begins;
- optimizer state: a tensor in ``optimizer.state`` when the step ends;
- activations: saved for backward (a ``saved_tensors_hooks`` pack hook sees each), each storage once,
  by its real size and dtype, unless it is a parameter or the input;
- input: the batch's tensors;
- temporaries: everything else the step made (intermediate results, workspace returned by kernels);
- other (before the step): whatever else was alive when it began.

The measured peak comes from outside this bookkeeping: on CUDA the caching allocator
(``max_memory_allocated``; reserved - allocated is the allocator's cache and fragmentation); on the
CPU the growth of the process's peak resident memory over the step. The difference between the
measured peak and the categories at the tracked peak is the explicit ``unattributed`` residual.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dnnperf.analysis.opcount import NO_MODULE, OpCounter, _tensors

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "input",
    "temporaries",
    "other",
)
#: Measured beside the categories: the allocator's cache (CUDA) and what no category explains.
EXTRA = ("allocator_cache", "unattributed")

try:  # private API (the weak storage reference torch.multiprocessing uses); see test_memory
    _weak_ref = torch.UntypedStorage._weak_ref
    _expired = torch.UntypedStorage._expired
    _free_weak_ref = torch.UntypedStorage._free_weak_ref
except AttributeError:  # pragma: no cover - depends on the installed torch
    _weak_ref = _expired = _free_weak_ref = None  # type: ignore[assignment]


def storage_key(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(storage identity, bytes) of a tensor's storage; None for tensors without one (meta...)."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if tensor.device.type == "meta":
        return None
    return storage._cdata, storage.nbytes()


def storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """Distinct storages among ``tensors``: identity -> bytes."""
    found: dict[int, int] = {}
    for tensor in tensors:
        key = storage_key(tensor)
        if key is not None:
            found[key[0]] = key[1]
    return found


def optimizer_tensors(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[torch.Tensor]:
    """The tensors the optimizers keep between steps (momentum, Adam's moments; not step counters)."""
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    yield value


@dataclass
class _Allocation:
    key: int
    nbytes: int
    at: float
    module: str
    phase: str
    weak: int | None
    ptr: int = 0
    freed: float | None = None
    category: str = "temporaries"
    #: The module whose forward saved this storage for backward (None: not saved).
    saved_by: str | None = None


@dataclass
class StepMemory:
    """One step's memory: the peak by category, a timeline, per-layer bytes and the subsystem."""

    device: str
    #: Bytes per category at the moment of the tracked peak (see CATEGORIES, EXTRA).
    peak: dict[str, int]
    #: The measured peak (allocator on CUDA; resident-memory growth + bytes alive at the start on CPU).
    measured_peak: int
    #: How ``measured_peak`` was measured.
    measured_by: str
    #: Seconds from the step's start to the tracked peak, and where it fell.
    peak_at_s: float
    peak_module: str
    peak_phase: str
    #: (seconds from the start, bytes per category) at every allocation and release.
    timeline: list[tuple[float, dict[str, int]]]
    #: Stage boundaries: (seconds from the start, stage name entered).
    stages: list[tuple[float, str]]
    #: module -> {parameters, gradients, outputs, saved} bytes.
    layers: dict[str, dict[str, int]]
    #: Resident memory, page faults, device utilisation, counters (see MemoryProfile.subsystem).
    subsystem: dict[str, Any] = field(default_factory=dict)
    #: Each category's own largest value over the step (the saved activations peak at the end of
    #: forward, the gradients at the update: not necessarily at the moment of the overall peak).
    category_max: dict[str, int] = field(default_factory=dict)
    #: Wall time of the tracked step (the tracking's overhead, beside the plain steps' times).
    wall_s: float = 0.0

    @property
    def tracked_peak(self) -> int:
        return sum(v for k, v in self.peak.items() if k in CATEGORIES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "peak": self.peak,
            "tracked_peak": self.tracked_peak,
            "measured_peak": self.measured_peak,
            "measured_by": self.measured_by,
            "peak_at_s": self.peak_at_s,
            "peak_module": self.peak_module,
            "peak_phase": self.peak_phase,
            "timeline": [[t, by] for t, by in self.timeline],
            "stages": [[t, name] for t, name in self.stages],
            "layers": self.layers,
            "subsystem": self.subsystem,
            "category_max": self.category_max,
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepMemory:
        return cls(
            device=str(data["device"]),
            peak={k: int(v) for k, v in data["peak"].items()},
            measured_peak=int(data["measured_peak"]),
            measured_by=str(data["measured_by"]),
            peak_at_s=float(data["peak_at_s"]),
            peak_module=str(data["peak_module"]),
            peak_phase=str(data["peak_phase"]),
            timeline=[(float(t), {k: int(v) for k, v in by.items()}) for t, by in data["timeline"]],
            stages=[(float(t), str(name)) for t, name in data["stages"]],
            layers={m: {k: int(v) for k, v in d.items()} for m, d in data["layers"].items()},
            subsystem=dict(data.get("subsystem", {})),
            category_max={k: int(v) for k, v in data.get("category_max", {}).items()},
            wall_s=float(data.get("wall_s", 0.0)),
        )


def _read_status(field_name: str) -> int | None:
    """A field of /proc/self/status in bytes (Linux), e.g. VmHWM (peak resident) or VmRSS."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _release_free_heap() -> None:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim``), so that the resident memory
    at the start of a step is what is alive and its growth is the step's own. A no-op elsewhere."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak_resident() -> bool:
    """Reset the kernel's peak-resident counter (VmHWM) to the current resident size (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


PERF_EVENTS = ("cache-references", "cache-misses", "LLC-loads", "LLC-load-misses")


class CacheCounters:
    """Hardware cache counters of this process over a block, through ``perf stat -p`` where the machine
    exposes them. ``result`` is a dict of counts, or a string saying why there are none (no perf, no
    permission, counters not supported: as on virtual machines without a PMU). The perf process is
    stopped on exit, also on error."""

    def __init__(self) -> None:
        self.result: dict[str, int] | str = "not measured"
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> CacheCounters:
        perf = shutil.which("perf")
        if perf is None:
            self.result = "unsupported: perf is not installed"
            return self
        command = [perf, "stat", "-x", ",", "-e", ",".join(PERF_EVENTS), "-p", str(os.getpid())]
        try:
            self._process = subprocess.Popen(
                command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
            )
        except OSError as error:
            self.result = f"unsupported: {error}"
        time.sleep(0.05)  # perf attaches
        return self

    def __exit__(self, *exc: Any) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.send_signal(signal.SIGINT)
            _, errors = process.communicate(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            process.kill()
            _, errors = process.communicate()
        counts: dict[str, int] = {}
        unsupported = []
        for line in (errors or "").splitlines():
            parts = line.split(",")
            if len(parts) < 3 or parts[2] not in PERF_EVENTS:
                continue
            if parts[0].strip().isdigit():
                counts[parts[2]] = int(parts[0])
            else:
                unsupported.append(parts[2])
        if counts:
            self.result = counts
        elif unsupported:
            self.result = f"unsupported on this machine ({', '.join(unsupported)}: <not supported>)"
        else:
            self.result = f"unsupported: perf stat gave no counts ({(errors or '').strip()[:120]})"


@dataclass(frozen=True)
class AllocatorEvent:
    """One allocation (bytes > 0) or release (bytes < 0) by torch's CPU allocator."""

    ts: float
    addr: int
    bytes: int
    total: int  # bytes allocated after this event


@contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 around the profiler's start and stop, where kineto prints a line each
    ("profiler_start", "profiler_stop") that no setting turns off. Only around those calls."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class AllocatorEvents:
    """torch's CPU allocator over a block, as the profiler's memory events report it: every allocation
    and release with its address and the running total, buffers kernels allocate and free inside
    themselves included. The trace file is written to a temporary directory, removed at once."""

    def __init__(self) -> None:
        self.events: list[AllocatorEvent] = []
        self._profiler: Any = None

    def __enter__(self) -> AllocatorEvents:
        from torch.profiler import ProfilerActivity, profile

        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_native_stderr():
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        with _quiet_native_stderr():
            profiler.__exit__(*exc)
        if exc and exc[0] is not None:
            return
        with tempfile.TemporaryDirectory(prefix="dnnperf-memory-") as scratch:
            trace = Path(scratch) / "trace.json"
            profiler.export_chrome_trace(str(trace))
            raw = json.loads(trace.read_text()).get("traceEvents", [])
        events = []
        for event in raw:
            args = event.get("args", {})
            if event.get("name") == "[memory]" and args.get("Device Type") == 0 and "Total Allocated" in args:
                events.append(
                    AllocatorEvent(
                        float(event.get("ts", 0)),
                        int(args["Addr"]),
                        int(args["Bytes"]),
                        int(args["Total Allocated"]),
                    )
                )
        self.events = sorted(events, key=lambda e: e.ts)


class MemoryTracker:
    """Tracks one step's storages. Use it as the step's ``stages`` (it forwards to ``clock``)::

        tracker = MemoryTracker(model, [optimizer], batch)
        with tracker:
            task.step(batch, tracker)
        memory = tracker.result()

    Hooks, the dispatch mode and the saved-tensor hooks are removed on exit, also on error.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: Iterable[torch.optim.Optimizer],
        batch: Any,
        clock: Any = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if _weak_ref is None:
            raise RuntimeError(
                f"dnnperf's memory tracker needs torch.UntypedStorage weak references, which torch "
                f"{torch.__version__} does not provide"
            )
        self.model, self.optimizers, self.batch, self.clock = model, list(optimizers), batch, clock
        self.device = torch.device(device)
        self._allocator: AllocatorEvents | None = None
        self.counter = OpCounter(model, count=False, timed=False, device=self.device, observer=self._observe)
        self._live: dict[int, _Allocation] = {}
        self._all: list[_Allocation] = []
        self._outputs: dict[str, int] = {}
        self._stages: list[tuple[float, str]] = []
        self._start = 0.0
        self._before: dict[str, dict[int, int]] = {}
        self._hooks: list[Any] = []
        self._saved_hooks: Any = None
        self._counters = CacheCounters()
        self._result: StepMemory | None = None

    # -- the stages protocol ------------------------------------------------------------------------

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        self._mark(stage)
        if stage == "update":
            self._reap(time.perf_counter() - self._start)
            self._mark_live(self._gradients(), "gradients")
        clock = self.clock(stage) if self.clock is not None else None
        with self.counter(stage):
            if clock is None:
                yield
            else:
                with clock:
                    yield
        self._mark("other")

    def _mark(self, stage: str) -> None:
        self._stages.append((time.perf_counter() - self._start, stage))

    # -- context -------------------------------------------------------------------------------------

    def __enter__(self) -> MemoryTracker:
        self._before = {
            "parameters": storages(self.model.parameters()),
            "gradients": self._gradients(),
            "optimizer_state": storages(optimizer_tensors(self.optimizers)),
            "input": storages(
                _tensors(list(self.batch.values()) if isinstance(self.batch, dict) else self.batch)
            ),
        }
        gc.collect()
        _release_free_heap()
        self._faults = resource.getrusage(resource.RUSAGE_SELF)
        self._rss_start = _read_status("VmRSS")
        self._hwm_reset = _reset_peak_resident()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_start = torch.cuda.memory_allocated(self.device)
        for name, module in self.model.named_modules():
            self._hooks.append(module.register_forward_hook(self._output_hook(name or "(root)")))
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)
        self._saved_hooks.__enter__()
        try:
            self.counter.__enter__()
        except BaseException:
            self._remove()
            raise
        self._counters = CacheCounters().__enter__()
        if self.device.type == "cpu":
            self._allocator = AllocatorEvents().__enter__()
        self._start = time.perf_counter()
        self._stages.append((0.0, "other"))
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.counter.__exit__(*exc)
        finally:
            end = time.perf_counter() - self._start
            if self._allocator is not None:
                self._allocator.__exit__(*exc)
            self._counters.__exit__(*exc)
            self._remove()
        if exc[0] is None:
            self._finish(end)

    def _remove(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None

    # -- observing -----------------------------------------------------------------------------------

    def _output_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._outputs[name] = self._outputs.get(name, 0) + sum(storages(_tensors(output)).values())

        return hook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        # Storage identities are addresses, reused once freed: mark the live allocation itself.
        key = storage_key(tensor)
        allocation = self._live.get(key[0]) if key is not None else None
        if allocation is not None and allocation.saved_by is None:
            stack = self.counter._stack
            allocation.saved_by = stack[-1] if stack else NO_MODULE
        return tensor

    def _gradients(self) -> dict[int, int]:
        return storages(p.grad for p in self.model.parameters() if p.grad is not None)

    def _mark_live(self, keys: Iterable[int], category: str) -> None:
        for key in keys:
            allocation = self._live.get(key)
            if allocation is not None:
                allocation.category = category

    def _reap(self, now: float) -> None:
        for key in [k for k, a in self._live.items() if a.weak is not None and _expired(a.weak)]:
            allocation = self._live.pop(key)
            allocation.freed = now
            _free_weak_ref(allocation.weak)
            allocation.weak = None

    def _observe(self, module: str, phase: str, call: Any, info: Any) -> None:
        now = time.perf_counter() - self._start
        self._reap(now)
        known = self._before
        for tensor in _tensors(call.out):
            key = storage_key(tensor)
            if key is None or key[0] in self._live or any(key[0] in d for d in known.values()):
                continue
            storage = tensor.untyped_storage()
            allocation = _Allocation(
                key[0], key[1], now, module, phase, _weak_ref(storage), storage.data_ptr()
            )
            self._live[key[0]] = allocation
            self._all.append(allocation)

    # -- the result ----------------------------------------------------------------------------------

    def _finish(self, end: float) -> None:
        self._reap(end)
        for allocation in self._live.values():  # still alive at the end of the step
            if allocation.weak is not None:
                _free_weak_ref(allocation.weak)
                allocation.weak = None
        self._mark_live(self._gradients(), "gradients")
        self._mark_live(storages(optimizer_tensors(self.optimizers)), "optimizer_state")
        fixed = {k: sum(v.values()) for k, v in self._before.items()}
        for allocation in self._all:
            if allocation.category == "temporaries" and allocation.saved_by is not None:
                allocation.category = "activations"
        # Replay: bytes per category after every event; the peak is the largest total.
        events = sorted(
            [(a.at, a.nbytes, a) for a in self._all]
            + [(a.freed, -a.nbytes, a) for a in self._all if a.freed is not None],
            key=lambda e: (e[0], e[1] < 0),
        )
        current = dict.fromkeys(CATEGORIES, 0)
        for name, value in fixed.items():
            current[name] += value
        timeline = [(0.0, dict(current))]
        peak, peak_at, peak_module, peak_phase = dict(current), 0.0, NO_MODULE, "other"
        category_max = dict(current)
        for at, delta, allocation in events:
            current[allocation.category] += delta
            timeline.append((at, dict(current)))
            category_max[allocation.category] = max(
                category_max[allocation.category], current[allocation.category]
            )
            if delta > 0 and sum(current.values()) > sum(peak.values()):
                peak, peak_at = dict(current), at
                peak_module, peak_phase = allocation.module, allocation.phase
        peak_all: dict[str, int] = {**peak, "allocator_cache": 0, "unattributed": 0}
        if self._allocator is not None and self._allocator.events:
            # The allocator's own peak, each live allocation named by the storage it became.
            at_peak, moment = self._allocator_peak(fixed)
            peak_all = {**at_peak, "allocator_cache": 0}
            measured = sum(at_peak.values())
            measured_by = "torch CPU allocator (profiler memory events), allocations matched to storages"
            if moment is not None:
                peak_at, peak_module, peak_phase = moment.at, moment.module, moment.phase
        elif self.device.type == "cuda":
            measured = sum(fixed.values()) + torch.cuda.max_memory_allocated(self.device) - self._cuda_start
            measured_by = "cuda caching allocator"
            peak_all["allocator_cache"] = max(
                0, torch.cuda.max_memory_reserved(self.device) - torch.cuda.max_memory_allocated(self.device)
            )
            peak_all["unattributed"] = measured - sum(peak.values())
        else:
            measured, measured_by = 0, "unavailable"
        self._result = StepMemory(
            device=str(self.device),
            peak=peak_all,
            measured_peak=measured,
            measured_by=measured_by,
            peak_at_s=peak_at,
            peak_module=peak_module,
            peak_phase=peak_phase,
            timeline=timeline,
            stages=self._stages,
            layers=self._layer_bytes(),
            subsystem=self._subsystem_now(),
            category_max=category_max,
            wall_s=end,
        )

    def _allocator_peak(self, fixed: Mapping[str, int]) -> tuple[dict[str, int], _Allocation | None]:
        """Bytes per category at the allocator's peak. Each allocation event is matched to the tracked
        storage made at the same address with the same size (in order); the unmatched ones that are
        released within the step are temporaries and workspace (buffers kernels and autograd use and
        free), those still held at the end are unattributed."""
        assert self._allocator is not None
        events = self._allocator.events
        queues: dict[int, deque[_Allocation]] = {}
        for allocation in sorted(self._all, key=lambda a: a.at):
            queues.setdefault(allocation.ptr, deque()).append(allocation)
        released: set[int] = set()  # indices of allocations the step releases again
        open_allocations: dict[int, int] = {}
        for index, event in enumerate(events):
            if event.bytes > 0:
                open_allocations[event.addr] = index
            elif event.addr in open_allocations:
                released.add(open_allocations.pop(event.addr))
        current = dict.fromkeys((*CATEGORIES, "unattributed"), 0)
        for name, value in fixed.items():
            current[name] += value
        live: dict[int, tuple[str, int]] = {}
        best, best_total, moment, last = dict(current), -1, None, None
        for index, event in enumerate(events):
            if event.bytes > 0:
                queue = queues.get(event.addr)
                if queue and queue[0].nbytes == event.bytes:
                    allocation = queue.popleft()
                    category, last = allocation.category, allocation
                elif index in released:
                    category = "temporaries"
                else:
                    category = "unattributed"
                live[event.addr] = (category, event.bytes)
                current[category] += event.bytes
                if event.total > best_total:
                    best, best_total, moment = dict(current), event.total, last
            elif event.addr in live:
                category, size = live.pop(event.addr)
                current[category] -= size
        return best, moment

    def _layer_bytes(self) -> dict[str, dict[str, int]]:
        layers: dict[str, dict[str, int]] = {}
        for name, module in self.model.named_modules():
            params = list(module.parameters(recurse=False))
            entry = {
                "parameters": sum(p.numel() * p.element_size() for p in params),
                "gradients": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
                "outputs": self._outputs.get(name or "(root)", 0),
                "saved": 0,
            }
            layers[name or "(root)"] = entry
        for allocation in self._all:
            if allocation.saved_by in layers:
                layers[allocation.saved_by]["saved"] += allocation.nbytes
        return layers

    def _subsystem_now(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        hwm, rss = _read_status("VmHWM"), self._rss_start
        growth = hwm - rss if self._hwm_reset and hwm is not None and rss is not None else None
        info: dict[str, Any] = {
            "rss_bytes": _read_status("VmRSS"),
            "peak_rss_bytes": hwm,
            # The cross-check on the CPU: how far the peak resident memory rose during the step.
            "peak_rss_growth_bytes": growth,
            "cache_counters": self._counters.result,
            "minor_faults": usage.ru_minflt - self._faults.ru_minflt,
            "major_faults": usage.ru_majflt - self._faults.ru_majflt,
        }
        if self.device.type == "cuda":
            capacity = torch.cuda.get_device_properties(self.device).total_memory
            info["device_capacity_bytes"] = capacity
            info["device_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
            info["device_utilisation"] = torch.cuda.max_memory_reserved(self.device) / capacity
        return info

    def result(self) -> StepMemory:
        if self._result is None:
            raise RuntimeError("no step tracked: use the tracker as a context manager around one step")
        return self._result
