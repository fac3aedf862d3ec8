"""Async scheduling's one-step output lag (vLLM V1 ``AsyncScheduler``; ``engine_cpu.overlap_step``).

The next step is scheduled before the current step's outputs are processed, so a request that got its
last token keeps its slot and KV blocks through the next scheduling decision. Every pass here takes
exactly 10 ms (``LinearCost`` with no per-token terms), so pass boundaries are known times.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import LinearCost, make_stream, setup

from sim.config import ChunkedPrefillPolicyConfig, EngineCPUConfig
from sim.serving.engine import Engine

PASS_S = 0.01


def _run(stream, max_batch_size: int, overlap: bool, merge: bool = True, kv_blocks: int = 64) -> Engine:  # noqa: ANN001
    policy = ChunkedPrefillPolicyConfig(name="v1", max_batch_size=max_batch_size, chunk_size=512, scheduling="vllm-v1")
    engine_cpu = EngineCPUConfig(overlap_step=overlap)  # no CPU time: only the scheduling order differs
    config = setup(
        LinearCost(base_s=PASS_S), kv_blocks=kv_blocks, block_size=16, engine_cpu=engine_cpu, merge_decode_steps=merge
    )
    engine = Engine(stream, policy, config, audit_every=1)
    engine.run()
    return engine


@pytest.mark.parametrize("merge", [True, False])
def test_a_completed_request_holds_its_slot_through_the_next_decision(merge: bool) -> None:
    """Two slots: requests 0 and 1 start together, request 0 ends with the third pass (its third token).
    Synchronously request 2 takes its slot in the fourth pass; with the lag the fourth pass is decided while
    request 0 still holds the slot, so request 2 starts one pass later. Request 0 ends at the same time."""
    stream = make_stream([0.0, 0.0, 0.0], 16, [3, 20, 2])
    sync, lagged = (_run(stream, 2, overlap, merge).records for overlap in (False, True))
    assert sync.completion_s[0] == pytest.approx(3 * PASS_S) and lagged.completion_s[0] == sync.completion_s[0]
    assert sync.first_scheduled_s[2] == pytest.approx(3 * PASS_S)
    assert lagged.first_scheduled_s[2] == pytest.approx(4 * PASS_S)


def test_a_decision_with_nothing_to_run_waits_for_the_outputs_in_flight() -> None:
    """One slot: when request 0 ends, the next decision finds its slot still held and nothing else to run,
    so (as vLLM waits for the batch in flight when ``schedule()`` is empty) the outputs free it and request 1
    starts at once: the same time as synchronously."""
    stream = make_stream([0.0, 0.0], 16, [3, 2])
    sync, lagged = (_run(stream, 1, overlap).records for overlap in (False, True))
    assert sync.first_scheduled_s[1] == pytest.approx(3 * PASS_S)
    assert lagged.first_scheduled_s[1] == sync.first_scheduled_s[1]
    assert np.array_equal(lagged.completion_s, sync.completion_s)


def test_merging_decode_passes_keeps_lagged_runs_exact() -> None:
    """Decode-step merging stops where a lingering completion must be given back: records are identical
    with merging on and off, under KV pressure (preemptions) and staggered arrivals."""
    rng = np.random.default_rng(5)
    n = 60
    stream = make_stream(np.sort(rng.uniform(0, 0.5, n)), rng.integers(8, 120, n), rng.integers(1, 60, n))
    on, off = (_run(stream, 8, True, merge, kv_blocks=24) for merge in (True, False))
    for column in ("first_scheduled_s", "first_token_s", "completion_s", "preemptions"):
        assert np.array_equal(getattr(on.records, column), getattr(off.records, column)), column
    assert (on.records.generated_tokens == stream.output_tokens).all()
    assert on.records.preemptions.sum() > 0
