"""Property tests of the prefix-caching KV allocator and of the engine with caching on."""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import setup
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import ChunkedPrefillPolicyConfig, PagedPolicyConfig, Workload
from sim.serving.engine import Engine
from sim.serving.kv_cache import KVOverflowError
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.workload.source import build_request_stream


class Cost:
    """A simple linear pass-time model (seconds)."""

    def time_from_totals_s(self, tokens: int, seqs: int, work: float, decodes: int, kv: int) -> float:
        return 0.004 + tokens * 2e-5 + decodes * 1e-5 + kv * 1e-8


ops = st.lists(
    st.tuples(st.sampled_from(["take", "leave"]), st.integers(0, 5), st.integers(1, 12)), min_size=1, max_size=60
)


@settings(max_examples=examples(1.5))
@given(ops=ops, total=st.integers(4, 40))
def test_allocator_counts_stay_consistent(ops: list[tuple[str, int, int]], total: int) -> None:
    """Random requests with prompts from 6 shared prefixes take and release blocks: used +
    cached free never exceeds capacity, and every cached block is held or free, never both."""
    cache = PrefixCacheAllocator(total, 16)
    held: list[tuple[list[int], int]] = []  # (referenced keys, private blocks)
    for op, prefix, blocks in ops:
        if op == "leave" and held:
            refs, private = held.pop(prefix % len(held))
            cache.unreference(refs)
            cache.release(private)
        elif op == "take":
            keys = [prefix * 100 + j for j in range(blocks)]
            hits = cache.match(keys, len(keys))
            taking = sum(1 for k in keys[:hits] if cache.holders(k) == 0)
            if taking + blocks - hits > cache.free_blocks:
                with pytest.raises(KVOverflowError):
                    cache.allocate(cache.free_blocks + 1)
                continue
            cache.acquire(keys[:hits])
            cache.allocate(blocks - hits)
            fresh = cache.register(keys[hits:])
            held.append((keys[:hits] + fresh, blocks - hits - len(fresh)))
        cache.check()
        assert cache.used_blocks + cache.cached_free_blocks <= total
        assert cache.used_blocks == sum(p for _, p in held) + cache.held_cached_blocks
        assert sum(len(r) for r, _ in held) == cache.held_cached_blocks + cache.shared_surplus


def test_eviction_is_least_recently_freed_tail_first() -> None:
    cache = PrefixCacheAllocator(4, 16)
    cache.allocate(4)
    assert cache.register([1, 2, 3, 4]) == [1, 2, 3, 4]
    cache.unreference([1, 2, 3, 4])  # freed tail first: 4 is evicted first
    cache.release(0)
    cache.allocate(1)
    assert not cache.is_cached(4) and cache.match([1, 2, 3, 4], 4) == 3


def _stream(requests: int = 300, rate: float = 30.0, **extra: object) -> object:
    workload = Workload.model_validate(
        {
            "requests": requests,
            "arrival": {"kind": "poisson", "rate": rate},
            "prompt_tokens": {"kind": "uniform", "low": 20, "high": 300},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 120},
            **extra,
        }
    )
    return build_request_stream(workload, seed=3)


POLICIES = [
    PagedPolicyConfig(name="paged", max_num_batched_tokens=2048),
    ChunkedPrefillPolicyConfig(name="chunk", chunk_size=256),
    ChunkedPrefillPolicyConfig(name="prompt", chunk_size=256, allocate="prompt"),
    PagedPolicyConfig(name="multistep", num_scheduler_steps=4, max_num_batched_tokens=2048),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("kv_blocks", [120, 400])
def test_conservation_under_preemption_with_caching(policy: object, kv_blocks: int) -> None:
    """A small cache forces preemptions; audited every pass, every request completes with all its tokens."""
    stream = _stream(shared_prefix={"tokens": 600, "fraction": 0.7, "variants": 3})
    engine = Engine(
        stream, policy,
        setup(Cost(), kv_blocks=kv_blocks, block_size=16, replicas=2, prefix_caching=True, router="prefix_affinity"),
        audit_every=1,
    )
    out = engine.run()
    assert (out.requests["status"] == "completed").all()
    assert (engine.records.generated_tokens == stream.output_tokens).all()
    prefill = int(out.iterations["prefill_tokens"].sum())
    cached = int(out.requests["cached_prompt_tokens"].sum())
    assert prefill >= int(stream.prompt_tokens.sum()) - cached  # recomputation only adds
    if kv_blocks == 120:
        assert out.requests["preemptions"].sum() > 0
    for state in engine.states:
        assert state.blocks.used_blocks == 0
        assert state.blocks.cached_free_blocks <= kv_blocks


class RecordingCache(PrefixCacheAllocator):
    """Remembers when each key was registered and who acquired it when."""

    __slots__ = ("clock", "registered_at", "violations")

    def __init__(self, total: int, size: int) -> None:
        super().__init__(total, size)
        self.clock = lambda: 0.0
        self.registered_at: dict[int, float] = {}
        self.violations = 0

    def register(self, keys: object) -> list[int]:
        fresh = super().register(keys)  # type: ignore[arg-type]
        for key in fresh:
            self.registered_at[key] = self.clock()
        return fresh

    def acquire(self, keys: object) -> None:
        now = self.clock()
        self.violations += sum(1 for k in keys if self.registered_at.get(k, np.inf) > now)  # type: ignore[attr-defined]
        super().acquire(keys)  # type: ignore[arg-type]


def test_no_request_reads_a_block_still_being_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks become hittable when the piece computing them is scheduled (vLLM's ``allocate_slots`` caches
    them then; within a pass each layer writes its KV before attention reads it): every hit is on a block
    registered at or before the hit's pass start, in that pass or an earlier one, never a later one."""
    import sim.serving.memory_plan as memory_plan

    monkeypatch.setattr(memory_plan, "PrefixCacheAllocator", RecordingCache)
    stream = _stream(rate=200.0, shared_prefix={"tokens": 2000, "fraction": 1.0, "variants": 2})
    engine = Engine(stream, POLICIES[1], setup(Cost(), kv_blocks=3000, block_size=16, prefix_caching=True))
    cache = engine.states[0].blocks
    cache.clock = lambda: engine.env.now  # type: ignore[attr-defined]
    engine.run()
    assert cache.violations == 0  # type: ignore[attr-defined]
    assert cache.hits_blocks > 0


def test_caching_off_and_reserve_policies_are_unchanged() -> None:
    """prefix_caching is ignored for reserve memory, and off gives exactly the plain engine."""
    from sim.config import ContinuousPolicyConfig

    stream = _stream(shared_prefix={"tokens": 400, "fraction": 0.8, "variants": 2})
    for policy in (ContinuousPolicyConfig(name="c", max_batch_size=32), POLICIES[0]):
        plain = Engine(stream, policy, setup(Cost(), kv_blocks=2000, block_size=16)).run()
        caching = policy.kind == "continuous"
        other = Engine(stream, policy, setup(Cost(), kv_blocks=2000, block_size=16, prefix_caching=caching)).run()
        assert plain.requests.equals(other.requests)
