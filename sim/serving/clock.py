"""Float-exact scheduling on the simulation clock."""

from __future__ import annotations

import math


def delay_until(now_s: float, at_s: float) -> float:
    """A delay that makes ``now_s + delay`` land exactly on ``at_s`` (never before it).

    ``now + (at - now)`` can round one ulp short; a request would then be sent, or a
    static batch started, a hair before its recorded time.
    """
    delay = max(0.0, at_s - now_s)
    while now_s + delay < at_s:
        delay = math.nextafter(delay, math.inf)
    return delay
