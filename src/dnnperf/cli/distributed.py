"""``dnnperf profile W --nproc N --strategy dp|fsdp|zero1|pp|tp``: the command-line side of distributed runs.

Without RANK/WORLD_SIZE in the environment the command launches the ranks
(``dnnperf.distributed.launch``) and prints what rank 0 recorded; under torchrun (ours or the
user's, across machines) it runs as one rank."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dnnperf.cli.options import EXIT_FAILED, non_negative_float, positive_float, positive_int
from dnnperf.cli.output import command_line, finish_run
from dnnperf.distributed import DATA_PARALLEL, DEFAULT_TIMEOUT_S, SCHEDULES, STRATEGIES, DistributedSettings
from dnnperf.errors import UsageError
from dnnperf.paths import output_file, path_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The distributed options of ``dnnperf profile``."""
    group = parser.add_argument_group("distributed training (see docs/distributed.md)")
    group.add_argument("--nproc", type=positive_int, help="launch this many ranks on this machine (torchrun)")
    group.add_argument(
        "--strategy",
        choices=STRATEGIES,
        help="dp (DDP), fsdp (FSDP2, ZeRO-3), zero1 (sharded optimizer state), pp (pipeline), tp (tensor)",
    )
    # No argparse defaults where settings_from fills them in: an option given without --nproc is seen.
    group.add_argument("--schedule", choices=SCHEDULES, help="pp schedule (1f1b)")
    group.add_argument("--microbatches", type=positive_int, help="pp micro-batches per step (4)")
    group.add_argument("--rank-threads", type=positive_int, help="intra-op threads per rank (1 when shared)")
    group.add_argument(
        "--timeout",
        type=positive_float,
        help=f"seconds without progress after which a hung run is stopped ({DEFAULT_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--bucket-cap-mb",
        type=positive_float,
        help="dp bucket size in MiB (default: DDP's own: 25, the first bucket 1)",
    )
    group.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        help="fsdp: free each block's gathered parameters after its forward, gather again for backward (yes)",
    )
    group.add_argument("--mixed-precision", choices=("bf16",), help="fsdp: all-gather and compute in bf16")
    group.add_argument("--netns", action="store_true", help="each rank in its own network namespace (root)")
    group.add_argument("--link-mbit", type=positive_float, help="--netns: link bandwidth in Mbit/s")
    group.add_argument("--link-delay-ms", type=non_negative_float, help="--netns: link delay")
    group.add_argument(
        "--save-params", type=path_argument, help="dp: write the trained parameters to this .npz"
    )


#: The options that mean something only for a distributed run (``profile --nproc N``).
_DISTRIBUTED_ONLY = (
    "schedule", "microbatches", "rank_threads", "timeout", "bucket_cap_mb", "netns", "link_mbit",
    "link_delay_ms", "save_params", "reshard_after_forward", "mixed_precision",
)  # fmt: skip


def refuse_without_nproc(args: argparse.Namespace) -> None:
    """A distributed option on a single-process run is refused, not ignored."""
    given = [name for name in _DISTRIBUTED_ONLY if getattr(args, name, None) not in (None, False)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        verb = "apply" if len(given) > 1 else "applies"
        raise UsageError(f"{flags} {verb} to distributed runs: add --nproc N")


def wanted(args: argparse.Namespace) -> bool:
    """Is this a distributed run (asked for, or started as a rank by torchrun)?"""
    from dnnperf.distributed.worker import in_torchrun

    return (
        getattr(args, "strategy", None) is not None
        or getattr(args, "nproc", None) is not None
        or (hasattr(args, "strategy") and in_torchrun())
    )


def settings_from(args: argparse.Namespace) -> DistributedSettings:
    """The distributed settings, checked; a UsageError names what is wrong."""
    if getattr(args, "layers", False) or args.memory_limit is not None:
        raise UsageError("--layers and --memory-limit do not apply to distributed runs")
    if not args.netns and (args.link_mbit is not None or args.link_delay_ms):
        raise UsageError("--link-mbit and --link-delay-ms shape the link between namespaces: add --netns")
    strategy = args.strategy or "dp"
    if args.save_params is not None and strategy != "dp":
        raise UsageError(
            f"--save-params writes a dp replica's parameters; --strategy {strategy} splits them over ranks"
        )
    fsdp_only = [
        flag
        for flag, given in (
            ("--reshard-after-forward", args.reshard_after_forward is not None),
            ("--mixed-precision", args.mixed_precision is not None),
        )
        if given
    ]
    if fsdp_only and strategy != "fsdp":
        raise UsageError(f"{', '.join(fsdp_only)} applies to --strategy fsdp, not {strategy}")
    if args.save_params is not None:
        output_file(args.save_params, "--save-params")  # before any rank trains
    return DistributedSettings(
        strategy=strategy,
        nproc=args.nproc,
        schedule=args.schedule or "1f1b",
        microbatches=args.microbatches or 4,
        rank_threads=args.rank_threads,
        timeout_s=args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S,
        bucket_cap_mb=args.bucket_cap_mb,
        netns=args.netns,
        link_mbit=args.link_mbit,
        link_delay_ms=args.link_delay_ms or 0.0,
        save_params=args.save_params,
        reshard_after_forward=args.reshard_after_forward is not False,
        mixed_precision=args.mixed_precision,
    )


def ranks_fit_the_gpus(device_name: str, nproc: int) -> bool:
    """Whether ``nproc`` ranks on ``device_name`` can each have a GPU of their own (always, on the CPU)."""
    import torch

    from dnnperf.devices import resolve_device

    return resolve_device(device_name).type != "cuda" or nproc <= torch.cuda.device_count()


def check_gpus(device_name: str, nproc: int) -> None:
    """Each rank on CUDA gets a GPU of its own (``cuda:LOCAL_RANK``): refuse more ranks than GPUs
    here, before any starts, rather than let the extra ranks fail on a device that does not exist.
    ``auto`` with fewer GPUs than ranks is no error: the ranks run on the CPU (``run`` says so)."""
    import torch

    if device_name == "auto" or ranks_fit_the_gpus(device_name, nproc):
        return
    gpus = torch.cuda.device_count()
    if nproc > gpus:
        raise UsageError(
            f"--nproc {nproc} on CUDA needs {nproc} GPUs (one a rank) and this machine has {gpus}: "
            "use --device cpu (gloo) or fewer ranks"
        )


def check_launch(config: DistributedSettings, settings: Any) -> None:
    """What can be refused before any rank starts."""
    from dnnperf.distributed.ddp import check_divisible, require_supervised
    from dnnperf.distributed.worker import model_parallel_available
    from dnnperf.workloads import get_workload

    nproc = config.nproc or 2
    if config.netns:
        if os.geteuid() != 0:
            raise UsageError("--netns needs root (it creates network namespaces and shapes links with tc)")
        if nproc != 2:
            raise UsageError(f"--netns joins exactly 2 ranks with one veth pair; got --nproc {nproc}")
    check_gpus(settings.device, nproc)
    workload = get_workload(settings.workload)
    sizes = settings.batch_sizes or (workload.batch_size(settings.preset),)
    if config.strategy in DATA_PARALLEL:
        require_supervised(workload.build(settings.preset, "meta"), workload.name, config.strategy)
        for size in sizes:
            check_divisible(size, nproc, config.strategy)
        if config.mixed_precision is not None:
            from dnnperf.devices import resolve_device
            from dnnperf.distributed.sharded import check_mixed_precision

            check_mixed_precision(config.mixed_precision, resolve_device(settings.device))
    elif not model_parallel_available(config.strategy):
        raise UsageError(f"--strategy {config.strategy} is not available (its module is missing)")
    elif config.strategy == "pp":
        from dnnperf.distributed.pipeline import check_pipeline

        check_pipeline(workload, settings.preset, sizes, config.microbatches, nproc)


def run(args: argparse.Namespace, out: Any, settings: Any, store: Any, report: bool = False) -> int:
    """Launch the ranks, or be one; print and return the exit code like ``dnnperf profile`` (``report``:
    the HTML report beside the record of a run that ended well, written where the record is)."""
    from dnnperf.distributed import launch, worker
    from dnnperf.results.record import new_run_id
    from dnnperf.runner import RunFailed

    config = settings_from(args)
    steps_per_point = settings.warmup + settings.steps
    if worker.in_torchrun():
        quiet = worker.launched()
        try:
            record = worker.run_rank(settings, config, store, command=command_line())
        except RunFailed as failure:
            out.error(f"error: the run failed on rank {os.environ.get('RANK')}: {failure}")
            return EXIT_FAILED
        if record is not None and not quiet:
            finish_run(args, out, record, store.path(record.id), report)
        return 0
    if config.nproc is None:
        raise UsageError("--strategy needs --nproc N (or run the command under torchrun)")
    check_launch(config, settings)
    run_id = new_run_id(settings.workload, settings.preset)
    sizes = settings.batch_sizes or (1,)
    with out.progress(
        f"{settings.workload} ({settings.preset}) on {config.nproc} ranks", len(sizes) * steps_per_point
    ) as advance:
        seen = [0]

        def progress(step: int) -> None:
            while seen[0] < step:
                seen[0] += 1
                advance()

        argv = list(args.argv)
        if settings.device == "auto" and not ranks_fit_the_gpus("auto", config.nproc):
            out.error(f"note: {config.nproc} ranks and fewer GPUs: the ranks train on the CPU (gloo)")
            argv += ["--device", "cpu"]  # the ranks parse the command line again: the last one counts
        outcome = launch.launch(argv, config, store, run_id, on_progress=progress)
    record, path = outcome.record, store.path(run_id)
    if outcome.fault is not None:
        measured = sum(len(p.step_s) for p in record.points) if record is not None else 0
        kept = f"{measured} measured steps kept in {path}" if record is not None else "no record was saved"
        what = "interrupted" if outcome.fault.kind == "interrupted" else f"error: {outcome.fault.message}"
        out.error(f"{what}; {kept}; rank output in {outcome.log}")
        if args.json and record is not None:
            out.json({"record_path": str(path), "record": record.to_dict()})
        return outcome.exit_code
    if record is None:
        out.error(f"error: the ranks ended without a record (see {outcome.log})")
        return EXIT_FAILED
    finish_run(args, out, record, path, report)
    return 0
