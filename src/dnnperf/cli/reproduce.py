"""``dnnperf reproduce``: re-run a seed paper's experiment with dnnperf's commands, its claims checked
against the results."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dnnperf.cli.options import common
from dnnperf.cli.output import Output
from dnnperf.errors import UsageError
from dnnperf.paths import output_file, path_argument


def add_parsers(commands: Any) -> None:
    reproduce = commands.add_parser(
        "reproduce", help="re-run a seed paper's experiment with dnnperf's commands; claims against results"
    )
    reproduce.add_argument(
        "paper",
        help="tbd (004), training-phase (001), memory-subsystem (000), parallelism (002), offload (003), "
        "or all",
    )
    reproduce.add_argument(
        "--size", default="default", help="smoke (seconds, a check) or default (minutes: the experiment)"
    )
    reproduce.add_argument(
        "--output",
        type=path_argument,
        default=Path("docs/reproductions.md"),
        help="the markdown summary to update",
    )
    common(reproduce, runs=True)
    reproduce.set_defaults(handler=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace, out: Output) -> int:
    from dnnperf import reproduce
    from dnnperf.reproduce.base import SIZES
    from dnnperf.results.store import default_runs_dir

    modules = list(reproduce.PAPERS.values()) if args.paper == "all" else [reproduce.paper(args.paper)]
    if args.size not in SIZES:
        raise UsageError(f"unknown size {args.size!r}: choose one of {', '.join(SIZES)}")
    output_file(args.output, "--output")  # before any paper runs
    runs_dir = args.runs_dir or default_runs_dir()
    runs_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for module in modules:
        total = module.planned(args.size)
        with out.progress(f"seed {module.SEED} ({module.KEY})", total=total) as advance:
            session = reproduce.Session(runs_dir)
            results.append(module.run(session, args.size, progress=lambda _: advance()))
        reproduce.update_document(args.output, results[-1:])  # each paper kept as soon as it is done
    if args.json:
        out.json(
            {
                "output": str(args.output),
                "reproductions": [
                    {
                        "paper": r.key,
                        "seed": r.seed,
                        "size": r.size,
                        "claims": [vars(c) for c in r.claims],
                        "tables": {title: frame.to_dict("records") for title, frame in r.tables},
                    }
                    for r in results
                ],
            }
        )
        return 0
    from dnnperf.report.terminal import reproduction_table

    for result in results:
        out.print(reproduction_table(result))
    out.print(f"summary: {args.output}")
    return 0
