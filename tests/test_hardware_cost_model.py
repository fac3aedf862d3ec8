"""Cost model: physical floors, monotonicity, breakdowns and the three provenance paths.

These use only the committed calibration files (no ../shared needed).
"""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import UserError
from sim.hardware import COMPONENTS, MODELS, get_gpu, get_model, load_cost_model

EMPTY = np.zeros(0, dtype=np.int64)


def decode_time_s(cost, contexts) -> float:  # type: ignore[no-untyped-def]
    return cost.iteration_time_s(EMPTY, EMPTY, np.asarray(contexts))


def prefill_time_s(cost, tokens: int, context: int = 0) -> float:  # type: ignore[no-untyped-def]
    return cost.iteration_time_s(np.array([tokens]), np.array([context]), EMPTY)


@pytest.fixture(scope="module")
def llama7b():  # type: ignore[no-untyped-def]
    return load_cost_model("llama-2-7b", "a100-80gb", 1)


@pytest.mark.parametrize("cpu", [True, False])
def test_llama_2_7b_single_decode_between_weight_floor_and_15_ms(cpu: bool) -> None:
    cost = load_cost_model("llama-2-7b", "a100-80gb", 1, cpu_overhead=cpu)
    # Every weight is read once per forward pass: 13.5 GB / 2.0 TB/s = 6.7 ms.
    assert 6.7e-3 < decode_time_s(cost, [128]) < 15e-3


def test_llama_2_7b_prefill_2048_above_flop_floor(llama7b) -> None:  # type: ignore[no-untyped-def]
    # 2 FLOPs per parameter per token at the 312 TFLOP/s peak: 88 ms.
    assert prefill_time_s(llama7b, 2048) > 2 * 6.7e9 * 2048 / 312e12


CASES = [
    (m, g, tp)
    for m in MODELS
    for g, tp in (("a100-80gb", 1), ("a100-80gb", 2), ("h100-sxm", 1), ("h200", 4))
    if get_model(m).num_q_heads % tp == 0 and get_model(m).num_kv_heads % tp == 0
    # Dense floors (every weight read, every parameter's FLOPs); MoE floors: tests/test_moe_cost.py.
    and get_model(m).moe is None
]


@pytest.mark.parametrize("model,gpu,tp", CASES)
def test_every_model_and_gpu_respects_roofline_floors(model: str, gpu: str, tp: int) -> None:
    spec, roofs = get_model(model), get_gpu(gpu)
    cost = load_cost_model(model, gpu, tp, cpu_overhead=False)
    weight_floor_s = spec.weight_bytes / tp / (roofs.hbm_gb_per_s * 1e9)
    assert decode_time_s(cost, [16]) > weight_floor_s
    # Layer matmuls only: the LM head runs for one row, embeddings are a gather.
    matmul_params = (
        spec.num_params - (1 if spec.tied_embeddings else 2) * spec.vocab_size * spec.hidden_size
    )
    assert prefill_time_s(cost, 4096) > 2 * matmul_params * 4096 / tp / (
        roofs.peak_bf16_tflops * 1e12
    )


def test_labels_follow_provenance() -> None:
    assert load_cost_model("llama-2-7b", "a100-80gb", 1).label == "calibrated"
    assert load_cost_model("llama-2-7b", "a100-80gb", 2).label == "transferred"
    assert load_cost_model("qwen2.5-7b", "a100-80gb", 1).label == "transferred"  # no calibrated same-shape model
    assert load_cost_model("llama-2-7b", "h100-sxm", 1).label == "calibrated"
    assert load_cost_model("mistral-7b", "h100-sxm", 1).label == "transferred (h100 profiles)"
    assert load_cost_model("llama-2-7b", "h200", 1).label == "uncalibrated (roofline)"
    assert "llama-2-7b_a100-80gb_tp1.yaml" in load_cost_model("llama-2-7b", "a100-80gb", 1).source
    assert "MIT" in load_cost_model("mistral-7b", "h200", 1).source


@pytest.mark.parametrize(
    "args,match",
    [
        (("llama-2-7x", "a100-80gb", 1), "did you mean"),
        (("llama-2-7b", "a100", 1), "gpu"),
        (("llama-2-7b", "a100-80gb", 3), "tensor_parallel"),
        (("llama-2-70b", "a100-80gb", 32), "all-reduce"),
    ],
)
def test_bad_names_and_tp_are_user_errors(args: tuple, match: str) -> None:
    with pytest.raises(UserError, match=match):
        load_cost_model(*args)


def test_breakdown_sums_to_total_and_matches_totals_path(llama7b) -> None:  # type: ignore[no-untyped-def]
    chunk, ctx, dec = np.array([300, 64]), np.array([1000, 0]), np.array([5, 900, 2000])
    total, parts = llama7b.iteration_time_s(chunk, ctx, dec, breakdown=True)
    assert set(parts) <= set(COMPONENTS)
    assert {"linear", "lm_head", "attention_prefill", "attention_decode", "cpu_overhead"} == set(
        parts
    )
    assert sum(parts.values()) == total
    work = float(300 * (1000 + 150) + 64 * 32)
    assert llama7b.time_from_totals_s(364, 2, work, 3, 2905) == total
    assert all(v > 0 for v in parts.values())


def test_cpu_overhead_switch_removes_exactly_that_component() -> None:
    on = load_cost_model("llama-2-70b", "a100-80gb", 4)
    off = load_cost_model("llama-2-70b", "a100-80gb", 4, cpu_overhead=False)
    t_on, parts = on.iteration_time_s(EMPTY, EMPTY, np.full(32, 500), breakdown=True)
    t_off, parts_off = off.iteration_time_s(EMPTY, EMPTY, np.full(32, 500), breakdown=True)
    assert "cpu_overhead" not in parts_off and parts["all_reduce"] > 0
    assert t_on - t_off == pytest.approx(parts["cpu_overhead"])


def test_empty_batch_costs_nothing(llama7b) -> None:  # type: ignore[no-untyped-def]
    assert llama7b.iteration_time_s(EMPTY, EMPTY, EMPTY) == 0.0
    assert llama7b.time_from_totals_s(0, 0, 0.0, 0, 0) == 0.0


def test_mismatched_prefill_arrays_rejected(llama7b) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        llama7b.iteration_time_s(np.array([1, 2]), np.array([0]), EMPTY)


def test_decode_is_memory_bound_and_prefill_compute_bound(llama7b) -> None:  # type: ignore[no-untyped-def]
    # Decoding 16 sequences costs far less than 16 single decodes (weights are read once)...
    assert decode_time_s(llama7b, [100] * 16) < 2 * decode_time_s(llama7b, [100])
    # ...while a long prefill scales about linearly with its tokens (past the profiled 4096
    # tokens the curve is extrapolated).
    ratio = prefill_time_s(llama7b, 8192) / prefill_time_s(llama7b, 4096)
    assert 1.9 < ratio < 2.6


def test_faster_memory_means_faster_decode() -> None:
    times = [
        decode_time_s(load_cost_model("llama-2-7b", g, 1, cpu_overhead=False), [1000] * 64)
        for g in ("a100-40gb", "a100-80gb", "h100-sxm", "h200")
    ]
    assert times == sorted(times, reverse=True)


def test_gqa_model_decodes_long_contexts_cheaper() -> None:
    mha = load_cost_model("llama-2-7b", "a100-80gb", 1).iteration_time_s(
        EMPTY, EMPTY, np.full(64, 3000), breakdown=True
    )[1]
    gqa = load_cost_model("llama-3-8b", "a100-80gb", 1).iteration_time_s(
        EMPTY, EMPTY, np.full(64, 3000), breakdown=True
    )[1]
    assert gqa["attention_decode"] < 0.5 * mha["attention_decode"]


def test_transferred_roofline_agrees_with_calibration_on_profiled_model() -> None:
    calibrated = load_cost_model("llama-2-70b", "a100-80gb", 4, cpu_overhead=False)
    transferred = load_cost_model("llama-2-70b", "a100-80gb", 8, cpu_overhead=False)
    # Twice the GPUs: linear ops at large batches take about half as long.
    for tokens in (1024, 4096):
        lin4 = calibrated.iteration_time_s(
            np.array([tokens]), np.array([0]), EMPTY, breakdown=True
        )[1]["linear"]
        lin8 = transferred.iteration_time_s(
            np.array([tokens]), np.array([0]), EMPTY, breakdown=True
        )[1]["linear"]
        assert 0.4 < lin8 / lin4 < 0.65


COST_MODELS = [
    ("llama-2-7b", "a100-80gb", 1),
    ("llama-2-70b", "a100-80gb", 2),
    ("qwen2.5-7b", "a100-80gb", 2),
    ("opt-13b", "h100-sxm", 1),
]
batches = st.tuples(
    st.lists(
        st.tuples(st.integers(1, 3000), st.integers(0, 6000)), max_size=4
    ),  # prefill (chunk, context)
    st.lists(st.integers(1, 8000), max_size=300),  # decode contexts
)


@pytest.fixture(scope="module")
def cost_models():  # type: ignore[no-untyped-def]
    return [load_cost_model(*args) for args in COST_MODELS]


def _time(cost, prefill: list[tuple[int, int]], decode: list[int]) -> float:  # type: ignore[no-untyped-def]
    chunk = np.array([c for c, _ in prefill], dtype=np.int64)
    ctx = np.array([k for _, k in prefill], dtype=np.int64)
    return cost.iteration_time_s(chunk, ctx, np.array(decode, dtype=np.int64))


@settings(max_examples=examples(1.5))
@given(
    batch=batches,
    which=st.integers(0, 3),
    grow=st.integers(1, 2000),
    kind=st.sampled_from(["chunk", "context", "decode_context", "new_decode", "new_prefill"]),
)
def test_time_never_decreases_when_batch_grows(cost_models, batch, which, grow, kind) -> None:  # type: ignore[no-untyped-def]
    prefill, decode = batch
    bigger_prefill, bigger_decode = list(prefill), list(decode)
    if kind in ("chunk", "context") and prefill:
        i = which % len(prefill)
        c, k = prefill[i]
        bigger_prefill[i] = (c + grow, k) if kind == "chunk" else (c, k + grow)
    elif kind == "decode_context" and decode:
        bigger_decode[which % len(decode)] += grow
    elif kind == "new_decode":
        bigger_decode.append(grow)
    else:
        bigger_prefill.append((grow, which * 100))
    for cost in cost_models:
        assert _time(cost, bigger_prefill, bigger_decode) >= _time(cost, prefill, decode)
