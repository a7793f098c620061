"""The argparse types and the options several commands share. Nothing heavy is imported here: the
parser is built before torch loads (see ``dnnperf.cli``)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, NoReturn

from dnnperf.errors import one_line
from dnnperf.paths import path_argument

if TYPE_CHECKING:
    from dnnperf.memsave.budget import Budget

EXIT_FAILED = 1
EXIT_USAGE = 2
#: Ctrl-C's; a run stopped by SIGTERM exits with 143 (``interrupted_exit_code``).
EXIT_INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exits with code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)}\n")


def _int_at_least(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a {what} integer, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "positive")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "non-negative")


def positive_float(text: str) -> float:
    """A positive, finite number (seconds, MiB, Mbit/s)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return positive_float(text)


def batch_size_list(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("expects comma-separated positive integers, e.g. 1,2,4,8")
    try:
        sizes = tuple(positive_int(p) for p in parts)  # an empty item ("1,,2") is not a size either
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expects comma-separated positive integers (batch sizes), got {text!r}"
        ) from None
    if len(set(sizes)) < len(sizes):
        raise argparse.ArgumentTypeError(f"a batch size is repeated in {text!r}")
    return sizes


def budget_argument(text: str) -> Budget:
    """A memory budget, parsed once; a bad one is a UsageError, which argparse lets through to the
    CLI's one-line error and exit code 2."""
    from dnnperf.memsave.budget import Budget

    return Budget.parse(text)


def common(parser: argparse.ArgumentParser, runs: bool = False) -> None:
    """--json and --quiet of every command; --runs-dir of those that read or write run records."""
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout and nothing else"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or tables on the terminal")
    if runs:
        parser.add_argument(
            "--runs-dir",
            type=path_argument,
            default=None,
            help="where run records live (default: $DNNPERF_RUNS_DIR or ./dnnperf-runs)",
        )


def preset_and_batch(
    parser: argparse.ArgumentParser, preset: str = "tiny", batch: str = "batch size"
) -> None:
    """--preset and -b/--batch-size of a command on one workload of the suite."""
    parser.add_argument("--preset", default=preset, help=f"tiny, small or full (default: {preset})")
    parser.add_argument("-b", "--batch-size", type=positive_int, help=f"{batch} (default: the preset's)")


def hw_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hw",
        type=path_argument,
        help="hardware profile for efficiencies (default: the one `dnnperf hw` saved)",
    )
