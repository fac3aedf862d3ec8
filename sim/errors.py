"""User-facing errors.

Anything the user can fix (a wrong YAML key, a negative rate, a model that does not
fit in memory, a corrupt trace) is raised as :class:`UserError`. The CLI prints its
message on one line and exits with code 2; it never shows a traceback for these.
Programming errors stay ordinary exceptions so they are not hidden.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable


class UserError(Exception):
    """A mistake in the user's input, reported as one clear message (exit code 2).

    Args:
        message: what is wrong, naming the field, the value and what is allowed.
        field: dotted path of the offending field, when there is one.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __str__(self) -> str:
        message = super().__str__()
        if self.field and not message.startswith(self.field):
            return f"{self.field}: {message}"
        return message


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return a ' (did you mean X?)' hint for a misspelt name, or '' if nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class MissingDataError(UserError):
    """A data file the scenario needs (a trace, a profile folder) is not on this machine.

    ``python -m sim report`` skips scenarios that raise this, and says so, instead of failing.
    """


MAX_VALUE_CHARS = 80
"""Longest echo of a user's value in an error message."""

MAX_LINE_CHARS = 500
"""Longest error line the CLI prints."""


def cut(text: str, limit: int) -> str:
    """``text`` unchanged if it fits in ``limit`` characters, else its start and '…'."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """A user's value for an error message: its ``repr`` (so newlines show as ``\\n``), cut to ``limit`` characters.

    Numpy scalars show as the Python numbers they hold (``-0.1``, not ``np.float64(-0.1)``); a
    long string or a container is never formatted whole (a 5 MB name, a list with shared items).
    """
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str):
        return cut(repr(value[: limit + 1]), limit)
    try:
        if isinstance(value, (dict, list, tuple, set, frozenset)):
            return cut(_short_repr(value), limit)
        return cut(repr(value), limit)
    except ValueError:  # an int beyond Python's 4300-digit str() limit
        return f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable value>"


def _short_repr(value: object) -> str:
    """A bounded ``repr`` of a container: a few items of a few levels, whatever its size."""
    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxstring, short.maxother = 3, 4, 6, 40, 40
    return short.repr(value)


def one_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """A message as one line of at most ``limit`` characters: line breaks shown as ``\\n``, the rest cut."""
    return cut(text.replace("\r\n", "\n").translate(_LINE_BREAKS), limit)


_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
"""Every character str.splitlines() breaks at, as its escape."""
