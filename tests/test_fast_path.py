"""The engine's fast path gives the general path's records to the last bit, and is chosen only where it applies.

Hypothesis scenarios (the engine-invariant generator: arrivals or closed loops, lengths, KV pressure,
timeouts, retries, queue limits, replicas, routers, engine CPU time, front end; every built-in policy)
run on both paths: requests, iterations and inter-token gaps must match bit for bit, and so must the
scheduler-step counts. Larger scenarios with many replicas and calibrated cost models (the decode
pricing without a call per pass) are drawn too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from budget import examples
from fakes import LinearCost, assert_same_records, make_stream, setup
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_engine_invariants import COST, runs

from sim.config import (
    ChunkedPrefillPolicyConfig,
    ClientConfig,
    ContinuousPolicyConfig,
    EngineCPUConfig,
    PagedPolicyConfig,
    StaticPolicyConfig,
)
from sim.policies.table import make_policy
from sim.serving.engine import Engine
from sim.serving.fast.paths import KERNELS, MIRRORED, _code_tokens, decision_digest, fast_path_refusal
from sim.serving.fast.span import _fitting_steps


def _both(stream, policy, kwargs, cost=COST) -> tuple[Engine, Engine]:
    engines = []
    for fast in (False, True):
        engine = Engine(stream, policy, setup(cost, fast_path=fast, **kwargs), audit_every=1)
        engine.out = engine.run()
        engines.append(engine)
    return engines[0], engines[1]


def _assert_same(general: Engine, fast: Engine) -> None:
    assert general.path == "general" and fast.path == "fast"
    assert_same_records(general.out, fast.out)
    assert [w.scheduler_calls for w in general.workers] == [w.scheduler_calls for w in fast.workers]
    assert np.array_equal(general.records.generated_tokens, fast.records.generated_tokens)
    assert [s.queue_area_s for s in general.states] == [s.queue_area_s for s in fast.states]


def _single_step(case):
    """A ``runs()`` case as the fast path takes it: no pipeline stages, one scheduler step, the Sarathi
    rules, no output lag (the vLLM V1 rules and async scheduling run on the general path)."""
    stream, policy, kwargs = case
    if getattr(policy, "num_scheduler_steps", 1) != 1:
        policy = policy.model_copy(update={"num_scheduler_steps": 1})
    if getattr(policy, "scheduling", "sarathi") != "sarathi":
        policy = policy.model_copy(update={"scheduling": "sarathi"})
    cpu = kwargs.get("engine_cpu")
    if cpu is not None and cpu.overlap_step:
        kwargs = {**kwargs, "engine_cpu": cpu.model_copy(update={"overlap_step": False})}
    return stream, policy, {**kwargs, "pipeline": None}


@pytest.mark.slow
@settings(max_examples=examples(3))
@given(runs().map(_single_step))
def test_fast_and_general_paths_give_identical_records(case) -> None:
    stream, policy, kwargs = case
    _assert_same(*_both(stream, policy, kwargs))
    event(policy.kind)


@st.composite
def crowded_runs(draw, kinds=("static", "continuous", "paged", "chunked_prefill")):
    """Many requests on up to 8 replicas under KV pressure, open or closed loop, with timeouts (a policy
    of ``kinds``)."""
    n = draw(st.integers(20, 120))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    prompt, output = rng.integers(1, 80, n), rng.integers(1, 90, n)
    arrival = np.sort(rng.uniform(0, draw(st.sampled_from([0.0, 0.5, 4.0])), n))
    closed = None
    if draw(st.booleans()):
        from sim.workload.stream import ClosedLoop

        closed, arrival = ClosedLoop(draw(st.integers(1, 12)), rng.choice([0.0, 0.05], n)), np.full(n, np.nan)
    stream = make_stream(arrival, prompt, output, closed_loop=closed)
    kind = draw(st.sampled_from(kinds))
    mbs = draw(st.integers(2, 32))
    policy = {
        "static": StaticPolicyConfig(name="s", max_batch_size=mbs, max_wait_s=draw(st.sampled_from([0.0, 0.02]))),
        "continuous": ContinuousPolicyConfig(name="c", max_batch_size=mbs),
        "paged": PagedPolicyConfig(name="p", max_batch_size=mbs, max_num_batched_tokens=draw(st.integers(40, 400))),
        "chunked_prefill": ChunkedPrefillPolicyConfig(
            name="x", max_batch_size=mbs, chunk_size=draw(st.integers(8, 200)),
            allocate=draw(st.sampled_from(["chunk", "prompt"])),
        ),
    }[kind]  # fmt: skip
    block_size = draw(st.sampled_from([1, 4, 16]))
    need = -(-(int(prompt.max()) + int(output.max())) // block_size)  # any request runs alone, reserving too
    client = None
    if draw(st.booleans()):
        client = ClientConfig(timeout_s=draw(st.floats(0.05, 3)), max_retries=draw(st.integers(0, 2)), backoff_s=0.02)
    kwargs = dict(
        kv_blocks=need + draw(st.integers(0, 3 * need)),
        block_size=block_size,
        replicas=draw(st.integers(1, 8)),
        router=draw(st.sampled_from(["round_robin", "least_outstanding", "random"])),
        client=client,
        seed=draw(st.integers(0, 3)),
    )
    return stream, policy, kwargs


@pytest.mark.slow
@settings(max_examples=examples(1.5))
@given(crowded_runs(), st.sampled_from(["linear", "calibrated"]))
def test_crowded_replicas_give_identical_records(case, cost_kind) -> None:
    """Many replicas (spans passing other replicas' events), preemptions, and the calibrated cost model,
    whose decode passes the fast path prices from their terms, without a call."""
    stream, policy, kwargs = case
    cost = COST if cost_kind == "linear" else _calibrated()
    general, fast = _both(stream, policy, kwargs, cost)
    _assert_same(general, fast)
    if general.out.requests["preemptions"].sum():
        event(f"{policy.kind} preempted")
    if kwargs["replicas"] > 2:
        event("3+ replicas")


def _calibrated():
    from sim.hardware.cost_model import load_cost_model

    return load_cost_model("llama-2-7b", "a100-80gb", 1)


def test_many_replicas_merge_their_decode_passes() -> None:
    """Open-loop clients on 8 replicas: passes of one replica run past the others' events, so SimPy sees
    a small share of the passes (the general path: one event per pass or more, every replica's pass ends
    being events for the others)."""
    rng = np.random.default_rng(5)
    n = 400
    stream = make_stream(np.sort(rng.uniform(0, 40, n)), rng.integers(10, 60, n), rng.integers(50, 200, n))
    policy = ContinuousPolicyConfig(name="c", max_batch_size=16)
    kwargs = dict(kv_blocks=4000, block_size=16, replicas=8)
    general, fast = _both(stream, policy, kwargs, LinearCost(base_s=0.01, per_token_s=1e-4))
    _assert_same(general, fast)
    passes = len(fast.out.iterations)
    assert sum(w.pass_events for w in fast.workers) < passes / 3
    assert sum(w.pass_events for w in general.workers) > passes / 2


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (dict(speculative={"method": "ngram", "num_speculative_tokens": 2}), "speculative decoding"),
        (dict(num_scheduler_steps=4), "multi-step scheduling"),
    ],
)
def test_features_the_kernels_do_not_model_take_the_general_path(change, why) -> None:
    config = PagedPolicyConfig(name="p", max_batch_size=8).model_copy(update=change)
    if "speculative" in change:
        from sim.config.policy_base import SpeculativeConfig

        config = PagedPolicyConfig(name="p", max_batch_size=8, speculative=SpeculativeConfig(**change["speculative"]))
    assert fast_path_refusal(make_policy(config), config, setup(COST, kv_blocks=10, block_size=4)) == why


def test_setups_the_kernels_do_not_model_take_the_general_path() -> None:
    config = ContinuousPolicyConfig(name="c", max_batch_size=8)
    policy = make_policy(config)

    def refusal(**fields: object) -> str | None:
        return fast_path_refusal(policy, config, setup(COST, kv_blocks=10, block_size=4, **fields))

    assert refusal() is None
    assert refusal(fast_path=False) == "the fast path is turned off"
    assert refusal(merge_decode_steps=False).startswith("engine.merge_decode_steps is off")
    assert refusal(prefix_caching=True) == "prefix caching"
    assert refusal(router="prefix_affinity") == "the prefix_affinity router"
    lagged = EngineCPUConfig(step_ms=0.1, overlap_step=True)
    assert refusal(engine_cpu=lagged).startswith("async scheduling's one-step output lag")
    assert refusal(engine_cpu=lagged.model_copy(update={"overlap_step": False})) is None


def test_the_vllm_v1_rules_take_the_general_path() -> None:
    """The V1 preempt order and no admission after a preemption are not in the chunked kernel."""
    for scheduling, expected in (("sarathi", None), ("vllm-v1", "vLLM V1 scheduling rules (scheduling: vllm-v1)")):
        config = ChunkedPrefillPolicyConfig(name="x", max_batch_size=8, chunk_size=64, scheduling=scheduling)
        assert fast_path_refusal(make_policy(config), config, setup(COST, kv_blocks=10, block_size=4)) == expected


def test_a_policy_without_a_kernel_takes_the_general_path() -> None:
    """A policy of its own (docs/extending.md) subclasses a built-in one: no kernel mirrors it."""
    from sim.policies.continuous import ContinuousPolicy

    class Mine(ContinuousPolicy):
        pass

    config = ContinuousPolicyConfig(name="c", max_batch_size=8)
    assert fast_path_refusal(Mine(config), config, setup(COST, kv_blocks=10, block_size=4)) == (
        "no fast kernel for Mine"
    )


def test_every_kernel_was_checked_against_its_policy_as_it_is() -> None:
    """A policy's decisions changed: its runs now take the general path (still right, slower). Check its
    kernel in sim/serving/fast/kernels.py against the change, run this file's property tests, then set
    ``MIRRORED`` in sim/serving/fast/paths.py to the new digest printed here."""
    stale = {kind.__name__: decision_digest(kind) for kind in KERNELS if decision_digest(kind) != MIRRORED[kind]}
    assert not stale, f"kernels not checked against their policy's current code: {stale}"


def test_the_digest_reads_code_not_comments_or_docstrings() -> None:
    code = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    assert _code_tokens(code) == _code_tokens("def f(x):\n    # another comment\n    return x + 1\n")
    assert _code_tokens(code) != _code_tokens('def f(x):\n    """Doc."""\n    return x + 2\n')


def test_a_lone_request_runs_the_same_on_both_paths_with_every_policy() -> None:
    stream = make_stream([0.0], [30], [12])
    for config in (
        StaticPolicyConfig(name="s", max_batch_size=2),
        ContinuousPolicyConfig(name="c", max_batch_size=2),
        PagedPolicyConfig(name="p", max_batch_size=2),
        ChunkedPrefillPolicyConfig(name="x", max_batch_size=2, chunk_size=8),
    ):
        _assert_same(*_both(stream, config, dict(kv_blocks=12, block_size=4)))


def test_the_engine_names_its_path() -> None:
    stream = make_stream([0.0], [30], [12])
    config = ContinuousPolicyConfig(name="c", max_batch_size=2)
    assert Engine(stream, config, setup(COST, kv_blocks=12, block_size=4)).path == "fast"
    fields = dataclasses.asdict(setup(COST, kv_blocks=12, block_size=4).replica) | {"merge_decode_steps": False}
    assert Engine(stream, config, setup(COST, **{k: v for k, v in fields.items() if k != "cost_model"})).path == (
        "general"
    )


def test_a_scenario_records_each_policys_path_and_can_turn_the_fast_path_off() -> None:
    """``engine.fast_path: false`` sends every policy down the general path, the resolved scenario says so
    with the reason, and the tables a user gets are the same either way."""
    from pathlib import Path

    from sim.io.scenario import load_scenario
    from sim.runner import run

    path = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
    fast = run(load_scenario(path, {"workload.requests": 300}), progress=False)
    general = run(load_scenario(path, {"workload.requests": 300, "engine.fast_path": False}), progress=False)
    names = [p.name for p in fast.scenario.policies]
    assert fast.facts["engine_path"] == dict.fromkeys(names, "fast")
    assert general.facts["engine_path"] == dict.fromkeys(names, "general: the fast path is turned off")
    for table in ("requests", "iterations"):
        pd.testing.assert_frame_equal(getattr(fast, table), getattr(general, table), check_exact=True)
    pd.testing.assert_frame_equal(fast.summary, general.summary, check_exact=True)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=16), st.integers(0, 400), st.integers(1, 200))
def test_a_paged_span_skips_the_step_by_step_fit_only_when_every_repeat_fits(cycle, free, limit) -> None:
    """``decode_span`` takes all ``limit`` repeats without counting them when a block per member every
    ``block_size`` steps fits: then the count step by step agrees (``cycle``: new blocks per step, repeating,
    summing to the members)."""
    members = sum(cycle)
    fits = _fitting_steps(cycle, free, limit)
    if -(-limit // len(cycle)) * members <= free:
        assert fits == limit
    assert sum(cycle[k % len(cycle)] for k in range(fits)) <= free


@given(
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=8),
    st.lists(st.integers(0, 2**31 - 1), min_size=8, max_size=8),
)
def test_record_views_read_and_write_the_records_own_arrays(times, counts) -> None:
    """The replicas' element-wise views (``RecordViews``) give Python numbers with the arrays' bits, and what
    they write is in the arrays the tables are made of."""
    from sim.metrics.records import RequestRecords
    from sim.serving.fast.columns import RecordViews

    records = RequestRecords(8)
    views = RecordViews(records)
    for rid, value in enumerate(times):
        views.completion_s[rid] = value
        assert records.completion_s[rid].tobytes() == np.float64(value).tobytes()
        assert type(views.completion_s[rid]) is float
    records.generated_tokens[:] = counts
    assert [views.generated_tokens[rid] for rid in range(8)] == counts
    assert views.completion_s[len(times) - 1] == times[-1]
    assert views.first_token_s[0] != views.first_token_s[0]  # NaN, as the records start


@pytest.mark.slow
@settings(max_examples=examples(1))
@given(crowded_runs(kinds=("chunked_prefill",)))
def test_the_chunked_plan_without_preemption_is_the_ledgers_plan(case) -> None:
    """Where the chunked kernel plans without its ledger (nothing to preempt), the ledger's full plan of the
    same state is the same plan, and the blocks the plan counts for its own ``begin`` are those the ledger
    took; both plans are made at every scheduling step of a crowded run, whose records stay the general path's."""
    from sim.serving.fast.kernels import _LEDGER, ChunkedKernel

    full_plan, decide = ChunkedKernel._plan_with_ledger, ChunkedKernel.decide
    by_ledger = []

    def plan_with_ledger(self):
        by_ledger.append(True)
        return full_plan(self)

    def both(self, now_s):
        by_ledger.clear()
        runs = decide(self, now_s)
        if by_ledger:
            event("planned with the ledger")
            return runs
        plan = (runs, list(self.pieces), list(self.preempt), self.decode)
        chunk = (self._chunk_slot, self._chunk_blocks)
        free = self.total_blocks - self.used_blocks
        assert (full_plan(self), self.pieces, self.preempt, self.decode) == plan
        if chunk[0] != _LEDGER:
            event("begun in one step")
            assert chunk[1] == free - self.free
        self._chunk_slot, self._chunk_blocks = chunk
        return runs

    stream, policy, kwargs = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChunkedKernel, "_plan_with_ledger", plan_with_ledger)
        patch.setattr(ChunkedKernel, "decide", both)
        _assert_same(*_both(stream, policy, kwargs))
