"""Progress bars on stderr for long simulations: tqdm, on a terminal only, after ~2 s.

Redirected stderr (a log file, CI, a pipe) gets nothing at all: no bar is even created.
On a terminal each policy gets a bar titled ``policy k/n`` whose postfix carries the
simulated time and an estimate of the time left for the whole run (all policies).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

DELAY_S = 2.0  # quick runs print nothing, so short CLI runs and tests stay clean


class RunProgress:
    """Progress factory for one :func:`sim.runner.run` call: one bar per simulated policy.

    Called as ``factory(policy, total_requests, index=k, count=n)``; returns None (no bar)
    when the stream is not a terminal. The delay is counted from the start of the run, so a
    run of several short policies still shows its bar once it has lasted ``delay_s``.

    Args:
        file: where bars go (default: ``sys.stderr`` at the time of each call).
        delay_s: seconds into the run before anything is drawn (default :data:`DELAY_S`).
    """

    def __init__(self, file: TextIO | None = None, delay_s: float | None = None) -> None:
        self._file = file
        self._delay_s = DELAY_S if delay_s is None else delay_s
        self._started = time.monotonic()

    def __call__(self, policy: str, total_requests: int, *, index: int = 1, count: int = 1) -> _Bar | None:
        stream = self._file if self._file is not None else sys.stderr
        if not is_terminal(stream):
            return None
        delay_s = max(0.0, self._started + self._delay_s - time.monotonic())
        return _Bar(policy, total_requests, index, count, stream, delay_s, self._started)


class _Bar:
    """Adapter from the engine's ``progress(sim_time_s, finished_requests)`` calls to a tqdm bar.

    It only moves the counter: tqdm itself decides when to redraw (its ``mininterval`` and
    ``delay``), so a long run writes a few frames per second, not one per call.
    """

    def __init__(self, policy: str, total_requests: int, index: int, count: int, stream: TextIO,
                 delay_s: float, run_started: float) -> None:
        desc = f"{policy} {index}/{count}" if count > 1 else policy
        self._bar = tqdm(total=total_requests, desc=desc, unit="req", file=stream, delay=delay_s,
                         leave=False, dynamic_ncols=True)
        self._done_before = (index - 1) * total_requests  # every policy replays the same stream
        self._run_total = count * total_requests
        self._run_started = run_started

    def __call__(self, sim_time_s: float, finished_requests: int) -> None:
        self._bar.set_postfix_str(f"sim t={sim_time_s:,.0f}s{self._run_eta(finished_requests)}", refresh=False)
        self._bar.update(finished_requests - self._bar.n)

    def _run_eta(self, finished_requests: int) -> str:
        if self._run_total == self._bar.total:
            return ""  # one policy: the bar's own ETA is the run's
        done = self._done_before + finished_requests
        elapsed_s = time.monotonic() - self._run_started
        if done <= 0 or elapsed_s <= 0:
            return ""
        left_s = elapsed_s / done * (self._run_total - done)
        return f", run ~{tqdm.format_interval(left_s)} left"

    def close(self) -> None:
        self._bar.close()


def tqdm_progress(policy: str, total_requests: int, *, index: int = 1, count: int = 1) -> _Bar | None:
    """Progress factory for :func:`sim.runner.run` with no shared run clock (see :class:`RunProgress`)."""
    return RunProgress()(policy, total_requests, index=index, count=count)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an open terminal: where a progress bar may be drawn (also used by sweeps)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False
