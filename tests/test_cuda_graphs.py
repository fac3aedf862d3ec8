"""CUDA-graph padding: a pass's time is a step function of its size, priced at the captured size it
replays at, and the engine and the presets apply it."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import LinearCost, assert_same_records, make_stream, setup
from hypothesis import given
from hypothesis import strategies as st

import sim
from sim.config import PagedPolicyConfig
from sim.config.policy_base import CUDAGraphsConfig
from sim.errors import UserError
from sim.hardware.cost_model import load_cost_model
from sim.serving.cuda_graphs import CUDAGraphPadding, padded_size
from sim.serving.engine import simulate

SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]  # vLLM 0.15.1's default list for 256 sequences
KV = 200_000  # decode KV tokens held fixed, so the batch size alone moves the time


@pytest.fixture(scope="module")
def h100():
    return load_cost_model("llama-3-8b", "h100-sxm", 1, cpu_overhead=False)


def _decode_times(cost, batch_sizes):
    return [cost.time_from_totals_s(0, 0, 0.0, n, KV) for n in batch_sizes]


def test_decode_step_time_is_a_non_decreasing_step_function_of_the_batch(h100) -> None:
    padded = CUDAGraphPadding(h100, SIZES, pad_mixed=True)
    batches = range(1, 700)
    times = _decode_times(padded, batches)
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))
    bounds = [0, *SIZES]
    for low, high in zip(bounds, bounds[1:], strict=False):  # constant on (low, high], the unpadded time at high
        interval = _decode_times(padded, range(low + 1, high + 1))
        assert set(interval) == {h100.time_from_totals_s(0, 0, 0.0, high, KV)}
    beyond = range(SIZES[-1] + 1, 700)  # larger than every graph: eager, at its own size
    assert _decode_times(padded, beyond) == _decode_times(h100, beyond)
    assert len(set(times[: SIZES[-1]])) <= len(SIZES)


@given(n=st.integers(1, 2000), kv=st.integers(0, 10**7))
def test_padding_adds_time_only_below_the_largest_size_and_never_removes_any(n: int, kv: int) -> None:
    cost = LinearCost(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-7)
    padded = CUDAGraphPadding(cost, SIZES, pad_mixed=False)
    plain_s = cost.time_from_totals_s(0, 0, 0.0, n, kv)
    padded_s = padded.time_from_totals_s(0, 0, 0.0, n, kv)
    assert padded_s >= plain_s
    assert (padded_s == plain_s) == (n in SIZES or n > SIZES[-1])
    assert padded_size(n, SIZES) - n < 16  # the gap between graphs bounds the padding


def test_v0_pads_pure_decode_passes_only_and_v1_every_pass_up_to_the_largest_size() -> None:
    cost = LinearCost(base_s=0.01, per_token_s=1e-4)
    v0 = CUDAGraphPadding(cost, [1, 2, 4, 8], pad_mixed=False)
    v1 = CUDAGraphPadding(cost, [1, 2, 4, 8], pad_mixed=True)
    mixed = (3, 1, 4.5, 2, 100)  # 3 prefill tokens + 2 decodes = 5 tokens -> the 8-token graph in V1
    assert v0.time_from_totals_s(*mixed) == cost.time_from_totals_s(*mixed)
    assert v1.time_from_totals_s(*mixed) == cost.time_from_totals_s(3, 1, 4.5, 5, 100)
    large = (500, 1, 1e5, 2, 100)  # above the largest graph: eager
    assert v1.time_from_totals_s(*large) == cost.time_from_totals_s(*large)
    assert v1.time_from_totals_s(0, 0, 0.0, 0, 0) == cost.time_from_totals_s(0, 0, 0.0, 0, 0)


def _burst(graphs: CUDAGraphsConfig | None, n: int = 5):
    stream = make_stream(np.zeros(n), 64, 20)
    cost = LinearCost(base_s=0.01, per_token_s=1e-3, per_kv_token_s=1e-6)
    policy = PagedPolicyConfig(name="p", max_batch_size=n, max_num_batched_tokens=4096)
    return simulate(stream, policy, setup(cost, kv_blocks=400, block_size=16, cuda_graphs=graphs)), cost


def test_the_engine_prices_each_decode_pass_at_its_graph() -> None:
    plain, _ = _burst(None)
    exact, _ = _burst(CUDAGraphsConfig(capture_sizes=[5], batches="decode"))  # the batch is a captured size
    small, _ = _burst(CUDAGraphsConfig(capture_sizes=[4], batches="decode"))  # larger than every graph
    assert_same_records(plain, exact)
    assert_same_records(plain, small)
    padded, cost = _burst(CUDAGraphsConfig(capture_sizes=[8], batches="decode"))
    decodes = padded.iterations[padded.iterations["prefill_tokens"] == 0]
    expected = [cost.time_from_totals_s(0, 0, 0.0, 8, kv) for kv in decodes["decode_kv_tokens"]]
    assert decodes["decode_tokens"].eq(5).all()
    np.testing.assert_allclose(decodes["duration_s"], expected, rtol=0, atol=1e-15)


def test_a_scenarios_cuda_graphs_slow_a_small_batch_down() -> None:
    fixed = {"kind": "fixed", "value": 100}
    workload = {"requests": 3, "arrival": {"kind": "burst"}, "prompt_tokens": fixed, "output_tokens": fixed}
    policies = [{"name": "eager", "kind": "paged", "max_batch_size": 8},
                {"name": "graphs", "kind": "paged", "max_batch_size": 8,
                 "cuda_graphs": {"capture_sizes": [1, 64], "batches": "decode"}}]  # fmt: skip
    scenario = sim.Scenario(name="g", model="llama-3-8b", gpu="h100-sxm", workload=workload, policies=policies)
    tpot = sim.run(scenario).summary.set_index("policy")["tpot_p50_s"]
    assert tpot["graphs"] > tpot["eager"]  # 3 decodes priced as 64


def test_a_disaggregated_decode_pool_applies_its_cuda_graphs() -> None:
    from fakes import disagg_scenario

    data = disagg_scenario()
    data["workload"]["requests"] = 40
    pool = data["disaggregation"]["decode"]
    graphs = {**pool, "policy": {**pool["policy"], "cuda_graphs": {"capture_sizes": [512], "batches": "decode"}}}
    plain = sim.run(sim.Scenario.from_data(data)).summary.set_index("policy")
    data["disaggregation"]["decode"] = graphs
    padded = sim.run(sim.Scenario.from_data(data)).summary.set_index("policy")
    assert padded.loc["1p1d", "tpot_p50_s"] > plain.loc["1p1d", "tpot_p50_s"]
    assert padded.loc["vllm-v0", "tpot_p50_s"] == plain.loc["vllm-v0", "tpot_p50_s"]


@pytest.mark.parametrize("sizes", [[], [0, 8], [8, 8], [16, 8], [True]])
def test_capture_sizes_must_be_positive_and_increasing(sizes: list) -> None:
    policy = {"name": "x", "kind": "paged", "max_batch_size": 8, "cuda_graphs": {"capture_sizes": sizes}}
    with pytest.raises(UserError, match=r"cuda_graphs\.capture_sizes"):
        sim.Scenario(name="g", model="llama-3-8b", workload={"requests": 1}, policies=[policy])
