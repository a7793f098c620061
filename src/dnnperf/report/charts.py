"""Charts as inline SVG: matplotlib figures (no pyplot, no global backend) serialised to text that an
HTML page embeds as it is. Fonts stay text (``svg.fonttype: none``) so a chart is a few kB, and every
string is text matplotlib escapes; math parsing is off so a ``$`` in a layer name is just a dollar."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import matplotlib
import numpy as np
from matplotlib.figure import Figure

#: Stage and category colours that stay the same from chart to chart (matplotlib's tab20 order).
PALETTE = tuple(matplotlib.colormaps["tab20"].colors[::2] + matplotlib.colormaps["tab20"].colors[1::2])
PHASE_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "update": "#2ca02c"}

_RC = {
    "svg.fonttype": "none",  # text as text: small, searchable, escaped by matplotlib
    "text.parse_math": False,  # a user's "$x$" is shown, not typeset (and cannot fail to parse)
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.image_inline": True,
}
# Ids (clip paths, markers) are salted per chart: two charts in one page must not share an id.
_salts = itertools.count()
# What an inline <svg> in HTML does without: the XML prologue, the DTD and the RDF metadata (their
# URLs are namespaces, never fetched, but a self-contained page should name no URL at all).
_STRIP = (
    re.compile(r"<\?xml[^>]*\?>\s*"),
    re.compile(r"<!DOCTYPE[^>]*>\s*"),
    re.compile(r"<metadata>.*?</metadata>\s*", re.S),
    re.compile(r'\s+xmlns(:\w+)?="[^"]*"'),
)
_PATH = re.compile(r'(\sd=")([^"]*)"')
_DECIMALS = re.compile(r"(\.\d)\d+")


def color_map(names: Sequence[str]) -> dict[str, str]:
    """A stable colour per name, in the given order."""
    return {name: matplotlib.colors.to_hex(PALETTE[i % len(PALETTE)]) for i, name in enumerate(names)}


@contextmanager
def figure(width: float = 7.5, height: float = 3.2) -> Iterator[Figure]:
    """A matplotlib Figure for one chart, under dnnperf's rc settings."""
    with matplotlib.rc_context(_RC):
        yield Figure(figsize=(width, height), layout="constrained")


def to_svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element to inline in HTML."""
    buffer = io.StringIO()
    with matplotlib.rc_context({**_RC, "svg.hashsalt": f"dnnperf-chart-{next(_salts)}"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    for pattern in _STRIP:
        text = pattern.sub("", text)
    # Path coordinates to a tenth of a point (matplotlib writes six decimals): a third of the size.
    text = _PATH.sub(lambda m: m[1] + _DECIMALS.sub(r"\1", m[2]) + '"', text)
    return text.strip()


def _milliseconds(axis) -> None:
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v * 1e3:g}"))


def _bytes(axis) -> None:
    axis.set_major_formatter(matplotlib.ticker.EngFormatter(unit="B"))


def _legend_outside(ax) -> None:
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)


def stacked_bars(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    colors: Mapping[str, str] | None = None,
    seconds: bool = False,
    bytes_: bool = False,
) -> str:
    """One bar per label, stacked by series (e.g. batch sizes x stages)."""
    colors = colors or color_map(list(series))
    with figure() as fig:
        ax = fig.add_subplot()
        x = np.arange(len(labels))
        bottom = np.zeros(len(labels))
        for name, values in series.items():
            values = np.asarray(values, dtype=float)
            ax.bar(x, values, bottom=bottom, label=name, color=colors.get(name), width=0.6)
            bottom += values
        ax.set_xticks(x, list(labels))
        ax.set_ylabel(ylabel)
        if seconds:
            _milliseconds(ax.yaxis)
        if bytes_:
            _bytes(ax.yaxis)
        _legend_outside(ax)
        return to_svg(fig)


def horizontal_bars(
    labels: Sequence[str],
    values: Sequence[float],
    groups: Sequence[str],
    xlabel: str,
    colors: Mapping[str, str] = PHASE_COLORS,
    seconds: bool = False,
) -> str:
    """One bar per label (largest first at the top), coloured by group (e.g. the phase)."""
    height = 1.0 + 0.22 * len(labels)
    with figure(height=height) as fig:
        ax = fig.add_subplot()
        y = np.arange(len(labels))[::-1]
        ax.barh(y, values, color=[colors.get(g, "#7f7f7f") for g in groups], height=0.7)
        ax.set_yticks(y, list(labels))
        ax.set_xlabel(xlabel)
        if seconds:
            _milliseconds(ax.xaxis)
        seen = dict.fromkeys(groups)
        handles = [matplotlib.patches.Patch(color=colors.get(g, "#7f7f7f"), label=g) for g in seen]
        ax.legend(handles=handles, loc="lower right", frameon=False)
        return to_svg(fig)


def roofline(
    peak_flops: float,
    bandwidth: float,
    points: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
) -> str:
    """The roofline (min of peak and intensity x bandwidth, log-log) with one scatter per group of
    (intensity FLOP/B, achieved FLOP/s) points."""
    with figure(height=3.8) as fig:
        ax = fig.add_subplot()
        xs = np.concatenate([np.asarray(x, dtype=float) for x, _ in points.values()] or [np.ones(1)])
        xs = xs[np.isfinite(xs) & (xs > 0)]
        ridge = peak_flops / bandwidth
        low = min(xs.min() if xs.size else ridge, ridge) / 4
        high = max(xs.max() if xs.size else ridge, ridge) * 4
        grid = np.geomspace(low, high, 200)
        ax.plot(grid, np.minimum(peak_flops, grid * bandwidth), color="black", lw=1.5, label="roofline")
        ax.axvline(ridge, color="grey", lw=0.8, ls=":")
        for name, (x, y) in points.items():
            ax.scatter(x, y, s=14, alpha=0.75, label=name, color=PHASE_COLORS.get(name))
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Plain tick labels: the default log formatter writes mathtext, shown raw with parsing off.
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved FLOP/s")
        ax.yaxis.set_major_formatter(matplotlib.ticker.EngFormatter(unit="FLOP/s"))
        ax.set_title(title, loc="left", fontsize=9)
        ax.legend(loc="lower right", frameon=False)
        return to_svg(fig)


def memory_timeline(
    times: Sequence[float],
    series: Mapping[str, Sequence[float]],
    boundaries: Sequence[tuple[float, str]],
    colors: Mapping[str, str],
) -> str:
    """Bytes per category over one step (stacked areas), with the stage boundaries marked."""
    with figure(height=3.4) as fig:
        ax = fig.add_subplot()
        names = list(series)
        ax.stackplot(
            times, *[series[n] for n in names], labels=names, colors=[colors[n] for n in names], step="post"
        )
        top = ax.get_ylim()[1]
        for start, stage in boundaries:
            ax.axvline(start, color="black", lw=0.6, alpha=0.5)
            ax.text(start, top, f" {stage}", rotation=90, va="top", ha="left", fontsize=7, alpha=0.8)
        _milliseconds(ax.xaxis)
        ax.set_xlabel("time in the step (ms)")
        _bytes(ax.yaxis)
        _legend_outside(ax)
        return to_svg(fig)


def memory_scaling(
    batch_sizes: Sequence[int],
    peaks: Sequence[float],
    fixed: float,
    per_sample: float,
    capacity: float | None,
    predicted: int | None,
) -> str:
    """Measured peaks against batch size, the fitted line, the capacity and the predicted max batch."""
    with figure(height=3.4) as fig:
        ax = fig.add_subplot()
        ax.scatter(batch_sizes, peaks, color="#1f77b4", zorder=3, label="measured peak")
        end = max(max(batch_sizes), predicted or 0) * 1.1
        # A prediction far beyond the sweep (a CPU's whole memory) needs log axes to show both.
        far = end > 20 * max(batch_sizes)
        grid = np.geomspace(min(batch_sizes) / 2, end, 100) if far else np.linspace(0, end, 100)
        if far:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.plot(grid, fixed + per_sample * grid, color="#ff7f0e", label="fit: fixed + per sample x batch")
        if capacity is not None and predicted is not None:
            ax.axhline(capacity, color="#d62728", ls="--", lw=1, label="capacity")
            ax.axvline(predicted, color="#2ca02c", ls=":", lw=1, label=f"predicted max batch {predicted}")
        ax.set_xlabel("batch size")
        ax.set_ylabel("peak memory")
        _bytes(ax.yaxis)
        ax.legend(loc="upper left", frameon=False)
        return to_svg(fig)


def memory_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    budget: float | None = None,
    colors: Mapping[str, str] | None = None,
) -> str:
    """Bytes against time in the step, one line per series (e.g. the memory saver's variants), with
    an optional budget line."""
    colors = colors or color_map(list(series))
    with figure(height=3.4) as fig:
        ax = fig.add_subplot()
        for name, (times, values) in series.items():
            ax.plot(times, values, drawstyle="steps-post", lw=1.2, label=name, color=colors.get(name))
        if budget is not None:
            ax.axhline(budget, color="#d62728", ls="--", lw=1, label="budget")
        _milliseconds(ax.xaxis)
        ax.set_xlabel("time in the step (ms)")
        ax.set_ylabel("bytes allocated")
        _bytes(ax.yaxis)
        _legend_outside(ax)
        return to_svg(fig)


def strategy_lines(
    axis: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[bool]]],
    crossings: Sequence[tuple[float, float]] = (),
) -> str:
    """Predicted throughput along one what-if axis, one line per strategy (hollow markers where it
    does not fit in memory), the crossovers of the best strategy as shaded spans between the two
    values around them. Log scales where the values span more than a factor of 10."""
    colors = color_map(list(series))
    with figure(height=3.2) as fig:
        ax = fig.add_subplot()
        xs_all = [x for xs, _, _ in series.values() for x in xs]
        ys_all = [y for _, ys, _ in series.values() for y in ys if y > 0]
        if xs_all and min(xs_all) > 0 and max(xs_all) > 10 * min(xs_all):
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ys_all and max(ys_all) > 10 * min(ys_all):
            ax.set_yscale("log")  # matplotlib's log ticks are math text, which is off here: plain numbers
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        for name, (xs, ys, fits) in series.items():
            color = colors[name]
            ax.plot(xs, ys, lw=1.4, color=color, label=name)
            ax.scatter(
                xs, ys, s=18, zorder=3, edgecolors=color,
                facecolors=[color if f else "none" for f in fits],
            )  # fmt: skip
        for low, high in crossings:
            ax.axvspan(low, high, color="#999999", alpha=0.15, lw=0)
        ax.set_xlabel(axis)
        ax.set_ylabel("samples/s (predicted)")
        _legend_outside(ax)
        return to_svg(fig)


def predicted_vs_measured(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]], band: float, unit: str = "ms"
) -> str:
    """Predicted against measured seconds, one colour per series, log-log, with the diagonal (a perfect
    model) and dashed lines at +-``band`` (the validation target)."""
    colors = color_map(list(series))
    scale = 1e3 if unit == "ms" else 1.0
    with figure(width=6.5, height=4.2) as fig:
        ax = fig.add_subplot()
        values = [v * scale for m, p in series.values() for v in (*m, *p) if v > 0]
        low, high = (min(values) / 1.5, max(values) * 1.5) if values else (1e-3, 1.0)
        grid = np.geomspace(low, high, 50)
        ax.plot(grid, grid, color="#333333", lw=1, label="predicted = measured")
        for factor in (1 - band, 1 + band):
            ax.plot(grid, grid * factor, color="#999999", lw=0.8, ls="--")
        for name, (measured, predicted) in series.items():
            ax.scatter(
                [m * scale for m in measured], [p * scale for p in predicted],
                s=22, color=colors[name], label=name, zorder=3,
            )  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"predicted ({unit})")
        _legend_outside(ax)
        return to_svg(fig)


#: The most processes drawn as lines of their own in a watch timeline (the largest by peak).
TIMELINE_PROCESSES = 8


def timeline(
    lines: Mapping[str, tuple[Sequence[float], Sequence[float | None]]],
    ylabel: str,
    marks: Sequence[float] = (),
    in_bytes: bool = False,
) -> str:
    """Values against seconds since the start, one line per series (None: a gap), and the step marks
    as thin vertical lines."""
    colors = color_map(list(lines))
    with figure(height=2.8) as fig:
        ax = fig.add_subplot()
        for mark in marks:
            ax.axvline(mark, color="#bbbbbb", lw=0.6, zorder=0)
        for name, (times, values) in lines.items():
            ys = [np.nan if v is None else v for v in values]
            ax.plot(times, ys, lw=1.2, label=name, color=colors[name])
        ax.set_xlabel("seconds since the command started" + (" (grey: step marks)" if marks else ""))
        ax.set_ylabel(ylabel)
        if in_bytes:
            _bytes(ax.yaxis)
        if len(lines) > 1:
            _legend_outside(ax)
        return to_svg(fig)


def histogram(values: Sequence[float], xlabel: str) -> str:
    """How many values fall in each of up to 30 bins (times in seconds, shown in ms)."""
    with figure(height=2.8) as fig:
        ax = fig.add_subplot()
        ax.hist(values, bins=min(30, max(len(values), 1)), color=PALETTE[0])
        _milliseconds(ax.xaxis)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("steps")
        return to_svg(fig)
