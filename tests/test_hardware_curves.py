"""Monotone piecewise-linear curves and the monotone envelopes used to build their knots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.hardware.curves import (
    PiecewiseLinear,
    error_summary,
    isotonic,
    log_spaced_indices,
    running_max,
)


def test_interpolates_between_and_hits_knots() -> None:
    curve = PiecewiseLinear([1, 3, 5], [10, 20, 40])
    assert curve(1) == 10 and curve(3) == 20 and curve(5) == 40
    assert curve(2) == pytest.approx(15) and curve(4) == pytest.approx(30)


def test_extrapolates_with_upper_half_secant_and_floors_at_zero() -> None:
    curve = PiecewiseLinear([10, 20, 30, 40], [1, 2, 3, 10])
    # secant from the knot at the middle (30, 3) to the last (40, 10): slope 0.7
    assert curve(50) == pytest.approx(17.0)
    assert curve(5) == pytest.approx(0.5)
    assert curve(-100) == 0.0


@pytest.mark.parametrize(
    "xs,ys", [([1], [1]), ([1, 1], [1, 2]), ([2, 1], [1, 2]), ([1, 2], [2, 1])]
)
def test_rejects_bad_knots(xs: list, ys: list) -> None:
    with pytest.raises(ValueError):
        PiecewiseLinear(xs, ys)


@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=30),
    st.floats(-50, 500),
    st.floats(0, 50),
)
def test_curve_through_monotone_knots_is_monotone(
    values: list[float], x: float, step: float
) -> None:
    ys = running_max(values)
    curve = PiecewiseLinear(np.arange(len(ys)) * 3.0 + 1, ys)
    assert curve(x + step) >= curve(x) - 1e-12


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=50))
def test_running_max_is_smallest_monotone_upper_envelope(values: list[float]) -> None:
    env = running_max(values)
    assert np.all(np.diff(env) >= 0) and np.all(env >= values)
    # points not below any earlier point are kept exactly
    for i, v in enumerate(values):
        if v >= max(values[: i + 1]):
            assert env[i] == v


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=50))
def test_isotonic_is_monotone_and_preserves_mean(values: list[float]) -> None:
    fit = isotonic(values)
    assert np.all(np.diff(fit) >= -1e-9)
    assert fit.mean() == pytest.approx(np.mean(values), abs=1e-6)


def test_log_spaced_indices_keep_ends() -> None:
    xs = np.arange(1, 5000)
    picked = log_spaced_indices(xs, 20)
    assert picked[0] == 0 and picked[-1] == len(xs) - 1 and len(picked) <= 20


def test_error_summary_ignores_rows_below_threshold() -> None:
    s = error_summary(np.array([1.1, 0.02, 2.0]), np.array([1.0, 0.01, 2.0]))
    assert s["rows"] == 2 and s["mape"] == pytest.approx(0.05) and s["worst"] == pytest.approx(0.1)
