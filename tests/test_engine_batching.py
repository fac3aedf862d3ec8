"""Batching policies against each other: the effects the literature predicts.

- No variance, no gain: identical requests all at t=0 in one batch take the same time
  under static and continuous batching.
- With spread output lengths continuous batching (Orca) beats static batching.
- Paged memory (vLLM) under a KV budget too small for the load preempts by recompute
  and still completes every request; without the max-output reservation it runs
  larger batches than continuous batching on the same memory.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import LinearCost, llama7b_like, make_stream, setup

from sim.config import (
    ChunkedPrefillPolicyConfig,
    ContinuousPolicyConfig,
    PagedPolicyConfig,
    StaticPolicyConfig,
)
from sim.serving.engine import Engine, simulate


def _makespan_s(out) -> float:
    return float(out.requests["completion_s"].max())


def test_identical_burst_gives_static_and_continuous_the_same_makespan():
    n = 24
    stream = make_stream(np.zeros(n), 64, 40)
    cost = LinearCost(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-6)
    static = simulate(stream, StaticPolicyConfig(name="s", max_batch_size=n), setup(cost, kv_blocks=400, block_size=16))
    cont = simulate(
        stream, ContinuousPolicyConfig(name="c", max_batch_size=n), setup(cost, kv_blocks=400, block_size=16),
    )
    one_iteration_s = cont.iterations["duration_s"].max()
    assert abs(_makespan_s(static) - _makespan_s(cont)) <= one_iteration_s
    assert (
        len(static.iterations) == len(cont.iterations) == 40
    )  # one prefill pass + 39 decode steps


@pytest.mark.parametrize("pad", [True, False])
def test_spread_outputs_favour_continuous_over_static(pad: bool):
    rng = np.random.default_rng(5)
    n, batch = 160, 16
    stream = make_stream(np.zeros(n), rng.integers(50, 300, n), rng.integers(10, 1001, n))
    kw = dict(kv_blocks=4000, block_size=16)
    static = simulate(
        stream, StaticPolicyConfig(name="s", max_batch_size=batch, pad_finished=pad), setup(llama7b_like(), **kw),
    )
    cont = simulate(stream, ContinuousPolicyConfig(name="c", max_batch_size=batch), setup(llama7b_like(), **kw))
    assert n / _makespan_s(cont) > n / _makespan_s(static)
    assert cont.requests["e2e_s"].mean() < static.requests["e2e_s"].mean()


def test_static_padding_costs_compute_that_unpadded_static_saves():
    rng = np.random.default_rng(1)
    stream = make_stream(np.zeros(64), 100, rng.integers(1, 200, 64))
    cost = LinearCost(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-6)
    busy = {
        pad: simulate(
            stream, StaticPolicyConfig(name="s", max_batch_size=16, pad_finished=pad),
            setup(cost, kv_blocks=1000, block_size=16),
        )
        .iterations["duration_s"]
        .sum()
        for pad in (True, False)
    }
    assert busy[True] > busy[False]


def test_static_waits_up_to_max_wait_for_a_fuller_batch():
    stream = make_stream([0.0, 0.1, 0.2, 0.3, 5.0], 10, 2)
    policy = StaticPolicyConfig(name="s", max_batch_size=4, max_wait_s=1.0)
    req = simulate(stream, policy, setup(LinearCost(0.01), kv_blocks=100, block_size=16)).requests
    assert np.allclose(req["first_scheduled_s"][:4], 0.3)  # the 4th arrival fills the batch
    assert req["first_scheduled_s"][4] == pytest.approx(6.0)  # alone: waits max_wait_s


@pytest.mark.parametrize(
    "policy",
    [
        PagedPolicyConfig(name="p", max_batch_size=64),
        ChunkedPrefillPolicyConfig(name="cp", max_batch_size=64, chunk_size=256),
    ],
)
def test_tight_kv_preempts_and_still_completes_everything(policy):
    n = 48
    stream = make_stream(np.zeros(n), 100, 300)
    kv_blocks = 60  # one request alone needs ceil(399 / 16) = 25 blocks at its last step
    engine = Engine(stream, policy, setup(llama7b_like(), kv_blocks=kv_blocks, block_size=16), audit_every=1)
    out = engine.run()
    assert out.requests["preemptions"].sum() > 0
    assert (out.requests["status"] == "completed").all()
    assert np.array_equal(engine.records.generated_tokens, stream.output_tokens)
    assert out.iterations["kv_blocks_used"].max() <= kv_blocks
    # Recompute: preempted requests re-prefill, so more prompt tokens are computed than sent.
    assert out.iterations["prefill_tokens"].sum() > stream.prompt_tokens.sum()


def test_paged_memory_without_reservation_batches_more_than_continuous():
    rng = np.random.default_rng(3)
    n = 200
    stream = make_stream(
        np.zeros(n), rng.integers(100, 600, n), rng.integers(20, 200, n), max_output_tokens=1000
    )
    kw = dict(kv_blocks=600, block_size=16)
    cont = simulate(stream, ContinuousPolicyConfig(name="c", max_batch_size=256), setup(llama7b_like(), **kw))
    paged = simulate(stream, PagedPolicyConfig(name="p", max_batch_size=256), setup(llama7b_like(), **kw))
    assert paged.iterations["batch_size"].mean() > cont.iterations["batch_size"].mean()
    assert _makespan_s(paged) < _makespan_s(cont)


def _real_cost_model():
    try:
        from sim.hardware.cost_model import load_cost_model

        return load_cost_model("llama-2-7b", "a100-80gb", 1)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here"
        pytest.skip(f"calibrated Llama-2-7B cost model unavailable: {exc}")


@pytest.mark.parametrize(
    "policy",
    [
        StaticPolicyConfig(name="s", max_batch_size=32),
        ContinuousPolicyConfig(name="c", max_batch_size=64),
        PagedPolicyConfig(name="p"),
        ChunkedPrefillPolicyConfig(name="cp"),
    ],
)
def test_calibrated_cost_model_respects_prefill_floor(policy):
    cost = _real_cost_model()
    rng = np.random.default_rng(7)
    n = 300
    prompt, output = rng.integers(20, 2000, n), rng.integers(5, 400, n)
    stream = make_stream(np.sort(rng.uniform(0, 30, n)), prompt, output, max_output_tokens=512)
    req = simulate(stream, policy, setup(cost, kv_blocks=7335, block_size=16)).requests
    assert (req["status"] == "completed").all()
    floor_s = np.array([cost.time_from_totals_s(int(p), 1, p * p / 2, 0, 0) for p in prompt])
    assert np.all(req["ttft_s"] >= floor_s - 1e-12)
