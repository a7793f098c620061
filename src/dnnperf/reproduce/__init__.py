"""Re-running the seed papers' experiments with dnnperf's public commands (``dnnperf reproduce``).

Each paper module has ``KEY``, ``SEED``, ``TITLE``, ``SIZES`` and ``run(session, size, progress)``
returning a :class:`~dnnperf.reproduce.base.Reproduction`. :func:`render_markdown` writes its section of
``docs/reproductions.md``; :func:`update_document` replaces that section in place, leaving the others.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pandas as pd

from dnnperf.errors import UsageError
from dnnperf.jsonio import write_text_atomic
from dnnperf.reproduce import memory_subsystem, offload, parallelism, tbd, training_phase
from dnnperf.reproduce.base import Reproduction, Session

PAPERS: dict[str, ModuleType] = {
    m.KEY: m for m in (tbd, training_phase, memory_subsystem, parallelism, offload)
}
#: What is not reproduced yet, and why (said in the document, not hidden).
PENDING = {}

__all__ = ["PAPERS", "Reproduction", "Session", "paper", "render_markdown", "update_document"]


def paper(name: str) -> ModuleType:
    """A paper by key (``tbd``) or seed number (``004``)."""
    for module in PAPERS.values():
        if name in (module.KEY, module.SEED):
            return module
    if name in PENDING:
        raise UsageError(f"seed {name} cannot be reproduced yet: {PENDING[name]}")
    known = ", ".join(f"{m.KEY} ({m.SEED})" for m in PAPERS.values())
    raise UsageError(f"unknown paper {name!r}: choose one of {known}, or all")


def _escape(text: str) -> str:
    """A table cell's text with its pipes escaped: a bare ``|`` would end the cell."""
    return text.replace("|", "\\|")


def _markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(no rows)"
    # Text cells and headings escaped; numbers stay numbers, for their format and alignment.
    escaped = frame.map(lambda v: _escape(v) if isinstance(v, str) else v)
    escaped.columns = [_escape(str(c)) for c in frame.columns]
    return escaped.to_markdown(index=False, floatfmt=".3g")


def render_markdown(reproduction: Reproduction) -> str:
    """The paper's section: claims beside measurements, verdicts, the commands; then the tables."""
    machine, software = reproduction.machine, reproduction.software
    gpus = ", ".join(g["name"] for g in machine.get("gpus", [])) or "no GPU"
    lines = [
        f"## Seed {reproduction.seed}: {reproduction.title}",
        "",
        f"`dnnperf reproduce {reproduction.key} --size {reproduction.size}` on {reproduction.date} at "
        f"commit `{reproduction.commit}`: "
        f"{machine.get('cpu_model', '?')}, {machine.get('cores_usable', '?')} usable cores, "
        f"{machine.get('memory_bytes', 0) / 2**30:.0f} GiB, {gpus}; torch {software.get('torch', '?')}; "
        f"{reproduction.seconds / 60:.1f} minutes; load average at the end "
        f"{'/'.join(f'{x:.1f}' for x in reproduction.load)} (1/5/15 min).",
        "",
        "| the paper's claim | measured here | verdict | why | produced by |",
        "|---|---|---|---|---|",
    ]
    for claim in reproduction.claims:
        commands = "<br>".join(f"`{c}`" for c in claim.commands) or "-"
        cells = [claim.claim, claim.measured, f"**{claim.verdict}**", claim.why, commands]
        lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    for note in reproduction.notes:
        lines += ["", note]
    for title, frame in reproduction.tables:
        lines += ["", f"### {title}", "", _markdown_table(frame)]
    return "\n".join(lines) + "\n"


HEADER = """# Reproductions of the seed papers

Each section is written by `dnnperf reproduce PAPER` (`make reproduce` runs them all) from the runs it
makes with dnnperf's public commands; every figure cites the command that produced it. Verdicts: **holds**
when the measured result agrees with the paper's claim on this machine, **differs** otherwise, with why.
"""


def update_document(path: Path, reproductions: list[Reproduction]) -> None:
    """Replace each paper's section of ``path`` (between its markers), keep the rest, write atomically."""
    text = path.read_text() if path.exists() else HEADER
    for reproduction in reproductions:
        begin, end = f"<!-- paper:{reproduction.key} -->", f"<!-- /paper:{reproduction.key} -->"
        section = f"{begin}\n{render_markdown(reproduction)}{end}"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        if pattern.search(text):
            text = pattern.sub(lambda _, section=section: section, text)
        else:
            text = f"{text.rstrip()}\n\n{section}\n"
    pending = "\n".join(f"- seed {seed}: not reproduced yet ({why})." for seed, why in PENDING.items())
    block = f"<!-- pending -->\n## Not reproduced yet\n\n{pending}\n<!-- /pending -->"
    pattern = re.compile(r"<!-- pending -->.*?<!-- /pending -->", re.DOTALL)
    if not PENDING:
        text = pattern.sub("", text)
    elif pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = f"{text.rstrip()}\n\n{block}\n"
    write_text_atomic(path, text.rstrip() + "\n")
