"""Mixture-of-experts cost: routing statistics, the dense limit, the memory floor and the compute roof."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import UserError
from sim.hardware import moe
from sim.hardware.all_reduce import NCCL_EAGER, VLLM_V0_GRAPHS, custom_fit
from sim.hardware.calibration_files import CALIBRATION_DIR, ROOFLINE_FILE, read_yaml
from sim.hardware.catalog import MoESpec, get_gpu, get_model
from sim.hardware.cost_model import CostModel, load_cost_model
from sim.hardware.memory import kv_budget
from sim.hardware.moe import expected_distinct_experts, tokens_per_expert
from sim.hardware.transfer import roofline_calibration

ROOF = read_yaml(CALIBRATION_DIR / ROOFLINE_FILE)
A100 = get_gpu("a100-80gb")


def _cost(model, tp: int = 1, **kwargs) -> CostModel:  # type: ignore[no-untyped-def]
    data = roofline_calibration(ROOF, model, A100, tp, **kwargs)
    return CostModel(data, model, label="test", source="test", cpu_overhead=False)


def _monte_carlo_distinct(tokens: int, top_k: int, experts: int, trials: int, seed: int) -> np.ndarray:
    """Distinct experts touched per trial: every token picks top_k different experts at random."""
    rng = np.random.default_rng(seed)
    keys = rng.random((trials, tokens, experts))
    chosen = np.argpartition(keys, top_k - 1, axis=2)[:, :, :top_k]  # a uniform k-subset per token
    hit = np.zeros((trials, experts), bool)
    np.put_along_axis(hit, chosen.reshape(trials, -1), True, axis=1)
    return hit.sum(axis=1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tokens", "top_k", "experts"), [(1, 2, 8), (3, 2, 8), (16, 2, 8), (10, 8, 256), (100, 8, 256)]
)
def test_expected_distinct_experts_matches_a_monte_carlo_draw(tokens: int, top_k: int, experts: int) -> None:
    draws = _monte_carlo_distinct(tokens, top_k, experts, trials=2000, seed=tokens * experts)
    expected = float(expected_distinct_experts(tokens, top_k, experts))
    stderr = max(draws.std(ddof=1), 1e-9) / np.sqrt(len(draws))
    assert abs(draws.mean() - expected) <= 4 * stderr + 1e-9, (draws.mean(), expected)
    assert expected == pytest.approx(experts * (1 - (1 - top_k / experts) ** tokens))


def test_distinct_experts_limits() -> None:
    assert float(expected_distinct_experts(1, 8, 256)) == pytest.approx(8)  # one token: exactly k experts
    assert float(expected_distinct_experts(100_000, 8, 256)) == pytest.approx(256)  # saturates at E
    assert float(tokens_per_expert(1, 8, 256)) == pytest.approx(1.0)
    assert float(tokens_per_expert(4096, 2, 8)) == pytest.approx(4096 * 2 / 8)


def test_one_expert_top_one_is_the_dense_model() -> None:
    dense = get_model("llama-3-8b")
    moe = dataclasses.replace(dense, name="llama-3-8b-moe1", moe=MoESpec(num_experts=1, top_k=1, expert_ffn=14336))
    assert moe.num_params == dense.num_params and moe.weight_bytes == dense.weight_bytes
    for tp in (1, 2):
        a, b = _cost(dense, tp), _cost(moe, tp)
        for batch in [(np.array([300]), np.array([0]), np.arange(1, 40) * 50), (np.array([]), np.array([]), [700])]:
            assert b.iteration_time_s(*batch) == pytest.approx(a.iteration_time_s(*batch), rel=1e-12)
        assert kv_budget(moe, A100, tp).num_blocks == kv_budget(dense, A100, tp).num_blocks


def _mixtral_and_dense_twin():  # type: ignore[no-untyped-def]
    mixtral = get_model("mixtral-8x7b")
    assert mixtral.moe is not None
    width = mixtral.moe.num_experts * mixtral.moe.expert_ffn
    dense = dataclasses.replace(mixtral, name="dense-46b", moe=None, mlp_hidden_size=width)
    # Same total size up to the router (8 x 4096 weights per layer).
    assert dense.num_params == pytest.approx(mixtral.num_params, rel=1e-4)
    return mixtral, dense


def test_decode_at_batch_one_sits_between_the_active_weight_floor_and_the_dense_twin() -> None:
    mixtral, dense = _mixtral_and_dense_twin()
    tp = 2
    step = _cost(mixtral, tp).iteration_time_s(np.array([]), np.array([]), np.array([1]))
    floor_s = mixtral.active_params * mixtral.dtype_bytes / tp / (A100.hbm_gb_per_s * 1e9)
    dense_step = _cost(dense, tp).iteration_time_s(np.array([]), np.array([]), np.array([1]))
    assert floor_s < step < dense_step
    # It reads two of eight experts, so it is well under the dense twin, yet above the floor.
    assert step < 0.5 * dense_step


def _gemm_flops_ideal_s(model, tp: int, tokens: float) -> float:  # type: ignore[no-untyped-def]
    """FLOPs of every weight a token passes through (all but the embedding gather) at peak."""
    flops_per_token = 2.0 * (model.active_params - model.vocab_size * model.hidden_size) / tp
    return flops_per_token * tokens / (A100.peak_bf16_tflops * 1e12)


def test_large_batch_cost_approaches_active_flops_over_the_fitted_compute_efficiency() -> None:
    mixtral, _ = _mixtral_and_dense_twin()
    tp, tokens = 2, 32768
    cost = _cost(mixtral, tp)
    linear_s = cost.breakdown_from_totals_s(tokens, 1, 0.0, 0, 0)["linear"]
    eff = ROOF["efficiency"]
    # Experts see tokens x k / E = 8192 rows each; the MLP GEMMs' compute efficiency there.
    e_c = float(np.interp(np.log(8192), np.log(eff["tokens"]), eff["ops"]["mlp_up_proj"]["compute"]))
    lm_head_s = tokens * 2.0 * mixtral.hidden_size * mixtral.vocab_size / tp / (A100.peak_bf16_tflops * 1e12)
    predicted = (_gemm_flops_ideal_s(mixtral, tp, tokens) - lm_head_s) / e_c  # `linear` excludes the LM head
    # Compute-bound: within the share the memory-bound norms/activation/rope add (under 15%).
    assert predicted < linear_s < 1.15 * predicted
    # At batch 1 the same model is far from compute-bound (per token, over 100x slower).
    one = cost.breakdown_from_totals_s(1, 1, 0.0, 0, 0)["linear"]
    assert one > 100 * linear_s / tokens


def test_moe_stays_memory_bound_longer_than_the_dense_model_of_its_active_size() -> None:
    mixtral = get_model("mixtral-8x7b")
    assert mixtral.moe is not None
    # A dense model whose FFN is the two active experts side by side: the same active size.
    width = mixtral.moe.top_k * mixtral.moe.expert_ffn
    dense = dataclasses.replace(mixtral, name="dense-13b", moe=None, mlp_hidden_size=width)
    assert dense.active_params == pytest.approx(mixtral.active_params, rel=1e-4)
    moe_cost, dense_cost = _cost(mixtral, 2), _cost(dense, 2)

    def growth(cost: CostModel, batch: int) -> float:
        return (
            cost.breakdown_from_totals_s(batch, batch, 0.0, 0, 0)["linear"]
            / cost.breakdown_from_totals_s(1, 1, 0.0, 0, 0)["linear"]
        )

    # Up to 8 tokens the dense model reads the same weights (memory-bound: ~flat); the MoE model
    # reads more experts with every token, so its cost per step grows ...
    assert growth(moe_cost, 8) > 2 * growth(dense_cost, 8)

    # ... and per token it keeps falling long after the dense one has flattened out.
    def per_token_drop(cost: CostModel) -> float:
        return growth(cost, 256) / 256 / (growth(cost, 2048) / 2048)

    assert per_token_drop(moe_cost) > 1.5 * per_token_drop(dense_cost)


def test_expert_parallel_adds_an_all_to_all_and_is_validated() -> None:
    tp2 = load_cost_model("mixtral-8x7b", "a100-80gb", 2, cpu_overhead=False)
    ep2 = load_cost_model("mixtral-8x7b", "a100-80gb", 2, cpu_overhead=False, expert_parallel=2)
    assert ep2.label == tp2.label == "transferred (MoE)"
    # Two all-to-alls of 0.03 ms latency each in each of the 32 layers (the experts' own cost
    # barely moves: the same weight bytes are read, whole experts instead of halves).
    a2a_s = 32 * 2 * 0.03e-3
    assert ep2.time_from_totals_s(0, 0, 0.0, 1, 100) > tp2.time_from_totals_s(0, 0, 0.0, 1, 100) + 0.9 * a2a_s
    with pytest.raises(UserError, match="no experts"):
        load_cost_model("llama-2-7b", "a100-80gb", 1, expert_parallel=2)
    with pytest.raises(UserError, match="does not divide tensor_parallel"):
        load_cost_model("mixtral-8x7b", "a100-80gb", 2, expert_parallel=4)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3000), grow=st.integers(1, 600), prefill=st.booleans())
@pytest.mark.parametrize(("model", "tp"), [("mixtral-8x7b", 2), ("mixtral-8x7b", 4), ("qwen3-30b-a3b", 2)])
def test_moe_step_never_gets_cheaper_with_more_tokens_at_tensor_parallel(
    model: str, tp: int, batch: int, grow: int, prefill: bool
) -> None:
    """Touched experts, tokens per expert, the engine's all-reduce (custom kernel below its limit, NCCL above):
    whatever changes with the batch, a larger batch never costs less."""
    cost = load_cost_model(model, "h100-sxm", tp, cpu_overhead=False)

    def step(tokens: int) -> float:
        if prefill:
            return cost.time_from_totals_s(tokens, 1, tokens * tokens / 2, 0, 0)
        return cost.time_from_totals_s(0, 0, 0.0, tokens, tokens * 500)

    assert step(batch + grow) >= step(batch)


def test_moe_decode_all_reduces_after_attention_and_after_the_experts_with_the_engines_kernel() -> None:
    """Mixtral-8x7B TP2 on H100: two all-reduces per layer of batch x 4096 x 2 bytes, the custom one-shot kernel
    inside a CUDA graph for decode batches (vLLM), not the profiled eager NCCL time."""
    engine = load_cost_model("mixtral-8x7b", "h100-sxm", 2, cpu_overhead=False, all_reduce=VLLM_V0_GRAPHS)
    nccl = engine.with_all_reduce(NCCL_EAGER)
    for batch in (1, 20, 64):
        decode = (0, 0, 0.0, batch, batch * 1000)
        fit, _ = custom_fit(get_gpu("h100-sxm"), 2, "one_shot")
        expected_s = 2 * 32 * float(fit.ms(np.array([batch * 4096 * 2.0]))[0]) * 1e-3
        assert engine.breakdown_from_totals_s(*decode)["all_reduce"] == pytest.approx(expected_s)
        assert nccl.time_from_totals_s(*decode) - engine.time_from_totals_s(*decode) > 0.05 * nccl.time_from_totals_s(
            *decode
        )


# vLLM PR #24700 ("Improve default fused moe configs"), H100, `benchmark_moe.py --model=Mixtral-8x7B-Instruct-v0.1
# -tp=2`, tuned config (E=8, N=7168): fused_moe kernel time per MoE layer (µs) by batch size.
FUSED_MOE_H100_TP2_US = {
    1: 144.03, 2: 229.28, 4: 351.10, 8: 434.98, 16: 471.49, 24: 478.27, 32: 487.35, 48: 487.85, 64: 483.14,
    96: 494.42, 128: 491.39, 256: 536.77, 512: 662.33, 1024: 833.72, 1536: 1122.93,
}  # fmt: skip


def test_mixtral_tp2_expert_layer_matches_vllms_fused_moe_kernel_on_h100() -> None:
    """The grouped GEMMs over the touched experts' TP slices and the activation between them (one kernel over all
    B x k routed rows), against the measured fused-MoE kernel: decode batches 8-256 within 3%, every batch within
    11% (batches 1-4 also pay the routing kernels, which are not priced)."""
    mixtral, h100 = get_model("mixtral-8x7b"), get_gpu("h100-sxm")
    eff = read_yaml(CALIBRATION_DIR / "h100-sxm_roofline.yaml")["efficiency"]
    assert mixtral.moe is not None
    errors = {}
    for batch, measured_us in FUSED_MOE_H100_TP2_US.items():
        ops = moe._moe_ops(mixtral, mixtral.moe, 2, 1, np.array([float(batch)]), 1.0)[1:]  # without the router GEMM
        errors[batch] = float(moe._ops_ms(eff, ops, h100)[0]) * 1e3 / measured_us - 1
    assert all(abs(e) < 0.03 for b, e in errors.items() if 8 <= b <= 256), errors
    assert all(abs(e) < 0.11 for e in errors.values()), errors
    assert np.mean(np.abs(list(errors.values()))) < 0.035, errors
