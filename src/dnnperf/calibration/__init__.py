"""Hardware calibration (``dnnperf hw``): what this machine can do, measured, as a
:class:`~dnnperf.hardware.HardwareProfile`.

:func:`calibrate` times a few kernels on one device:

* peak FLOP/s of square matrix products (``torch.mm``) and 3x3 convolutions (``F.conv2d``) per
  precision: float32 everywhere; bfloat16 on CPU when it runs at a sane speed; on CUDA also float32
  with TF32, float16 and bfloat16. The peak of a precision is the best sustained rate: the fastest
  sample of the fastest configuration (see :attr:`~dnnperf.hardware.KernelTiming.best_rate`)
  (:mod:`.compute`);
* memory bandwidth from sizes well inside the caches to well beyond them, for a copy
  (``dst.copy_(src)``, 2 x bytes moved) and a STREAM-style triad (``a = b + s * c``, 3 x bytes). The
  triad's DRAM plateau (its best sustained rate) is the roofline's memory bandwidth; the curve shows
  the cache plateaus (:mod:`.memory`);
* host<->device copy bandwidth (CUDA only), pageable and pinned, both directions (:mod:`.transfers`);
* the per-operator dispatch overhead (a one-element ``torch.add``, host side) (:mod:`.dispatch`).

Every quantity keeps its raw timed repetitions (mean seconds per call over a sample of back-to-back
calls, after warm-up: :mod:`.timing`); statistics come from :class:`~dnnperf.stats.Samples`. The sizes
of one compute curve are timed in alternating blocks, every compute curve in common rounds through the
calibration, and the memory sizes in several sweeps between those rounds, so that the machine's drifts
fall on all of them alike and every kernel gets several chances at a quiet moment. Timing excludes the
allocation of inputs and, where the operator has an ``out=`` form, of outputs. On CUDA the device is
synchronised around every timed sample. What is measured and for how long: :mod:`.plans`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timezone

import torch

from dnnperf import environment
from dnnperf.calibration.compute import measure_all_compute
from dnnperf.calibration.dispatch import measure_dispatch
from dnnperf.calibration.memory import MemorySweeps
from dnnperf.calibration.plans import PLANS, Plan
from dnnperf.calibration.timing import BackgroundLoad, Progress, Tracker, bytes_text
from dnnperf.calibration.transfers import measure_transfers
from dnnperf.errors import UsageError
from dnnperf.hardware import (
    DRAM_FACTOR,
    TRANSFERS,
    HardwareProfile,
    KernelTiming,
    cpu_caches,
    cuda_index,
    device_key,
    gpu_caches,
)


def _check_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("cannot calibrate cuda: no CUDA GPU is available on this machine")
        index = cuda_index(device)
        if index >= torch.cuda.device_count():
            raise UsageError(f"{device} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
        return torch.device("cuda", index)
    if device.type == "cpu":
        return torch.device("cpu")
    raise UsageError(f"cannot calibrate {device}: use cpu or cuda")


def _total_weight(plan: Plan, device: torch.device) -> float:
    compute = len(plan.precisions) * (len(plan.mm_sizes) + 2 * len(plan.conv_shapes))
    weight = compute * (plan.compute_s + plan.warmup_s)
    weight += 2 * len(plan.memory_sizes) * (plan.memory_s + max(1, plan.memory_sweeps) * plan.memory_warmup_s)
    if device.type == "cuda":
        weight += len(TRANSFERS) * (plan.transfer_s + plan.warmup_s)
    return weight + plan.dispatch_s + plan.warmup_s


def calibrate(
    device: torch.device | str, progress: Progress | None = None, quick: bool = False
) -> HardwareProfile:
    """Measure ``device`` and return its profile (not saved: see :func:`dnnperf.hardware.save_profile`).

    ``progress(description, fraction_done)`` is called before each measurement and once with 1.0 at
    the end. ``quick`` runs tiny sizes and few repetitions (seconds; for tests, not for analyses)."""
    device = _check_device(device)
    plan = PLANS[(device.type, quick)]
    tracker = Tracker(progress, _total_weight(plan, device))
    background = BackgroundLoad()
    started = time.perf_counter()
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    notes: list[str] = []
    threads = torch.get_num_threads()
    on_device = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
    with on_device, torch.no_grad():
        # The memory sweeps are spread between the compute rounds: a stretch of a neighbour's memory
        # traffic then slows one sweep, and the other sweeps still see the machine's bandwidth.
        caches = gpu_caches(device) if device.type == "cuda" else cpu_caches(threads)
        sweeps = MemorySweeps(device, plan, tracker, caches)
        compute = measure_all_compute(device, plan, tracker, sweeps)
        memory = sweeps.curves(notes)
        if device.type == "cuda":
            transfers: dict[str, KernelTiming] | None = measure_transfers(device, plan, tracker)
            transfer_reason = None
            name = torch.cuda.get_device_name(device)
        else:
            transfers = None
            transfer_reason = "not applicable: the CPU is the host, there is no host<->device copy"
            name = environment.cpu_model()
        dispatch = measure_dispatch(device, plan, tracker)
    profile = HardwareProfile(
        device_key=device_key(device),
        device_type=device.type,
        device_index=device.index,
        device_name=name,
        threads=threads,
        quick=quick,
        created=created,
        duration_s=time.perf_counter() - started,
        environment=environment.describe(),
        caches=caches,
        compute=tuple(compute),
        memory=memory,
        dispatch=dispatch,
        host_transfer=transfers,
        host_transfer_reason=transfer_reason,
        notes=tuple(notes),
        background_cores=round(background.cores(), 3),
    )
    if not profile.dram_points()[1]:
        largest = max(p.params["footprint"] for p in profile.bandwidth_curve().points)
        profile = replace(
            profile,
            notes=(
                *profile.notes,
                f"DRAM plateau not confirmed: the largest working set ({bytes_text(largest)}) is not "
                f"known to exceed {DRAM_FACTOR}x the last-level cache; memory_bandwidth may include "
                "cache effects",
            ),
        )
    tracker.finish()
    return profile
