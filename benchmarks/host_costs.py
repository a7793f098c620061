"""Where a GPU step's host time goes, against what the performance model's host calibration sees.

The model over-predicts host-bound GPU steps 1.3-1.6x (docs/validation.md#single-process-on-a-gpu-step-time).
This measures, in one process on one device, where a step's host time goes and what the
calibration's timing sees of it:

1. real training steps of suite workloads at a host-bound batch: the host seconds of forward,
   backward and update (the host clock around each phase, nothing synchronised inside the step) and
   the wall step;
2. two zoo-like blocks (conv-BatchNorm-ReLU, Linear-ReLU): each operator's host seconds as the model's
   calibration times them (the counter, each call behind a lead), against the blocks' forward and
   backward in a tight loop without any counter;
3. what the counter adds to a view against a plain call (``calibrate.operator_call_overhead``).

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
from dnnperf.perfmodel.calibrate import operator_call_overhead, timed_rows
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


def block(make: Callable[[], nn.Module], shape: tuple[int, ...], device: torch.device) -> dict:
    """A block's operators as the model's calibration times them (``calibrate.timed_rows``: the
    counter, each call behind a lead), their host seconds per call and per phase, against the block's
    forward and backward in a tight loop without any counter."""
    torch.manual_seed(0)
    layer = make().to(device)
    rows = timed_rows(layer, shape, 10, device)
    per_call = rows["host"] / rows["calls"]
    keys = rows["phase"] + "/" + rows["family"] + "/" + rows["op"]
    found: dict = {"counted per call": dict(zip(keys, per_call, strict=True))}
    for phase in ("forward", "backward"):
        found[f"counted {phase} s"] = float(rows.loc[rows["phase"] == phase, "host"].sum())
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
    found["loop forward s"] = statistics.median(forward[10:])
    found["loop backward s"] = statistics.median(backward[10:])
    return found


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
    result["view_counter_adds_s"] = operator_call_overhead(device)
    print(f"a view: the counter adds {result['view_counter_adds_s'] * 1e6:.2f} us", flush=True)
    partial = args.output.with_suffix(args.output.suffix + ".part")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
