"""Disaggregated engine: exact transfer times, conservation, and the no-interference TPOT identity."""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import LinearCost, make_stream
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import ChunkedPrefillPolicyConfig, ContinuousPolicyConfig, PagedPolicyConfig
from sim.serving.disagg import DisaggEngine, PoolSpec
from sim.serving.kv_link import Link, TransferModel
from sim.serving.setup import ReplicaSetup

BLOCK = 16
PREFILL = ChunkedPrefillPolicyConfig(name="p", kind="chunked_prefill", max_batch_size=64, chunk_size=2048)
DECODE = PagedPolicyConfig(name="d", kind="paged", max_batch_size=64)


def _engine(stream, *, p=1, d=1, cost=None, transfer=None, kv_p=4000, kv_d=4000, decode=DECODE, **kw):
    cost = cost or LinearCost(base_s=0.01, per_token_s=1e-5, per_kv_token_s=1e-7)
    transfer = transfer or TransferModel(131072, 25e9, 10e-6, 32)
    return DisaggEngine(
        stream, PoolSpec(PREFILL, ReplicaSetup(cost, kv_p, BLOCK), p),
        PoolSpec(decode, ReplicaSetup(cost, kv_d, BLOCK), d), transfer,
        block_size=BLOCK, audit_every=1, **kw,
    )  # fmt: skip


def test_single_transfer_is_latency_plus_bytes_over_bandwidth_exactly() -> None:
    model = TransferModel(131072, 25e9, 10e-6, 32)
    engine = _engine(make_stream([0.0], [1000], [5]), transfer=model)
    out = engine.run()
    expected = 10e-6 + 1000 * 131072 / 25e9
    assert out.requests["kv_transfer_s"].iloc[0] == expected
    assert model.duration_s(1000) == expected


def test_two_simultaneous_transfers_on_one_link_queue() -> None:
    # Both prompts finish in the same prefill pass, so both transfers are asked for at once on
    # the one link: the first takes T, the second waits T and then takes T (FIFO, full bandwidth).
    engine = _engine(make_stream([0.0, 0.0], [800, 800], [5, 5]))
    out = engine.run()
    single = engine.transfer.duration_s(800)
    assert out.requests["first_token_s"].nunique() == 1
    first, second = sorted(out.requests["kv_transfer_s"])
    assert first == single and second == pytest.approx(2 * single, rel=1e-12)  # wait = free_at - now
    assert engine.links[0][0].transfers == 2 and engine.links[0][0].busy_s == 2 * single


def test_link_books_fifo() -> None:
    link = Link()
    assert link.book(0.0, 1.0) == 0.0
    assert link.book(0.5, 1.0) == 0.5  # waits for the first
    assert link.book(5.0, 1.0) == 0.0 and link.free_at_s == 6.0


def test_layerwise_hides_the_transfer_behind_the_last_prefill_pass() -> None:
    model = TransferModel(131072, 25e9, 0.0, 32, layerwise=True)
    wire = 1000 * 131072 / 25e9
    assert model.duration_s(1000, overlap_pass_s=0.0) == wire  # no overlap possible: after_prefill
    assert model.duration_s(1000, overlap_pass_s=1.0) == wire / 32  # only the last layer remains
    assert model.duration_s(1000, overlap_pass_s=wire / 2) == pytest.approx(wire - wire / 2 * 31 / 32)


def test_infinitely_fast_link_tpot_is_the_decode_only_step_time() -> None:
    # One prefill and one decode replica, requests far apart: each decodes alone, so its TPOT must
    # be exactly the mean of the decode pool's passes it ran in, each a decode-only pass (no prefill).
    cost = LinearCost(base_s=0.01, per_token_s=1e-5, per_kv_token_s=1e-7)
    prompts, outputs = [300, 1200, 700, 2000], [12, 40, 7, 25]
    stream = make_stream([0.0, 10.0, 20.0, 30.0], prompts, outputs)
    engine = _engine(stream, cost=cost, transfer=TransferModel(131072, 1e30, 0.0, 32))
    out = engine.run()
    it = out.iterations
    decode_passes = it[it["replica"] == 1]
    assert (decode_passes["prefill_tokens"] == 0).all()
    for row in out.requests.itertuples():
        starts = decode_passes["start_s"]
        mine = decode_passes[(starts >= row.first_token_s) & (starts < row.completion_s)]
        assert len(mine) == row.output_tokens - 1
        contexts = row.prompt_tokens + np.arange(1, row.output_tokens)
        expected = [cost.time_from_totals_s(0, 0, 0.0, 1, int(c)) for c in contexts]
        assert mine["duration_s"].tolist() == pytest.approx(expected, rel=0, abs=1e-15)
        assert row.tpot_s == pytest.approx(np.mean(expected), rel=1e-12)


def test_prefill_pool_never_decodes_and_decode_pool_never_prefills_without_preemption() -> None:
    rng = np.random.default_rng(3)
    n = 200
    stream = make_stream(np.sort(rng.uniform(0, 20, n)), rng.integers(50, 1500, n), rng.integers(2, 200, n))
    out = _engine(stream, p=2, d=2).run()
    it = out.iterations
    assert (it.loc[it["replica"] < 2, "decode_tokens"] == 0).all()
    assert (it.loc[it["replica"] >= 2, "prefill_tokens"] == 0).all()
    assert (out.requests["preemptions"] == 0).all()


def _conservation(out, stream, p: int) -> None:
    req, it = out.requests, out.iterations
    assert (req["status"] == "completed").all()
    multi = req["output_tokens"] > 1
    # Prefilled once: the prefill pool computes every prompt exactly once.
    assert it.loc[it["replica"] < p, "prefill_tokens"].sum() == stream.prompt_tokens.sum()
    # Decoded once, or preempted and recomputed (counted): decode-pool prefill tokens only come from
    # recomputes, and decode tokens are the outputs after the first, plus one per recompute's token.
    recompute = it.loc[it["replica"] >= p, "prefill_tokens"].sum()
    assert (recompute == 0) == (req["preemptions"].sum() == 0)
    decodes = it.loc[it["replica"] >= p, "decode_tokens"].sum()
    from_recompute = (req["output_tokens"] - 1).sum() - decodes  # tokens emitted by re-prefills instead
    assert 0 <= from_recompute <= req["preemptions"].sum()
    # Each multi-token request crossed one link, joined one decode replica, and finished there.
    assert req.loc[multi, "kv_transfer_s"].notna().all() and req.loc[~multi, "kv_transfer_s"].isna().all()
    assert (req.loc[multi, "replica"] >= p).all() and (req.loc[multi, "prefill_replica"] < p).all()
    assert (it["kv_blocks_used"] <= it["kv_blocks_total"]).all()


@pytest.mark.slow
@settings(max_examples=examples(0.25))
@given(
    seed=st.integers(0, 10_000),
    kv_d=st.integers(130, 400),
    rate=st.floats(5, 60),
    decode_kind=st.sampled_from(["paged", "continuous", "chunked_prefill"]),
)
def test_conservation_under_pressure(seed: int, kv_d: int, rate: float, decode_kind: str) -> None:
    # Tight decode memory forces waits for memory and (paged kinds) preemptions on the decode side.
    rng = np.random.default_rng(seed)
    n = 60
    stream = make_stream(
        np.cumsum(rng.exponential(1 / rate, n)), rng.integers(20, 1500, n), rng.integers(1, 300, n),
        max_output_tokens=300,
    )  # fmt: skip
    decode = {
        "paged": DECODE,
        "continuous": ContinuousPolicyConfig(name="c", kind="continuous", max_batch_size=16),
        "chunked_prefill": ChunkedPrefillPolicyConfig(name="x", kind="chunked_prefill", max_batch_size=64),
    }[decode_kind]
    kv_d = max(kv_d, 120) if decode_kind != "continuous" else 200
    engine = _engine(stream, p=2, d=2, kv_p=150, kv_d=kv_d, decode=decode)
    out = engine.run()  # audits every pass: KV within budget, blocks matching requests (transfers aside)
    _conservation(out, stream, 2)
    for state, role in zip(engine.prefill_states + engine.decode_states, engine.roles, strict=True):
        assert not role.sending and not role.receiving and state.blocks.used_blocks == 0


def test_kv_lives_in_one_pool_outside_a_transfer() -> None:
    # Watch every request at every pass boundary: it holds prefill blocks (prefilling or sending) or
    # decode blocks (receiving or running), and both only while its transfer is in flight.
    rng = np.random.default_rng(7)
    n = 80
    stream = make_stream(np.sort(rng.uniform(0, 5, n)), rng.integers(50, 1500, n), rng.integers(2, 100, n))
    engine = _engine(stream, p=2, d=2, kv_d=300)
    violations: list[int] = []
    p = len(engine.prefill_states)
    original = engine.roles[p].on_boundary

    def watch(now_s: float) -> None:
        assert original is not None
        original(now_s)
        prefill = list(zip(engine.prefill_states, engine.roles[:p], strict=True))
        decode = list(zip(engine.decode_states, engine.roles[p:], strict=True))
        in_prefill = set().union(*(r.sending.keys() | s.running.keys() for s, r in prefill))
        in_decode = set().union(*(r.receiving.keys() | s.running.keys() for s, r in decode))
        sending = set().union(*(r.sending.keys() for _, r in prefill))
        receiving = set().union(*(r.receiving.keys() for _, r in decode))
        violations.extend((in_prefill & in_decode) - (sending & receiving))

    engine.roles[p].on_boundary = watch
    engine.run()
    assert violations == []
