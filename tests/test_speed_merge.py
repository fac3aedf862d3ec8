"""Decode-step merging gives identical results to one SimPy event per pass, for every policy.

Hypothesis scenarios (the engine-invariant generator: arrivals or closed loops, lengths, KV
pressure, timeouts, retries, queue limits, replicas, routers, multi-step, engine CPU time,
front end) are simulated with ``merge_decode_steps`` on and off; requests, iterations and
inter-token gaps must match bit for bit, and so must the scheduler-step counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import LinearCost, assert_same_records, make_stream, setup
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_engine_invariants import COST, runs

from sim.config import ContinuousPolicyConfig, PagedPolicyConfig, StaticPolicyConfig
from sim.metrics.records import RequestRecords
from sim.serving.engine import Engine
from sim.serving.memory_plan import MemoryPlan
from sim.serving.merge import exact_delay
from sim.serving.pool_state import PoolRole
from sim.serving.state import ReplicaState


def _run(stream, policy, kwargs, merge: bool) -> tuple[Engine, object]:
    engine = Engine(stream, policy, setup(COST, merge_decode_steps=merge, **kwargs), audit_every=1)
    return engine, engine.run()


@pytest.mark.slow
@settings(max_examples=examples(3))
@given(runs())
def test_merging_on_and_off_give_identical_records(case):
    stream, policy, kwargs = case
    engine_off, off = _run(stream, policy, kwargs, merge=False)
    engine_on, on = _run(stream, policy, kwargs, merge=True)
    assert_same_records(off, on)
    assert [w.scheduler_calls for w in engine_off.workers] == [w.scheduler_calls for w in engine_on.workers]
    events_off = sum(w.pass_events for w in engine_off.workers)
    events_on = sum(w.pass_events for w in engine_on.workers)
    assert events_on <= events_off
    if events_on < events_off:
        event(f"{policy.kind}: merged")


@pytest.mark.parametrize(
    "policy",
    [
        StaticPolicyConfig(name="s", max_batch_size=4),
        ContinuousPolicyConfig(name="c", max_batch_size=4),
        PagedPolicyConfig(name="p", max_batch_size=4),
    ],
    ids=lambda p: p.kind,
)
def test_a_lone_burst_decodes_in_few_events(policy) -> None:
    """Four requests sent at once, nothing else happening: passes merge between completions."""
    stream = make_stream(np.zeros(4), np.array([10, 20, 30, 40]), np.array([50, 80, 100, 200]))
    kwargs = dict(kv_blocks=200, block_size=4)
    engine_off, off = _run(stream, policy, kwargs, merge=False)
    engine_on, on = _run(stream, policy, kwargs, merge=True)
    assert_same_records(off, on)
    passes = len(on.iterations)
    assert engine_off.workers[0].pass_events == passes
    assert engine_on.workers[0].pass_events <= 2 + 4  # the prefill, then one run per completion


def test_states_whose_passes_differ_do_not_merge() -> None:
    """Speculative acceptance and pool hand-offs make each pass differ: such replicas never merge."""

    class Decoration:  # anything that decorates the decode step
        pass_extra_s = 0.0

    def state(**features: object) -> ReplicaState:
        lengths = np.array([10])
        return ReplicaState(0, RequestRecords(1), lengths, lengths, MemoryPlan(), 8, 4, **features)  # type: ignore[arg-type]

    assert state().merges_decode is True
    assert state(speculation=Decoration()).merges_decode is False
    assert state(pool=PoolRole()).merges_decode is False


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_exact_delay_lands_on_the_time_or_says_it_cannot(now_s: float, span_s: float) -> None:
    at_s = now_s + span_s
    delay_s = exact_delay(now_s, at_s)
    assert delay_s is None or now_s + delay_s == at_s
    if at_s <= 2 * now_s:  # Sterbenz: at - now is exact
        assert delay_s == at_s - now_s


def test_delays_fall_back_to_the_passes_own_durations() -> None:
    """0.030602000000000004 + d never equals 0.173521 (a case hypothesis found)."""
    from sim.serving.merge import _delays

    now_s, end_s = 0.030602000000000004, 0.173521
    assert exact_delay(now_s, end_s) is None
    delays = _delays(now_s, [now_s, 0.1], [0.1 - now_s, end_s - 0.1])
    total = now_s
    for delay_s in delays:
        total += delay_s
    assert total == 0.1 + (end_s - 0.1)


def test_engine_cpu_and_tight_kv_merge_identically() -> None:
    """Paged memory at the edge of its KV (preemptions) with a linear CPU model."""
    from sim.config import EngineCPUConfig

    rng = np.random.default_rng(3)
    stream = make_stream(np.sort(rng.uniform(0, 2, 40)), rng.integers(5, 60, 40), rng.integers(20, 120, 40))
    policy = PagedPolicyConfig(name="p", max_batch_size=16, engine_cpu=EngineCPUConfig(step_ms=0.5, pass_ms=0.2))
    kwargs = dict(kv_blocks=45, block_size=4, engine_cpu=policy.engine_cpu)
    cost = LinearCost(base_s=0.01, per_token_s=2e-4, per_kv_token_s=1e-6)
    outs = [Engine(stream, policy, setup(cost, merge_decode_steps=m, **kwargs)).run() for m in (False, True)]
    assert outs[0].requests["preemptions"].sum() > 0
    assert_same_records(*outs)
