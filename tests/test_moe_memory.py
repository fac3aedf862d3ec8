"""Mixture-of-experts catalog and memory: total vs active parameters, MLA's small KV, models that do not fit."""

from __future__ import annotations

import dataclasses

import pytest

from sim.errors import UserError
from sim.hardware.catalog import get_gpu, get_model
from sim.hardware.memory import GIB, kv_budget, kv_bytes_per_token

# (total, active) billions from each model card; ours leave out norms, biases and (V3) the MTP layer.
CARDS = {
    "mixtral-8x7b": (46.7, 12.9),
    "mixtral-8x22b": (141.0, 39.0),
    "deepseek-v2-lite": (15.7, 2.4),
    "deepseek-v3": (671.0, 37.0),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_total_and_active_parameters_match_the_model_card(name: str) -> None:
    model = get_model(name)
    total, active = CARDS[name]
    assert model.num_params / 1e9 == pytest.approx(total, rel=0.01)
    # Cards round the active count and some leave the embeddings out: within 12%.
    assert model.active_params / 1e9 == pytest.approx(active, rel=0.12)
    assert model.active_params < model.num_params / 3


def test_deepseek_v3_mla_kv_is_576_values_per_layer() -> None:
    v3 = get_model("deepseek-v3")
    assert v3.mla is not None and v3.mla.kv_lora_rank + v3.mla.rope_dim == 576
    per_token = kv_bytes_per_token(v3, 1)
    assert per_token == 576 * 61 * 2 == 70_272  # ~70 KB per token in bf16
    # The latent is shared by all heads: every tensor-parallel rank holds all of it.
    assert kv_bytes_per_token(v3, 8) == per_token
    # The same model with Llama-3-70B-style GQA (8 KV heads of 128) would cache 3.5x more,
    # and with plain multi-head attention over its 128 heads 57x more.
    gqa = dataclasses.replace(v3, mla=None, num_kv_heads=8, explicit_head_dim=128)
    mha = dataclasses.replace(v3, mla=None, explicit_head_dim=128)
    assert kv_bytes_per_token(gqa, 1) > 3.5 * per_token
    assert kv_bytes_per_token(mha, 1) > 50 * per_token


def test_weights_count_total_parameters_and_fp8_halves_them() -> None:
    fp8, bf16 = get_model("deepseek-v3"), get_model("deepseek-v3-bf16")
    assert fp8.num_params == bf16.num_params and fp8.active_params == bf16.active_params
    embeddings = fp8.embedding_params * 2  # embeddings and LM head stay bf16
    assert fp8.weight_bytes == fp8.num_params - fp8.embedding_params + embeddings
    assert bf16.weight_bytes == 2 * bf16.num_params
    h200 = kv_budget(fp8, get_gpu("h200"), 8)
    assert h200.weight_bytes_per_gpu == -(-fp8.weight_bytes // 8)


def test_deepseek_v3_bf16_on_eight_a100_does_not_fit_and_says_by_how_much() -> None:
    model, gpu = get_model("deepseek-v3-bf16"), get_gpu("a100-80gb")
    with pytest.raises(UserError, match="does not fit on a100-80gb at tensor_parallel=8") as info:
        kv_budget(model, gpu, 8)
    message = str(info.value)
    assert "167.8 GB" in message  # 1342 GB of bf16 weights / 8
    usable = gpu.memory_gb * 0.9
    short = model.weight_bytes / 8 / GIB - usable  # before the activation reserve
    assert short > 80  # more than a whole A100's usable memory per GPU
    assert "GiB short per GPU" in message


def test_deepseek_v3_on_eight_gpus_fits_only_in_fp8_on_h200() -> None:
    fp8, bf16 = get_model("deepseek-v3"), get_model("deepseek-v3-bf16")
    for model, gpu in [(fp8, "a100-80gb"), (fp8, "h100-sxm"), (bf16, "h200")]:
        with pytest.raises(UserError, match="does not fit"):
            kv_budget(model, get_gpu(gpu), 8)
    budget = kv_budget(fp8, get_gpu("h200"), 8)
    # ~40 GiB per GPU of latent cache: hundreds of thousands of tokens at 70 KB each.
    assert budget.capacity_tokens * 70_272 / GIB == pytest.approx(budget.available_bytes / GIB, rel=0.01)
    assert budget.capacity_tokens > 500_000
