"""``dnnperf libcompare``: each convolution layer through the default library and through explicit
im2col + GEMM."""

from __future__ import annotations

import argparse
from typing import Any

from dnnperf.cli.hw import hardware_for
from dnnperf.cli.options import common, hw_argument, non_negative_int, positive_int, preset_and_batch
from dnnperf.cli.output import Output


def add_parsers(commands: Any) -> None:
    libcompare = commands.add_parser(
        "libcompare",
        help="each convolution layer through the default library and through explicit im2col + GEMM",
    )
    libcompare.add_argument("workload", help="a workload of the suite (see `dnnperf list`)")
    preset_and_batch(libcompare)
    libcompare.add_argument("--repeats", type=positive_int, default=10, help="timed samples per layer (10)")
    libcompare.add_argument("--warmup", type=non_negative_int, default=2, help="warm-up calls per layer (2)")
    libcompare.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (auto)")
    hw_argument(libcompare)
    common(libcompare)
    libcompare.set_defaults(handler=cmd_libcompare)


def cmd_libcompare(args: argparse.Namespace, out: Output) -> int:
    import torch

    from dnnperf.analysis.libcompare import compare_convolutions, comparison_table
    from dnnperf.devices import resolve_device, to_device
    from dnnperf.workloads import get_workload

    workload = get_workload(args.workload)
    workload.config(args.preset)
    device = resolve_device(args.device)
    hardware = hardware_for(args.device, args.hw, out)
    batch_size = workload.batch_size(args.preset, args.batch_size)
    torch.manual_seed(0)
    task = workload.build(args.preset, device)
    batch = to_device(workload.data(args.preset).synthesize(batch_size, 0), device)
    peak = hardware.peak_flops() if hardware is not None else None
    with out.progress_fraction(f"{workload.name}: convolutions both ways") as progress:
        comparisons = compare_convolutions(
            task.model,
            lambda: task.step(batch),
            device,
            repeats=args.repeats,
            warmup=args.warmup,
            peak_flops=peak,
            progress=progress,
        )
    rows = comparison_table(comparisons)
    if args.json:
        out.json(
            {
                "workload": workload.name,
                "preset": args.preset,
                "batch_size": batch_size,
                "device": str(device),
                "peak_flops": peak,
                "layers": [c.to_dict() for c in comparisons],
            }
        )
    else:
        from dnnperf.report.terminal import libcompare_table

        out.print(libcompare_table(workload.name, batch_size, rows, peak))
    return 0
