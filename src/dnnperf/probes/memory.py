"""Memory of one training step by data structure, over time and per layer.

The step runs under torch's profiler with memory events: every allocation and release of torch's
allocator, with its address, size, moment and the running total (so the measured peak is the
allocator's own, buffers kernels allocate and free inside themselves included). Module hooks say
which layer ran when; the profiler's backward-node events (with the sequence number of the forward
operator that made each node) place backward's allocations in the layer whose forward made the node.
What each allocation *was* is decided when the step ends, by address:

- parameters, and whatever else was alive before the step (gradients, optimizer state, input): the
  bytes of those storages, no events;
- activations: saved for backward (a ``saved_tensors_hooks`` pack hook sees each), each storage once,
  by its real size and dtype, unless it is a parameter or the input;
- gradients: ``.grad`` of a parameter when the update begins;
- optimizer state: a tensor in ``optimizer.state`` when the step ends;
- temporaries: everything else the step made and released (intermediate results, workspace, and
  what only a reference cycle held: the garbage collector runs before the trace ends);
- unattributed: made, still held after the step, and none of the above.

On CUDA the caching allocator's peak is the measured one (reserved - allocated is its cache and
fragmentation); what the events do not explain is the explicit ``unattributed`` residual.
"""

from __future__ import annotations

import bisect
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
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dnnperf.devices import on_device
from dnnperf.probes.opcount import NO_MODULE, ROOT_MODULE, tensors_of
from dnnperf.probes.saved import listening
from dnnperf.results.memory import CATEGORIES, StepMemory


def storage_key(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(storage identity, bytes) of a tensor's storage; None for tensors without one (meta...)."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if tensor.device.type == "meta":
        return None
    return storage._cdata, storage.nbytes()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """What of ``tensor`` this process holds: a sharded tensor's (a DTensor's, as FSDP2 makes parameters,
    gradients and optimizer state) local shard; any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    if to_local is None:
        return tensor
    with torch.no_grad():  # a view of the shard, not a node of the next backward
        return to_local()


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
                    yield local(value)


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


def _read_status(field_name: str) -> int | None:
    """A field of /proc/self/status in bytes (Linux), e.g. VmHWM (peak resident) or VmRSS."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def release_free_heap() -> None:
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


class ResidentGrowth:
    """The process's resident memory over a block: its peak, how far the peak rose, page faults.

    With ``trim`` (the cross-check), the C heap's free pages are returned to the OS first and the
    kernel's peak-resident counter is reset, so the growth is the block's own. That has a price paid
    inside the block: every heap page it touches that was returned is faulted in and zeroed again (on
    resnet18 at ``small``, about +30% step time: nearly all of the memory tracker's cost, see
    docs/benchmarks-memory.md). Without ``trim`` nothing is returned or reset: the resident memory,
    the process's lifetime peak and the page faults are still read, the growth is None.
    """

    def __init__(self, trim: bool = True) -> None:
        self.trim = trim
        self._faults = resource.getrusage(resource.RUSAGE_SELF)
        self._rss_start: int | None = None
        self._hwm_reset = False

    def __enter__(self) -> ResidentGrowth:
        if self.trim:
            release_free_heap()
        self._faults = resource.getrusage(resource.RUSAGE_SELF)
        self._rss_start = _read_status("VmRSS")
        self._hwm_reset = _reset_peak_resident() if self.trim else False
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def result(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        hwm, rss = _read_status("VmHWM"), self._rss_start
        growth = hwm - rss if self._hwm_reset and hwm is not None and rss is not None else None
        return {
            "rss_bytes": _read_status("VmRSS"),
            "peak_rss_bytes": hwm,
            # The cross-check on the CPU: how far the peak resident memory rose during the block.
            "peak_rss_growth_bytes": growth,
            "minor_faults": usage.ru_minflt - self._faults.ru_minflt,
            "major_faults": usage.ru_majflt - self._faults.ru_majflt,
        }


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


#: A backward node's evaluation, as the profiler names it (the node's name follows).
NODE_EVENT = "autograd::engine::evaluate_function: "
START_MARKER = "dnnperf::memory::start"
#: The tracker's own moments (a module entered or left, a stage begun) as instant ranges in the trace:
#: on the profiler's clock, like the allocations they place, so no clock alignment decides which side
#: of a boundary an allocation falls on (the marker's alignment is only as good as the marker is short,
#: and on a loaded machine it can be preempted for milliseconds).
_MOMENT = "dnnperf::memory::moment::"


@dataclass(frozen=True)
class AllocatorEvent:
    """One allocation (bytes > 0) or release (bytes < 0) by torch's allocator on the tracked device."""

    ts: float  # seconds from the step's start
    addr: int
    bytes: int
    total: int  # bytes allocated after this event (CPU: since the trace began; CUDA: on the device)


def outside_releases(allocations: list[AllocatorEvent], known: set[int]) -> list[tuple[float, int]]:
    """(when, bytes) of each release of a block that was allocated before the trace began and is not
    one of ``known`` (the step's categories from before it): a release of an address the trace has not
    seen allocated since its last release, or at all."""
    live: set[int] = set()
    found = []
    for event in allocations:
        if event.bytes > 0:
            live.add(event.addr)
        elif event.addr in live:
            live.discard(event.addr)
        elif event.addr not in known:
            found.append((event.ts, -event.bytes))
    return found


def with_unseen_releases(
    allocations: list[AllocatorEvent],
    noted: list[tuple[float, int, int]],
    collectives: Iterable[tuple[float, float]] = (),
) -> list[AllocatorEvent]:
    """The allocator's events with the releases torch's profiler did not see. It reports only what a
    thread it profiles releases, and a collective's worker thread (gloo's) sometimes drops the last
    reference to the collective's tensors:

    - a block whose release is ``noted`` ((when, address, bytes): ``watch_release``) is released then;
    - a block allocated inside a collective that returns once done (``collectives``: (start, end),
      ``synchronous_collective``) and never released in the trace is the collective's own buffer,
      released by its end;
    - a block allocated again at its address with no release between was released by then.

    Each added release lowers the running total of every event after it."""
    windows = list(collectives)
    unreleased: list[int] = []  # indices of allocations the trace never releases
    open_blocks: dict[int, int] = {}  # address -> index of its allocation
    for index, event in enumerate(allocations):
        if event.bytes > 0:
            if event.addr in open_blocks:
                unreleased.append(open_blocks[event.addr])
            open_blocks[event.addr] = index
        else:
            open_blocks.pop(event.addr, None)
    unreleased += open_blocks.values()
    # (when, address, bytes, the allocation's index where known)
    found: list[tuple[float, int, int, int]] = [(at, address, nbytes, -1) for at, address, nbytes in noted]
    for index in unreleased:
        event = allocations[index]
        ends = [stop for start, stop in windows if start <= event.ts <= stop]
        if ends:
            found.append((min(ends), event.addr, event.bytes, index))
    found.sort()

    held: dict[int, tuple[int, int]] = {}  # address -> (index of its allocation, bytes)
    unseen = 0  # bytes released without an event so far
    out: list[AllocatorEvent] = []

    def release(ts: float, address: int) -> None:
        nonlocal unseen
        _, nbytes = held.pop(address)
        unseen += nbytes
        total = out[-1].total if out else 0
        out.append(AllocatorEvent(ts, address, -nbytes, total - nbytes))

    def release_found(at: float, address: int, nbytes: int, index: int) -> None:
        block = held.get(address)
        if block is not None and block[1] == nbytes and index in (-1, block[0]):
            release(at, address)

    next_found = 0
    for index, event in enumerate(allocations):
        while next_found < len(found) and found[next_found][0] <= event.ts:
            release_found(*found[next_found])
            next_found += 1
        if event.bytes > 0 and event.addr in held:
            release(event.ts, event.addr)
        if event.bytes > 0:
            held[event.addr] = (index, event.bytes)
        else:
            held.pop(event.addr, None)
        out.append(replace(event, total=event.total - unseen))
    for entry in found[next_found:]:
        release_found(*entry)
    return out


#: The trackers now tracking a step (``watch_release`` and ``synchronous_collective`` tell each).
_TRACKING: list[MemoryTracker] = []


def watch_release(tensor: torch.Tensor) -> None:
    """Note when ``tensor``'s storage is released, on whichever thread drops its last reference, for
    the CPU step being tracked (what a collective's worker thread frees, the profiler does not see).
    Nothing happens while no step is tracked."""
    for tracker in _TRACKING:
        tracker.watch(tensor)


@contextmanager
def synchronous_collective() -> Iterator[None]:
    """Around a collective that returns once it is done: the buffers it allocates inside itself and
    the trace never sees released were released by its end (by its worker thread, unseen)."""
    trackers = list(_TRACKING)
    starts = [tracker.now() for tracker in trackers]
    try:
        yield
    finally:
        for tracker, start in zip(trackers, starts, strict=True):
            tracker.collectives.append((start, tracker.now()))


@dataclass
class StepTrace:
    """What the profiler saw of one step, on the step's own clock (seconds from its start): the
    allocator's events, every backward node's evaluation (start, end, sequence number) and, per
    sequence number, when the forward operator that made the node ran."""

    allocations: list[AllocatorEvent] = field(default_factory=list)
    nodes: list[tuple[float, float, int | None]] = field(default_factory=list)
    forward_ops: dict[int, float] = field(default_factory=dict)
    #: The tracker's moments by key (``record_moment``), when the profiler saw them.
    moments: dict[str, float] = field(default_factory=dict)
    #: CUDA copies: kind ("HtoD", "DtoH", "DtoD"...) -> [bytes, seconds on the copy engine].
    copies: dict[str, list[float]] = field(default_factory=dict)
    #: CUDA work on the device (kernels, copies, memsets): (when the host launched it, on the step's
    #: clock; seconds it ran on the device), joined through the profiler's correlation ids.
    kernels: list[tuple[float, float]] = field(default_factory=list)

    def shifted(self, by: float) -> StepTrace:
        """The same trace with every moment ``by`` seconds later."""
        return replace(
            self,
            allocations=[replace(event, ts=event.ts + by) for event in self.allocations],
            nodes=[(start + by, stop + by, seq) for start, stop, seq in self.nodes],
            forward_ops={seq: at + by for seq, at in self.forward_ops.items()},
            moments={key: at + by for key, at in self.moments.items()},
            kernels=[(at + by, seconds) for at, seconds in self.kernels],
        )

    def copy_summary(self) -> dict[str, float]:
        """Bytes, seconds and achieved bandwidth of host-to-device and device-to-host copies."""
        summary: dict[str, float] = {}
        for kind, label in (("HtoD", "host_to_device"), ("DtoH", "device_to_host")):
            nbytes, seconds = self.copies.get(kind, [0.0, 0.0])
            summary[f"{label}_bytes"] = nbytes
            summary[f"{label}_s"] = seconds
            summary[f"{label}_bytes_per_s"] = nbytes / seconds if seconds > 0 else float("nan")
        return summary


class AllocatorEvents:
    """torch's allocator over a block, through the profiler's memory events: every allocation and
    release with its address and the running total (buffers kernels allocate and free inside
    themselves included), with the operator events that place them in a layer. A marker at the start
    puts the profiler's clock on ``time.perf_counter``'s. The trace file is written to a temporary
    directory, removed at once."""

    def __init__(self, device: torch.device, origin: float, memory: bool = True) -> None:
        self.device, self.origin, self.memory = device, origin, memory
        self.trace = StepTrace()
        self._profiler: Any = None
        self._marked_at = 0.0

    def __enter__(self) -> AllocatorEvents:
        from torch.profiler import ProfilerActivity, profile, record_function

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities, profile_memory=self.memory)
        with _quiet_native_stderr():
            self._profiler.__enter__()
        # The marker's middle on both clocks (its first call pays a one-off lookup: warmed up first).
        with record_function(START_MARKER + "::warm-up"):
            pass
        before = time.perf_counter()
        with record_function(START_MARKER):
            pass
        self._marked_at = (before + time.perf_counter()) / 2
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
        self.trace = self._parse(raw)

    def _parse(self, raw: list[dict[str, Any]]) -> StepTrace:
        marker = next((e for e in raw if e.get("name") == START_MARKER), None)
        if marker is None:
            return StepTrace()
        base = float(marker["ts"]) + float(marker.get("dur", 0)) / 2
        offset = self._marked_at - self.origin

        def seconds(ts: Any) -> float:
            return (float(ts) - base) * 1e-6 + offset

        device_type = 1 if self.device.type == "cuda" else 0
        device_index = self.device.index if self.device.index is not None else 0
        trace = StepTrace()
        launched: dict[Any, float] = {}  # correlation id -> when the host launched it
        ran: list[tuple[Any, float]] = []  # (correlation id, seconds on the device)
        for event in raw:
            args = event.get("args", {})
            name = event.get("name", "")
            category = event.get("cat", "")
            if category in _DEVICE_WORK and "correlation" in args:
                ran.append((args["correlation"], float(event.get("dur", 0)) * 1e-6))
            elif category in _LAUNCHES and "correlation" in args:
                launched[args["correlation"]] = seconds(event.get("ts", 0))
            if name == "[memory]":
                if args.get("Device Type") != device_type or "Total Allocated" not in args:
                    continue
                if device_type == 1 and args.get("Device Id", device_index) != device_index:
                    continue
                trace.allocations.append(
                    AllocatorEvent(
                        seconds(event.get("ts", 0)),
                        int(args["Addr"]),
                        int(args["Bytes"]),
                        int(args["Total Allocated"]),
                    )
                )
            elif name.startswith("Memcpy ") and "bytes" in args:  # "Memcpy HtoD (Pinned -> Device)"
                kind = name.split()[1]
                totals = trace.copies.setdefault(kind, [0.0, 0.0])
                totals[0] += float(args["bytes"])
                totals[1] += float(event.get("dur", 0)) * 1e-6
            elif event.get("ph") == "X":
                sequence = args.get("Sequence number")
                if name.startswith(_MOMENT):
                    trace.moments[name[len(_MOMENT) :]] = seconds(event["ts"])
                elif name.startswith(NODE_EVENT):
                    start = seconds(event["ts"])
                    trace.nodes.append((start, start + float(event.get("dur", 0)) * 1e-6, sequence))
                elif sequence is not None:  # the first operator with a number made its node
                    # The earliest, not the first listed: on CUDA backward runs on the engine's device
                    # thread, whose operators carry their node's number and may be listed first.
                    at = seconds(event["ts"])
                    if at < trace.forward_ops.get(int(sequence), float("inf")):
                        trace.forward_ops[int(sequence)] = at
        trace.allocations.sort(key=lambda e: e.ts)
        trace.nodes.sort()
        trace.kernels = sorted((launched[c], d) for c, d in ran if c in launched)
        return trace


@dataclass
class _Block:
    """One allocation of the step, named when the step ends."""

    addr: int
    nbytes: int
    at: float
    freed: float | None
    module: str
    phase: str
    category: str = "temporaries"
    #: The module whose forward saved this storage for backward (None: not saved).
    saved_by: str | None = None


def record_moment(key: str) -> None:
    """Put one of the tracker's moments in the profiler's trace (nothing when no profiler runs)."""
    with torch.profiler.record_function(_MOMENT + key):
        pass


def on_trace_clock(changes: list[tuple[float, str]], kind: str, trace: StepTrace) -> list[tuple[float, str]]:
    """Changes recorded with ``record_moment(f"{kind}{index}")`` at the time the trace saw them (the
    host clock's reading where the trace has none)."""
    moved = [(trace.moments.get(f"{kind}{i}", t), value) for i, (t, value) in enumerate(changes)]
    return sorted(moved, key=lambda change: change[0])


class ChangingValue:
    """A value that changes at known times (the current module, the current stage): ``at(t)``."""

    def __init__(self, changes: list[tuple[float, str]], default: str) -> None:
        self.times = [t for t, _ in changes]
        self.values = [v for _, v in changes]
        self.default = default

    def at(self, t: float) -> str:
        index = bisect.bisect_right(self.times, t) - 1
        return self.values[index] if index >= 0 else self.default


#: Trace categories (kineto's) of work that runs on the GPU, and of the host calls that launch it.
_DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCHES = ("cuda_runtime", "cuda_driver")

#: Slack when a moment seen by a hook is compared with the profiler's (the clocks are aligned at one
#: marker to within microseconds; an operator's output is allocated well before autograd saves it).
_SLACK_S = 10e-6


class MemoryTracker:
    """Tracks one step's memory. Use it as the step's ``stages`` (it forwards to ``clock``)::

        tracker = MemoryTracker(model, [optimizer], batch)
        with tracker:
            task.step(batch, tracker)
        memory = tracker.result()

    During the step: the profiler's allocator events, module hooks (which layer runs), a saved-tensor
    hook (what backward keeps) and a look at the gradients when the update begins. No dispatch mode:
    the tracked step runs torch's own kernels at nearly their own speed. Hooks and the profiler are
    removed on exit, also on error.

    ``resident=False`` leaves out the resident-memory cross-check (``peak_rss_growth_bytes`` is then
    None; see ResidentGrowth): its heap trim, not the tracking, is what makes the tracked step slower
    (it faults its memory in again). Every other figure is the same either way.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: Iterable[torch.optim.Optimizer],
        batch: Any,
        clock: Any = None,
        device: torch.device | str = "cpu",
        resident: bool = True,
    ) -> None:
        self.model, self.optimizers, self.batch, self.clock = model, list(optimizers), batch, clock
        self._resident = ResidentGrowth(trim=resident)
        self._resident_at_end: dict[str, Any] | None = None
        self.device = torch.device(device)
        self._allocator: AllocatorEvents | None = None
        self._names = {id(m): name or ROOT_MODULE for name, m in model.named_modules()}
        self._module_stack: list[str] = []
        self._module_changes: list[tuple[float, str]] = []
        self._outputs: dict[str, int] = {}
        self._saved_storages: list[tuple[float, int, int, str]] = []  # (time, address, bytes, module)
        self._gradients_at_update: list[tuple[float, set[int]]] = []  # one per update (WGAN-GP: two)
        self._stages: list[tuple[float, str]] = []
        self._start = 0.0
        self._before: dict[str, int] = {}
        self._before_addresses: set[int] = set()
        # Tensors that existed before the step and were released in it (the last step's gradients at
        # a zero_grad(set_to_none=True) that opens the step): (time, category, bytes, address). The
        # profiler reports no release of a block allocated before it started.
        self._released: list[tuple[float, str, int, int]] = []
        self._finalizers: list[weakref.finalize] = []
        # Storages released on a thread other than the step's (watch_release): (time, address, bytes).
        self._released_elsewhere: list[tuple[float, int, int]] = []
        #: Synchronous collectives run in the step: (start, end) (see synchronous_collective).
        self.collectives: list[tuple[float, float]] = []
        self._thread = threading.get_ident()
        self._hooks: list[Any] = []
        self._saved_hooks: Any = None
        self._counters = CacheCounters()
        self._result: StepMemory | None = None

    # -- the stages protocol ------------------------------------------------------------------------

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        self.mark(stage)
        if self.clock is None:
            yield
        else:
            with self.clock(stage):
                yield
        self._mark("other")

    def mark(self, stage: str) -> None:
        """A stage begins now (the update: the gradients it will read are named as such)."""
        self._mark(stage)
        if stage == "update":
            self._gradients_at_update.append((self.now(), _addresses(self._grads())))

    def now(self) -> float:
        """Seconds since the tracked step began."""
        return time.perf_counter() - self._start

    def _mark(self, stage: str) -> None:
        self._stages.append((self.now(), stage))
        record_moment(f"s{len(self._stages) - 1}")

    # -- context -------------------------------------------------------------------------------------

    def __enter__(self) -> MemoryTracker:
        before = {
            "parameters": [local(p) for p in self.model.parameters()],
            "gradients": self._grads(),
            "optimizer_state": list(optimizer_tensors(self.optimizers)),
            "input": list(
                tensors_of(list(self.batch.values()) if isinstance(self.batch, dict) else self.batch)
            ),
        }
        # Only what lies on the tracked device: a loop's host batch, before it is copied to the GPU, is
        # none of the device's memory (the copy is the step's own).
        before = {name: [t for t in tensors if on_device(t, self.device)] for name, tensors in before.items()}
        self._before = {name: sum(storages(tensors).values()) for name, tensors in before.items()}
        self._before_addresses = {a for tensors in before.values() for a in _addresses(tensors)}
        gc.collect()
        self._resident.__enter__()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_start = torch.cuda.memory_allocated(self.device)
        try:
            for module in self.model.modules():
                self._hooks.append(module.register_forward_pre_hook(self._enter_module))
                self._hooks.append(module.register_forward_hook(self._leave_module, always_call=True))
            self._saved_hooks = listening(self._on_saved)
            self._saved_hooks.__enter__()
            self._counters = CacheCounters().__enter__()
            self._watch_releases(before)
            del before  # its lists would keep every tensor from before the step alive
            self._start = time.perf_counter()
            self._thread = threading.get_ident()
            _TRACKING.append(self)
            self._allocator = AllocatorEvents(self.device, self._start).__enter__()
        except BaseException:
            self._remove()
            raise
        self._stages.append((0.0, "other"))
        return self

    def __exit__(self, *exc: Any) -> None:
        end = self.now()
        # The resident figures end with the step: stopping the profiler and reading its trace back (a
        # JSON of every event) is Python memory too, and on an op-heavy step dwarfs the step's own
        # (WGAN-GP at `small`: the peak rose from 26 to 53 MiB after a 22 MiB step; docs/memory.md).
        self._resident_at_end = self._resident.result()
        # What only reference cycles keep (double backward's create_graph ties a gradient to its own
        # graph) is released by the collector, still in view: temporaries, not unattributed.
        gc.collect()
        try:
            if self._allocator is not None:
                self._allocator.__exit__(*exc)
        finally:
            self._counters.__exit__(*exc)
            self._remove()
        if exc[0] is None:
            self._finish(end)

    def _watch_releases(self, before: dict[str, list[torch.Tensor]]) -> None:
        """A finalizer on each tensor that alone owns a storage that existed before the step: when the
        step lets go of it, the release is noted with the moment (CPython frees at the last reference)."""
        owners: dict[int, int] = {}
        for tensors in before.values():
            for tensor in tensors:
                address = tensor.untyped_storage().data_ptr()
                owners[address] = owners.get(address, 0) + 1
        for category, tensors in before.items():
            for tensor in tensors:
                storage = tensor.untyped_storage()
                whole = tensor._base is None and storage.nbytes() == tensor.numel() * tensor.element_size()
                address, nbytes = storage.data_ptr(), storage.nbytes()
                if whole and owners[address] == 1 and nbytes > 0:
                    released = weakref.finalize(tensor, self._on_released, category, nbytes, address)
                    self._finalizers.append(released)

    def _on_released(self, category: str, nbytes: int, address: int) -> None:
        self._released.append((self.now(), category, nbytes, address))

    def watch(self, tensor: torch.Tensor) -> None:
        """Note the release of ``tensor``'s storage if it happens on another thread (see watch_release):
        the profiler reports those on the step's own thread itself. CPU only: CUDA's peak is its
        caching allocator's, which sees every thread."""
        if self.device.type != "cpu" or not on_device(tensor, self.device):
            return
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes > 0:
            self._finalizers.append(weakref.finalize(storage, self._on_released_elsewhere, address, nbytes))

    def _on_released_elsewhere(self, address: int, nbytes: int) -> None:
        if threading.get_ident() != self._thread:
            self._released_elsewhere.append((self.now(), address, nbytes))

    def _alive_before(self, address: int, t: float) -> bool:
        """Is ``address`` a block from before the step, not released by ``t``?"""
        if address not in self._before_addresses:
            return False
        return not any(a == address and at <= t for at, _, _, a in self._released)

    def _remove(self) -> None:
        if self in _TRACKING:
            _TRACKING.remove(self)
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None

    # -- observing -----------------------------------------------------------------------------------

    def _enter_module(self, module: nn.Module, args: Any) -> None:
        name = self._names.get(id(module), type(module).__name__)
        self._module_stack.append(name)
        self._module_changes.append((self.now(), name))
        record_moment(f"m{len(self._module_changes) - 1}")

    def _leave_module(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self._names.get(id(module), type(module).__name__)
        if name in self._module_stack:  # normally the last entry
            del self._module_stack[len(self._module_stack) - 1 - self._module_stack[::-1].index(name) :]
        self._module_changes.append((self.now(), self._module_stack[-1] if self._module_stack else NO_MODULE))
        record_moment(f"m{len(self._module_changes) - 1}")
        self._outputs[name] = self._outputs.get(name, 0) + sum(storages(tensors_of(output)).values())

    def _on_saved(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            module = self._module_stack[-1] if self._module_stack else NO_MODULE
            self._saved_storages.append((self.now(), storage.data_ptr(), storage.nbytes(), module))

    def _grads(self) -> list[torch.Tensor]:
        return [local(p.grad) for p in self.model.parameters() if p.grad is not None]

    # -- the result ----------------------------------------------------------------------------------

    def _blocks(
        self, trace: StepTrace, end: float
    ) -> tuple[list[_Block], list[tuple[AllocatorEvent, _Block]]]:
        """Every allocation of the step with its release, layer and stage, and the events in order."""
        modules = ChangingValue(on_trace_clock(self._module_changes, "m", trace), NO_MODULE)
        stages = ChangingValue(on_trace_clock(self._stages, "s", trace), "other")
        node_starts = [start for start, _, _ in trace.nodes]
        seq_module = {seq: modules.at(t) for seq, t in trace.forward_ops.items()}

        def module_at(t: float) -> str:
            index = bisect.bisect_right(node_starts, t) - 1
            while index >= 0:  # the latest node evaluation around t (re-entrant ones nest)
                start, stop, seq = trace.nodes[index]
                if stop >= t:
                    return seq_module.get(seq, NO_MODULE) if seq is not None else NO_MODULE
                if t - start > 1.0:
                    break
                index -= 1
            return modules.at(t)

        blocks: list[_Block] = []
        events: list[tuple[AllocatorEvent, _Block]] = []
        live: dict[int, _Block] = {}
        for event in trace.allocations:
            if event.bytes > 0:
                block = _Block(
                    event.addr, event.bytes, event.ts, None, module_at(event.ts), stages.at(event.ts)
                )
                live[event.addr] = block
                blocks.append(block)
                events.append((event, block))
            elif event.addr in live:
                block = live.pop(event.addr)
                block.freed = event.ts
                events.append((event, block))
        return blocks, events

    def _name_blocks(self, blocks: list[_Block], end: float) -> None:
        by_address: dict[int, list[_Block]] = {}
        for block in blocks:
            by_address.setdefault(block.addr, []).append(block)

        def alive(address: int, t: float) -> _Block | None:
            candidates = by_address.get(address, [])
            index = bisect.bisect_right([b.at for b in candidates], t + _SLACK_S) - 1
            if index < 0:
                return None
            block = candidates[index]
            return block if block.freed is None or block.freed >= t - _SLACK_S else None

        for t, address, _, module in self._saved_storages:
            block = alive(address, t)
            if block is not None and block.saved_by is None:
                block.saved_by = module
                block.category = "activations"
        for t, addresses in self._gradients_at_update:
            for address in addresses:
                if not self._alive_before(address, t) and (block := alive(address, t)) is not None:
                    block.category = "gradients"
        for address in _addresses(optimizer_tensors(self.optimizers)):
            if not self._alive_before(address, end) and (block := alive(address, end)) is not None:
                block.category = "optimizer_state"
        for block in blocks:
            if block.freed is None and block.category == "temporaries":
                block.category = "unattributed"  # held after the step and no category's

    def _clock_skew(self, trace: StepTrace) -> float:
        """How far the trace's clock runs ahead of the host clock's, from the tracker's moments: each
        is read on the host clock just before the trace sees it, so the smallest difference is the
        truest (the start marker alone is off by however long it was preempted)."""
        pairs = [(f"m{i}", t) for i, (t, _) in enumerate(self._module_changes)]
        pairs += [(f"s{i}", t) for i, (t, _) in enumerate(self._stages)]
        ahead = [trace.moments[key] - t for key, t in pairs if key in trace.moments]
        return min(ahead, default=0.0)

    def _finish(self, end: float) -> None:
        trace = self._allocator.trace if self._allocator is not None else StepTrace()
        trace = trace.shifted(-self._clock_skew(trace))
        trace = replace(
            trace,
            allocations=with_unseen_releases(trace.allocations, self._released_elsewhere, self.collectives),
        )
        blocks, events = self._blocks(trace, end)
        # Blocks from before the step whose release the trace did report (CUDA's allocator always
        # does; torch's CPU reporter does for a block it saw allocated in an earlier profiled session):
        # their release is in the allocator's running total already.
        reported: set[int] = set()
        allocated: set[int] = set()
        for event in trace.allocations:
            if event.bytes > 0:
                allocated.add(event.addr)
            elif event.addr in self._before_addresses and event.addr not in allocated:
                reported.add(event.addr)
        self._name_blocks(blocks, end)
        current = dict.fromkeys((*CATEGORIES, "unattributed"), 0)
        for name, value in self._before.items():
            current[name] += value
        timeline = [(0.0, {k: v for k, v in current.items() if k in CATEGORIES})]
        category_max = dict(current)
        peak, peak_total, peak_block = dict(current), -1, None
        released = sorted(self._released)
        gone = 0  # bytes from before the step released so far that the trace's running total still holds
        # Releases of blocks the step never knew (an earlier step's leftovers collected now) lower the
        # running total without lowering any category: added back, so they cannot move the peak.
        others = outside_releases(trace.allocations, self._before_addresses)
        outside, next_other = 0, 0
        # module -> the most alive while its forward, or its backward, allocated
        phase_peak: dict[str, dict[str, int]] = {"forward": {}, "backward": {}}
        for event, block in events:
            while released and released[0][0] <= event.ts:
                at, category, nbytes, address = released.pop(0)
                current[category] -= nbytes
                gone += 0 if address in reported else nbytes
                timeline.append((at, {k: v for k, v in current.items() if k in CATEGORIES}))
            current[block.category] += event.bytes
            category_max[block.category] = max(category_max[block.category], current[block.category])
            timeline.append((event.ts, {k: v for k, v in current.items() if k in CATEGORIES}))
            if event.bytes > 0 and block.phase in phase_peak:
                peaks = phase_peak[block.phase]
                peaks[block.module] = max(peaks.get(block.module, 0), sum(current.values()))
            while next_other < len(others) and others[next_other][0] <= event.ts:
                outside += others[next_other][1]
                next_other += 1
            if event.bytes > 0 and event.total - gone + outside > peak_total:
                peak, peak_total, peak_block = dict(current), event.total - gone + outside, block
        unattributed = peak.pop("unattributed")
        category_max.pop("unattributed")
        peak_all = {**peak, "allocator_cache": 0, "unattributed": unattributed}
        if self.device.type == "cuda":
            # The caching allocator's own peak; what the events did not explain is unattributed. Its
            # growth is over everything on the device at the start, which holds blocks of no category
            # (a loop's last device copy of its batch): those released before the peak lowered the
            # start it grew from.
            grown = torch.cuda.max_memory_allocated(self.device) - self._cuda_start
            if others:  # the trace's running total with those releases added back, at its highest
                released, index, highest = 0, 0, 0
                for event in trace.allocations:
                    while index < len(others) and others[index][0] <= event.ts:
                        released += others[index][1]
                        index += 1
                    highest = max(highest, event.total + released)
                grown = max(grown, highest - self._cuda_start)
            measured = sum(self._before.values()) + grown
            measured_by = "cuda caching allocator"
            peak_all["unattributed"] = measured - sum(peak.values())
            peak_all["allocator_cache"] = max(
                0, torch.cuda.max_memory_reserved(self.device) - torch.cuda.max_memory_allocated(self.device)
            )
        elif trace.allocations:
            measured = sum(peak.values()) + unattributed
            measured_by = "torch CPU allocator (profiler memory events)"
        else:
            measured, measured_by = 0, "unavailable"
        layers = self._layer_bytes(blocks)
        for phase, peaks in phase_peak.items():
            for name, value in peaks.items():
                if name in layers:
                    layers[name][f"{phase}_peak"] = value
        self._result = StepMemory(
            device=str(self.device),
            peak=peak_all,
            measured_peak=measured,
            measured_by=measured_by,
            peak_at_s=peak_block.at if peak_block is not None else 0.0,
            peak_module=peak_block.module if peak_block is not None else NO_MODULE,
            peak_phase=peak_block.phase if peak_block is not None else "other",
            timeline=timeline,
            stages=self._stages,
            layers=layers,
            subsystem=self._subsystem_now(),
            category_max=category_max,
            wall_s=end,
        )

    def _layer_bytes(self, blocks: list[_Block]) -> dict[str, dict[str, int]]:
        layers: dict[str, dict[str, int]] = {}
        for name, module in self.model.named_modules():
            params = [(local(p), p.requires_grad) for p in module.parameters(recurse=False)]
            layers[name or ROOT_MODULE] = {
                "parameters": sum(p.numel() * p.element_size() for p, _ in params),
                "gradients": sum(p.numel() * p.element_size() for p, trained in params if trained),
                "outputs": self._outputs.get(name or ROOT_MODULE, 0),
                "saved": 0,
                "forward_peak": 0,
                "backward_peak": 0,
            }
        for block in blocks:
            if block.saved_by in layers:
                layers[block.saved_by]["saved"] += block.nbytes
        return layers

    def _subsystem_now(self) -> dict[str, Any]:
        resident = self._resident_at_end if self._resident_at_end is not None else self._resident.result()
        info: dict[str, Any] = {**resident, "cache_counters": self._counters.result}
        if self.device.type == "cuda":
            capacity = torch.cuda.get_device_properties(self.device).total_memory
            info["device_capacity_bytes"] = capacity
            info["device_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
            info["device_utilisation"] = torch.cuda.max_memory_reserved(self.device) / capacity
            if self._allocator is not None:
                info.update(self._allocator.trace.copy_summary())
        return info

    def result(self) -> StepMemory:
        if self._result is None:
            raise RuntimeError("no step tracked: use the tracker as a context manager around one step")
        return self._result


def _addresses(tensors: Iterable[torch.Tensor]) -> set[int]:
    """The storage addresses of tensors (where their allocation begins)."""
    found = set()
    for tensor in tensors:
        if tensor.device.type != "meta":
            with suppress(RuntimeError, NotImplementedError):
                found.add(tensor.untyped_storage().data_ptr())
    return found
