"""Arrival processes: when each request is sent.

Open-loop kinds produce sorted send times in seconds, vectorised (no per-request
Python loop), one table entry per kind in :data:`ARRIVAL_KINDS`:

* ``poisson``: exponential gaps with mean ``1/rate``; the first request arrives one
  gap after t=0.
* ``gamma``: gamma gaps with mean ``1/rate`` and coefficient of variation ``cv``
  (shape ``k = 1/cv^2``, scale ``1/(rate k)``); ``cv = 1`` is Poisson, ``cv > 1`` bursty.
* ``constant``: request i (0-based) at ``(i + 1) / rate``: the first arrives one gap
  after t=0, like Poisson, so constant arrivals are exactly the mean Poisson arrival times.
* ``burst``: everything at t=0 (offline throughput).
* ``schedule``: a piecewise-constant-rate (nonhomogeneous) Poisson process whose phases
  repeat until every request is sent. Generated exactly by a time change: the points of
  a unit-rate Poisson process are mapped through the inverse of the cumulative rate
  ``Lambda(t)``, which is piecewise linear. Phases with rate 0 get no arrivals.

Closed-loop clients have no send times up front; :func:`closed_loop_clients` draws
their think times (for ``closed_loop`` and for a trace replayed with ``concurrency``).
Trace replay lives in :mod:`sim.workload.source`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.config import (
    Arrival,
    BurstArrival,
    ClosedLoopArrival,
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
    ScheduleArrival,
    TraceArrival,
)
from sim.workload.stream import ClosedLoop


def sample_arrivals(config: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Send times (float64 seconds, ascending, from t=0) of ``n`` open-loop requests.

    Args:
        config: an open-loop arrival config (poisson, gamma, constant, burst, schedule).
        n: number of requests.
        rng: the ``"arrivals"`` stream.

    Raises:
        ValueError: ``config`` is a closed-loop or trace arrival (handled elsewhere).
    """
    if config.kind not in ARRIVAL_KINDS:
        raise ValueError(f"arrival kind '{config.kind}' has no synthetic send times")
    return ARRIVAL_KINDS[config.kind](config, n, rng)


def closed_loop_clients(config: ClosedLoopArrival | TraceArrival, n: int, rng: np.random.Generator) -> ClosedLoop:
    """Closed-loop clients with one think time per request index.

    Think times are exponential with mean ``config.think_time_s`` (all zero when it is 0).

    Args:
        config: the closed-loop arrival config, or a trace arrival with ``concurrency`` (its rows
            replayed by that many clients, in trace order).
        n: number of requests.
        rng: the ``"think_time"`` stream.
    """
    clients = config.concurrency if isinstance(config, TraceArrival) else config.clients
    if clients is None:
        raise ValueError("a trace arrival without concurrency is open loop")
    if config.think_time_s > 0:
        think_s = rng.exponential(config.think_time_s, size=n)
    else:
        think_s = np.zeros(n)
    return ClosedLoop(clients=clients, think_time_s=think_s)


def _poisson(config: PoissonArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / config.rate, size=n))


def _gamma(config: GammaArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    shape = 1.0 / config.cv**2
    return np.cumsum(rng.gamma(shape, 1.0 / (config.rate * shape), size=n))


def _constant(config: ConstantArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    # i / rate rather than a cumulative sum: no rounding drift over a million requests.
    return np.arange(1, n + 1, dtype=np.float64) / config.rate


def _burst(config: BurstArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.zeros(n)


def _schedule(config: ScheduleArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    durations_s = np.array([p.duration_s for p in config.phases])
    rates = np.array([p.rate for p in config.phases])
    starts_s = np.concatenate(([0.0], np.cumsum(durations_s)[:-1]))
    cycle_s = float(durations_s.sum())
    live = rates > 0  # zero-rate phases hold no mass of Lambda, so no point maps into them
    starts_s, rates, durations_s = starts_s[live], rates[live], durations_s[live]
    mass = rates * durations_s  # expected arrivals in each live phase
    mass_starts = np.concatenate(([0.0], np.cumsum(mass)[:-1]))
    cycle_mass = float(mass.sum())

    unit_points = np.cumsum(rng.exponential(1.0, size=n))
    cycles = np.floor(unit_points / cycle_mass)
    within = np.maximum(unit_points - cycles * cycle_mass, 0.0)
    phase = np.clip(np.searchsorted(mass_starts, within, side="right") - 1, 0, len(mass) - 1)
    times_s = cycles * cycle_s + starts_s[phase] + (within - mass_starts[phase]) / rates[phase]
    # Guard against last-bit rounding at cycle boundaries breaking the sort order.
    return np.maximum.accumulate(times_s)


# One explicit table of the open-loop kinds (closed_loop and trace are built in source.py).
ARRIVAL_KINDS: dict[str, Callable[..., np.ndarray]] = {
    "poisson": _poisson,
    "gamma": _gamma,
    "constant": _constant,
    "burst": _burst,
    "schedule": _schedule,
}
