"""A peak-memory budget: a number of bytes, or a share of the step's peak without saving (known only
once the step has been measured)."""

from __future__ import annotations

from dataclasses import dataclass

from dnnperf.analysis.memory import parse_bytes
from dnnperf.errors import UsageError


@dataclass(frozen=True)
class Budget:
    """``bytes`` (absolute) or ``percent`` (the share of the no-saving peak, in (0, 100]); ``text``
    as it was given, which the record keeps."""

    text: str
    bytes: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """'50%' of the no-saving peak, or a size ('2GiB', '500MB', '1000000'); a UsageError in one
        line for anything else."""
        stripped = text.strip()
        if stripped.endswith("%"):
            try:
                share = float(stripped[:-1])
            except ValueError:
                raise UsageError(f"not a percentage: {text!r} (e.g. 50%)") from None
            if not 0 < share <= 100:
                raise UsageError(f"a budget percentage must be in (0, 100], got {text!r}")
            return cls(text=text, percent=share)
        return cls(text=text, bytes=parse_bytes(stripped))

    @classmethod
    def of(cls, value: Budget | int | str) -> Budget:
        """A Budget from what the Python API takes: a Budget, a number of bytes, or the CLI's text."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls.parse(str(value))  # bytes, refused as the CLI refuses the same digits
        if isinstance(value, str):
            return cls.parse(value)
        raise UsageError(f"a budget is a string ('50%', '2GiB') or a number of bytes, got {value!r}")

    def bytes_for(self, peak: int) -> int:
        """The budget in bytes against the no-saving ``peak``: a byte at least (the record's budget
        is positive)."""
        if self.bytes is not None:
            return self.bytes
        assert self.percent is not None
        return max(1, int(peak * self.percent / 100))

    def __str__(self) -> str:
        return self.text
