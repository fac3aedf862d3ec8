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


SHOWN_CHARS = 80
"""Longest value :func:`shown` quotes: an error line must stay one short line whatever the input."""
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = SHOWN_CHARS
_SHORT_REPR.maxlist = _SHORT_REPR.maxtuple = _SHORT_REPR.maxdict = 6
_SHORT_REPR.maxlevel = 2


def shown(value: object) -> str:
    """``repr(value)`` for an error message: one line, cut to about :data:`SHOWN_CHARS` characters.

    Only the start of a long string or list is formatted, so a 5 MB cell costs nothing; an
    integer too long for ``repr`` (over 4300 digits) is described by its size instead.
    """
    try:
        text = _SHORT_REPR.repr(value)
    except ValueError:  # int too large to format (sys.get_int_max_str_digits)
        return f"an integer of {value.bit_length() if isinstance(value, int) else '?'} bits"
    return text if len(text) <= SHOWN_CHARS + 3 else text[:SHOWN_CHARS] + "..."


class MissingDataError(UserError):
    """A data file the scenario needs (a trace, a profile folder) is not on this machine.

    ``python -m sim report`` skips scenarios that raise this, and says so, instead of failing.
    """
