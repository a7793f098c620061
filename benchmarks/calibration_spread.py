"""How far the model's calibration moves between back-to-back runs on this host; prints a markdown table.

Each repeat measures the layer zoo (``calibrate.zoo_calibration``: each family's efficiency against
the profile's curves) and the optimizer update's cost (``calibrate.update_samples`` fitted by
``update_step_fit``: the share of its counted bytes it moves) anew, one thread, against one
`dnnperf hw` profile; the table gives each figure's median and range over the repeats. What moves
here moves every prediction made with the calibration (docs/validation-heldout.md: a set's bias
between runs).

``--profile PATH`` (required): the `dnnperf hw` profile; ``--json PATH`` keeps every repeat.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from dnnperf import environment, hardware
from dnnperf.jsonio import write_json_atomic
from dnnperf.perfmodel import machine as machines
from dnnperf.perfmodel.calibrate import update_samples, update_step_fit, zoo_calibration

#: The families the held-out steps spend most of their non-product time in, and the compute-bound ones.
FAMILIES = (
    "elementwise/forward",
    "elementwise/backward",
    "memory/forward",
    "memory/backward",
    "normalization/backward",
    "softmax/backward",
    "convolution/forward",
    "convolution/backward",
    "matmul/forward/aten.addmm",
)
UPDATE_SHARE = "update's share of its bytes"


def measure(profile: hardware.HardwareProfile, repeats: int) -> list[dict[str, float]]:
    """``repeats`` calibrations one after another: each family's efficiency and the update's share."""
    base = machines.from_profile(profile)
    found = []
    for number in range(repeats):
        zoo = zoo_calibration(base)
        zoo_machine = machines.from_profile(profile, efficiency=zoo.efficiency, call_s=zoo.call_s)
        figures = {f: zoo.efficiency[f] for f in FAMILIES if f in zoo.efficiency}
        figures[UPDATE_SHARE] = update_step_fit(*update_samples(zoo_machine).fitted(step_sets=True))[2]
        found.append(figures)
        print(f"repeat {number + 1} of {repeats} done", flush=True)
    return found


def markdown(document: dict) -> str:
    repeats = document["repeats"]
    lines = [
        f"{len(repeats)} calibrations one after another, {document['finished']}, {document['machine']}, "
        f"torch {document['torch']}, commit `{document['commit']}`, one thread:",
        "",
        "| figure | median | range | range / median |",
        "|---|---:|---:|---:|",
    ]
    for name in (*FAMILIES, UPDATE_SHARE):
        values = [r[name] for r in repeats if name in r]
        if values:
            middle = statistics.median(values)
            lines.append(
                f"| {name} | {middle:.3f} | {min(values):.3f}-{max(values):.3f} | "
                f"{(max(values) - min(values)) / middle:.0%} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True, help="a `dnnperf hw` profile")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="keep every repeat here")
    args = parser.parse_args()
    if not args.profile.is_file():
        parser.error(
            f"no hardware profile at {args.profile}: run `OMP_NUM_THREADS=1 dnnperf hw -q --output PATH`"
        )
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    torch.set_num_threads(1)
    document = {
        "repeats": measure(hardware.read_profile(args.profile), args.repeats),
        "machine": f"{environment.cpu_model()} ({platform.machine()})",
        "torch": torch.__version__,
        "commit": environment.source_commit(),
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if args.json:
        write_json_atomic(args.json, document)
    print(markdown(document))


if __name__ == "__main__":
    main()
