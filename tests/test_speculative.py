"""Speculative decoding: the acceptance model, conservation, KV, and the cost model's directions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fakes import LinearCost, make_stream, setup

from sim.config import ChunkedPrefillPolicyConfig, ContinuousPolicyConfig, PagedPolicyConfig, SpeculativeConfig
from sim.hardware.cost_model import load_cost_model
from sim.serving.engine import Engine
from sim.serving.spec_acceptance import AcceptanceTrace, build_trace, mean_tokens_per_step

GAMMA = 4


def _spec(rate: float | dict = 0.7, method: str = "ngram", **kw) -> dict:
    return {"method": method, "num_speculative_tokens": GAMMA, "acceptance_rate": rate, **kw}


def _tokens_per_step(trace: AcceptanceTrace, length: int, gamma: int) -> list[int]:
    """Walk one request as the engine does: position 1 onwards, k accepted + 1 per step, uncapped window."""
    steps, position = [], 1
    while position + gamma < length:
        accepted = trace.accepted(0, position, gamma)
        steps.append(accepted + 1)
        position += accepted + 1
    return steps


@pytest.mark.parametrize("rate", [0.3, 0.6, 0.8, 0.95])
def test_mean_tokens_per_step_matches_leviathan(rate: float) -> None:
    trace = AcceptanceTrace(np.array([400_000]), np.array([rate]), np.random.default_rng(7))
    steps = np.array(_tokens_per_step(trace, 400_000, GAMMA), dtype=float)
    # Exact mean and variance of 1 + min(Geometric, gamma): P(T = j + 1) = a^j (1 - a), P(T = gamma + 1) = a^gamma.
    probs = [rate**j * (1 - rate) for j in range(GAMMA)] + [rate**GAMMA]
    values = np.arange(1, GAMMA + 2)
    mean = float(np.dot(probs, values))
    sd = math.sqrt(float(np.dot(probs, (values - mean) ** 2)))
    assert mean == pytest.approx(mean_tokens_per_step(rate, GAMMA), rel=1e-12)
    # Tolerance: 4 standard errors of the mean (two-sided false alarm ~6e-5 per case).
    assert abs(steps.mean() - mean) < 4 * sd / math.sqrt(len(steps)), (steps.mean(), mean, len(steps))


def test_acceptance_zero_and_one_are_exact() -> None:
    trace = AcceptanceTrace(np.array([1000, 1000]), np.array([0.0, 1.0]), np.random.default_rng(0))
    assert all(trace.accepted(0, p, GAMMA) == 0 for p in range(1, 990))
    assert all(trace.accepted(1, p, GAMMA) == GAMMA for p in range(1, 990))
    assert mean_tokens_per_step(0.0, GAMMA) == 1.0 and mean_tokens_per_step(1.0, GAMMA) == GAMMA + 1


def test_trace_is_common_across_rates_and_leaves_other_streams_alone() -> None:
    low = build_trace(SpeculativeConfig(**_spec(0.5)), np.array([500] * 20), seed=3)
    high = build_trace(SpeculativeConfig(**_spec(0.8)), np.array([500] * 20), seed=3)
    # Same uniforms, higher threshold: the higher rate accepts at least as many tokens everywhere.
    assert all(high.accepted(r, p, GAMMA) >= low.accepted(r, p, GAMMA) for r in range(20) for p in range(1, 490))
    per_request = build_trace(SpeculativeConfig(**_spec({"kind": "beta", "mean": 0.7})), np.array([10] * 5000), 3)
    assert per_request.rates.mean() == pytest.approx(0.7, abs=0.01) and per_request.rates.std() > 0.05


def _engine(policy, stream, kv_blocks: int = 400, block_size: int = 16, cost=None) -> Engine:
    engine = Engine(
        stream, policy, setup(cost or LinearCost(0.01, 1e-4), kv_blocks=kv_blocks, block_size=block_size),
        audit_every=1,
    )
    engine.run()
    return engine


POLICIES = [
    lambda s: ContinuousPolicyConfig(name="c", max_batch_size=8, speculative=s),
    lambda s: PagedPolicyConfig(name="p", max_batch_size=8, speculative=s),
    lambda s: ChunkedPrefillPolicyConfig(name="s", max_batch_size=8, chunk_size=64, speculative=s),
]


@pytest.mark.parametrize("make", POLICIES)
@pytest.mark.parametrize("rate", [0.0, 0.7, 1.0])
def test_every_request_emits_exactly_its_tokens_within_kv(make, rate: float) -> None:
    rng = np.random.default_rng(5)
    stream = make_stream(np.sort(rng.uniform(0, 2, 60)), rng.integers(5, 60, 60), rng.integers(1, 80, 60))
    engine = _engine(make(_spec(rate)), stream, kv_blocks=40)  # tight: paged policies preempt
    requests = engine.records
    assert (requests.generated_tokens == stream.output_tokens).all()
    # Each request's tokens: the prefill's first token, then steps x 1 + accepted drafts (no preemption)
    # or more (a re-prefill after a preemption also emits one); never past output_tokens.
    made = 1 + requests.spec_steps + requests.spec_accepted_tokens
    assert (made <= stream.output_tokens + requests.preemptions).all()
    assert (made[requests.preemptions == 0] == stream.output_tokens[requests.preemptions == 0]).all()
    assert (requests.spec_accepted_tokens <= requests.spec_proposed_tokens).all()
    if rate == 0.0:
        assert requests.spec_accepted_tokens.sum() == 0
    if rate == 1.0:
        assert (requests.spec_accepted_tokens == requests.spec_proposed_tokens).all()


def test_draft_blocks_are_allocated_for_the_step_and_rolled_back() -> None:
    # Prompt 15 in blocks of 16: the first decode step writes positions 15..19 (2 blocks); with
    # a = 0 only position 15 is kept, so 1 block is held between steps.
    stream = make_stream([0.0], 15, 10)
    out = Engine(
        stream, PagedPolicyConfig(name="p", speculative=_spec(0.0)), setup(LinearCost(), kv_blocks=4, block_size=16),
        audit_every=1,
    ).run()
    used = out.iterations["kv_blocks_used"].tolist()
    assert used[:2] == [1, 2]  # the prefill, then the first verification with its draft block
    assert out.requests["spec_tokens_per_step"][0] == 1.0


def test_exact_tokens_per_step_at_a_one() -> None:
    stream = make_stream([0.0, 0.0], 20, 1 + 5 * (GAMMA + 1))  # 5 full steps after the first token
    out = Engine(
        stream, PagedPolicyConfig(name="p", speculative=_spec(1.0)),
        setup(LinearCost(), kv_blocks=50, block_size=16),
    ).run()
    assert out.requests["spec_steps"].tolist() == [5, 5]
    assert out.requests["spec_tokens_per_step"].tolist() == [GAMMA + 1, GAMMA + 1]


def test_per_request_acceptance_is_the_same_under_every_policy() -> None:
    # The acceptance pattern belongs to the request, not to the batch (common random numbers).
    rng = np.random.default_rng(2)
    stream = make_stream(np.sort(rng.uniform(0, 1, 30)), rng.integers(5, 40, 30), rng.integers(2, 60, 30))
    columns = ["spec_steps", "spec_proposed_tokens", "spec_accepted_tokens"]
    frames = [
        Engine(stream, make(_spec(0.7)), setup(LinearCost(0.01, 1e-4), kv_blocks=1000, block_size=16)).run().requests
        for make in POLICIES
    ]
    for frame in frames[1:]:
        assert frame[columns].equals(frames[0][columns])


def _stream_alone(n: int, gap_s: float = 30.0):
    return make_stream(np.arange(n) * gap_s, 300, 200)


@pytest.mark.parametrize("spec", [_spec(0.6, "ngram"), _spec(0.6, "eagle"), _spec(0.8, "eagle")])
def test_tpot_falls_at_batch_one(spec: dict) -> None:
    cost = load_cost_model("llama-2-7b", "a100-80gb", 1)
    stream = _stream_alone(5)
    base = Engine(stream, PagedPolicyConfig(name="p"), setup(cost, kv_blocks=2000, block_size=16)).run()
    fast = Engine(
        stream, PagedPolicyConfig(name="p", speculative=spec), setup(cost, kv_blocks=2000, block_size=16)
    ).run()
    assert fast.iterations["batch_size"].max() == 1
    assert fast.requests["tpot_s"].mean() < 0.75 * base.requests["tpot_s"].mean()


def test_tpot_falls_at_batch_one_with_a_draft_model() -> None:
    target = load_cost_model("llama-2-70b", "a100-80gb", 4)
    draft = load_cost_model("llama-2-7b", "a100-80gb", 4)
    stream = _stream_alone(3)
    spec = _spec(0.6, "draft_model", draft_model="llama-2-7b")
    base = Engine(stream, PagedPolicyConfig(name="p"), setup(target, kv_blocks=4000, block_size=16)).run()
    fast = Engine(
        stream, PagedPolicyConfig(name="p", speculative=spec),
        setup(target, kv_blocks=4000, block_size=16, draft_cost_model=draft),
    ).run()
    assert fast.requests["tpot_s"].mean() < base.requests["tpot_s"].mean()


def test_throughput_falls_at_a_saturated_batch() -> None:
    # Llama-3-8B (GQA: small KV reads) on one A100, 1,500 requests at once, up to 512 running:
    # the linear layers are compute-bound, so verifying 5 tokens per sequence costs ~5x.
    cost = load_cost_model("llama-3-8b", "a100-80gb", 1)
    rng = np.random.default_rng(1)
    stream = make_stream(np.zeros(1500), rng.integers(128, 512, 1500), rng.integers(100, 400, 1500))
    rates = {}
    for label, spec in (("off", None), ("on", _spec(0.6, "ngram"))):
        policy = PagedPolicyConfig(name="p", max_batch_size=512, speculative=spec)
        out = Engine(stream, policy, setup(cost, kv_blocks=27_000, block_size=16)).run()
        assert out.iterations["batch_size"].mean() > 200  # saturated
        rates[label] = stream.output_tokens.sum() / out.requests["completion_s"].max()
    assert rates["on"] < 0.95 * rates["off"]
