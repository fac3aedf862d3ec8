"""The fleet-size searches against plain threshold functions (no simulation).

A workload that needs k replicas is a function "meets iff replicas >= k"; the search must
return exactly k (or say the budget is too small), whatever the work estimate it is fed, and
never run a fleet above the budget. The split search must return a split of minimal total.
"""

from __future__ import annotations

import math

from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.sweeps.fleet_search import LIGHT_LOAD, FleetOutcome, Probe, Search, Size, search_replicas, search_split


def _drive(
    search: Search, meets, busy: float = 0.9, work_per_replica_s: float = 1.0
) -> tuple[FleetOutcome, list[Size]]:
    """Run a search to its end against ``meets(size)``; return the outcome and every size tried."""
    tried = []
    try:
        size = next(search)
        while True:
            tried.append(size)
            size = search.send(Probe(meets(size), busy, work_per_replica_s * sum(size)))
    except StopIteration as stop:
        return stop.value, tried


@settings(max_examples=examples(3))
@given(needed=st.integers(1, 80), cap=st.integers(1, 64), span_s=st.floats(0.1, 1e3), work=st.floats(0.0, 1e4))
def test_replica_search_finds_the_threshold_within_the_budget(
    needed: int, cap: int, span_s: float, work: float
) -> None:
    outcome, tried = _drive(search_replicas(span_s, cap), lambda size: size[0] >= needed, work_per_replica_s=work)
    assert all(1 <= size[0] <= cap for size in tried)
    assert len(tried) == len(set(tried))  # no fleet runs twice
    if needed <= cap:
        assert outcome.size == (needed,)
        assert len(tried) <= 2 * math.ceil(math.log2(cap + 1)) + 3 + math.ceil(math.log(cap + 1, 1.5))
    else:
        assert outcome.size is None and "budget" in outcome.note


def test_a_fleet_failing_while_almost_idle_is_given_up_at_once() -> None:
    outcome, tried = _drive(search_replicas(100.0, 64), lambda size: False, busy=LIGHT_LOAD / 2)
    assert outcome.size is None and tried == [(1,)]
    assert "cannot help" in outcome.note


@settings(max_examples=examples(2))
@given(prefill=st.integers(1, 8), decode=st.integers(1, 8), total=st.integers(2, 20), cap=st.integers(2, 24))
def test_split_search_finds_a_split_of_minimal_total(prefill: int, decode: int, total: int, cap: int) -> None:
    def meets(size: Size) -> bool:
        return size[0] >= prefill and size[1] >= decode and sum(size) >= total

    outcome, tried = _drive(search_split(50.0, cap), meets)
    feasible = [(p, d) for p in range(1, cap) for d in range(1, cap - p + 1) if meets((p, d))]
    assert all(sum(size) <= cap for size in tried)
    if feasible:
        assert outcome.size is not None and meets(outcome.size)
        assert sum(outcome.size) == min(sum(s) for s in feasible)
    else:
        assert outcome.size is None
