"""Output paths checked before any work (dnnperf/paths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnnperf.errors import UsageError
from dnnperf.paths import output_directory, output_file

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def test_outputs_that_can_be_written_pass_and_leave_nothing(tmp_path):
    existing = tmp_path / "old.html"
    existing.write_text("kept until the atomic write replaces it")
    assert output_file(existing, "-o") == existing  # overwritten later, atomically
    assert output_file(tmp_path / "new.json", "--trace") == tmp_path / "new.json"
    assert output_file(tmp_path / "a" / "b" / "hw.json", "--output", parents=True)  # its writer makes a/b
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "stages.csv").write_text("")
    assert output_directory(tmp_path / "csv", "--csv") and output_directory(tmp_path / "x" / "y", "--csv")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["csv", "old.html", "stages.csv"]  # no probe left


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda d: output_file(d, "-o"), "is a directory, not a file"),
        (lambda d: output_file(d / "missing" / "r.html", "-o"), "no directory"),
        (lambda d: output_file(d / "file" / "r.html", "-o", parents=True), "file: not a directory"),
        (lambda d: output_directory(d / "file", "--csv"), "not a directory"),
        (lambda d: output_directory(d / "file" / "sub", "--csv"), "file is not a directory"),
        (lambda d: output_file(Path("/proc/r.html"), "-o"), "cannot write in /proc"),
    ],
)
def test_outputs_that_cannot_be_written_are_named(tmp_path, check, message):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=message):
        check(tmp_path)
