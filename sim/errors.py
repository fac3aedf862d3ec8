"""User-facing errors.

Anything the user can fix (a wrong YAML key, a negative rate, a model that does not
fit in memory, a corrupt trace) is raised as :class:`UserError`. The CLI prints its
message on one line and exits with code 2; it never shows a traceback for these.
Programming errors stay ordinary exceptions so they are not hidden.
"""

from __future__ import annotations

import difflib
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
