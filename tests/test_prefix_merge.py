"""Decode-step merging under prefix caching gives the records of one SimPy event per pass.

Every scenario is simulated with ``prefix_caching`` on and ``merge_decode_steps`` on and
off; requests, iterations and inter-token gaps must match bit for bit, and so must the
scheduler-step counts. Workloads: the engine-invariant generator (no content identity:
requests are keyed only once preempted, under tight KV), shared system prompts and
multi-turn sessions on small caches (evictions, preemptions, cache-aware routing, client
timeouts), and a slice of the Mooncake conversation trace.
"""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import assert_same_records, setup
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_engine_invariants import COST, runs
from test_prefix_mooncake import CONVERSATION, needs_shared
from test_prefix_regressions import POLICIES, cases

from sim.config import ChunkedPrefillPolicyConfig, ClientConfig, PagedPolicyConfig, Workload
from sim.serving.engine import Engine
from sim.workload.mooncake import clip_prompts, load_mooncake
from sim.workload.source import build_request_stream
from sim.workload.stream import RequestStream


def _check_merge_identical(stream: object, policy: object, kwargs: dict[str, object]) -> tuple[Engine, Engine]:
    """Run with merging off and on (caching on, audited every pass); assert identical records."""
    engines = [
        Engine(stream, policy, setup(COST, prefix_caching=True, merge_decode_steps=merge, **kwargs), audit_every=1)  # type: ignore[arg-type]
        for merge in (False, True)
    ]
    off, on = (engine.run() for engine in engines)
    assert_same_records(off, on)
    assert [w.scheduler_calls for w in engines[0].workers] == [w.scheduler_calls for w in engines[1].workers]
    events_off = sum(w.pass_events for w in engines[0].workers)
    events_on = sum(w.pass_events for w in engines[1].workers)
    assert events_on <= events_off
    return engines[0], engines[1]


def _check_and_tag(stream: object, policy: object, kwargs: dict[str, object]) -> None:
    """The check, telling hypothesis' statistics which cases merged, preempted or evicted."""
    off, on = _check_merge_identical(stream, policy, kwargs)
    if sum(w.pass_events for w in on.workers) < sum(w.pass_events for w in off.workers):
        event("merged")
    if off.records.preemptions.sum():
        event("preempted")
    if sum(state.blocks.evicted_blocks for state in off.states):
        event("evicted")


@pytest.mark.slow
@settings(max_examples=examples(1.5))
@given(runs().filter(lambda case: case[1].kind in ("paged", "chunked_prefill")))
def test_streams_without_content_merge_identically(case: tuple[object, object, dict[str, object]]) -> None:
    """Arrivals or closed loops, tight KV, timeouts, replicas, multi-step, engine CPU, front end."""
    stream, policy, kwargs = case
    _check_and_tag(stream, policy, kwargs)


@st.composite
def shared_prefix_cases(draw: st.DrawFn) -> tuple[object, object, dict[str, object]]:
    """The small-cache shared-prefix scenarios of the regressions, some with client timeouts."""
    stream, policy, kwargs = draw(cases())
    if draw(st.booleans()):
        kwargs["client"] = ClientConfig(
            timeout_s=draw(st.floats(0.05, 2)), max_retries=draw(st.integers(0, 2)), backoff_s=0.03
        )
    return stream, policy, kwargs


@pytest.mark.slow
@settings(max_examples=examples(1.5))
@given(shared_prefix_cases())
def test_shared_prefixes_on_small_caches_merge_identically(case: tuple[object, object, dict[str, object]]) -> None:
    stream, policy, kwargs = case
    _check_and_tag(stream, policy, kwargs)


@st.composite
def session_cases(draw: st.DrawFn) -> tuple[object, object, dict[str, object]]:
    """Multi-turn sessions (each turn repeats the conversation so far) on caches from tight up."""
    workload = Workload.model_validate(
        {
            "requests": draw(st.integers(4, 50)),
            "arrival": {"kind": "poisson", "rate": draw(st.sampled_from([5.0, 50.0]))},
            "prompt_tokens": {"kind": "uniform", "low": 1, "high": draw(st.sampled_from([30, 150]))},
            "output_tokens": {"kind": "uniform", "low": 1, "high": draw(st.sampled_from([10, 80]))},
            "sessions": {
                "turns": {"kind": "fixed", "value": draw(st.integers(1, 5))},
                "think_time_s": draw(st.sampled_from([0.0, 0.05, 0.5])),
            },
        }
    )
    stream = build_request_stream(workload, seed=draw(st.integers(0, 5)))
    block_size = draw(st.sampled_from([4, 16]))
    need = int(np.max(-(-(stream.prompt_tokens + stream.output_tokens - 1) // block_size)))
    kwargs: dict[str, object] = {
        "kv_blocks": need + draw(st.one_of(st.just(0), st.integers(0, 2 * need))),
        "block_size": block_size,
        "replicas": draw(st.integers(1, 2)),
        "router": draw(st.sampled_from(["round_robin", "prefix_affinity"])),
    }
    return stream, draw(st.sampled_from(POLICIES)), kwargs


@given(session_cases())
def test_sessions_merge_identically(case: tuple[object, object, dict[str, object]]) -> None:
    stream, policy, kwargs = case
    _check_and_tag(stream, policy, kwargs)


@needs_shared
@pytest.mark.parametrize(
    "policy",
    [ChunkedPrefillPolicyConfig(name="v1", chunk_size=512, max_batch_size=64), PagedPolicyConfig(name="paged")],
    ids=lambda p: p.kind,
)
@pytest.mark.parametrize("kv_blocks", [300, 1500])
def test_a_mooncake_slice_merges_identically(policy: object, kv_blocks: int) -> None:
    """200 conversation requests (prompts clipped to 2,048 tokens), on caches that evict."""
    trace = clip_prompts(load_mooncake(CONVERSATION, 200), 2048)
    stream = RequestStream(trace.arrival_s, trace.prompt_tokens, np.minimum(trace.output_tokens, 200),
                           200, content=trace.content)  # fmt: skip
    off, on = _check_merge_identical(stream, policy, {"kv_blocks": kv_blocks, "block_size": 16, "replicas": 2})
    assert sum(w.pass_events for w in on.workers) < sum(w.pass_events for w in off.workers)
    assert sum(state.blocks.evicted_blocks for state in off.states) > 0


def test_an_eviction_that_eases_a_chunked_admission_ends_the_merge() -> None:
    """Shared prefixes, chunk 32, 78 blocks of 4 (a case found by search): merging straight through
    the decode steps' evictions missed a queued request that one eviction let in (its budget-limited
    chunk then started earlier, and hits past the evicted block stopped taking a free block each)."""
    workload = Workload.model_validate(
        {
            "requests": 40,
            "arrival": {"kind": "poisson", "rate": 500.0},
            "prompt_tokens": {"kind": "uniform", "low": 1, "high": 60},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 100},
            "shared_prefix": {"tokens": 100, "fraction": 1.0, "variants": 2},
        }
    )
    stream = build_request_stream(workload, seed=49)
    policy = ChunkedPrefillPolicyConfig(name="c", chunk_size=32, max_batch_size=8)
    off, on = _check_merge_identical(stream, policy, {"kv_blocks": 78, "block_size": 4})
    assert sum(state.blocks.evicted_blocks for state in off.states) > 0
    assert on.workers[0].pass_events < off.workers[0].pass_events
