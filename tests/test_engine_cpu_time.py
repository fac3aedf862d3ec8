"""The engine CPU-time model: a pass costs GPU time + a per-pass term, and the first pass of
every scheduling step also the step term (hidden behind the GPU time with overlap_step)."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import LinearCost, make_stream, setup

from sim.config import ContinuousPolicyConfig, EngineCPUConfig, PagedPolicyConfig, StaticPolicyConfig
from sim.serving.cpu_time import EngineCPUTime
from sim.serving.engine import Engine, simulate

CPU = EngineCPUConfig(step_ms=2.0, step_us_per_seq=100.0, pass_ms=1.0, pass_us_per_seq=10.0)


def _gpu_s(cost: LinearCost, it) -> np.ndarray:
    """The LinearCost time of each iteration row (no per-KV-token term)."""
    return cost.base_s + cost.per_token_s * (it["prefill_tokens"] + it["decode_tokens"]).to_numpy()


def _pass_s(seqs) -> np.ndarray:
    return 1e-3 + 10e-6 * np.asarray(seqs)


def _step_s(seqs) -> np.ndarray:
    return 2e-3 + 100e-6 * np.asarray(seqs)


def test_model_converts_units_and_adds_the_terms():
    model = EngineCPUTime.from_config(CPU)
    assert model.pass_overhead_s(4) == pytest.approx(1e-3 + 40e-6)
    assert model.step_overhead_s(4) == pytest.approx(2e-3 + 400e-6)
    assert model.pass_time_s(0.01, 4, first_of_step=False) == pytest.approx(0.01 + 1.04e-3)
    assert model.pass_time_s(0.01, 4, first_of_step=True) == pytest.approx(0.01 + 1.04e-3 + 2.4e-3)
    hidden = EngineCPUTime.from_config(CPU.model_copy(update={"overlap_step": True}))
    assert hidden.pass_time_s(0.01, 4, first_of_step=True) == pytest.approx(0.01 + 1.04e-3)  # 2.4 ms < 10 ms
    assert hidden.pass_time_s(0.001, 4, first_of_step=True) == pytest.approx(1.04e-3 + 2.4e-3)  # GPU hides 1 ms
    assert EngineCPUTime().pass_time_s(0.01, 7, first_of_step=True) == 0.01  # all zero: GPU time exactly


@pytest.mark.parametrize(
    "policy",
    [
        PagedPolicyConfig(name="p", max_batch_size=8),
        ContinuousPolicyConfig(name="c", max_batch_size=8),
        StaticPolicyConfig(name="s", max_batch_size=8),
    ],
    ids=lambda p: p.kind,
)
def test_every_pass_costs_gpu_plus_pass_plus_step_time(policy):
    cost = LinearCost(base_s=0.01, per_token_s=1e-4)
    stream = make_stream([0.0, 0.0, 0.05, 0.2], [30, 40, 20, 60], [9, 5, 12, 3])
    out = simulate(stream, policy, setup(cost, kv_blocks=100, block_size=16, engine_cpu=CPU))
    it = out.iterations
    seqs = it["batch_size"].to_numpy()
    want = _gpu_s(cost, it) + _pass_s(seqs) + _step_s(seqs)
    assert np.allclose(it["duration_s"], want, rtol=0, atol=1e-15)


def test_overlapped_step_time_is_hidden_up_to_the_gpu_time():
    cost = LinearCost(base_s=0.003, per_token_s=1e-5)
    stream = make_stream(np.zeros(12), 100, 6)
    cpu = CPU.model_copy(update={"overlap_step": True})
    out = simulate(stream, PagedPolicyConfig(name="p"), setup(cost, kv_blocks=200, block_size=16, engine_cpu=cpu))
    it = out.iterations
    gpu, seqs = _gpu_s(cost, it), it["batch_size"].to_numpy()
    step = _step_s(seqs)  # 12 seqs: 3.2 ms, more than a 3.1 ms decode pass, less than the prefill
    want = gpu + _pass_s(seqs) + np.maximum(0.0, step - gpu)
    assert np.allclose(it["duration_s"], want, rtol=0, atol=1e-15)
    decode = (it["decode_tokens"] > 0).to_numpy()
    assert np.all(step[decode] > gpu[decode]) and np.all(step[~decode] < gpu[~decode])  # both branches seen


@pytest.mark.parametrize("steps", [2, 4, 5])
def test_with_multi_step_the_step_term_is_paid_once_per_block(steps):
    cost = LinearCost(base_s=0.01, per_token_s=1e-4)
    n, output = 3, 11  # 10 decode steps
    stream = make_stream(np.zeros(n), 16, output)
    policy = PagedPolicyConfig(name="p", num_scheduler_steps=steps)
    engine = Engine(stream, policy, setup(cost, kv_blocks=100, block_size=16, engine_cpu=CPU))
    it = engine.run().iterations
    seqs = it["batch_size"].to_numpy()
    extra = it["duration_s"].to_numpy() - _gpu_s(cost, it) - _pass_s(seqs)
    blocks = -(-(output - 1) // steps)
    first_of_step = np.zeros(len(it), dtype=bool)
    first_of_step[0] = True  # the prefill pass
    first_of_step[1 + steps * np.arange(blocks)] = True
    assert len(it) == 1 + blocks * steps and engine.workers[0].scheduler_calls == 1 + blocks
    assert np.allclose(extra[first_of_step], _step_s(seqs[first_of_step]), rtol=0, atol=1e-15)
    assert np.allclose(extra[~first_of_step], 0.0, rtol=0, atol=1e-15)


def test_an_all_zero_model_is_the_gpu_time_bit_for_bit():
    cost = LinearCost(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-6)
    stream = make_stream(np.linspace(0, 1, 30), 64, 40)
    kw = dict(kv_blocks=60, block_size=16)
    policy = PagedPolicyConfig(name="p", max_batch_size=8)
    plain = simulate(stream, policy, setup(cost, **kw))
    zero = simulate(stream, policy, setup(cost, engine_cpu=EngineCPUConfig(), **kw))
    assert plain.iterations.equals(zero.iterations) and plain.requests.equals(zero.requests)
    assert plain.itl.equals(zero.itl)
