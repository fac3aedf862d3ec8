"""Regressions of prefix caching in the engine, and a property test over small caches that would have caught them."""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import setup
from hypothesis import given, settings
from hypothesis import strategies as st
from test_prefix_allocator import Cost, _stream

from sim.config import ChunkedPrefillPolicyConfig, PagedPolicyConfig, Workload
from sim.serving.engine import Engine
from sim.workload.source import build_request_stream

WHOLE_PROMPT = ChunkedPrefillPolicyConfig(name="prompt", chunk_size=256, allocate="prompt")


def _check_run(engine: Engine, stream: object, kv_blocks: int) -> None:
    out = engine.run()
    assert (out.requests["status"] == "completed").all()
    assert (engine.records.generated_tokens == stream.output_tokens).all()  # type: ignore[attr-defined]
    # Every admission computes what its hits leave (a re-admission may hit more than the first did).
    served = sum(state.blocks.hits_blocks * state.blocks.block_size for state in engine.states)
    assert int(out.iterations["prefill_tokens"].sum()) >= int(stream.prompt_tokens.sum()) - served  # type: ignore[attr-defined]
    assert int(out.requests["cached_prompt_tokens"].sum()) <= served
    for state in engine.states:
        assert state.blocks.used_blocks == 0
        assert state.blocks.cached_free_blocks <= kv_blocks


def test_whole_prompt_grant_does_not_evict_the_next_joiners_hits() -> None:
    """Whole-prompt allocation, shared prefixes, 120 blocks, round robin: this raised
    ``KVOverflowError: block 50 is not cached``. Joiners were admitted one at a time, each
    allocating its whole prompt at once, so one joiner's grant evicted the free cached blocks
    the next joiner of the same pass had matched at planning; its ``acquire`` then failed."""
    stream = _stream(shared_prefix={"tokens": 600, "fraction": 0.7, "variants": 3})
    engine = Engine(
        stream, WHOLE_PROMPT,
        setup(Cost(), kv_blocks=120, block_size=16, replicas=2, prefix_caching=True, router="round_robin"),
        audit_every=1,
    )
    _check_run(engine, stream, 120)
    assert engine.records.preemptions.sum() > 0
    assert sum(state.blocks.evicted_blocks for state in engine.states) > 0
    assert sum(state.blocks.hits_blocks for state in engine.states) > 0


POLICIES = [
    PagedPolicyConfig(name="paged", max_num_batched_tokens=2048),
    PagedPolicyConfig(name="multistep", num_scheduler_steps=4, max_num_batched_tokens=2048),
    ChunkedPrefillPolicyConfig(name="chunk", chunk_size=256),
    WHOLE_PROMPT,
    ChunkedPrefillPolicyConfig(name="prompt-small", chunk_size=64, max_batch_size=8, allocate="prompt"),
]


@st.composite
def cases(draw: st.DrawFn) -> tuple[object, object, dict[str, object]]:
    prefix = {
        "tokens": draw(st.sampled_from([16, 40, 200, 600])),
        "fraction": draw(st.sampled_from([0.5, 0.9, 1.0])),
        "variants": draw(st.integers(1, 4)),
    }
    workload = Workload.model_validate(
        {
            "requests": draw(st.integers(5, 60)),
            "arrival": {"kind": "poisson", "rate": draw(st.sampled_from([20.0, 200.0]))},
            "prompt_tokens": {"kind": "uniform", "low": 1, "high": draw(st.sampled_from([40, 300]))},
            "output_tokens": {"kind": "uniform", "low": 1, "high": draw(st.sampled_from([8, 120]))},
            "shared_prefix": prefix,
        }
    )
    stream = build_request_stream(workload, seed=draw(st.integers(0, 5)))
    block_size = draw(st.sampled_from([4, 16]))
    need = int(np.max(-(-(stream.prompt_tokens + stream.output_tokens - 1) // block_size)))
    kwargs = {
        "kv_blocks": need + draw(st.one_of(st.just(0), st.integers(0, need))),
        "block_size": block_size,
        "replicas": draw(st.integers(1, 3)),
        "router": draw(st.sampled_from(["round_robin", "prefix_affinity", "least_outstanding"])),
    }
    return stream, draw(st.sampled_from(POLICIES)), kwargs


@pytest.mark.slow
@settings(max_examples=examples(1.2))
@given(cases())
def test_small_caches_with_shared_prefixes_keep_the_books(case: tuple[object, object, dict[str, object]]) -> None:
    """Every paged policy (whole-prompt allocation included), shared prefixes, KV from the least
    that fits one request up, any router: audited every pass, every request completes with all its
    tokens and the cache ends empty of holders."""
    stream, policy, kwargs = case
    engine = Engine(stream, policy, setup(Cost(), prefix_caching=True, **kwargs), audit_every=1)  # type: ignore[arg-type]
    _check_run(engine, stream, int(kwargs["kv_blocks"]))  # type: ignore[call-overload]
