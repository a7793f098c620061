"""The ``dnnperf`` command line. Results go to stdout (a single JSON document with --json);
logs, progress and errors go to stderr. Bad input: one line on stderr and exit code 2.

The parser is assembled here from a module per command (or family of commands); each module's
``add_parsers`` adds its subcommands with their handlers. This package imports nothing heavy at its
top (rich, numpy, torch and the command modules load inside ``main``), so the console script reaches
``main``'s signal handling at once: Ctrl-C or SIGTERM while torch loads is the one line "interrupted"
and exit code 130 or 143, not a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from dnnperf.cli.options import EXIT_USAGE, OneLineParser
from dnnperf.errors import DnnperfError, one_line
from dnnperf.interrupts import exit_now, interrupted_exit_code, stop_on_signals
from dnnperf.version import __version__

if TYPE_CHECKING:
    from dnnperf.cli.output import Output


def build_parser() -> argparse.ArgumentParser:
    from dnnperf.cli import bench, hw, libcompare, memsave, predict, reproduce, runs, watch

    parser = OneLineParser(
        prog="dnnperf",
        description="Measure, explain, predict and reduce the cost of training deep neural networks.",
    )
    parser.add_argument("--version", action="version", version=f"dnnperf {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for module in (bench, libcompare, hw, runs, reproduce, memsave, predict, watch):
        module.add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The stop signals are handled from here on, before the parser imports torch: a Ctrl-C or SIGTERM
    # while it loads is one line and 130 or 143, as later (SIGTERM saves partial results like Ctrl-C).
    with stop_on_signals():
        try:
            return run_command(argv)
        except KeyboardInterrupt:
            sys.stderr.write("dnnperf: interrupted\n")
            sys.stderr.flush()
            return interrupted_exit_code()


def run_and_exit() -> NoReturn:
    """The console script and ``python -m dnnperf``: :func:`main`, then a quick exit with its code."""
    exit_now(main())


def run_command(argv: Sequence[str] | None) -> int:
    """Parse the command line and run its command; every error a user can fix is one line."""
    from dnnperf.cli.output import Output

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except DnnperfError as error:  # an argument type that parses a value fully (--budget) names it
        sys.stderr.write(f"dnnperf: error: {one_line(str(error))}\n")
        return EXIT_USAGE
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what ranks of a distributed run re-run
    handler: Callable[[argparse.Namespace, Output], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    out = Output(args.json, args.quiet)
    try:
        return handler(args, out)
    except DnnperfError as error:
        out.error(f"error: {error}")
        return EXIT_USAGE
    except MemoryError as error:  # asked for more than the host has (a batch of 10^13 samples)
        out.error(f"error: more memory than this host has was asked for ({error}): try a smaller batch")
        return EXIT_USAGE
    except Exception as error:  # a bug in dnnperf or the workload: say so in one line unless debugging
        if os.environ.get("DNNPERF_DEBUG"):
            raise
        out.error(f"internal error: {type(error).__name__}: {error} (set DNNPERF_DEBUG=1 for the traceback)")
        return 1
