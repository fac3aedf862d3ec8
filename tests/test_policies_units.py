"""Policies as plain state machines: hand-built replica states, no SimPy.

Each test puts requests into a known state, asks a policy for one plan, and checks
the decision against the policy's written rule (docs/engine.md), not against a
snapshot of the code's output.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import (
    ChunkedPrefillPolicyConfig,
    ContinuousPolicyConfig,
    PagedPolicyConfig,
    StaticPolicyConfig,
)
from sim.errors import UserError
from sim.metrics.records import RequestRecords
from sim.policies import POLICIES, IterationPlan, make_policy
from sim.serving.kv_cache import BlockAllocator, KVOverflowError
from sim.serving.memory_plan import MemoryPlan
from sim.serving.state import ReplicaState


def make_state(prompts, outputs, *, kv_blocks, block_size=16, reserve=None, holds=False):
    """A replica holding nothing, with requests 0..n-1 sent at t = 0, 1, 2, ..."""
    n = len(prompts)
    records = RequestRecords(n)
    records.arrival_s[:] = np.arange(n, dtype=float)
    memory = MemoryPlan(reserve_tokens=reserve)
    return ReplicaState(
        0, records, np.asarray(prompts), np.asarray(outputs), memory, kv_blocks, block_size, holds_slots=holds
    )


def enqueue(state, rids, now=0.0):
    for rid in rids:
        state.enqueue(rid, now)


def step(state, policy, now=0.0, duration=1.0) -> tuple[IterationPlan, list[int]]:
    """One scheduling decision applied and credited, as the worker would."""
    plan = policy.schedule(state.view(now))
    if plan.has_work:
        state.begin(plan, now)
        return plan, state.end(plan, now + duration)
    return plan, []


def continuous(mbs=8):
    return make_policy(ContinuousPolicyConfig(name="c", max_batch_size=mbs))


def paged(mbs=8, budget=4096, steps=1):
    return make_policy(
        PagedPolicyConfig(name="p", max_batch_size=mbs, max_num_batched_tokens=budget, num_scheduler_steps=steps)
    )


def chunked(mbs=8, chunk=64, scheduling="sarathi"):
    return make_policy(
        ChunkedPrefillPolicyConfig(name="cp", max_batch_size=mbs, chunk_size=chunk, scheduling=scheduling)
    )


def static(mbs=4, wait=0.0, pad=True):
    return make_policy(
        StaticPolicyConfig(name="s", max_batch_size=mbs, max_wait_s=wait, pad_finished=pad)
    )


# ----------------------------------------------------------------------------- table
def test_policy_table_covers_every_config_kind():
    assert set(POLICIES) == {"static", "continuous", "paged", "chunked_prefill"}
    assert (
        type(make_policy(ContinuousPolicyConfig(name="c", max_batch_size=2)))
        is POLICIES["continuous"]
    )


def test_unknown_policy_kind_is_a_user_error():
    class Bogus:
        kind = "contineous"

    with pytest.raises(UserError, match="continuous"):
        make_policy(Bogus())


# ----------------------------------------------------------------------------- continuous
def test_continuous_admits_fifo_up_to_batch_size():
    state = make_state([10] * 5, [5] * 5, kv_blocks=100, reserve=5)
    enqueue(state, range(5))
    plan = continuous(mbs=3).schedule(state.view(0.0))
    assert [rid for rid, _ in plan.prefill] == [0, 1, 2]
    assert [tokens for _, tokens in plan.prefill] == [10, 10, 10]  # whole prompts


def test_continuous_reserves_prompt_plus_max_output_and_stops_at_first_misfit():
    # block 16: request 0 reserves ceil((20+40)/16)=4 blocks, request 1 ceil((60+40)/16)=7.
    state = make_state([20, 60, 4], [8, 8, 8], kv_blocks=10, reserve=40)
    enqueue(state, range(3))
    plan = continuous().schedule(state.view(0.0))
    assert [rid for rid, _ in plan.prefill] == [
        0
    ]  # request 2 would fit but may not overtake request 1


def test_continuous_joiners_prefill_alongside_running_decodes():
    state = make_state([10, 10], [5, 5], kv_blocks=100, reserve=5)
    policy = continuous()
    enqueue(state, [0])
    step(state, policy)
    enqueue(state, [1], now=1.0)
    plan = policy.schedule(state.view(1.0))
    assert plan.decode and plan.prefill == [(1, 10)]


# ----------------------------------------------------------------------------- static
def test_static_batch_admits_nobody_until_it_is_done():
    state = make_state([10] * 4, [1, 3, 3, 3], kv_blocks=100, reserve=3, holds=True)
    policy = static(mbs=2)
    enqueue(state, [0, 1])
    step(state, policy)  # prefill; request 0 is done (1 token) but keeps its slot
    enqueue(state, [2, 3], now=1.0)
    plan, _ = step(state, policy, now=1.0)
    assert plan.decode and not plan.prefill and plan.charge_idle_slots
    assert state.running_count == 2 and state.idle_slots == 1
    plan, _ = step(state, policy, now=2.0)  # request 1's third token: the batch ends
    assert state.running_count == 0 and state.blocks.used_blocks == 0
    plan = policy.schedule(state.view(3.0))
    assert [rid for rid, _ in plan.prefill] == [2, 3]


def test_static_waits_for_a_full_batch_then_for_max_wait():
    state = make_state([10] * 3, [2] * 3, kv_blocks=100, reserve=2, holds=True)
    policy = static(mbs=3, wait=0.5)
    enqueue(state, [0, 1], now=1.0)
    plan = policy.schedule(state.view(1.2))
    assert not plan.has_work and plan.wake_at_s == pytest.approx(1.5)
    assert len(policy.schedule(state.view(1.5)).prefill) == 2  # waited long enough
    enqueue(state, [2], now=1.3)
    assert len(policy.schedule(state.view(1.3)).prefill) == 3  # full before the wait ends


def test_static_batch_limited_by_kv_starts_without_waiting():
    # Each slot reserves ceil((10+22)/16) = 2 blocks; 5 blocks hold 2 slots of 3 asked.
    state = make_state([10] * 3, [22] * 3, kv_blocks=5, reserve=22, holds=True)
    enqueue(state, range(3))
    plan = static(mbs=3, wait=100.0).schedule(state.view(0.0))
    assert [rid for rid, _ in plan.prefill] == [0, 1]


@pytest.mark.parametrize("pad", [True, False])
def test_static_padding_charges_finished_slots_only_when_asked(pad):
    state = make_state([8, 8], [1, 4], kv_blocks=10, reserve=4, holds=True)
    policy = static(mbs=2, pad=pad)
    enqueue(state, [0, 1])
    step(state, policy)
    plan = policy.schedule(state.view(1.0))
    _, _, _, decode_seqs, decode_kv = state.begin(plan, 1.0)
    assert decode_seqs == (2 if pad else 1)
    # Live request 1 attends to 8 + 1 tokens; finished request 0 stays at 8 + 1.
    assert decode_kv == (18 if pad else 9)


# ----------------------------------------------------------------------------- paged
def test_paged_is_prefill_first_within_the_token_budget():
    state = make_state([30, 30, 30, 30, 10], [9] * 5, kv_blocks=100)
    policy = paged(budget=70)
    enqueue(state, [0])
    step(state, policy)
    enqueue(state, [1, 2, 3, 4], now=1.0)
    plan = policy.schedule(state.view(1.0))
    assert not plan.decode  # a prefill iteration: decodes wait
    assert [rid for rid, _ in plan.prefill] == [
        1,
        2,
    ]  # 30 + 30 <= 70 < 90; request 4 may not overtake


def test_paged_runs_an_oversize_prompt_alone():
    state = make_state([500, 5], [3, 3], kv_blocks=100)
    enqueue(state, [0, 1])
    plan = paged(budget=100).schedule(state.view(0.0))
    assert plan.prefill == [(0, 500)]


def test_paged_decodes_when_no_waiting_request_fits():
    state = make_state([32, 64], [9, 9], kv_blocks=3)  # request 1's prompt needs 4 blocks
    policy = paged()
    enqueue(state, [0])
    step(state, policy)
    enqueue(state, [1], now=1.0)
    plan = policy.schedule(state.view(1.0))
    assert plan.decode and not plan.prefill


def test_paged_admission_keeps_vllms_watermark_free_unless_the_replica_is_empty():
    # 200 blocks: the watermark keeps int(1% x 200) = 2 free. Request 1's prompt takes 198.
    state = make_state([16, 198 * 16], [10, 2], kv_blocks=200)
    policy = paged(budget=8192)
    enqueue(state, [1])
    assert policy.schedule(state.view(0.0)).prefill == [(1, 198 * 16)]  # empty replica: no watermark
    state = make_state([16, 198 * 16], [10, 2], kv_blocks=200)
    enqueue(state, [0])
    step(state, policy)
    enqueue(state, [1], now=1.0)
    plan = policy.schedule(state.view(1.0))  # 199 free: 198 fit, but not with 2 kept free
    assert plan.decode and not plan.prefill


def test_paged_preempts_the_most_recently_arrived_when_a_step_needs_blocks():
    # Block size 4: after prefill each request caches 4 tokens in 1 block; the next
    # step needs a 2nd block each (6 of 6 used); 4 steps later each needs a 3rd.
    state = make_state([4, 4, 4], [20] * 3, kv_blocks=6, block_size=4)
    policy = paged()
    enqueue(state, range(3))
    step(state, policy)
    for t in range(1, 5):
        plan, _ = step(state, policy, now=float(t))
        assert not plan.preempt
    assert state.blocks.used_blocks == 6
    plan = policy.schedule(state.view(5.0))
    assert plan.preempt == [2] and plan.decode  # frees 2 blocks: enough for requests 0 and 1
    state.begin(plan, 5.0)
    assert next(state.waiting_ids()) == 2 and state.blocks.used_blocks == 6
    state.end(plan, 6.0)
    assert state.records.preemptions.tolist() == [0, 0, 1]
    # Recompute: prompt + the 5 tokens generated so far are re-prefilled.
    assert state.tokens_to_prefill(2) == 9


def test_paged_multi_step_promises_kv_for_the_whole_block():
    # Block size 4: after prefill each request caches 4 tokens in 1 block (2 of 4 used).
    # One step needs 1 more block each (fits); 5 steps need 2 more each (4 > 2 free).
    for steps, victims in ((1, []), (5, [1])):
        state = make_state([4, 4], [20, 20], kv_blocks=4, block_size=4)
        policy = paged(steps=steps)
        enqueue(state, [0, 1])
        step(state, policy)
        plan = policy.schedule(state.view(1.0))
        assert plan.decode and not plan.prefill and plan.steps == steps
        assert plan.preempt == victims  # request 0 alone: 1 held + 2 more = 3 of 4 blocks


def test_paged_multi_step_growth_stops_at_a_requests_last_token():
    # Same cache, but each request has one decode step left: 1 block each fits, K = 5 or not.
    state = make_state([4, 4], [2, 2], kv_blocks=4, block_size=4)
    policy = paged(steps=5)
    enqueue(state, [0, 1])
    step(state, policy)
    plan = policy.schedule(state.view(1.0))
    assert plan.decode and plan.steps == 5 and not plan.preempt


def test_paged_multi_step_prefill_plans_are_single_passes():
    state = make_state([4, 4], [20, 20], kv_blocks=40, block_size=4)
    policy = paged(steps=8)
    enqueue(state, [0])
    plan, _ = step(state, policy)
    assert plan.prefill == [(0, 4)] and plan.steps == 1


def test_ledger_multi_step_promise_counts_released_victims_growth():
    # Three decoders at a block edge (block size 4, 4 cached each, 3 of 8 blocks used):
    # 8 steps need 2 more blocks each.
    state = make_state([4, 4, 4], [30] * 3, kv_blocks=8, block_size=4)
    enqueue(state, range(3))
    step(state, paged())
    view = state.view(1.0)
    assert not view.kv.try_decode_steps(8)  # 6 needed, 5 free
    view.kv.release(2)  # its block and its growth come back: 4 needed, 6 free
    assert view.kv.try_decode_steps(8) and view.kv.free_blocks == 2
    view.kv.release(1)  # released after the promise: its block and promised growth return
    assert view.kv.free_blocks == 5
    with pytest.raises(ValueError):
        view.kv.try_decode_steps(4)  # one plan, one number of steps


# ----------------------------------------------------------------------------- chunked
def test_chunked_gives_decodes_priority_and_chunks_the_rest_of_the_budget():
    state = make_state([10, 10, 100, 100], [9] * 4, kv_blocks=100)
    policy = chunked(chunk=64)
    enqueue(state, [0, 1])
    step(state, policy)
    enqueue(state, [2, 3], now=1.0)
    plan = policy.schedule(state.view(1.0))
    assert plan.decode and plan.prefill == [(2, 62)]  # 64 - 2 decodes
    state.begin(plan, 1.0)
    state.end(plan, 2.0)
    plan = policy.schedule(state.view(2.0))
    # The part-way request continues first, then the next waiting one gets the remainder.
    assert plan.prefill == [(2, 38), (3, 24)]


def test_chunked_preempts_a_newer_request_for_an_older_requests_chunk():
    # Block size 4, 6 blocks. Request 0 arrived first but was queued after request 1
    # (as after a retry). Request 1 decodes; request 0 is part-way through its prompt.
    state = make_state([24, 4], [3, 20], kv_blocks=6, block_size=4)
    policy = chunked(chunk=8)
    enqueue(state, [1, 0])
    plan, _ = step(state, policy)
    assert plan.prefill == [(1, 4), (0, 4)]
    plan, _ = step(state, policy, now=1.0)
    assert plan.decode and plan.prefill == [(0, 7)] and state.blocks.used_blocks == 5
    plan = policy.schedule(state.view(2.0))
    # Request 0's next 7 tokens need 2 blocks, 1 is free: the newer request 1 goes.
    assert plan.preempt == [1] and plan.prefill == [(0, 7)]
    assert not plan.decode  # its only decoder was preempted


def test_chunked_vllm_v1_preempts_the_request_started_last_not_the_latest_arrival():
    # The case above under vLLM V1's rules: the victim is popped from the end of the running list,
    # where request 0 went when it started (after request 1), so request 0 preempts itself
    # (vllm/v1/core/sched/scheduler.py at v0.11.0: `self.running.pop()`, `preempted_req == request`).
    state = make_state([24, 4], [3, 20], kv_blocks=6, block_size=4)
    policy = chunked(chunk=8, scheduling="vllm-v1")
    enqueue(state, [1, 0])
    step(state, policy)
    step(state, policy, now=1.0)
    plan = policy.schedule(state.view(2.0))
    assert plan.preempt == [0] and plan.prefill == [] and plan.decode


@pytest.mark.parametrize(("rules", "admitted"), [("sarathi", False), ("vllm-v1", True)])
def test_chunked_watermark_only_under_the_sarathi_rules(rules, admitted):
    # 200 blocks: V0's watermark keeps int(1% x 200) = 2 free. Request 1's prompt takes 198 blocks and
    # request 0's decode one more, leaving none: V1 admits it (allocate_slots checks free blocks only).
    state = make_state([16, 198 * 16], [10, 2], kv_blocks=200)
    policy = chunked(chunk=4096, scheduling=rules)
    enqueue(state, [0])
    step(state, policy)
    enqueue(state, [1], now=1.0)
    plan = policy.schedule(state.view(1.0))
    assert plan.decode and (plan.prefill == [(1, 198 * 16)]) is admitted


def test_chunked_requester_that_is_newest_preempts_itself():
    # Block size 4, 5 blocks: request 1's next chunk cannot fit and it is the newest.
    state = make_state([12, 12], [20, 20], kv_blocks=5, block_size=4)
    policy = chunked(chunk=8)
    enqueue(state, [0, 1])
    step(state, policy)
    plan, _ = step(state, policy, now=1.0)
    assert plan.prefill == [(0, 4), (1, 4)]
    plan = policy.schedule(state.view(2.0))
    assert plan.decode and plan.preempt == [1] and plan.prefill == []
    state.begin(plan, 2.0)
    assert state.tokens_to_prefill(1) == 12  # its partial prefill is lost (recompute)


# ----------------------------------------------------------------------------- KV pieces
def test_ledger_remembers_promised_blocks():
    state = make_state([16, 16, 16], [1] * 3, kv_blocks=2)
    enqueue(state, range(3))
    view = state.view(0.0)
    assert view.kv.try_admit(0, 16) and view.kv.try_admit(1, 16)
    assert not view.kv.try_admit(2, 16)
    assert state.blocks.used_blocks == 0  # only promises; the state is unchanged


def test_allocator_refuses_to_go_over_capacity():
    blocks = BlockAllocator(4, 16)
    blocks.allocate(4)
    assert blocks.free_blocks == 0 and not blocks.can_allocate(1)
    with pytest.raises(KVOverflowError):
        blocks.allocate(1)
    with pytest.raises(KVOverflowError):
        BlockAllocator(4, 16).release(1)
