"""Errors a user can fix. The CLI prints them as one line and exits with code 2; and the text helpers
that keep what a user or a record supplied from taking over the terminal or the line."""

from __future__ import annotations

import re
import unicodedata

#: The most characters of one quoted value (an argument, a name) a message echoes.
ECHO_LIMIT = 80
#: The most characters of a word without spaces (a path) a message keeps, and of the whole message.
WORD_LIMIT, MESSAGE_LIMIT = 240, 1000

_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
#: Text direction overrides and isolates: invisible, and they reorder what the terminal shows.
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class DnnperfError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class UsageError(DnnperfError):
    """Bad arguments: unknown names, out-of-range numbers, unavailable devices."""


class RecordError(ValueError):
    """A document that is not a valid run record; the message says what is wrong."""


def shortened(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis when longer."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def printable(text: str, limit: int | None = None, newlines: bool = False) -> str:
    """``text`` as a terminal should show it: control characters (escape sequences, bells, carriage
    returns; newlines unless ``newlines``) and direction overrides written as ``\\x1b`` escapes, so
    they are seen and not obeyed; cut to ``limit`` characters."""
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    shown = "".join(
        c
        if (c.isprintable() and c not in _BIDI) or (newlines and c == "\n") or unicodedata.category(c) == "Zs"
        else repr(c)[1:-1]
        for c in text[: None if limit is None else limit * 4]  # an escape is at most 10 characters
    )
    return shown if limit is None else shortened(shown, limit)


def one_line(message: str) -> str:
    """A message as one terminal line: whitespace runs made one space, control characters made
    visible, a quoted value longer than ECHO_LIMIT (a 100 KB argument echoed back) cut, as is a
    word longer than WORD_LIMIT and the message beyond MESSAGE_LIMIT."""
    message = _QUOTED.sub(
        lambda m: (
            shortened(m.group(), ECHO_LIMIT - 1) + m.group()[0] if len(m.group()) > ECHO_LIMIT else m.group()
        ),
        message[: MESSAGE_LIMIT * 100],
    )
    words = [shortened(printable(word), WORD_LIMIT) for word in message.split()]
    return shortened(" ".join(words), MESSAGE_LIMIT)
