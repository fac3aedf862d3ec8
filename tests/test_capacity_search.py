"""The capacity rate search on its own, driven by plain "meets the SLO" functions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.sweeps.capacity_search import CHECK_FACTOR, SearchOutcome, search_rate


def drive(
    meets: Callable[[float], bool],
    start: float,
    tolerance: float = 0.02,
    low: float | None = None,
    high: float | None = None,
) -> tuple[SearchOutcome, list[float]]:
    """Run a search to completion; returns its outcome and every rate it asked for."""
    search = search_rate(start, tolerance, low, high)
    asked = [next(search)]
    while True:
        try:
            asked.append(search.send(meets(asked[-1])))
        except StopIteration as stop:
            return stop.value, asked


rates = st.floats(min_value=1e-2, max_value=1e3, allow_nan=False)


@settings(max_examples=examples(2))
@given(threshold=rates, start=rates, tolerance=st.sampled_from([0.001, 0.02, 0.1, 0.3]))
def test_monotone_threshold_is_found_within_tolerance(
    threshold: float, start: float, tolerance: float
) -> None:
    outcome, asked = drive(lambda r: r <= threshold, start, tolerance)
    assert outcome.rate_rps is not None and outcome.fail_rps is not None
    assert outcome.rate_rps <= threshold < outcome.fail_rps
    assert outcome.fail_rps <= outcome.rate_rps * (1 + tolerance) * (1 + 1e-12)
    assert (
        outcome.checked_rps == outcome.rate_rps * CHECK_FACTOR and outcome.checked_rps > threshold
    )
    assert outcome.checked_rps in asked and outcome.rate_rps in asked
    assert len(asked) == len(set(asked))  # no rate is run twice
    assert outcome.note == ""


@given(threshold=rates, start=rates)
def test_search_cost_is_logarithmic(threshold: float, start: float) -> None:
    _, asked = drive(lambda r: r <= threshold, start, 0.02)
    # doublings to bracket (ratio <= 1e5: <= 17) + bisecting a factor 2 to 2% (<= 6) + check
    assert len(asked) <= 26


def test_non_monotone_region_is_searched_past() -> None:
    # Meets below 1, fails on (1, 3), meets on [3, 3.5]: the check above 1 finds the second region.
    def meets(rate: float) -> bool:
        return rate <= 1.0 or 3.0 <= rate <= 3.5

    outcome, _ = drive(meets, start=3.2, tolerance=0.02)
    assert meets(outcome.rate_rps) and not meets(outcome.rate_rps * CHECK_FACTOR)
    assert 3.0 <= outcome.rate_rps <= 3.5


def test_reported_rate_always_meets_and_check_fails_when_latency_is_jagged() -> None:
    jagged = {round(0.1 * k, 1) for k in range(1, 40) if k % 7 != 3}

    def meets(rate: float) -> bool:
        return rate < 4.0 and round(rate, 1) in jagged

    for start in (0.5, 1.7, 3.9, 8.0):
        outcome, _ = drive(meets, start)
        assert outcome.rate_rps is not None and meets(outcome.rate_rps)
        if outcome.checked_rps is not None:
            assert not meets(outcome.checked_rps)


def test_bounds_are_tried_first_and_respected() -> None:
    outcome, asked = drive(lambda r: r <= 5.0, start=100.0, low=1.0, high=8.0)
    assert asked[:2] == [1.0, 8.0]
    assert all(1.0 <= r <= 8.0 * CHECK_FACTOR for r in asked)
    assert outcome.rate_rps <= 5.0 < outcome.fail_rps


@pytest.mark.parametrize(
    ("meets", "low", "high", "expect_rate", "expect_fail", "word"),
    [
        (lambda r: False, 2.0, None, None, 2.0, "fails"),  # even the low bound fails
        (lambda r: True, None, 9.0, 9.0, None, "meets"),  # even the high bound meets
        (lambda r: False, None, None, None, None, "fails"),  # nothing meets down to start / 2**20
        (lambda r: True, None, None, None, None, "meets"),  # everything meets up to start * 2**20
    ],
)
def test_unbounded_answers_say_so(meets, low, high, expect_rate, expect_fail, word) -> None:  # noqa: ANN001
    outcome, asked = drive(meets, start=4.0, low=low, high=high)
    if expect_rate is not None:
        assert outcome.rate_rps == expect_rate
    if expect_fail is not None:
        assert outcome.fail_rps == expect_fail
    assert (outcome.rate_rps is None) != (outcome.fail_rps is None)
    assert outcome.checked_rps is None and word in outcome.note
    assert len(asked) <= 25
