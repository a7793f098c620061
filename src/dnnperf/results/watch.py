"""What ``dnnperf watch`` records about a command's process tree, and its checked JSON form.

Every series is sampled at the instants in ``WatchResult.t`` (seconds since the command started).
Counters (CPU seconds, page faults, disk bytes, context switches) are stored cumulative, as read;
rates (busy cores) are derived from them, so a record edited by hand cannot disagree with itself.
A value the sampler could not read (PSS of another user's process, /proc absent) is None, never 0.
PSS and USS cost a walk of the process's page tables: they are read less often for large processes
and hold their last value in between (``dnnperf.watch.sampler``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any

from dnnperf.errors import RecordError
from dnnperf.results.fields import (
    GPU_KINDS,
    SERIES_KINDS,
    WATCH,
    FieldError,
    Maybe,
    check_fields,
    check_numbers,
)

#: How the watched command ended: on its own, killed by a signal it did not forward, or stopped
#: because the watcher was asked to stop (Ctrl-C, SIGTERM), whatever the command then did.
ENDS = ("exited", "signalled", "interrupted")
#: What became of a process that outlived the command: it ended on its own within the grace period,
#: or the watcher ended it with SIGTERM, or with SIGKILL.
FATES = ("exited", "terminated", "killed")


@dataclass
class WatchConfig:
    """The command watched and how often it was sampled."""

    argv: list[str]
    interval_s: float = 0.1


@dataclass
class Series:
    """Cumulative counters and gauges, one value per sample (see SERIES_KINDS)."""

    cpu_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    pss_bytes: list[int | None] = field(default_factory=list)
    uss_bytes: list[int | None] = field(default_factory=list)
    minor_faults: list[int | None] = field(default_factory=list)
    major_faults: list[int | None] = field(default_factory=list)
    read_bytes: list[int | None] = field(default_factory=list)
    write_bytes: list[int | None] = field(default_factory=list)
    voluntary_switches: list[int] = field(default_factory=list)
    involuntary_switches: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)

    def append(self, values: dict[str, Any]) -> None:
        for name in SERIES_KINDS:
            getattr(self, name).append(values[name])

    def __len__(self) -> int:
        return len(self.cpu_s)

    def series_dict(self) -> dict[str, list[Any]]:
        return {name: list(getattr(self, name)) for name in SERIES_KINDS}


@dataclass
class ProcessSeries(Series):
    """One process of the tree, from the sample ``first`` on (a process appears and goes once)."""

    pid: int = 0
    ppid: int | None = None
    name: str = ""
    cmdline: list[str] = field(default_factory=list)
    first: int = 0


@dataclass
class TotalSeries(Series):
    """The whole tree. CPU seconds, page faults and disk bytes include descendants that ended and
    were reaped inside the tree (the kernel adds them to their parent); memory, context switches
    and threads are those of the processes alive at the sample."""

    #: How many processes the tree had at each sample.
    processes: list[int] = field(default_factory=list)


@dataclass
class GpuSeries:
    """One NVIDIA device, one value per sample; None where the driver did not say."""

    index: int
    name: str
    utilization_pct: list[float | None] = field(default_factory=list)
    memory_used_bytes: list[int | None] = field(default_factory=list)
    pcie_rx_bytes_per_s: list[float | None] = field(default_factory=list)
    pcie_tx_bytes_per_s: list[float | None] = field(default_factory=list)
    power_w: list[float | None] = field(default_factory=list)


@dataclass
class StepMarks:
    """The command's ``mark_step()`` calls: when (seconds since the start) and, when given, which step."""

    t: list[float] = field(default_factory=list)
    step: list[int | None] = field(default_factory=list)
    #: Lines of the marks file that were not a mark (written by something else than mark_step).
    ignored: int = 0


@dataclass
class OutlivedProcess:
    """A descendant still running when the command ended, and what became of it."""

    pid: int
    name: str
    cmdline: list[str]
    fate: str


@dataclass
class SamplingCost:
    """CPU seconds the sampler's own thread used for each sample (under ``dnnperf watch``, with the
    save of the record that followed it)."""

    cpu_s: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(self.cpu_s)

    @property
    def per_sample_s(self) -> float | None:
        return self.total_s / len(self.cpu_s) if self.cpu_s else None


@dataclass
class WatchResult:
    """Everything one ``watch`` of a command recorded."""

    config: WatchConfig
    #: When the command started (``time.time()``, the clock ``mark_step`` writes).
    started_at: float
    #: Sample instants, seconds since ``started_at``, non-decreasing.
    t: list[float] = field(default_factory=list)
    total: TotalSeries = field(default_factory=TotalSeries)
    processes: list[ProcessSeries] = field(default_factory=list)
    gpus: list[GpuSeries] = field(default_factory=list)
    #: Why there are no GPU series (no nvidia-ml-py, no driver), or None when there are.
    gpu_note: str | None = None
    marks: StepMarks = field(default_factory=StepMarks)
    #: One of ENDS.
    end: str = "exited"
    #: The command's exit status when it exited; None when a signal ended it (both None: still running).
    exit_code: int | None = None
    #: The signal that ended the command, when one did.
    signal: int | None = None
    #: The signal that asked the watcher to stop (the end is then "interrupted").
    stop_signal: int | None = None
    outlived: list[OutlivedProcess] = field(default_factory=list)
    cost: SamplingCost = field(default_factory=SamplingCost)
    #: Seconds from the start until the command ended.
    wall_s: float = 0.0
    #: The kernel's own account of the command's tree when it was reaped: CPU seconds of it and every
    #: descendant it reaped, and the largest resident size any one of them reached (exact, not sampled).
    kernel_cpu_s: float | None = None
    kernel_peak_rss_bytes: int | None = None

    def align(self) -> None:
        """Cut every series to the samples that all of them hold (a sample cut short by an error
        leaves some series one value longer than others), so that the result survives its JSON form."""
        gpu_lengths = [len(getattr(g, name)) for g in self.gpus for name in GPU_KINDS]
        total_lengths = [len(getattr(self.total, name)) for name in SERIES_KINDS]
        samples = min(
            len(self.t), len(self.cost.cpu_s), len(self.total.processes), *total_lengths, *gpu_lengths
        )
        del self.t[samples:]
        del self.cost.cpu_s[samples:]
        self.processes = [p for p in self.processes if p.first < samples]
        for series in (self.total, *self.processes):
            first = series.first if isinstance(series, ProcessSeries) else 0
            for name in SERIES_KINDS:
                del getattr(series, name)[samples - first :]
        del self.total.processes[samples:]
        for gpu in self.gpus:
            for name in GPU_KINDS:
                del getattr(gpu, name)[samples:]

    @property
    def ended(self) -> bool:
        """Whether the command has ended (an exit code or a signal is known)."""
        return self.exit_code is not None or self.signal is not None

    @property
    def shell_exit_code(self) -> int:
        """The status a shell reports: the exit code, or 128 + the signal that ended the command."""
        if self.exit_code is not None:
            return self.exit_code
        return 128 + (self.signal or 0)

    def cpu_cores(self, series: Series | None = None) -> list[float | None]:
        """Cores busy up to each sample, over at least half an interval back (CPU time is counted in
        10 ms ticks: over a shorter span, such as the one to the sample taken as the command ended,
        one tick would read as several cores); None where no earlier sample is far enough back."""
        series = self.total if series is None else series
        first = series.first if isinstance(series, ProcessSeries) else 0
        times = self.t[first : first + len(series)]
        cores: list[float | None] = []
        back = 0
        for i in range(len(series)):
            while back + 1 < i and times[i] - times[back + 1] >= self.config.interval_s / 2:
                back += 1
            span = times[i] - times[back]
            if back == i or span < self.config.interval_s / 2:
                cores.append(None)
            else:
                cores.append(max(series.cpu_s[i] - series.cpu_s[back], 0.0) / span)
        return cores

    @property
    def sampling_share(self) -> float | None:
        """The sampler's CPU time as a share of one core over the run."""
        return self.cost.total_s / self.wall_s if self.wall_s > 0 else None

    @property
    def peak_rss_bytes(self) -> int | None:
        """The tree's largest sampled resident size (the sum over its processes)."""
        return max(self.total.rss_bytes, default=None)

    def step_s(self) -> list[float]:
        """Time between consecutive step marks (one fewer than the marks)."""
        marks = self.marks.t
        return [b - a for a, b in pairwise(marks)]

    def step_rss_growth_bytes(self) -> list[int]:
        """The tree's resident-size change over each step: RSS at the last sample at or before each
        mark, differenced (a step shorter than the interval shows the growth of several steps on one)."""
        held = []
        for mark in self.marks.t:
            index = next((i for i in range(len(self.t) - 1, -1, -1) if self.t[i] <= mark), None)
            held.append(self.total.rss_bytes[index] if index is not None else 0)
        return [b - a for a, b in pairwise(held)]

    def summary(self) -> dict[str, Any]:
        """The figures a report leads with, recomputed from the samples."""
        busy = [c for c in self.cpu_cores() if c is not None]
        steps = self.step_s()
        return {
            "samples": len(self.t),
            "peak_rss_bytes": self.peak_rss_bytes,
            "mean_cpu_cores": sum(busy) / len(busy) if busy else None,
            "peak_cpu_cores": max(busy, default=None),
            "steps": len(steps),
            "median_step_s": sorted(steps)[len(steps) // 2] if steps else None,
            "sampling_cpu_per_sample_s": self.cost.per_sample_s,
            "sampling_share_of_core": self.sampling_share,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": {"argv": list(self.config.argv), "interval_s": self.config.interval_s},
            "started_at": self.started_at,
            "wall_s": self.wall_s,
            "t": list(self.t),
            "total": self.total.series_dict() | {"processes": list(self.total.processes)},
            "processes": [
                {"pid": p.pid, "ppid": p.ppid, "name": p.name, "cmdline": list(p.cmdline), "first": p.first}
                | p.series_dict()
                for p in self.processes
            ],
            "gpus": [
                {f.name: (list(v) if isinstance(v := getattr(g, f.name), list) else v) for f in fields(g)}
                for g in self.gpus
            ],
            "gpu_note": self.gpu_note,
            "marks": {"t": list(self.marks.t), "step": list(self.marks.step), "ignored": self.marks.ignored},
            "end": self.end,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "stop_signal": self.stop_signal,
            "outlived": [
                {"pid": o.pid, "name": o.name, "cmdline": list(o.cmdline), "fate": o.fate}
                for o in self.outlived
            ],
            "cost": {"cpu_s": list(self.cost.cpu_s)},
            "kernel": {"cpu_s": self.kernel_cpu_s, "peak_rss_bytes": self.kernel_peak_rss_bytes},
            "summary": self.summary(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> WatchResult:
        """Validate a parsed ``watch`` section and build the result; RecordError says what is wrong.
        The stored summary is ignored: it is recomputed from the samples."""
        try:
            check_numbers(data)
            check_fields(data, WATCH, ("watch",))
        except FieldError as error:
            raise RecordError(str(error)) from None
        if not isinstance(data, dict):
            raise RecordError("watch is not an object")
        _require(data, WATCH, "watch")
        samples = len(data["t"])
        if any(b < a for a, b in pairwise(data["t"])):
            raise RecordError("watch.t goes backwards: sample instants must not decrease")
        if data["config"]["interval_s"] <= 0:
            raise RecordError(f"watch.config.interval_s is {data['config']['interval_s']!r}, not positive")
        if data["end"] not in ENDS:
            raise RecordError(f"watch.end {data['end']!r} is not one of {', '.join(ENDS)}")
        if data["exit_code"] is not None and data["signal"] is not None:
            raise RecordError("watch holds both an exit_code and a signal: at most one ended the command")
        if data["end"] == "interrupted" and data["stop_signal"] is None:
            raise RecordError("watch.end is 'interrupted' but no stop_signal says what asked it to stop")
        _lengths(data["total"], [*SERIES_KINDS, "processes"], samples, "watch.total")
        _lengths(data["cost"], ["cpu_s"], samples, "watch.cost")
        processes = []
        for index, item in enumerate(data["processes"]):
            where = f"watch.processes[{index}]"
            length = len(item["cpu_s"])
            _lengths(item, list(SERIES_KINDS), length, where)
            if item["first"] + length > samples:
                raise RecordError(
                    f"{where} runs to sample {item['first'] + length}, past the {samples} taken"
                )
            processes.append(
                ProcessSeries(
                    pid=item["pid"],
                    ppid=item["ppid"],
                    name=item["name"],
                    cmdline=list(item["cmdline"]),
                    first=item["first"],
                    **{name: list(item[name]) for name in SERIES_KINDS},
                )
            )
        gpus = []
        for index, item in enumerate(data["gpus"]):
            _lengths(item, list(GPU_KINDS), samples, f"watch.gpus[{index}]")
            gpus.append(
                GpuSeries(index=item["index"], name=item["name"], **{k: list(item[k]) for k in GPU_KINDS})
            )
        marks = data["marks"]
        _lengths(marks, ["step"], len(marks["t"]), "watch.marks")
        for index, item in enumerate(data["outlived"]):
            if item["fate"] not in FATES:
                raise RecordError(
                    f"watch.outlived[{index}].fate {item['fate']!r} is not one of {', '.join(FATES)}"
                )
        kernel = data.get("kernel") or {}
        total = data["total"]
        return cls(
            config=WatchConfig(argv=list(data["config"]["argv"]), interval_s=data["config"]["interval_s"]),
            started_at=data["started_at"],
            t=list(data["t"]),
            total=TotalSeries(
                processes=list(total["processes"]), **{name: list(total[name]) for name in SERIES_KINDS}
            ),
            processes=processes,
            gpus=gpus,
            gpu_note=data["gpu_note"],
            marks=StepMarks(
                t=list(marks["t"]),
                step=list(marks["step"]),
                ignored=marks["ignored"],
            ),
            end=data["end"],
            exit_code=data["exit_code"],
            signal=data["signal"],
            stop_signal=data["stop_signal"],
            outlived=[OutlivedProcess(**item) for item in data["outlived"]],
            cost=SamplingCost(cpu_s=list(data["cost"]["cpu_s"])),
            wall_s=data["wall_s"],
            kernel_cpu_s=kernel.get("cpu_s"),
            kernel_peak_rss_bytes=kernel.get("peak_rss_bytes"),
        )


def _require(value: Any, spec: Any, where: str) -> None:
    """Every key the spec names is present (check_fields lets absent keys pass), recursively."""
    if isinstance(spec, Maybe):
        if value is not None:
            _require(value, spec.spec, where)
    elif isinstance(spec, dict) and isinstance(value, dict):
        for key, inner in spec.items():
            if key not in value and not isinstance(inner, Maybe):
                raise RecordError(f"{where}.{key} is missing")
            if key in value:
                _require(value[key], inner, f"{where}.{key}")
    elif isinstance(spec, list) and isinstance(value, list):
        for index, item in enumerate(value):
            _require(item, spec[0], f"{where}[{index}]")


def _lengths(section: dict[str, Any], names: list[str], expected: int, where: str) -> None:
    for name in names:
        if len(section[name]) != expected:
            raise RecordError(f"{where}.{name} holds {len(section[name])} values, not {expected}")
