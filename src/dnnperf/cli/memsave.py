"""``dnnperf memsave WORKLOAD --budget X``: the command line of ``dnnperf.memsave`` (docs/memsave.md).

Plans for the budget, prints the plan, runs it and the baselines, and saves a run record of kind
``memsave`` (its ``memsave`` section, docs/run-record.md) with the HTML report beside it. A budget the
planner cannot meet is a result, not bad input: it says why, the baselines are still measured and
saved, and the exit code is 0. A budget that is not a size or a share in (0, 100%] exits 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from dnnperf.cli.options import budget_argument, common, positive_int, preset_and_batch
from dnnperf.cli.output import Output, command_line
from dnnperf.errors import UsageError
from dnnperf.paths import path_argument

DEFAULT_PAIRS = 6


def add_parsers(commands: Any) -> None:
    from dnnperf.devices import DEVICE_CHOICES

    parser = commands.add_parser(
        "memsave", help="plan offload/recompute per layer for a peak-memory budget, run it and the baselines"
    )
    parser.add_argument("workload", help="a workload of the suite (see `dnnperf list`)")
    parser.add_argument(
        "--budget",
        required=True,
        type=budget_argument,
        help="peak memory allowed: a size (2GiB, 500MB, 1000000) or a share of the unoptimised peak (60%%)",
    )
    preset_and_batch(parser)
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=DEFAULT_PAIRS,
        help=f"paired plain/variant steps timed per variant ({DEFAULT_PAIRS})",
    )
    parser.add_argument("--device", default="auto", help=f"{', '.join(DEVICE_CHOICES)} or cuda:N (auto)")
    parser.add_argument(
        "--offload-dir",
        type=path_argument,
        help="where the CPU disk tier writes (default: a temporary directory)",
    )
    parser.add_argument(
        "--state",
        choices=("auto", "keep", "offload"),
        default="auto",
        help="gradients and optimizer state: auto (the planner may fuse each update into backward and "
        "keep the optimizer state off the device, where the update can be fused), keep, or offload "
        "(default: auto)",
    )
    parser.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    common(parser, runs=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, out: Output) -> int:
    """Profile, plan, run and measure; save the record; print or emit JSON. Returns the exit code."""
    import torch

    from dnnperf.devices import resolve_device, to_device
    from dnnperf.memsave.planner import PlanResult
    from dnnperf.memsave.run import memsave
    from dnnperf.report.terminal import memsave_plan_table, memsave_variants_table
    from dnnperf.results.record import Point, RunRecord, utc_now
    from dnnperf.results.settings import MemsaveSettings
    from dnnperf.results.store import RunStore
    from dnnperf.runner import workload_section
    from dnnperf.workloads import get_workload

    workload = get_workload(args.workload)
    workload.config(args.preset)  # an unknown preset is a UsageError naming the choices
    if args.offload_dir is not None and not args.offload_dir.is_dir():
        raise UsageError(f"--offload-dir {args.offload_dir}: not a directory")
    device = resolve_device(args.device)
    if device.type == "cuda" and args.offload_dir is not None:
        out.warn("--offload-dir is not used on CUDA: offloaded tensors go to pinned host memory")
    batch_size = workload.batch_size(args.preset, args.batch_size)
    store = RunStore(args.runs_dir)
    settings = MemsaveSettings(
        workload=workload.name,
        preset=args.preset,
        batch_sizes=[batch_size],
        steps=args.steps,
        warmup=2,
        device=str(device),
        requested_device=args.device,
        data="memory",
        budget=str(args.budget),
        training_state=args.state,
        offload_dir=str(args.offload_dir) if args.offload_dir is not None else None,
        torch_threads=torch.get_num_threads(),
    )
    record = RunRecord.start(
        "memsave", workload_section(workload, args.preset), settings, command=command_line()
    )
    point = Point(batch_size=batch_size)
    record.points.append(point)
    store.save(record)

    def on_plan(plan: PlanResult, baseline_peak: int) -> None:
        """The plan as soon as it is made, before it runs (it can take a while)."""
        out.print(
            memsave_plan_table(
                plan.table.to_dict("records"),
                plan.budget,
                str(args.budget),
                baseline_peak,
                plan.feasible,
                plan.predicted_peak,
                plan.reason,
            )
        )
        progress("running the plan" if plan.feasible else "infeasible: no plan to run", 0.9)

    try:
        with out.progress_fraction(f"{workload.name} ({args.preset}): profiling, baselines") as progress:
            torch.manual_seed(0)
            task = workload.build(args.preset, device)
            batch = to_device(workload.data(args.preset).synthesize(batch_size, 0), device)
            result = memsave(
                task, batch, device, args.budget, pairs=args.steps, offload_dir=args.offload_dir,
                on_plan=on_plan, training_state=args.state,
            )  # fmt: skip
        record.memsave = result
        # The point: every plain (unoptimised) step timed between the variants' steps.
        point.step_s = [s for v in result.variants for s in v.plain_s]
        point.status = record.status = "complete"
    except KeyboardInterrupt:
        point.status = record.status = "partial"
        raise
    except BaseException as error:
        point.status = record.status = "failed"
        record.error = f"{type(error).__name__}: {error}"
        raise
    finally:
        record.finished = utc_now()
        store.save(record)
    path = store.path(record.id)
    report = None
    if not args.no_report:
        from dnnperf.report.html import default_path, write_report

        report = write_report(record, default_path(path))
    planned = next((v for v in result.variants if v.name == "planner"), None)
    within = None if planned is None else planned.peak <= result.budget
    if within is False:  # the planner's promise broken by the measurement: say so, loudly
        out.warn(
            f"the planner called {args.budget} feasible but the measured peak {planned.peak:,} bytes "
            f"exceeds the budget {result.budget:,}"
        )
    if args.json:
        out.json(
            {
                "record_path": str(path),
                "report_path": str(report) if report else None,
                "within_budget": within,
                "memsave": result.to_dict(),
            }
        )
        return 0
    out.print(memsave_variants_table(result))
    out.print(f"record: {path}")
    if report is not None:
        out.print(f"report: {report}")
    return 0
