"""Sampling a process tree with psutil: every process under a root, each sample.

Processes are found anew at each sample (the root's descendants) and followed until they go, also
after their parent ended (an orphan is re-parented outside the tree, but it is still the command's).
psutil's Process keeps the start time of the process it names, so a reused pid is never mistaken
for one followed before.

PSS and USS come from /proc/PID/smaps_rollup, which the kernel computes by walking the process's
page tables: about 15 us per resident MiB, 150 ms for a 10 GiB process. They are read at most as
often as keeps that walk under PSS_SHARE of one core, and hold their last value in between.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import psutil

from dnnperf.results.watch import SERIES_KINDS, ProcessSeries, TotalSeries

#: Fields of /proc/PID/stat after the command name: ppid, minflt, cminflt, majflt, cmajflt (man 5 proc).
_PPID, _MINFLT, _CMINFLT, _MAJFLT, _CMAJFLT = 1, 7, 8, 9, 10
#: The share of one core the PSS/USS reads of each process may take.
PSS_SHARE = 0.02
#: Reads of the tree in one sample when a process is reaped during one (see TreeSampler.sample).
READ_ATTEMPTS = 3


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses:
    the fields start after the last ')'); None where /proc is absent or the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    return text[text.rfind(b")") + 2 :].split()


def page_faults(pid: int) -> tuple[int, int, int, int] | None:
    """Minor and major page faults of a process and of its reaped children (psutil has no portable
    call for them)."""
    values = stat_fields(pid)
    try:
        return (int(values[_MINFLT]), int(values[_CMINFLT]), int(values[_MAJFLT]), int(values[_CMAJFLT]))
    except (TypeError, IndexError, ValueError):
        return None


def parent_of(pid: int) -> int | None:
    values = stat_fields(pid)
    if values is not None and len(values) > _PPID:
        return int(values[_PPID])
    with contextlib.suppress(psutil.Error):  # no /proc: psutil knows the platform's way
        return psutil.Process(pid).ppid()
    return None


def read_process(process: psutil.Process, full: bool) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One process's values (its own) and its contribution to the tree's totals (its own plus its
    reaped children's, where the kernel keeps them); None when it is gone. ``full``: read PSS and
    USS too (None otherwise, and where they are not readable)."""
    try:
        with process.oneshot():
            cpu = process.cpu_times()
            memory, pss, uss = process.memory_info(), None, None
            if full:
                with contextlib.suppress(psutil.AccessDenied):
                    memory = process.memory_full_info()
                    pss, uss = memory.pss, memory.uss
            switches = process.num_ctx_switches()
            threads = process.num_threads()
            try:
                io = process.io_counters()  # includes reaped children: the kernel adds them on wait
                read_bytes, write_bytes = io.read_bytes, io.write_bytes
            except (psutil.AccessDenied, AttributeError):  # AttributeError: platforms without it
                read_bytes = write_bytes = None
    except psutil.NoSuchProcess:  # gone (a zombie is still readable: ZombieProcess not raised above)
        return None
    except psutil.AccessDenied:  # another user's process under the tree: nothing readable
        return None
    faults = page_faults(process.pid)
    own = {
        "cpu_s": cpu.user + cpu.system,
        "rss_bytes": memory.rss,
        "pss_bytes": pss,
        "uss_bytes": uss,
        "minor_faults": faults[0] if faults else None,
        "major_faults": faults[2] if faults else None,
        "read_bytes": read_bytes,
        "write_bytes": write_bytes,
        "voluntary_switches": switches.voluntary,
        "involuntary_switches": switches.involuntary,
        "threads": threads,
    }
    tree = own | {
        "cpu_s": own["cpu_s"] + cpu.children_user + cpu.children_system,
        "minor_faults": faults[0] + faults[1] if faults else None,
        "major_faults": faults[2] + faults[3] if faults else None,
    }
    return own, tree


def sum_values(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Field by field sums; a field unreadable in any row is None in the sum (a partial sum would
    read as a drop)."""
    total: dict[str, Any] = {}
    for name in SERIES_KINDS:
        values = [row[name] for row in rows]
        total[name] = None if any(v is None for v in values) else sum(values)
    return total


class TreeSampler:
    """Samples the tree rooted at ``root_pid`` every ``interval_s``; call :meth:`sample` each time."""

    def __init__(self, root_pid: int, interval_s: float) -> None:
        self.interval_s = interval_s
        root = psutil.Process(root_pid)
        self.followed: dict[int, psutil.Process] = {root_pid: root}
        self.series: dict[tuple[int, float], ProcessSeries] = {}
        #: Processes that went (pid and start time): a series is contiguous, never resumed.
        self.ended: set[tuple[int, float]] = set()
        #: Pids seen outside the tree: a process never moves into another's tree, so they are not
        #: read again (a pid reused within one interval would need the whole pid space to wrap).
        self.outside: set[int] = set()
        #: Per process: the sample at which PSS and USS are next read, and their last values.
        self.pss_due: dict[tuple[int, float], int] = {}
        self.pss_held: dict[tuple[int, float], tuple[int | None, int | None]] = {}
        self.total = TotalSeries()
        self.samples = 0

    def discover(self) -> None:
        """Follow every new descendant of a followed process (orphans of an ended parent keep being
        followed, and so do their own children)."""
        try:
            pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            pids = psutil.pids()
        self.outside &= set(pids)
        parents = {
            pid: parent_of(pid) for pid in pids if pid not in self.outside and pid not in self.followed
        }
        inside = set(self.followed)
        while True:
            joining = [pid for pid, parent in parents.items() if parent in inside]
            if not joining:
                break
            for pid in joining:
                del parents[pid]
                inside.add(pid)
                with contextlib.suppress(psutil.Error):  # gone since the scan
                    process = psutil.Process(pid)
                    if (pid, process.create_time()) not in self.ended:
                        self.followed[pid] = process
        self.outside.update(parents)

    def sample(self, extra: dict[str, Any] | None = None) -> None:
        """Read every followed process and append one sample to its series and to the totals.
        ``extra``: counters of processes no longer in the tree (the reaped root) added to the totals.

        A process reaped while the tree is read (its parent read before it, without its counters, and
        it gone when its turn came) would take its whole CPU time and faults out of this sample's
        totals and put them back into the next, a spike of tens of cores: the tree is then read
        again, up to ``READ_ATTEMPTS`` times."""
        self.discover()
        index = self.samples
        for _ in range(READ_ATTEMPTS):
            rows, reaped = self._read_followed(index)
            if not reaped:
                break
        tree_rows = ([] if extra is None else [extra]) + [tree for _, _, tree in rows]
        for process, own, _ in rows:
            self.series_of(process, index).append(own)
        self.total.append(sum_values(tree_rows) if tree_rows else dict.fromkeys(SERIES_KINDS, 0))
        self.total.processes.append(len(tree_rows) - (extra is not None))
        self.samples += 1

    def _read_followed(
        self, index: int
    ) -> tuple[list[tuple[psutil.Process, dict[str, Any], dict[str, Any]]], bool]:
        """Every followed process's (process, own values, tree values), parents before their children
        (the order they were found in); and whether one was gone (no longer followed after this)."""
        rows = []
        reaped = False
        for pid, process in list(self.followed.items()):
            key = (pid, process.create_time())
            full = self.pss_due.get(key, 0) <= index
            began = time.thread_time()
            values = read_process(process, full)
            if values is None:  # gone: a pid seen again later is another process
                self.forget(pid)
                reaped = True
                continue
            own, tree = values
            if full:
                # The walk's cost sets when the next one is due, to keep under PSS_SHARE of a core.
                cost = time.thread_time() - began
                self.pss_due[key] = index + max(1, math.ceil(cost / (PSS_SHARE * self.interval_s)))
                self.pss_held[key] = (own["pss_bytes"], own["uss_bytes"])
            own["pss_bytes"], own["uss_bytes"] = tree["pss_bytes"], tree["uss_bytes"] = self.pss_held[key]
            rows.append((process, own, tree))
        return rows, reaped

    def series_of(self, process: psutil.Process, index: int) -> ProcessSeries:
        key = (process.pid, process.create_time())
        if key not in self.series:
            try:
                name, cmdline, ppid = process.name(), process.cmdline(), process.ppid()
            except psutil.Error:  # a zombie keeps no command line
                name, cmdline, ppid = "", [], None
            self.series[key] = ProcessSeries(
                pid=process.pid, ppid=ppid, name=name, cmdline=cmdline, first=index
            )
        else:
            renamed(process, self.series[key])
        return self.series[key]

    def follow(self, process: psutil.Process) -> None:
        """Follow a process found outside the tree (one of the command's, re-parented elsewhere)."""
        with contextlib.suppress(psutil.Error):  # gone already
            if process.pid not in self.followed and (process.pid, process.create_time()) not in self.ended:
                self.followed[process.pid] = process
                self.outside.discard(process.pid)

    def forget(self, pid: int) -> None:
        """Stop following a process (one gone, or the reaped root: its pid may be reused at once)."""
        process = self.followed.pop(pid, None)
        if process is not None:
            self.ended.add((pid, process.create_time()))

    def alive(self) -> list[psutil.Process]:
        """The followed processes still running (zombies excluded: they have ended)."""
        running = []
        for process in self.followed.values():
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
        return running

    def process_series(self) -> list[ProcessSeries]:
        return sorted(self.series.values(), key=lambda s: (s.first, s.pid))


def renamed(process: psutil.Process, series: ProcessSeries) -> None:
    """A process that ran another program (exec: a shim, ``bash -c``, ``exec`` in a script) is named
    by the program it runs now: its command line is read again at every sample, and on a change its
    name too (psutil keeps a process's first name; a new handle reads it afresh)."""
    try:
        cmdline = process.cmdline()
        if cmdline and cmdline != series.cmdline:
            fresh = psutil.Process(process.pid)
            if fresh.create_time() == process.create_time():  # the same process, not a reused pid
                series.name, series.cmdline = fresh.name(), cmdline
    except psutil.Error:  # gone or a zombie: it keeps the name it had
        pass
