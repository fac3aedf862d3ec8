"""Arrival processes against their defining statistics (tolerances from sampling theory)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import (
    BurstArrival,
    ClosedLoopArrival,
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
    ScheduleArrival,
    TraceArrival,
)
from sim.workload.arrivals import closed_loop_clients, sample_arrivals

N = 200_000


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _gaps(times_s: np.ndarray) -> np.ndarray:
    return np.diff(np.concatenate(([0.0], times_s)))


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


@pytest.mark.parametrize("rate", [0.5, 8.0])
def test_poisson_gaps_are_exponential(rate: float) -> None:
    times_s = sample_arrivals(PoissonArrival(rate=rate), N, _rng())
    gaps = _gaps(times_s)
    assert np.all(gaps >= 0) and times_s[0] > 0
    # Mean of n exponentials: relative sd 1/sqrt(n) ~ 0.22%; CV: ~ 1/sqrt(n) too.
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.012)
    assert _cv(gaps) == pytest.approx(1.0, rel=0.02)
    # Memorylessness: P(gap > 2/rate) = e^-2.
    assert np.mean(gaps > 2 / rate) == pytest.approx(np.exp(-2), abs=0.004)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_gaps_have_configured_mean_and_cv(cv: float) -> None:
    rate = 4.0
    gaps = _gaps(sample_arrivals(GammaArrival(rate=rate, cv=cv), N, _rng(1)))
    assert np.all(gaps >= 0)
    # 5 sigma of the sample mean; the sample CV of a gamma (excess kurtosis 6 cv^2)
    # has relative sd ~ sqrt((6 cv^2 + 2) / n) / 2.
    assert gaps.mean() == pytest.approx(1 / rate, rel=5 * cv / np.sqrt(N))
    assert _cv(gaps) == pytest.approx(cv, rel=2.5 * np.sqrt((6 * cv**2 + 2) / N))


def test_constant_arrivals_are_evenly_spaced_from_one_gap() -> None:
    times_s = sample_arrivals(ConstantArrival(rate=4.0), 1_000_001, _rng())
    assert times_s[0] == 0.25
    assert times_s[-1] == pytest.approx(250_000.25, abs=1e-9)  # no accumulated drift
    np.testing.assert_allclose(np.diff(times_s), 0.25, atol=1e-9)


def test_burst_is_all_at_zero() -> None:
    assert not np.any(sample_arrivals(BurstArrival(), 100, _rng()))


def _schedule() -> ScheduleArrival:
    return ScheduleArrival.model_validate(
        {
            "phases": [
                {"duration_s": 10, "rate": 5},
                {"duration_s": 5, "rate": 0},
                {"duration_s": 20, "rate": 20},
                {"duration_s": 2.5, "rate": 1},
            ]
        }
    )


def test_schedule_counts_per_phase_match_rate_times_duration() -> None:
    config = _schedule()
    cycle_s = 37.5
    times_s = sample_arrivals(config, 100_000, _rng(2))
    assert np.all(np.diff(times_s) >= 0)
    cycles = int(times_s[-1] // cycle_s)  # only complete cycles are fully observed
    assert cycles > 150
    phase_of = np.searchsorted(
        [10, 15, 35, 37.5], times_s[times_s < cycles * cycle_s] % cycle_s, "right"
    )
    counts = np.bincount(phase_of, minlength=4)
    assert counts[1] == 0  # a rate-0 phase gets nothing
    for phase, expected_per_cycle in ((0, 50.0), (2, 400.0), (3, 2.5)):
        expected = expected_per_cycle * cycles
        assert abs(counts[phase] - expected) < 5 * np.sqrt(expected), phase  # Poisson: var = mean


def test_schedule_is_poisson_within_a_phase() -> None:
    times_s = sample_arrivals(_schedule(), 100_000, _rng(3))
    in_phase = (times_s % 37.5 >= 15) & (times_s % 37.5 < 35)
    gaps = np.diff(times_s)[in_phase[1:] & in_phase[:-1]]
    # Gaps between consecutive arrivals inside the 20/s phase, truncated at the phase end
    # (20 s >> 1/20 s, so truncation is negligible).
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.02)
    assert _cv(gaps) == pytest.approx(1.0, rel=0.03)


def test_schedule_starting_idle_sends_nothing_before_load_starts() -> None:
    config = ScheduleArrival.model_validate(
        {"phases": [{"duration_s": 30, "rate": 0}, {"duration_s": 10, "rate": 2}]}
    )
    times_s = sample_arrivals(config, 5_000, _rng(4))
    assert np.all(times_s % 40 >= 30)
    assert len(times_s) / (times_s[-1] // 40 + 1) == pytest.approx(20, rel=0.1)


def test_closed_loop_think_times() -> None:
    loop = closed_loop_clients(ClosedLoopArrival(clients=3, think_time_s=2.0), N, _rng())
    assert loop.clients == 3 and loop.think_time_s.shape == (N,)
    assert loop.think_time_s.mean() == pytest.approx(2.0, rel=0.012)
    assert _cv(loop.think_time_s) == pytest.approx(1.0, rel=0.02)
    none = closed_loop_clients(ClosedLoopArrival(clients=1), 10, _rng())
    assert not np.any(none.think_time_s)


def test_trace_kind_has_no_synthetic_send_times() -> None:
    with pytest.raises(ValueError):
        sample_arrivals(TraceArrival(path="x.csv"), 10, _rng())
