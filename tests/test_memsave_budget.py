"""The memory budget: parsed once from its text (the CLI's and the Python API's), in bytes against a
peak only where it is a share of it."""

import pytest

from dnnperf.errors import UsageError
from dnnperf.memsave.budget import Budget

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def test_a_share_is_bytes_only_against_a_peak_and_a_size_is_bytes_whatever_the_peak():
    half = Budget.parse("50%")
    assert half.bytes is None and [half.bytes_for(p) for p in (1000, 3)] == [500, 1]
    assert Budget.parse("1%").bytes_for(50) == 1  # a byte at least: a record's budget is positive
    two_kib = Budget.parse(" 2KiB ")
    assert [two_kib.bytes_for(p) for p in (1, 10**9)] == [2048, 2048]
    assert str(two_kib) == " 2KiB "  # the text as given is what the record keeps


def test_the_python_api_takes_a_budget_bytes_or_the_same_text():
    parsed = Budget.parse("60%")
    assert Budget.of(parsed) is parsed  # not parsed again
    assert Budget.of("60%") == parsed
    assert Budget.of(4096) == Budget.parse("4096") and Budget.of(4096).bytes_for(1) == 4096


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("lots", "not a size"),
        ("0%", "(0, 100]"),
        ("101%", "(0, 100]"),
        ("x%", "not a percentage"),
        ("0", "must be positive"),
        (-5, "not a size in bytes: '-5'"),
        (0.5, "got 0.5"),
        (True, "got True"),
    ],
)
def test_a_bad_budget_is_one_usage_error_naming_it(value, needle):
    with pytest.raises(UsageError) as raised:
        Budget.of(value)
    assert needle in str(raised.value) and "\n" not in str(raised.value)
