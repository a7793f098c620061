"""Library kernels replayed in isolation: a description's distinct convolution, matrix-product and CPU
attention calls, as plain data, run again on random operands of the same shapes, strides and dtypes.

Two parts of the model stand on these replays:

- **Workspace** (perfmodel/workspace.py): what a convolution's backward allocates inside the call.
- **Time** (:func:`replayed_rows`): a roofline with calibrated curves cannot see how a library blocks
  channels. On the project's Xeon, oneDNN computes a 3x3 convolution with 3 output channels in the
  time of one with 16 (docs/performance-model.md); WGAN-GP's generator ends in such a layer and its
  critic's gradient penalty runs double-backward convolutions, and its step was predicted 26% short.
  So on a machine that *is* this host's device (a calibrated profile: ``Machine.replay_device``), each
  distinct convolution call of the step is timed once in isolation and its median replaces the
  roofline of the rows whose every call was replayed. On a CPU, where asked, each distinct small
  matrix product is too, and its rows take the slower of replay and roofline (:data:`MATRIX_OPS`),
  and so is each call of the fused attention kernel (:data:`ATTENTION_OPS`).

A replay evicts the core's private caches before each timed call and leaves the last level alone: in a
step, a convolution's operands were last touched some layers earlier, and the small presets' working
sets fit in this host's 260 MB L3. Flush sizes were compared on four workloads' steps
(docs/validation.md#why-convolutions-are-replayed-and-how-the-replays-are-flushed): replayed warm,
WGAN-GP batch 16 was predicted at 157 ms, with 8 MiB written between calls (4x this core's L2) 171 ms,
with 64 MiB (which also thrashes the L3 and the TLB) 239 ms, against 187 ms measured; small convolutions
are the most sensitive. On a GPU the L2 is flushed whole (twice its size written), not yet checked
against a step. These are microbenchmarks of the library on this device, never the step being predicted;
their results are cached per host, device, thread count and torch version."""

from __future__ import annotations

import functools
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from dnnperf.devices import current
from dnnperf.hardware import matmul_flops
from dnnperf.probes.opcount import minor_faults

#: Convolutions forward and backward (and the forward convolutions a double backward runs): replayed
#: for workspace and for time, the kernels whose cost depends on more than their FLOPs and bytes.
CONVOLUTION_OPS = ("aten.convolution", "aten.convolution_backward")
#: Matrix products: where asked (``ComputeOptions.replay_matrix_products``), replayed for time on a
#: CPU where a call is smaller than the machine's calibrated matmul curve starts (this host's: square
#: products of 268 MFLOP), which prices it at its smallest size's rate. Replayed, such calls run
#: several times slower than that (hf:levit's and hf:swin's products of 10 kFLOP to 3 MFLOP a call:
#: 1.5-6.5x), while calls of 10-300 MFLOP replay at 0.87-0.98 of it, their operands warmer in
#: isolation than in a step. So a product's replay only ever raises its price (compute.op_times).
#: Not on a GPU: not validated there.
MATRIX_OPS = ("aten.mm", "aten.bmm", "aten.addmm")
#: The CPU's fused attention kernel, forward and backward: replayed for time on a CPU (unless
#: ``ComputeOptions.replay_attention`` is off). Its FLOPs (the two products)
#: leave out the online softmax over every score, whose cost per score grows as the head narrows:
#: 2 x 8 heads x 1,024 tokens here took 0.38 ns a score forward beyond its products at 64 dimensions
#: a head and 1.8 ns at 4, so a denoising U-Net's attention of 4 dimensions a head was priced at a
#: twelfth of its time.
ATTENTION_OPS = (
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
)
#: Operators a description keeps the distinct calls of.
REPLAYED_OPS = CONVOLUTION_OPS + MATRIX_OPS + ATTENTION_OPS
#: Families whose forward and backward calls a description keeps too, to be replayed where asked
#: (``ComputeOptions.replay_data_movement``): data movement (copies, pads, concatenations, gathers,
#: unfold's im2col and its col2im) and the operators with no formula. Their bytes do not tell their
#: time: the layout does. On this host a 3x3 unfold's col2im ran 1.59 ms where its bytes at the memory
#: family's efficiency came to 0.26, and a broadcast operand's clone 12 ms where they came to 50.
DATA_MOVEMENT_FAMILIES = ("memory", "uncovered")
#: The phases whose other calls a description keeps, each with its family (the update's are the
#: optimizer's, priced apart), for the replays of data movement or of the operators the layer zoo
#: never timed (``ComputeOptions.replay_untimed``).
KEPT_PHASES = ("forward", "backward")
#: Families a description never keeps the calls of: views and metadata, which run no kernel.
UNKEPT_FAMILIES = ("free",)
#: Timed calls per replay (after one untimed call that lets the library set up its caches).
REPEATS = 5
#: Bytes written between timed calls where the caches are not known (see flush_bytes).
DEFAULT_FLUSH_BYTES = 8 * 2**20
#: Key prefix of the on-disk cache; change it when what a replay measures changes.
CACHE_VERSION = "kernel-time-4"


_NOT_PLAIN = object()


def _encoded(value: Any) -> Any:
    """An argument as plain data (a tensor by shape, strides and dtype), or ``_NOT_PLAIN``."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta" or value.layout != torch.strided:
            return _NOT_PLAIN
        return {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype)[6:]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": str(value)}  # a mask's fill, -inf: JSON has no such number
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
        return {"torch": str(value).removeprefix("torch.")}  # a copy's dtype, a clone's memory format
    if isinstance(value, torch.device):
        return {"device": value.type}  # a factory's: replayed on the replay's device
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int)) for v in value):
        return list(value)
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, torch.Tensor) for v in value):
        items = [_encoded(v) for v in value]  # a concatenation's tensors, an index's indices
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    return _NOT_PLAIN


def signature(
    op_name: str, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """A call as plain data (tensors by shape, strides and dtype; keyword arguments under "kwargs"
    where it has any), or None if it cannot be replayed."""
    encoded = [_encoded(value) for value in args]
    named = {name: _encoded(value) for name, value in (kwargs or {}).items()}
    if any(value is _NOT_PLAIN for value in (*encoded, *named.values())):
        return None
    return {"op": op_name, "args": encoded, **({"kwargs": named} if named else {})}


def _operand(value: Any, device: torch.device) -> Any:
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return [_operand(v, device) for v in value]
    if not isinstance(value, dict):
        return value
    if "torch" in value:
        return getattr(torch, value["torch"])
    if "float" in value:
        return float(value["float"])
    if "device" in value:
        return device
    dtype = getattr(torch, value["dtype"])
    shape, stride = value["shape"], value["stride"]
    # The storage the strides reach (an expanded gradient has stride 0: one element per row).
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True)) if all(shape) else 0
    storage = torch.empty(span, dtype=dtype, device=device)
    if dtype == torch.bool:  # a boolean mask lets every position through, as most of a real one does
        storage = storage.fill_(True)
    else:
        storage = storage.normal_() if storage.is_floating_point() else storage.zero_()
    return storage.as_strided(shape, stride)


def operands(call: Mapping[str, Any], device: torch.device) -> list[Any]:
    """Random operands for a replay of ``call`` on ``device`` (its positional arguments)."""
    return [_operand(value, device) for value in call["args"]]


def keyword_operands(call: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Random operands for ``call``'s keyword arguments (an attention mask), as :func:`operands`."""
    return {name: _operand(value, device) for name, value in call.get("kwargs", {}).items()}


def resolve(op_name: str) -> Any:
    """The operator overload a signature names (``"aten.convolution"``)."""
    namespace, name = op_name.split(".", 1)
    packet = getattr(getattr(torch.ops, namespace), name)
    # Without a default overload (fill: Scalar and Tensor), the packet picks one by the arguments.
    return getattr(packet, "default", packet)


#: Per replayed operator: where its weight, output-channel operand (dim 1), bias and groups sit.
CHANNEL_ARGS = {
    "aten.convolution": {"weight": 1, "bias": 2, "groups": 8, "output": None},
    "aten.convolution_backward": {"weight": 2, "bias": 3, "groups": 9, "output": 0},
}


def _dense_strides(shape: Sequence[int], stride: Sequence[int]) -> list[int]:
    """Dense strides for ``shape`` in the dimension order ``stride`` has (channels-last stays so)."""
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    out = [0] * len(shape)
    step = 1
    for d in reversed(order):
        out[d] = step
        step *= max(shape[d], 1)
    return out


def split_output_channels(call: Mapping[str, Any], ways: int) -> dict[str, Any] | None:
    """``call`` as each of ``ways`` ranks makes it when tensor parallelism splits the convolution's
    output channels (distributed/tensor_parallel.py): the weight's and bias's first dimension and the
    output gradient's channels divided. None for a call it does not split (another operator, grouped,
    channels that do not divide)."""
    where = CHANNEL_ARGS.get(call["op"])
    if where is None:
        return None
    args = [dict(a) if isinstance(a, dict) else a for a in call["args"]]
    weight = args[where["weight"]]
    if args[where["groups"]] != 1 or not isinstance(weight, dict) or weight["shape"][0] % ways:
        return None

    def divided(tensor: dict[str, Any], dim: int) -> dict[str, Any]:
        shape = list(tensor["shape"])
        shape[dim] //= ways
        return {**tensor, "shape": shape, "stride": _dense_strides(shape, tensor["stride"])}

    args[where["weight"]] = divided(weight, 0)
    bias = args[where["bias"]]
    if isinstance(bias, dict):  # forward: the bias tensor
        args[where["bias"]] = divided(bias, 0)
    elif isinstance(bias, list):  # backward: the bias's sizes
        args[where["bias"]] = [bias[0] // ways]
    if where["output"] is not None:
        args[where["output"]] = divided(args[where["output"]], 1)
    return {"op": call["op"], "args": args}


def split_kernels(
    kernels: Sequence[Mapping[str, Any]], modules: set[str], ways: int
) -> tuple[list[dict[str, Any]], set[tuple[str, str, str]]]:
    """``StepGraph.kernels`` as a tensor-parallel rank runs them: the calls of ``modules`` (split by
    output channel) at their split shapes, the rest as they are; and the (module, phase, operator)
    rows whose calls were split."""
    out: list[dict[str, Any]] = []
    split_rows: set[tuple[str, str, str]] = set()
    for kernel in kernels:
        mine = [row for row in kernel["rows"] if row[0] in modules]
        others = [row for row in kernel["rows"] if row[0] not in modules]
        call = split_output_channels(kernel["call"], ways) if mine else None
        if call is None:
            out.append(dict(kernel))
            continue
        out.append({"call": call, "rows": mine})
        split_rows.update((m, p, o) for m, p, o, _ in mine)
        if others:
            out.append({"call": kernel["call"], "rows": others})
    return out, split_rows


class KernelCalls:
    """An ``OpCounter`` observer: the distinct calls of :data:`REPLAYED_OPS` in a step, and of every
    other operator that runs a kernel in its forward and backward (:data:`KEPT_PHASES`, with its
    family), each with how many times each (module, phase, operator) row made it."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.rows: list[dict[tuple[str, str, str], int]] = []
        self._index: dict[str, int] = {}
        #: Of ``calls``, the family of each kept for the replays of other operators (not REPLAYED_OPS).
        self._families: dict[int, str] = {}

    def __call__(self, module: str, phase: str, call: Any, info: Any) -> None:
        other = phase in KEPT_PHASES and info.family not in UNKEPT_FAMILIES
        if info.name not in REPLAYED_OPS and not other:
            return
        # The overload packet is replayed (resolve: its default overload), so an ``out=`` is left out.
        named = {name: value for name, value in call.kwargs.items() if name != "out"}
        found = signature(info.name, call.args, named)
        if found is None:
            return
        key = repr(found)
        if key not in self._index:
            self._index[key] = len(self.calls)
            if info.name not in REPLAYED_OPS:
                self._families[len(self.calls)] = info.family
            self.calls.append(found)
            self.rows.append({})
        rows = self.rows[self._index[key]]
        rows[module, phase, info.name] = rows.get((module, phase, info.name), 0) + 1

    def to_list(self) -> list[dict[str, Any]]:
        """As ``StepGraph.kernels`` keeps them: ``{"call": signature, "rows": [[module, phase, op,
        count], ...]}``, with the operator's ``"family"`` where it is not one of REPLAYED_OPS."""
        return [
            {
                "call": call,
                "rows": [[*key, count] for key, count in rows.items()],
                **({"family": self._families[index]} if index in self._families else {}),
            }
            for index, (call, rows) in enumerate(zip(self.calls, self.rows, strict=True))
        ]


@functools.cache
def flush_bytes(device: torch.device) -> int:
    """Bytes to write between timed calls (see the module doc): on a CPU four times its largest
    cache below the last level (L2), on a GPU twice its L2."""
    from dnnperf.hardware import cpu_caches, gpu_caches

    if device.type == "cuda":
        caches = gpu_caches(device)
        return 2 * caches[-1].size_bytes if caches else 128 * 2**20
    sizes = sorted(c.size_bytes for c in cpu_caches(1))
    return 4 * sizes[-2] if len(sizes) > 1 else DEFAULT_FLUSH_BYTES


@functools.cache
def device_lead(device: torch.device, seconds: float = 3e-4) -> Callable[[], None] | None:
    """A call that queues about ``seconds`` of work on a GPU (a matrix product sized on first use):
    run before a timed call, it keeps the device busy while the host sets the call up and launches it,
    so that events around the call time its kernels alone. On an idle GPU they would also time the
    launch's latency (a cuDNN convolution's set-up on the host is tens of microseconds). None on a
    CPU, which runs each call as the host makes it."""
    if torch.device(device).type != "cuda":
        return None
    for size in (1024, 2048, 4096, 8192):  # a few launches at most: the lead must not fill the queue
        with current(device):
            a = torch.randn(size, size, device=device)
            out = torch.empty_like(a)
            torch.mm(a, a, out=out)
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                torch.mm(a, a, out=out)
            end.record()
            end.synchronize()
        repeats = max(1, round(seconds / (start.elapsed_time(end) * 1e-3 / 3)))
        if repeats <= 8:
            break

    def lead() -> None:
        for _ in range(repeats):
            torch.mm(a, a, out=out)

    return lead


class Replay(NamedTuple):
    """One call replayed: median seconds, and the page faults it took (median per call)."""

    seconds: float
    faults: float


def time_call(call: Mapping[str, Any], device: torch.device | str = "cpu", repeats: int = REPEATS) -> Replay:
    """One call of ``call`` on ``device``, caches flushed before each timed call; NaN seconds when it
    cannot be replayed.

    Page faults are counted because the step's own are counted and charged apart (perfmodel/faults.py):
    a replay whose result glibc maps fresh on every call (a 256 KiB output is 64 faults, ~80 us
    here) would charge them twice, and whether it does depends on the process's allocator history
    (WGAN-GP ``small`` batch 4's replays summed to 83 ms in one process and 99 ms in another)."""
    device = torch.device(device)
    with current(device):
        return _time_call(call, device, repeats)


def _time_call(call: Mapping[str, Any], device: torch.device, repeats: int) -> Replay:
    try:
        op = resolve(call["op"])
        args = operands(call, device)
        named = keyword_operands(call, device)
        cuda = device.type == "cuda"
        flush = torch.empty(flush_bytes(device) // 4, device=device)
        lead = device_lead(device)
        op(*args, **named)  # untimed: a library's first call may set up caches of its own
        seconds: list[float] = []
        faults: list[int] = []
        for _ in range(repeats):
            flush.fill_(1.0)
            before = minor_faults()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                lead()  # the device busy while the host launches the call: its kernels alone are timed
                start.record()
                op(*args, **named)
                end.record()
                end.synchronize()
                seconds.append(start.elapsed_time(end) / 1e3)
            else:
                began = time.perf_counter()
                op(*args, **named)
                seconds.append(time.perf_counter() - began)
            faults.append(minor_faults() - before)
        return Replay(statistics.median(seconds), statistics.median(faults))
    except Exception:  # a replay must never break the prediction it serves: the roofline stands
        return Replay(math.nan, 0.0)


#: In-process results, so that a sweep's thousand predictions read the disk cache once.
_TIMED: dict[str, Replay] = {}
#: Whether replays are measured again rather than read from the disk cache (see :func:`remeasured`).
_REMEASURE = False


def forget_replays() -> None:
    """Drop this process's replay results: the next prediction reads the disk cache (or measures) anew."""
    _TIMED.clear()


@contextmanager
def remeasured() -> Iterator[None]:
    """Within: every replay is measured anew (once each), not read from the cache, and the cache
    takes the new figures. ``dnnperf validate`` re-measures in every round of its runs, so that a
    slow spell of the host lands in one round's replays, as in one round's runs, rather than in
    every prediction."""
    global _REMEASURE
    previous = _REMEASURE
    _REMEASURE = True
    _TIMED.clear()
    try:
        yield
    finally:
        _REMEASURE = previous
        _TIMED.clear()


def _gpu_key(device: str) -> str:
    from dnnperf.hardware import device_key

    return device_key(device)


def replays(calls: Iterable[Mapping[str, Any]], device: str) -> list[Replay]:
    """Each call replayed on ``device`` (cached; NaN seconds where it cannot be replayed)."""
    from dnnperf.cache import JsonCache

    store = JsonCache("kernel-times")
    which = device if not device.startswith("cuda") else f"{device}/{_gpu_key(device)}"
    host = f"{CACHE_VERSION}/{platform.node()}/{which}/{torch.get_num_threads()}/{torch.__version__}"
    keys = [(f"{host}/{call!r}", call) for call in calls]
    stored = {} if _REMEASURE or all(k in _TIMED for k, _ in keys) else store.entries()
    measured: dict[str, list[float]] = {}
    for key, call in keys:
        if key in _TIMED:
            continue
        cached = stored.get(key)
        if isinstance(cached, list) and len(cached) == 2 and all(isinstance(v, (int, float)) for v in cached):
            _TIMED[key] = Replay(float(cached[0]), float(cached[1]))
        else:
            _TIMED[key] = time_call(call, device)
            if math.isfinite(_TIMED[key].seconds):
                measured[key] = list(_TIMED[key])
    if measured:
        store.put_many(measured)  # one write for the lot
    return [_TIMED[key] for key, _ in keys]


#: The prefixes of floating-point and complex dtypes' names, as calls carry them (``"complex64"``).
FLOATING = ("float", "bfloat", "complex")


def floating_dtypes(call: Mapping[str, Any]) -> frozenset[str]:
    """The dtypes of ``call``'s floating-point and complex tensors (its arguments and keywords)."""
    found: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                visit(item)
        elif isinstance(value, dict) and str(value.get("dtype", "")).startswith(FLOATING):
            found.add(str(value["dtype"]))

    for value in (*call["args"], *call.get("kwargs", {}).values()):
        visit(value)
    return frozenset(found)


def reads_values(call: Mapping[str, Any]) -> bool:
    """Whether ``call`` takes an integer or boolean tensor: indices or a mask, whose values (zeros and
    all-true in a replay, :func:`operands`) choose what the kernel does, so a replay on them is no
    measure of the step's call (a gather from one row, every token routed to one expert)."""

    def integral(value: Any) -> bool:
        if isinstance(value, list):
            return any(integral(v) for v in value)
        dtype = value.get("dtype", "") if isinstance(value, dict) else ""
        return bool(dtype) and not dtype.startswith(FLOATING)

    return any(integral(v) for v in (*call["args"], *call.get("kwargs", {}).values()))


#: A call that moves next to nothing: its replay is the replay's own cost a call (the operator's
#: dispatch from Python, the timer), which the model charges apart as the call's dispatch.
FLOOR_CALL = {"op": "aten.clone", "args": [{"shape": [1], "stride": [1], "dtype": "float32"}]}


def replay_floor(device: str) -> float:
    """Seconds a replay of :data:`FLOOR_CALL` takes on ``device`` (cached as replays are): what comes off
    each replay of data movement, whose calls can be as short as the replay's own cost; 0 where it
    cannot be replayed."""
    seconds = replays([FLOOR_CALL], device)[0].seconds
    return seconds if math.isfinite(seconds) else 0.0


def product_flops(call: Mapping[str, Any]) -> float:
    """A matrix product's FLOPs from its signature (its last two tensors are the factors; a bmm's
    first dimension is its batch); infinite where they are not there."""
    shapes = [value["shape"] for value in call["args"] if isinstance(value, dict)]
    if len(shapes) < 2 or len(shapes[-2]) < 2 or not shapes[-1]:
        return math.inf
    left, right = shapes[-2], shapes[-1]
    return float(math.prod(left[:-2]) * matmul_flops(left[-2], left[-1], right[-1]))


def replayed_between(
    sources: Sequence[Mapping[str, Any]],
    batch_size: int,
    calls_per_row: Mapping[tuple[str, str, str], float],
    device: str,
    fault_s: float = 0.0,
    products_below: float = 0.0,
    attention: bool = False,
    others: Callable[[Mapping[str, Any], str], bool] | None = None,
) -> dict[tuple[str, str, str], float]:
    """An interpolated description's rows from its two sources' replays (``StepGraph.kernels_between``):
    each row replayed whole in both, its seconds interpolated linearly in the batch to ``batch_size``
    (as the description's FLOPs and bytes are), never below 0."""
    if len(sources) != 2 or sources[0]["batch"] == sources[1]["batch"]:
        return {}
    (a, rows_a), (b, rows_b) = (
        (
            float(s["batch"]),
            replayed_rows(s["kernels"], calls_per_row, device, fault_s, products_below, attention, others),
        )
        for s in sources
    )
    t = (batch_size - a) / (b - a)
    return {
        key: max(value + t * (rows_b[key] - value), 0.0) for key, value in rows_a.items() if key in rows_b
    }


def replayed_rows(
    kernels: Sequence[Mapping[str, Any]],
    calls_per_row: Mapping[tuple[str, str, str], float],
    device: str,
    fault_s: float = 0.0,
    products_below: float = 0.0,
    attention: bool = False,
    others: Callable[[Mapping[str, Any], str], bool] | None = None,
) -> dict[tuple[str, str, str], float]:
    """(module, phase, operator) -> the step's seconds in that row from replays, for the rows whose
    every call (``calls_per_row``, the description's count) was replayed; each replay's page faults
    at ``fault_s`` apiece taken off (the step's are charged apart). Matrix products only on a CPU
    and of fewer than ``products_below`` FLOPs a call (:data:`MATRIX_OPS`), or where ``others(call,
    "matmul")``; the CPU's attention kernel only where ``attention`` (:data:`ATTENTION_OPS`); the
    other operators a description keeps (with their family, KernelCalls) only on a CPU and where
    ``others(call, family)``, net of a replay's own cost a call (:func:`replay_floor`)."""
    cpu = device.startswith("cpu")

    def kept(kernel: Mapping[str, Any]) -> bool:  # a call ``others`` may choose
        return "family" in kernel or kernel["call"]["op"] in MATRIX_OPS

    # Which calls ``others`` chooses (on a CPU; never one that reads indices or a mask).
    picked = [
        cpu
        and others is not None
        and kept(k)
        and not reads_values(k["call"])
        and others(k["call"], k.get("family", "matmul"))
        for k in kernels
    ]
    # A row is priced whole, by its replays or not at all: where ``others`` chose some of its calls
    # (a complex exp beside a float one), its other kept calls are replayed with them.
    hit = {(m, p, o) for k, yes in zip(kernels, picked, strict=True) if yes for m, p, o, _ in k["rows"]}

    def wanted(kernel: Mapping[str, Any]) -> bool:
        call = kernel["call"]
        # Chosen by ``others``, or beside such a call in its row.
        in_hit_row = (
            cpu
            and kept(kernel)
            and not reads_values(call)
            and any((m, p, o) in hit for m, p, o, _ in kernel["rows"])
        )
        if call["op"] in MATRIX_OPS:
            return (cpu and product_flops(call) < products_below) or in_hit_row
        if call["op"] in ATTENTION_OPS:
            return cpu and attention
        if "family" in kernel:
            return in_hit_row
        return True

    kernels = [k for k in kernels if wanted(k)]
    if not kernels:
        return {}
    floor = replay_floor(device) if any("family" in k for k in kernels) else 0.0
    total: dict[tuple[str, str, str], float] = {}
    counted: dict[tuple[str, str, str], int] = {}
    for kernel, replay in zip(kernels, replays([k["call"] for k in kernels], device), strict=True):
        own = floor if "family" in kernel else 0.0
        each = max(replay.seconds - replay.faults * fault_s - own, 0.0)
        for module, phase, op, count in kernel["rows"]:
            key = (module, phase, op)
            total[key] = total.get(key, 0.0) + count * each
            counted[key] = counted.get(key, 0) + count
    return {
        key: value
        for key, value in total.items()
        if math.isfinite(value) and counted[key] == calls_per_row.get(key, -1)
    }
