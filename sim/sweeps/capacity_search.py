"""The rate search of a capacity question, free of any simulation.

:func:`search_rate` is a generator: it yields the next rate to try and is sent back
whether that rate met the SLO, so the same logic drives many policies in lock-step
(their runs batched onto the workers) and is tested with plain threshold functions.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

CHECK_FACTOR = 1.1
"""After converging, the search also runs this multiple of the answer, which must fail."""

MAX_WIDEN_STEPS = 20
"""Doublings/halvings tried while bracketing (a factor of about a million either way)."""

MAX_RESTARTS = 5
"""Times the search may continue above a failed rate that later turned out to be non-monotone."""

_MID_DIGITS = 6  # round midpoints to this many significant digits, so reported rates stay readable

Search = Generator[float, bool, "SearchOutcome"]


@dataclass(frozen=True)
class SearchOutcome:
    """Where a rate search ended.

    Attributes:
        rate_rps: highest rate found to meet the SLO (None: none of those tried did).
        fail_rps: lowest rate found to fail above ``rate_rps`` (None: none tried failed).
        checked_rps: ``CHECK_FACTOR`` x ``rate_rps``, run and found to fail (None if not run).
        note: why the answer is only a bound, or that latency was non-monotone; "" otherwise.
    """

    rate_rps: float | None
    fail_rps: float | None
    checked_rps: float | None = None
    note: str = ""


def search_rate(
    start_rps: float,
    tolerance: float,
    rate_low: float | None = None,
    rate_high: float | None = None,
) -> Search:
    """Highest rate meeting the SLO: bracket, bisect to ``tolerance``, check ``CHECK_FACTOR`` above.

    Args:
        start_rps: where bracketing starts when no bound is given.
        tolerance: bisect until fail_rps <= rate_rps x (1 + tolerance).
        rate_low: a rate expected to meet the SLO (tried first).
        rate_high: a rate expected to fail it.

    Yields:
        The next rate to run; send True if it met the SLO.

    Returns:
        The :class:`SearchOutcome`.
    """
    low, high = yield from _bracket(start_rps, rate_low, rate_high)
    note = ""
    for _ in range(MAX_RESTARTS + 1):
        if low is None or high is None:
            return _unbounded(low, high)
        low, high = yield from _bisect(low, high, tolerance)
        check = low * CHECK_FACTOR
        if not (yield check):
            return SearchOutcome(low, min(high, check), check, note)
        low = check
        if high <= low:
            note = (
                "latency is not monotone in load here: "
                "a higher rate met the SLO after a lower one failed"
            )
            low, high = yield from _widen(low, None)
    gave_up = f"gave up checking above after {MAX_RESTARTS} restarts"
    return SearchOutcome(low, high, None, f"{note}; {gave_up}" if note else gave_up)


def _bracket(
    start_rps: float, rate_low: float | None, rate_high: float | None
) -> Generator[float, bool, tuple[float | None, float | None]]:
    low: float | None = None
    high: float | None = None
    if rate_low is not None:
        if not (yield rate_low):
            return None, rate_low
        low = rate_low
    if rate_high is not None:
        if (yield rate_high):
            return rate_high, None
        high = rate_high
    if low is None and high is None:
        if (yield start_rps):
            low = start_rps
        else:
            high = start_rps
    return (yield from _widen(low, high))


def _widen(
    low: float | None, high: float | None
) -> Generator[float, bool, tuple[float | None, float | None]]:
    """Double up from a meeting rate, or halve down from a failing one, until both ends known."""
    for _ in range(MAX_WIDEN_STEPS):
        if low is not None and high is not None:
            break
        rate = low * 2 if low is not None else high / 2  # type: ignore[operator]
        if (yield rate):
            low = rate
        else:
            high = rate
    return low, high


def _bisect(
    low: float, high: float, tolerance: float
) -> Generator[float, bool, tuple[float, float]]:
    while high > low * (1 + tolerance):
        mid = _midpoint(low, high)
        if (yield mid):
            low = mid
        else:
            high = mid
    return low, high


def _midpoint(low: float, high: float) -> float:
    """Geometric midpoint (the error is relative), rounded when that keeps it strictly inside."""
    mid = math.sqrt(low * high)
    digits = _MID_DIGITS - 1 - math.floor(math.log10(mid))
    rounded = round(mid, digits)
    return rounded if low < rounded < high else mid


def _unbounded(low: float | None, high: float | None) -> SearchOutcome:
    if low is None:
        return SearchOutcome(
            None, high, None, f"fails the SLO at every rate tried, down to {high:g} req/s"
        )
    return SearchOutcome(low, None, None, f"meets the SLO at every rate tried, up to {low:g} req/s")
