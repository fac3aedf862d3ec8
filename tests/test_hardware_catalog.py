"""Catalog: published parameter counts, name lookups and tensor-parallel validation."""

from __future__ import annotations

import pytest

from sim.errors import UserError
from sim.hardware.catalog import GPUS, MODELS, check_tensor_parallel, get_gpu, get_model

# Parameter counts the model cards publish (billions); the catalog's shapes must reproduce them.
PUBLISHED_PARAMS_B = {
    "llama-2-7b": 6.74,
    "llama-2-70b": 68.98,
    "llama-3-8b": 8.03,
    "llama-3-70b": 70.55,
    "codellama-34b": 33.74,
    "phi-2": 2.78,
    "mistral-7b": 7.24,
    "opt-13b": 12.85,
    "llama-3.1-8b": 8.03,
    "qwen2.5-7b": 7.62,
}


def test_catalog_has_required_models_and_gpus() -> None:
    assert set(PUBLISHED_PARAMS_B) <= set(MODELS)
    assert {"a100-80gb", "a100-40gb", "h100-sxm", "h200", "a40", "l40s"} <= set(GPUS)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_parameter_count_matches_model_card(name: str) -> None:
    # Biases and norms are left out, so allow 1.5%.
    assert get_model(name).num_params / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[name], rel=0.015)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_are_consistent(name: str) -> None:
    m = get_model(name)
    if m.explicit_head_dim:  # config.json's head_dim (Mistral-Nemo): q width != hidden
        assert m.head_dim == m.explicit_head_dim
    else:
        assert m.head_dim * m.num_q_heads == m.hidden_size
    assert m.num_q_heads % m.num_kv_heads == 0
    if not m.weight_dtype_bytes:  # fp8 weights (DeepSeek-V3): tests/test_moe_memory.py
        assert m.weight_bytes == m.num_params * m.dtype_bytes


def test_llama_2_7b_weights_are_13_5_gb() -> None:
    assert get_model("llama-2-7b").weight_bytes / 1e9 == pytest.approx(13.5, rel=0.01)


def test_faster_gpus_have_higher_roofs() -> None:
    a100, h100, h200 = get_gpu("a100-80gb"), get_gpu("h100-sxm"), get_gpu("h200")
    assert a100.peak_bf16_tflops < h100.peak_bf16_tflops == h200.peak_bf16_tflops
    assert (
        get_gpu("a100-40gb").hbm_gb_per_s
        < a100.hbm_gb_per_s
        < h100.hbm_gb_per_s
        < h200.hbm_gb_per_s
    )
    assert h200.memory_gb > a100.memory_gb > get_gpu("a100-40gb").memory_gb


def test_unknown_model_suggests_and_lists() -> None:
    with pytest.raises(UserError) as err:
        get_model("llama-2-7")
    text = str(err.value)
    assert "did you mean 'llama-2-7b'" in text and "qwen2.5-7b" in text and text.startswith("model")


def test_unknown_gpu_lists_known() -> None:
    with pytest.raises(UserError, match="h100-sxm"):
        get_gpu("h100")


@pytest.mark.parametrize("tp", [0, 3, 5, -2])
def test_tensor_parallel_must_divide_heads(tp: int) -> None:
    with pytest.raises(UserError, match="tensor_parallel"):
        check_tensor_parallel(get_model("llama-2-7b"), tp)


def test_kv_heads_replicate_beyond_their_count() -> None:
    model = get_model("llama-2-70b")  # 64 query heads, 8 KV heads
    check_tensor_parallel(model, 16)
    assert model.kv_heads_per_gpu(16) == 1 and model.q_heads_per_gpu(16) == 4
    with pytest.raises(UserError, match="allowed: 1, 2, 4, 8, 16, 32, 64"):
        check_tensor_parallel(model, 12)
