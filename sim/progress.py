"""Progress bars on stderr for long simulations (tqdm, shown only after ~2 s)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from tqdm import tqdm


class _Bar:
    """Adapter from the engine's ``progress(sim_time_s, finished_requests)`` calls to a tqdm bar."""

    def __init__(self, policy: str, total_requests: int) -> None:
        # delay: quick runs print nothing, so short CLI runs and tests stay clean.
        self._bar = tqdm(total=total_requests, desc=policy, unit="req", file=sys.stderr, delay=2.0,
                         leave=False, dynamic_ncols=True)

    def __call__(self, sim_time_s: float, finished_requests: int) -> None:
        self._bar.n = finished_requests
        self._bar.set_postfix_str(f"sim t={sim_time_s:,.0f}s", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def tqdm_progress(policy: str, total_requests: int) -> Callable[[float, int], None]:
    """Progress factory for :func:`sim.runner.run`: one bar per simulated policy."""
    return _Bar(policy, total_requests)
