"""KV-cache budget: bytes per token, the memory arithmetic, pinning, and models that do not fit."""

from __future__ import annotations

import pytest

from sim.errors import UserError
from sim.hardware.catalog import MODELS, get_gpu, get_model
from sim.hardware.memory import GIB, kv_budget, kv_bytes_per_token


def test_kv_bytes_per_token_llama_2_7b() -> None:
    # 2 (K, V) x 32 layers x 32 heads x 128 dims x 2 bytes
    assert kv_bytes_per_token(get_model("llama-2-7b"), 1) == 524_288


def test_kv_bytes_per_token_llama_2_70b_tp2() -> None:
    # 2 x 80 layers x 8 KV heads x 128 x 2 bytes / 2 GPUs
    assert kv_bytes_per_token(get_model("llama-2-70b"), 2) == 163_840


def test_gqa_needs_less_kv_than_mha_of_same_width() -> None:
    assert kv_bytes_per_token(get_model("llama-3-8b"), 1) * 4 == kv_bytes_per_token(
        get_model("llama-2-7b"), 1
    )


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b", "phi-2"])
def test_budget_never_exceeds_memory(name: str) -> None:
    model, gpu = get_model(name), get_gpu("a100-80gb")
    budget = kv_budget(model, gpu, 1)
    assert budget.num_blocks >= 1 and not budget.pinned
    used = (
        budget.num_blocks * budget.bytes_per_block
        + budget.weight_bytes_per_gpu
        + budget.activation_reserve_bytes
    )
    assert used <= budget.gpu_memory_bytes * 0.9
    # Whole blocks: the remainder is smaller than one block.
    assert (
        budget.available_bytes - budget.num_blocks * budget.bytes_per_block < budget.bytes_per_block
    )
    assert budget.capacity_tokens == budget.num_blocks * budget.block_size


def test_llama_2_7b_on_a100_holds_about_116k_tokens() -> None:
    # 79.15 GiB x 0.9 - 12.6 GiB weights - ~1.5 GiB reserve = ~57 GiB / 0.5 MiB per token.
    budget = kv_budget(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1)
    assert 100_000 < budget.capacity_tokens < 125_000


def test_explicit_reserve_is_subtracted_exactly() -> None:
    model, gpu = get_model("llama-2-7b"), get_gpu("a100-80gb")
    small = kv_budget(model, gpu, 1, activation_reserve_gb=1.0)
    large = kv_budget(model, gpu, 1, activation_reserve_gb=5.0)
    assert small.available_bytes - large.available_bytes == 4 * GIB
    assert large.num_blocks < small.num_blocks


def test_more_utilization_or_tp_gives_more_blocks_per_gpu() -> None:
    model, gpu = get_model("llama-2-70b"), get_gpu("a100-80gb")
    assert (
        kv_budget(model, gpu, 2, gpu_memory_utilization=0.95).num_blocks
        > kv_budget(model, gpu, 2).num_blocks
    )
    assert kv_budget(model, gpu, 4).num_blocks > kv_budget(model, gpu, 2).num_blocks


def test_block_size_trades_blocks_for_tokens_per_block() -> None:
    model, gpu = get_model("llama-2-7b"), get_gpu("a100-80gb")
    b16, b32 = kv_budget(model, gpu, 1, block_size=16), kv_budget(model, gpu, 1, block_size=32)
    assert b32.num_blocks == b16.num_blocks // 2


def test_pinned_blocks_override_the_estimate() -> None:
    budget = kv_budget(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1, kv_blocks=7000)
    assert budget.pinned and budget.num_blocks == 7000 and budget.capacity_tokens == 112_000


def test_llama_2_70b_does_not_fit_one_a100() -> None:
    with pytest.raises(UserError) as err:
        kv_budget(get_model("llama-2-70b"), get_gpu("a100-80gb"), 1)
    text = str(err.value)
    assert "128.5 GiB" in text  # weights per GPU
    assert "71.2 GiB" in text  # 79.15 GiB x 0.9
    assert "tensor_parallel >= 2" in text


def test_does_not_fit_even_when_pinned() -> None:
    with pytest.raises(UserError, match="does not fit"):
        kv_budget(get_model("llama-3-70b"), get_gpu("a100-40gb"), 2, kv_blocks=100)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpu_memory_utilization": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"block_size": 0},
        {"kv_blocks": 0},
        {"activation_reserve_gb": -1.0},
    ],
)
def test_bad_arguments_are_user_errors(kwargs: dict) -> None:
    with pytest.raises(UserError, match="memory."):
        kv_budget(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1, **kwargs)


def test_every_catalog_model_fits_some_h200_tp() -> None:
    for model in MODELS.values():
        if model.weight_bytes > 400e9:  # DeepSeek-V3: 8 H200 in fp8, 16 in bf16 (tests/test_moe_memory.py)
            tp = 8 if model.weight_bytes < 1000e9 else 16
        else:
            tp = 1 if model.num_params < 40e9 else 4
        budget = kv_budget(model, get_gpu("h200"), tp)
        assert budget.num_blocks > 0
