"""Where a GPU step's host time goes: real steps by phase, and one block alone against the same block
as one of many in a network.

1. real training steps of suite workloads at a host-bound batch: the host seconds of forward,
   backward and update (the host clock around each phase, nothing synchronised inside the step) and
   the wall step;
2. two zoo-like blocks (conv-BatchNorm-ReLU, Linear-ReLU): each block's forward and backward issue
   time in a tight loop as the only layer of a step, and per block in a network of 20 copies (the
   first call of each phase pays for the step's start, which the model's host calibration,
   ``calibrate.host_issue_rows``, leaves out).

    python benchmarks/host_costs.py --device cuda --output host_costs.json   # benchmarks/gpu_check.sh

Runs on the CPU too (``--device cpu``), where host and device are one and the figures mean less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from dnnperf import environment
from dnnperf.devices import synchronize
from dnnperf.workloads import get_workload

WORKLOADS = ("resnet18", "resnet50", "vgg16", "alexnet", "transformer", "gpt2", "inception_v3", "seq2seq")
BLOCKS: tuple[tuple[str, Callable[[], nn.Module], tuple[int, ...]], ...] = (
    (
        "conv-bn-relu",
        lambda: nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()),
        (16, 64, 28, 28),
    ),
    ("linear-relu", lambda: nn.Sequential(nn.Linear(256, 256), nn.ReLU()), (64, 256)),
)


def step_phases(name: str, device: torch.device, batch: int, steps: int) -> dict[str, float]:
    """Median host seconds per phase and the median wall step of ``name`` at ``small``."""
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("small", device)
    data = {k: v.to(device) for k, v in workload.data("small").synthesize(batch, 1).items()}
    marks: dict[str, list[float]] = {"forward": [], "backward": [], "update": [], "wall": []}

    @contextmanager
    def stages(phase: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        marks[phase].append(time.perf_counter() - started)

    for _ in range(5):
        task.step(data)
    synchronize(device)
    for _ in range(steps):
        started = time.perf_counter()
        task.step(data, stages)
        synchronize(device)
        marks["wall"].append(time.perf_counter() - started)
    return {k: statistics.median(v) for k, v in marks.items()}


#: Copies of a block in the network whose per-block issue time is set beside the block's alone.
COPIES = 20


def issue_times(layer: nn.Module, shape: tuple[int, ...], device: torch.device) -> tuple[float, float]:
    """Median host seconds of ``layer``'s forward and backward issue in a tight loop (synchronised
    every 10 iterations, never inside one)."""
    x = torch.randn(shape, device=device, requires_grad=True)
    with torch.no_grad():
        grad = torch.randn_like(layer(x))
    forward, backward = [], []
    for i in range(60):
        started = time.perf_counter()
        y = layer(x)
        middle = time.perf_counter()
        y.backward(grad)
        forward.append(middle - started)
        backward.append(time.perf_counter() - middle)
        if i % 10 == 9:
            synchronize(device)
    return statistics.median(forward[10:]), statistics.median(backward[10:])


def block(make: Callable[[], nn.Module], shape: tuple[int, ...], device: torch.device) -> dict:
    """A block's forward and backward issue time alone, and per block as one of ``COPIES``."""
    torch.manual_seed(0)
    alone = issue_times(make().to(device), shape, device)
    network = issue_times(nn.Sequential(*[make() for _ in range(COPIES)]).to(device), shape, device)
    return {
        "alone forward s": alone[0],
        "alone backward s": alone[1],
        f"one of {COPIES} forward s": network[0] / COPIES,
        f"one of {COPIES} backward s": network[1] / COPIES,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=16, help="the workloads' batch (host-bound on a GPU)")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--output", type=Path, default=Path("host_costs.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    result: dict = {"environment": environment.describe(), "device": str(device), "batch": args.batch}
    result["steps"] = {}
    for name in args.workloads.split(","):
        result["steps"][name] = step_phases(name, device, args.batch, args.steps)
        print(name, {k: f"{v * 1e3:.2f} ms" for k, v in result["steps"][name].items()}, flush=True)
    result["blocks"] = {label: block(make, shape, device) for label, make, shape in BLOCKS}
    for label, found in result["blocks"].items():
        print(label, {k: f"{v * 1e6:.0f} us" for k, v in found.items() if k.endswith(" s")}, flush=True)
    partial = args.output.with_suffix(args.output.suffix + ".part")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
