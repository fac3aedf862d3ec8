"""Multi-step scheduling (vLLM 0.6 ``--num-scheduler-steps``): blocks of K decode passes.

The policy is asked once per block; KV for the whole block is promised up front; a request
that finishes inside a block keeps its slot and KV until the block ends and completes then;
tokens stream K at a time. With K = 1 nothing changes.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from budget import examples
from fakes import LinearCost, decode_group_ops, make_stream, setup
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import ClientConfig, EngineCPUConfig, PagedPolicyConfig
from sim.metrics.itl import itl_stats
from sim.serving.engine import Engine, simulate
from sim.serving.sequences import DecodeGroup, Seq


def paged(steps: int, **kw) -> PagedPolicyConfig:
    return PagedPolicyConfig(name="p", num_scheduler_steps=steps, **kw)


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("output", [9, 10, 13])
def test_scheduler_is_asked_once_per_block(steps, output):
    n = 5
    stream = make_stream(np.zeros(n), 20, output)
    engine = Engine(stream, paged(steps), setup(LinearCost(0.01), kv_blocks=100, block_size=16))
    out = engine.run()
    decode_steps = output - 1  # the first token comes from the prefill pass
    blocks = -(-decode_steps // steps)
    assert engine.workers[0].scheduler_calls == 1 + blocks  # one prefill pass, then blocks
    assert len(out.iterations) == 1 + blocks * steps  # every pass of a block is a row
    assert (out.iterations["batch_size"] == n).all()  # finished requests stay in the batch
    assert out.requests["completion_s"].to_numpy() == pytest.approx(0.01 * (1 + blocks * steps))


def test_a_request_finishing_mid_block_frees_its_slot_and_kv_only_at_the_block_end():
    # Two slots. A (3 tokens) gets its last one at decode step 2 of a 4-step block; C waits.
    cost = LinearCost(base_s=0.01)
    stream = make_stream([0.0, 0.0, 0.0], 8, [3, 9, 2])
    engine = Engine(stream, paged(4, max_batch_size=2), setup(cost, kv_blocks=20, block_size=4), audit_every=1)
    out = engine.run()
    req, it = out.requests, out.iterations
    block_end = it["start_s"][4] + it["duration_s"][4]  # the prefill pass, then passes 1-4
    assert block_end == pytest.approx(0.05)
    assert req["completion_s"][0] == pytest.approx(block_end)  # not at 0.03, its last token
    assert req["first_scheduled_s"][2] == pytest.approx(block_end)  # C waited for the slot
    assert it["batch_size"][1:5].tolist() == [2, 2, 2, 2]
    # A holds ceil(10 / 4) = 3 blocks to the end: B's 3 blocks + A's 3 in the last pass,
    # then C's prefill runs with B's 3 and C's 2 only.
    assert it["kv_blocks_used"][4] == 6 and it["prefill_tokens"][5] == 8 and it["kv_blocks_used"][5] == 5
    # The finished request is charged in the remaining passes, as a decode at its final context.
    assert it["decode_tokens"][1:5].tolist() == [2, 2, 2, 2]


def test_with_k_one_the_engine_is_the_single_step_engine():
    # A digest of the semantic columns of small runs, pinned before multi-step existed.
    assert _digest(1, None) == "6d240c37df5224f9"


def _digest(steps: int, cpu: EngineCPUConfig | None) -> str:
    rng = np.random.default_rng(7)
    n = 80
    stream = make_stream(np.sort(rng.uniform(0, 2, n)), rng.integers(4, 200, n), rng.integers(1, 120, n))
    cost = LinearCost(base_s=0.01, per_token_s=2e-4, per_kv_token_s=1e-6)
    digest = hashlib.sha256()
    for kw in (
        dict(kv_blocks=80, block_size=4),
        dict(kv_blocks=40, block_size=16, replicas=2, router="least_outstanding",
             client=ClientConfig(timeout_s=2.0, max_retries=1, backoff_s=0.05)),
    ):  # fmt: skip
        out = simulate(
            stream, paged(steps, max_batch_size=16, max_num_batched_tokens=256), setup(cost, engine_cpu=cpu, **kw)
        )
        for frame, columns in (
            (out.requests, ["first_scheduled_s", "first_token_s", "completion_s", "preemptions"]),
            (out.iterations, ["start_s", "duration_s", "batch_size", "decode_tokens", "kv_blocks_used"]),
        ):
            for column in columns:
                digest.update(np.ascontiguousarray(frame[column].to_numpy(dtype=np.float64)).tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 6])
def test_tpot_does_not_depend_on_k_and_each_event_carries_k_tokens(steps):
    n, output = 6, 13  # 12 decode steps: a multiple of every K here
    cost = LinearCost(base_s=0.01)
    stream = make_stream(np.zeros(n), 32, output)
    out = simulate(stream, paged(steps), setup(cost, kv_blocks=100, block_size=16))
    assert out.requests["tpot_s"].to_numpy() == pytest.approx(0.01)
    assert np.allclose(out.itl["gap_s"], steps * 0.01, rtol=0, atol=1e-12)  # K decode passes per event
    assert int(out.itl["count"].sum()) == n * (output - 1) // steps


def test_tpot_is_unchanged_by_k_when_pass_times_vary():
    cost = LinearCost(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-5)
    stream = make_stream(np.zeros(4), [16, 40, 64, 100], 13)
    tpot = {
        k: simulate(stream, paged(k), setup(cost, kv_blocks=100, block_size=16)).requests["tpot_s"] for k in (1, 3, 4)
    }
    assert np.allclose(tpot[1], tpot[3], rtol=1e-12) and np.allclose(tpot[1], tpot[4], rtol=1e-12)


def test_alone_with_k_one_every_gap_is_a_decode_step_and_tpot_is_their_mean():
    cost = LinearCost(base_s=0.01)
    out = simulate(make_stream([0.0], 10, 21), paged(1), setup(cost, kv_blocks=10, block_size=16))
    assert np.allclose(out.itl["gap_s"], 0.01, rtol=0, atol=1e-12) and out.itl["count"].sum() == 20
    stats = itl_stats(out.itl["gap_s"], out.itl["count"])
    assert out.requests["tpot_s"][0] == pytest.approx(stats["itl_mean_s"], rel=1e-12)


def test_new_prefills_wait_for_the_block_boundary():
    cost = LinearCost(base_s=0.01)
    stream = make_stream([0.0, 0.025], 8, [17, 3])  # B arrives during A's first block
    out = simulate(stream, paged(8), setup(cost, kv_blocks=20, block_size=16))
    assert out.requests["first_scheduled_s"][1] == pytest.approx(0.01 + 8 * 0.01)
    single = simulate(stream, paged(1), setup(cost, kv_blocks=20, block_size=16))
    assert single.requests["first_scheduled_s"][1] == pytest.approx(0.03)


def test_a_timeout_inside_a_block_takes_effect_at_its_end():
    cost = LinearCost(base_s=0.01)
    stream = make_stream([0.0, 0.0], 8, [30, 3])
    client = ClientConfig(timeout_s=0.035)  # inside the first block, [0.01, 0.09]
    out = simulate(stream, paged(8, max_batch_size=1), setup(cost, kv_blocks=20, block_size=16, client=client))
    req, it = out.requests, out.iterations
    assert req["status"].tolist() == ["timed_out", "timed_out"]
    assert req["completion_s"].to_numpy() == pytest.approx(0.035)
    assert len(it) == 9 and (it["batch_size"] == 1).all()  # the cancelled request ran to the block end
    assert req["first_scheduled_s"].isna()[1]  # gone from the queue at its deadline


def test_a_request_finishing_in_the_block_needs_no_kv_beyond_its_last_token():
    # 2 output tokens: one decode step. Even with K = 5 the two requests fit 4 blocks.
    stream = make_stream([0.0, 0.0], 4, 2)
    out = simulate(stream, paged(5), setup(LinearCost(0.01), kv_blocks=4, block_size=4))
    assert out.requests["preemptions"].tolist() == [0, 0]


# ----------------------------------------------------------------------------- KV over K steps
ops = decode_group_ops(max_size=60)


@settings(max_examples=examples(2))
@given(st.sampled_from([1, 3, 4, 16]), ops, st.integers(1, 40))
def test_blocks_over_k_steps_match_a_step_by_step_count(block_size, operations, steps):
    group = DecodeGroup(block_size)
    members: dict[int, Seq] = {}
    for rid, op in enumerate(operations):
        if op[0] == "add":
            _, prompt, before, extra = op
            members[rid] = seq = Seq(rid, (0.0, rid), prompt, before + 1 + extra, before)
            group.add(seq)
        elif op[0] == "remove" and members:
            group.remove(members.pop(sorted(members)[op[1] % len(members)]))
        elif op[0] == "step":
            for seq in group.advance():
                group.remove(members.pop(seq.rid))
        # Brute force: each member grows one cached token per step until its last token.
        need = 0
        for seq in members.values():
            cached = group.context(seq) - 1
            left = seq.output_tokens - group.generated(seq)
            grown = cached + min(steps, left)
            need += -(-grown // block_size) - -(-cached // block_size)
            assert group.growth_blocks(seq, steps) == -(-grown // block_size) - -(-cached // block_size)
        assert group.blocks_needed_over(steps) == need


@settings(max_examples=examples(1.2))
@given(
    st.integers(1, 20), st.integers(2, 12), st.sampled_from([1, 4, 16]), st.integers(0, 3),
    st.booleans(), st.booleans(), st.integers(0, 10_000),
)  # fmt: skip
def test_tight_kv_multi_step_runs_keep_the_books(n, steps, block_size, slack, timeouts, cpu, seed):
    rng = np.random.default_rng(seed)
    prompt, output = rng.integers(1, 60, n), rng.integers(1, 40, n)
    stream = make_stream(np.sort(rng.uniform(0, 1, n)), prompt, output)
    need = int(np.max(-(-(prompt + output - 1) // block_size)))
    engine = Engine(
        stream,
        paged(steps, max_batch_size=int(rng.integers(1, 9)), max_num_batched_tokens=int(rng.integers(1, 120))),
        setup(
            LinearCost(base_s=0.01, per_token_s=2e-4, per_kv_token_s=1e-6),
            kv_blocks=need + slack,
            block_size=block_size,
            client=ClientConfig(timeout_s=float(rng.uniform(0.05, 1.0))) if timeouts else None,
            engine_cpu=EngineCPUConfig(step_ms=1.0, pass_ms=0.5, pass_us_per_seq=20.0) if cpu else None,
        ),
        audit_every=1,
    )
    out = engine.run()
    req, it = out.requests, out.iterations
    done = (req["status"] == "completed").to_numpy()
    assert timeouts or done.all()
    assert np.array_equal(engine.records.generated_tokens[done], output[done])
    assert np.all(it["kv_blocks_used"] <= need + slack)
    ends = (it["start_s"] + it["duration_s"]).to_numpy()
    assert np.all(it["start_s"].to_numpy()[1:] >= ends[:-1] - 1e-12)
    # Completions happen at pass ends (a block's end), never inside a pass.
    completion = req["completion_s"][done].to_numpy()
    assert all(np.isclose(ends, c, rtol=0, atol=1e-9).any() for c in completion)
    assert int(out.itl["count"].sum()) <= int(np.maximum(engine.records.generated_tokens - 1, 0).sum())
