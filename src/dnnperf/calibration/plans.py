"""What a calibration measures and for how long, per device type, full or quick."""

from __future__ import annotations

from dataclasses import dataclass

from dnnperf.hardware import PRECISIONS, GiB, KiB, MiB


@dataclass(frozen=True)
class Plan:
    """What to measure and for how long."""

    precisions: tuple[str, ...]
    mm_sizes: tuple[int, ...]
    #: (batch, channels, pixels): 3x3 convolutions, padding 1, as many output channels as input.
    conv_shapes: tuple[tuple[int, int, int], ...]
    memory_sizes: tuple[int, ...]
    transfer_bytes: int
    #: Warm-up before each configuration: first calls pay for page faults, oneDNN primitive creation,
    #: cuDNN algorithm search and clock ramp-up. Memory kernels need less (their pages are touched
    #: when the tensors are filled).
    warmup_s: float
    memory_warmup_s: float
    #: Measuring time per configuration (compute: spread over alternating blocks of about block_s).
    compute_s: float
    block_s: float
    memory_s: float
    #: The memory sizes are swept this many times (largest first, then smallest first, alternately),
    #: memory_s split between the sweeps: a neighbour's burst of memory traffic then lands on a part of
    #: every size's samples rather than on all the samples of whichever sizes ran at that moment.
    memory_sweeps: int
    transfer_s: float
    dispatch_s: float
    #: Shortest sample: a kernel shorter than this is called back to back within one sample, so that
    #: clock resolution and the synchronisation around a sample do not count.
    min_sample_s: float
    min_repeats: int
    max_repeats: int = 200


def _powers_of_two(low: int, high: int, step: int = 2) -> tuple[int, ...]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= step
    return tuple(sizes)


# Timed on this project's 2-core CI machine: the full CPU plan takes about 75 s, the quick one a few.
PLANS = {
    ("cpu", False): Plan(
        precisions=("float32", "bfloat16"),
        mm_sizes=(512, 1024, 2048),
        # Early layers (large images, few channels) and late ones (small images, many channels: on
        # some CPUs oneDNN's fastest case, e.g. 152 GFLOP/s at (32, 256, 4) against 116 at (8, 256, 28)
        # on one AMD EPYC core; a peak that misses it puts late VGG layers above 100%).
        conv_shapes=((16, 64, 56), (16, 128, 28), (8, 256, 28), (32, 256, 8), (32, 256, 4), (32, 512, 4)),
        memory_sizes=_powers_of_two(16 * KiB, 512 * MiB),
        transfer_bytes=0,
        warmup_s=0.25,
        memory_warmup_s=0.05,
        compute_s=1.75,
        block_s=0.25,
        memory_s=0.9,
        memory_sweeps=4,
        transfer_s=0.0,
        dispatch_s=1.5,
        min_sample_s=0.02,
        min_repeats=5,
    ),
    ("cpu", True): Plan(
        precisions=("float32", "bfloat16"),
        mm_sizes=(96, 192),
        conv_shapes=((2, 16, 16),),
        memory_sizes=(16 * KiB, 128 * KiB, 1 * MiB),
        transfer_bytes=0,
        warmup_s=0.01,
        memory_warmup_s=0.005,
        compute_s=0.04,
        block_s=0.01,
        memory_s=0.02,
        memory_sweeps=2,
        transfer_s=0.0,
        dispatch_s=0.03,
        min_sample_s=0.002,
        min_repeats=3,
    ),
    ("cuda", False): Plan(
        precisions=PRECISIONS,
        mm_sizes=(2048, 4096, 8192),
        conv_shapes=((64, 128, 56), (64, 256, 28), (128, 256, 28)),
        memory_sizes=_powers_of_two(1 * MiB, 4 * GiB),
        transfer_bytes=256 * MiB,
        warmup_s=0.2,
        memory_warmup_s=0.05,
        compute_s=0.5,
        block_s=0.1,
        memory_s=0.3,
        memory_sweeps=2,
        transfer_s=1.0,
        dispatch_s=1.0,
        min_sample_s=0.01,
        min_repeats=5,
    ),
    ("cuda", True): Plan(
        precisions=PRECISIONS,
        mm_sizes=(256, 512),
        conv_shapes=((4, 32, 16),),
        memory_sizes=(1 * MiB, 4 * MiB, 16 * MiB),
        transfer_bytes=16 * MiB,
        warmup_s=0.01,
        memory_warmup_s=0.005,
        compute_s=0.03,
        block_s=0.01,
        memory_s=0.02,
        memory_sweeps=2,
        transfer_s=0.03,
        dispatch_s=0.03,
        min_sample_s=0.002,
        min_repeats=3,
    ),
}
