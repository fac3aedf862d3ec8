"""Progress bars on stderr for long simulations: tqdm, on a terminal only, after ~2 s.

Redirected stderr (a log file, CI, a pipe) gets nothing at all: no bar is even created.
On a terminal each policy gets a bar titled ``policy k/n`` whose postfix carries the
simulated time and an estimate of the time left for the whole run (all policies).

When a bar appears and how often it is redrawn are decided here, on one clock that the
caller may replace (:class:`RunProgress`'s ``clock``), not by tqdm's own timer: a test can
then drive the bar with a fake clock and see the same frames on any machine, however busy.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

DELAY_S = 2.0  # quick runs print nothing, so short CLI runs and tests stay clean
FRAME_INTERVAL_S = 0.1  # at most ten frames a second (tqdm's own default ``mininterval``)

Clock = Callable[[], float]
"""Seconds from an arbitrary origin that never go back (:func:`time.monotonic`)."""


class RunProgress:
    """Progress factory for one :func:`sim.runner.run` call: one bar per simulated policy.

    Called as ``factory(policy, total_requests, index=k, count=n)``; returns None (no bar)
    when the stream is not a terminal. The delay is counted from the start of the run, so a
    run of several short policies still shows its bar once it has lasted ``delay_s``.

    Args:
        file: where bars go (default: ``sys.stderr`` at the time of each call).
        delay_s: seconds into the run before anything is drawn (default :data:`DELAY_S`).
        clock: the clock for the delay, the frame interval and the run's ETA (default
            :func:`time.monotonic`; tests pass a fake one).
    """

    def __init__(self, file: TextIO | None = None, delay_s: float | None = None, clock: Clock = time.monotonic) -> None:
        self._file = file
        self._clock = clock
        self._started = clock()
        self._shown_from = self._started + (DELAY_S if delay_s is None else delay_s)

    def __call__(self, policy: str, total_requests: int, *, index: int = 1, count: int = 1) -> _Bar | None:
        stream = self._file if self._file is not None else sys.stderr
        if not is_terminal(stream):
            return None
        desc = f"{policy} {index}/{count}" if count > 1 else policy
        return _Bar(desc, total_requests, index, count, stream, self._clock, self._started, self._shown_from)


class _Bar:
    """Adapter from the engine's ``progress(sim_time_s, finished_requests)`` calls to a tqdm bar.

    The engine calls every few passes; a frame is drawn only once the run has reached its
    delay and :data:`FRAME_INTERVAL_S` after the previous frame, so a long run writes a few
    frames per second, not one per call. The tqdm bar is created at the first frame: a run
    that ends within its delay writes nothing at all.
    """

    def __init__(self, desc: str, total_requests: int, index: int, count: int, stream: TextIO,
                 clock: Clock, run_started: float, shown_from: float) -> None:
        self._desc = desc
        self._total = total_requests
        self._stream = stream
        self._clock = clock
        self._done_before = (index - 1) * total_requests  # every policy replays the same stream
        self._run_total = count * total_requests
        self._run_started = run_started
        self._shown_from = shown_from
        self._last_frame = -math.inf
        self._bar: tqdm | None = None

    def __call__(self, sim_time_s: float, finished_requests: int) -> None:
        now = self._clock()
        if now < self._shown_from or now - self._last_frame < FRAME_INTERVAL_S:
            return
        self._last_frame = now
        bar = self._bar if self._bar is not None else self._open()
        bar.n = finished_requests
        bar.set_postfix_str(f"sim t={sim_time_s:,.0f}s{self._run_eta(finished_requests, now)}", refresh=False)
        bar.refresh()

    def _open(self) -> tqdm:
        # No timer of tqdm's own: its delay and redraw interval would read the wall clock, and
        # frames are only ever drawn by ``refresh`` above.
        self._bar = tqdm(total=self._total, desc=self._desc, unit="req", file=self._stream, leave=False,
                         dynamic_ncols=True, mininterval=math.inf)
        return self._bar

    def _run_eta(self, finished_requests: int, now: float) -> str:
        if self._run_total == self._total:
            return ""  # one policy: the bar's own ETA is the run's
        done = self._done_before + finished_requests
        elapsed_s = now - self._run_started
        if done <= 0 or elapsed_s <= 0:
            return ""
        left_s = elapsed_s / done * (self._run_total - done)
        return f", run ~{tqdm.format_interval(left_s)} left"

    def close(self) -> None:
        if self._bar is not None:
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
