"""The docs as a user reads them: pages short enough to read, no references to numbered episodes of past
work (in docs, README and source comments), and every relative link landing on a file and heading that
exist."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
MAX_LINES = 400
#: Words that date a text to an episode of its own making, which means nothing to a user.
DIARY = re.compile(
    r"\bsessions? \d+|\bSession \d+|\b(previous|earlier|last) session\b|\b(previous|earlier) call\b"
    r"|\bfor now\b|\bnot available yet\b"
    # ... and to the work behind it: fixes, earlier code, the machines' lending and locking
    r"|\bFixed \(|\bshipped\b|\bfinal code\b|\bnew code\b|\bthe old (table|estimator|peak|rule|model|code)\b"
    r"|\bCPU lock\b|\bdevice tool\b|\bworkplace\b|\bacceptance item\b|\bthe issue\b"
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, duplicates numbered as GitHub numbers them (-1, -2, ...)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of a page (outside code blocks) whose file or heading does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


def test_anchors_follow_githubs_rule():
    assert github_anchor("Single process, step time (CPU)") == "single-process-step-time-cpu"
    assert github_anchor("`dnnperf hw` twice in a row (target: within 10%)") == (
        "dnnperf-hw-twice-in-a-row-target-within-10"
    )
    assert github_anchor("2 ranks: dp, pp and tp") == "2-ranks-dp-pp-and-tp"


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Known part\n\n## Known part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#known-part) [second](other.md#known-part-1) [self](#page)\n"
        "[gone](missing.md) [no heading](other.md#unknown) [web](https://example.com/x.md)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#unknown (no such heading)"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_is_short_enough_to_read(page):
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_LINES, f"{page.name} has {lines} lines (at most {MAX_LINES}): split it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_describes_the_product_not_its_history(page):
    hits = [line for line in page.read_text().splitlines() if DIARY.search(line)]
    assert not hits, f"{page.name}: " + " | ".join(hits[:5])


def test_source_comments_describe_the_product_not_its_history():
    hits = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("src", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".sh")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DIARY.search(line)
    ]
    assert not hits, hits


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    assert not broken_links(page), f"{page.name}: {broken_links(page)}"
