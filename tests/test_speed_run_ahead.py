"""Running ahead of the SimPy clock and reusing pure decode plans change nothing (issue 17).

With merging on, a worker ends passes and begins the next ones without a SimPy event while
no other event is due, repeats pure decode passes in bulk and skips building a plan when
``Policy.decode_only`` says the policy would plan a pure decode step again. These tests check:

- ``decode_only`` never says yes when ``schedule`` would plan anything else, in every state a
  hypothesis scenario reaches (arrivals, lengths, KV pressure and preemption, timeouts,
  retries, queue limits, replicas, closed loops, engine CPU time, front end);
- merging on and off give the same records, bit for bit, in larger scenarios under KV
  pressure and with timeouts and retries, with far fewer SimPy events;
- the iterations table is in canonical order whatever order its rows were appended in.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from budget import examples
from fakes import LinearCost, assert_same_records, make_stream, setup
from hypothesis import event, given, settings
from test_engine_invariants import COST, runs

from sim.config import (
    ChunkedPrefillPolicyConfig,
    ClientConfig,
    ContinuousPolicyConfig,
    PagedPolicyConfig,
    StaticPolicyConfig,
)
from sim.metrics.records import IterationRecords
from sim.policies.base import IterationPlan, Policy, SchedulerView
from sim.serving.engine import Engine
from sim.serving.merge import MAX_AHEAD_PASSES


class CheckedPolicy(Policy):
    """Wraps a policy: before every plan, asks ``decode_only`` on its own fresh view and checks it."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.memory = inner.memory
        self.holds_slots = inner.holds_slots
        self.steady_decode = inner.steady_decode
        self.said_yes = 0

    def schedule(self, view: SchedulerView) -> IterationPlan:
        state = view  # the replica state is its own view
        says = self.inner.decode_only(state.view(state.now_s))  # type: ignore[attr-defined]
        plan = self.inner.schedule(state.view(state.now_s))  # type: ignore[attr-defined]
        if says:
            self.said_yes += 1
            assert plan.decode and not plan.prefill and not plan.preempt and plan.steps == 1, plan
            assert plan.wake_at_s is None
        return plan

    def decode_only(self, view: SchedulerView) -> bool:
        return self.inner.decode_only(view)


def _run(stream, policy, kwargs, merge: bool, cost=COST):
    engine = Engine(stream, policy, setup(cost, merge_decode_steps=merge, **kwargs), audit_every=1)
    return engine, engine.run()


@pytest.mark.slow
@settings(max_examples=examples(2))
@given(runs())
def test_decode_only_says_yes_only_before_a_pure_decode_plan(case):
    """Merging off (a plan every pass), so every state the policy meets is checked."""
    stream, policy, kwargs = case
    engine = Engine(stream, policy, setup(COST, merge_decode_steps=False, **kwargs))
    checked = CheckedPolicy(engine.policy)
    for worker in engine.workers:
        worker._policy = checked
    engine.run()
    if checked.said_yes:
        event(f"{policy.kind}: decode_only said yes")


def _pressure_stream(seed: int, n: int = 160):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 6, n))
    return make_stream(arrival, rng.integers(4, 120, n), rng.integers(1, 150, n))


POLICIES = [
    StaticPolicyConfig(name="s", max_batch_size=8, max_wait_s=0.05, pad_finished=True),
    ContinuousPolicyConfig(name="c", max_batch_size=24),
    PagedPolicyConfig(name="p", max_batch_size=32, max_num_batched_tokens=256),
    ChunkedPrefillPolicyConfig(name="cp", max_batch_size=32, chunk_size=96),
    ChunkedPrefillPolicyConfig(name="cpp", max_batch_size=32, chunk_size=96, allocate="prompt"),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("replicas", [1, 2])
def test_kv_pressure_timeouts_and_retries_merge_identically(policy, replicas) -> None:
    """Tight KV (preemption for paged memory), client timeouts and retries, one or two replicas
    (with two, each replica's pass ends bound how far the other may run ahead)."""
    stream = _pressure_stream(replicas)
    paged = policy.kind in ("paged", "chunked_prefill")
    kwargs = dict(
        kv_blocks=90 if paged else 80,
        block_size=4,
        replicas=replicas,
        router="least_outstanding",
        client=ClientConfig(timeout_s=2.5, max_retries=2, backoff_s=0.05),
    )
    cost = LinearCost(base_s=0.004, per_token_s=1e-4, per_kv_token_s=2e-6)
    engine_off, off = _run(stream, policy, kwargs, merge=False, cost=cost)
    engine_on, on = _run(stream, policy, kwargs, merge=True, cost=cost)
    assert_same_records(off, on)
    assert [w.scheduler_calls for w in engine_off.workers] == [w.scheduler_calls for w in engine_on.workers]
    assert (off.requests["status"] == "timed_out").any()
    if policy.kind == "paged":
        assert off.requests["preemptions"].sum() > 0
    events_on = sum(w.pass_events for w in engine_on.workers)
    assert events_on < len(on.iterations) / (2 if replicas == 1 else 1)


@pytest.mark.parametrize("policy", POLICIES[:4], ids=lambda p: p.name)
def test_a_burst_with_nothing_else_due_runs_ahead_in_bounded_steps(policy) -> None:
    """All requests at t=0, no timeouts: nothing else is ever due, yet the worker still waits
    for the clock every MAX_AHEAD_PASSES passes (it keeps one list entry per pass run ahead)."""
    rng = np.random.default_rng(5)
    n = 300
    stream = make_stream(np.zeros(n), rng.integers(4, 60, n), rng.integers(20, 200, n))
    kwargs = dict(kv_blocks=2000, block_size=16)
    engine_off, off = _run(stream, policy, kwargs, merge=False)
    engine_on, on = _run(stream, policy, kwargs, merge=True)
    assert_same_records(off, on)
    passes = len(on.iterations)
    events = engine_on.workers[0].pass_events
    assert passes // MAX_AHEAD_PASSES <= events <= passes // MAX_AHEAD_PASSES + 4


def test_iteration_rows_are_ordered_by_start_then_replica_whatever_the_append_order() -> None:
    rows = [(1, 0.0, 0.5), (0, 0.0, 0.7), (1, 0.5, 0.5), (0, 0.7, 0.2)]  # starts never decrease
    frames = []
    for order in (rows, [rows[1], rows[0], rows[2], rows[3]]):
        records = IterationRecords()
        for replica, start_s, duration_s in order:
            records.append(replica, start_s, duration_s, 1, 0, 1, 1)
        frames.append(records.to_frame(10))
    pd.testing.assert_frame_equal(frames[0], frames[1])
    assert frames[0]["replica"].tolist()[:2] == [0, 1]
