"""``dnnperf bench WORKLOAD --framework torch|tensorflow|jax``: a child process per framework, under
watch.

``add_arguments`` adds ``--framework`` to the bench parser; ``run`` is the bench command when it is
given. Options of the in-process bench that a framework child does not take are refused, not ignored.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from dnnperf.cli.options import EXIT_FAILED
from dnnperf.cli.output import command_line
from dnnperf.errors import UsageError
from dnnperf.frameworks import FRAMEWORKS

if TYPE_CHECKING:  # the parser imports this module: torch (under the store) loads only to run
    from dnnperf.results.store import RunStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="train in a child process under watch: torch (this bench), or tensorflow or jax "
        "(Keras 3, basic_cnn and alexnet, the frameworks extra); adds RSS, page faults, busy cores",
    )


def refuse_unsupported(args: argparse.Namespace) -> None:
    """Options the framework path does not take: a one-line UsageError naming them."""
    if getattr(args, "data", "memory") != "memory":
        raise UsageError("--framework trains on synthetic data in memory: --data disk does not apply")
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("workers", "data_dir", "nproc", "strategy", "layers", "memory", "hw")
        if getattr(args, name, None) not in (None, False)
    ]
    if given:
        raise UsageError(f"{', '.join(given)} cannot be combined with --framework")


def system_table(figures: list[dict[str, Any]], title: str) -> Any:
    """Per batch size: the process tree's peak resident memory, page faults and busy cores."""
    from dnnperf.report.terminal import Table

    table = Table(title=title, title_justify="left")
    for header in ("batch", "peak RSS MiB", "minor faults", "major faults", "cores busy (measured)"):
        table.add_column(header, justify="right")

    def shown(value: Any, scale: float = 1.0, digits: int = 0) -> str:
        return "-" if value is None else f"{value / scale:,.{digits}f}"

    for row in figures:
        table.add_row(
            str(row["batch_size"]),
            shown(row["peak_rss_bytes"], 2**20, 1),
            shown(row["minor_faults"]),
            shown(row["major_faults"]),
            shown(row["cpu_cores"], 1.0, 2),
        )
    return table


def run(args: argparse.Namespace, out: Any, store: RunStore) -> int:
    """The bench command with ``--framework``: exit code 0, 1 (the run failed) or 130/143 (stopped)."""
    from dnnperf.frameworks.bench import bench_framework, system_figures
    from dnnperf.interrupts import interrupted_exit_code
    from dnnperf.report.terminal import points_table
    from dnnperf.runner import Interrupted, RunFailed

    refuse_unsupported(args)
    sizes = args.sweep or ((args.batch_size,) if args.batch_size else None)
    try:
        record = bench_framework(
            args.workload,
            args.framework,
            args.preset,
            sizes,
            args.steps,
            args.warmup,
            seed=args.seed,
            device=args.device,
            store=store,
            command=command_line(),
        )
    except RunFailed as failure:
        path = store.path(failure.record.id)
        out.error(f"error: the {args.framework} run failed: {failure} (record kept in {path})")
        if args.json:
            out.json({"record_path": str(path), "record": failure.record.to_dict()})
        return EXIT_FAILED
    except Interrupted as interrupt:
        path = store.path(interrupt.record.id)
        out.error(f"interrupted: what was measured is saved as a partial record: {path}")
        if args.json:
            out.json({"record_path": str(path), "record": interrupt.record.to_dict()})
        # The watcher's handlers, not interrupts', saw the signal during the run: its record says which.
        watched = interrupt.record.watch
        if watched is not None and watched.stop_signal is not None:
            return 128 + int(watched.stop_signal)
        return interrupted_exit_code()
    path = store.path(record.id)
    figures = system_figures(record)
    if args.json:
        out.json({"record_path": str(path), "record": record.to_dict(), "system": figures})
        return 0
    out.print(points_table(record))
    out.print(system_table(figures, f"{args.framework}: the process tree, sampled every "
                                    f"{record.settings['watch_interval_s']} s"))  # fmt: skip
    out.print(f"not seen: {record.settings['limitations']}")
    out.print(f"record: {path}")
    return 0
