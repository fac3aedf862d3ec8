"""Linear-op cost of mixture-of-experts (MoE) and multi-head latent attention (MLA) models.

A MoE layer sends each of its B tokens to ``top_k`` of ``E`` routed experts. Under uniform
routing, an expert is missed by one token with probability 1 - k/E, so B tokens touch

    D(B) = E x (1 - (1 - k/E)^B)

distinct experts in expectation, each receiving B x k / D(B) tokens. Each touched expert's
weights are read once (memory-bound at small B: D grows almost like B x k), and the FLOPs are
those of B x k token-expert pairs (compute-bound at large B, where D saturates at E). Each
expert GEMM is priced with the roofline efficiencies fitted on the dense profiles
(:mod:`sim.hardware.roofline`), looked up at the GEMM's own row count, the tokens per expert,
not at B: that is why a MoE model stays memory-bound to much larger batches than a dense one.
The fused MoE kernel pays one launch latency per projection, not one per expert, and its activation
is one elementwise kernel over all B x k routed rows. Against vLLM's fused-MoE kernel times for
Mixtral-8x7B at TP2 on H100 (vLLM PR #24700) this is within 3% at decode batches 8-256 and within
11% at every batch from 1 to 1536 (tests/test_moe_cost.py).

Because the expectation depends on B alone, the whole MoE cost is a function of the token
count and is folded into the same precomputed ``linear`` curve as a dense model's
(:mod:`sim.hardware.transfer`): the engine's hot path is unchanged.

Parallelism (``tensor_parallel`` GPUs per replica, ``expert_parallel`` N dividing it):
attention, shared experts and dense layers are tensor-parallel over all TP GPUs; the routed
experts are split into N groups of E/N experts, each expert tensor-parallel over TP/N GPUs.
With N > 1 every MoE layer adds a dispatch and a combine all-to-all, priced on the GPU's link
(see :func:`all_to_all_ms`). ``imbalance`` >= 1 says how much more than its fair share of
token-expert pairs the busiest expert-parallel group receives (it only matters when N > 1).

MLA (DeepSeek) is priced *absorbed* for decode: the key/value up-projection is folded into the
query and output projections, so attention reads the kv_lora_rank + rope_dim latent once per
cached token (one shared "KV head" of 576 values for DeepSeek-V3) for every query head. Prefill
is priced un-absorbed, as multi-head attention with qk head dim nope + rope and value dim v.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sim.errors import UserError
from sim.hardware import roofline
from sim.hardware.catalog import GPUSpec, ModelSpec, MoESpec

# Fixed cost of one all-to-all (NCCL/DeepEP launch and synchronisation), the same constant
# the PCIe all-reduce roofline uses (scaling.PCIE_LATENCY_MS).
A2A_LATENCY_MS = 0.03
# Share of the link's per-direction bandwidth a collective achieves: A100 NCCL all-reduce in
# the Vidur profiles moves 156-174 GB/s bus bandwidth on 300 GB/s NVLink.
A2A_LINK_EFFICIENCY = 0.55

# (efficiency-curve op, FLOPs, bytes, tokens at which that op's efficiency is looked up)
Op = tuple[str, np.ndarray, np.ndarray, np.ndarray]


def expected_distinct_experts(tokens: np.ndarray | float, top_k: int, num_experts: int) -> np.ndarray:
    """Expected distinct experts B tokens touch with top-k uniform routing: E x (1 - (1 - k/E)^B)."""
    t = np.asarray(tokens, float)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** t)


def tokens_per_expert(tokens: np.ndarray | float, top_k: int, num_experts: int) -> np.ndarray:
    """Mean tokens each touched expert receives: B x k / D(B) (at least 1 for B >= 1)."""
    t = np.asarray(tokens, float)
    return t * top_k / expected_distinct_experts(t, top_k, num_experts)


def check_expert_parallel(model: ModelSpec, tensor_parallel: int, expert_parallel: int) -> None:
    """Reject an expert-parallel degree the model or the replica cannot be split by.

    Raises:
        UserError: N > 1 on a dense model, N does not divide tensor_parallel (the GPUs of a
            replica) or the number of routed experts.
    """
    n = expert_parallel
    if n == 1:
        return
    if model.moe is None:
        raise UserError(f"{model.name} has no experts; expert_parallel must be 1, got {n}", field="expert_parallel")
    if tensor_parallel % n:
        raise UserError(
            f"{n} does not divide tensor_parallel = {tensor_parallel} (experts are split over the GPUs "
            f"of one replica)",
            field="expert_parallel",
        )
    if model.moe.num_experts % n:
        raise UserError(
            f"{n} does not divide the {model.moe.num_experts} experts of {model.name}", field="expert_parallel"
        )


def attention_views(model: ModelSpec) -> tuple[ModelSpec, ModelSpec]:
    """Head layouts the attention fit is scaled to: (decode, prefill).

    Without MLA both are the model itself. With MLA, decode is absorbed: every query head
    attends over one shared latent "KV head" of kv_lora_rank + rope_dim values; prefill is
    multi-head attention with query/key head dim nope + rope.
    """
    if model.mla is None:
        return model, model
    mla = model.mla
    decode = dataclasses.replace(model, num_kv_heads=1, explicit_head_dim=mla.cached_width, mla=None)
    prefill = dataclasses.replace(model, explicit_head_dim=mla.nope_dim + mla.rope_dim, mla=None)
    return decode, prefill


def _gemm(t: np.ndarray, k: float, n: float, weight_b: int, act_b: int) -> tuple[np.ndarray, np.ndarray]:
    """[t x k] x [k x n]: FLOPs, and bytes with weights and activations at their own widths."""
    return 2.0 * t * k * n, weight_b * k * n + act_b * (t * k + t * n)


def _common_ops(model: ModelSpec, tp: int, t: np.ndarray) -> list[Op]:
    """Per-layer ops outside the FFN: attention projections, norms, rope, residual add."""
    dense = roofline.op_work(model, tp, t)
    keep = ("input_layernorm", "post_attention_layernorm", "add")
    ops: list[Op] = [(op, *dense[op], t) for op in keep if op in dense]
    wb, d, h = model.weight_bytes_per_param, model.dtype_bytes, model.hidden_size
    heads = model.q_heads_per_gpu(tp)
    if model.mla is None:
        q, kv = heads * model.head_dim, model.kv_heads_per_gpu(tp) * model.head_dim
        ops.append(("attn_pre_proj", *_gemm(t, h, q + 2 * kv, wb, d), t))
        ops.append(("attn_post_proj", *_gemm(t, q, h, wb, d), t))
        if "attn_rope" in dense:
            ops.append(("attn_rope", *dense["attn_rope"], t))
        return ops
    return ops + _mla_ops(model, heads, t)


def _mla_ops(model: ModelSpec, heads: int, t: np.ndarray) -> list[Op]:
    """MLA projections on one GPU holding ``heads`` query heads.

    The down-projections (query bottleneck, KV latent) are replicated on every rank, as vLLM
    does; the up-projections and the output are split by head. The KV up-projection is applied
    once per new token: in absorbed decode it multiplies the query and the output instead, with
    the same FLOPs and weight bytes.
    """
    assert model.mla is not None
    mla, wb, d, h = model.mla, model.weight_bytes_per_param, model.dtype_bytes, model.hidden_size
    qk = heads * (mla.nope_dim + mla.rope_dim)
    zero = np.zeros_like(t)
    if mla.q_lora_rank:
        query = [_gemm(t, h, mla.q_lora_rank, wb, d), _gemm(t, mla.q_lora_rank, qk, wb, d)]
    else:
        query = [_gemm(t, h, qk, wb, d)]
    ops: list[Op] = [("attn_pre_proj", *work, t) for work in query]
    ops.append(("attn_pre_proj", *_gemm(t, h, mla.cached_width, wb, d), t))
    ops.append(("attn_pre_proj", *_gemm(t, mla.kv_lora_rank, heads * (mla.nope_dim + mla.v_head_dim), wb, d), t))
    ops.append(("attn_post_proj", *_gemm(t, heads * mla.v_head_dim, h, wb, d), t))
    latent_norms = 2.0 * d * t * (mla.q_lora_rank + mla.kv_lora_rank)
    ops.append(("input_layernorm", zero, latent_norms, t))
    ops.append(("attn_rope", zero, 2.0 * d * t * (heads + 1) * mla.rope_dim, t))
    return ops


def _mlp_ops(t: np.ndarray, pairs: np.ndarray, touched: np.ndarray, h: int, f: float, wb: int, d: int) -> list[Op]:
    """Gated MLP of width ``f`` over ``pairs`` token rows spread on ``touched`` weight copies.

    A dense MLP is touched = 1, pairs = t. The projections' efficiency is looked up at the rows each
    weight matrix sees (pairs / touched); the activation between them is one elementwise kernel over all
    ``pairs`` rows (vLLM's fused MoE runs ``silu_and_mul`` once on the grouped intermediate), so at its
    own row count: looked up per expert, a kernel of a few KB was priced like eight dense ones.
    """
    rows = pairs / touched
    up_flops, up_bytes = 2.0 * pairs * h * 2 * f, wb * touched * h * 2 * f + d * pairs * (h + 2 * f)
    down_flops, down_bytes = 2.0 * pairs * f * h, wb * touched * f * h + d * pairs * (f + h)
    return [
        ("mlp_up_proj", up_flops, up_bytes, rows),
        ("mlp_act", np.zeros_like(t), d * pairs * f * 3, pairs),  # one elementwise kernel over every pair's row
        ("mlp_down_proj", down_flops, down_bytes, rows),
    ]


def _moe_ops(model: ModelSpec, moe: MoESpec, tp: int, ep: int, t: np.ndarray, imbalance: float) -> list[Op]:
    """Router, shared experts and routed experts of one MoE layer on the busiest GPU."""
    wb, d, h = model.weight_bytes_per_param, model.dtype_bytes, model.hidden_size
    ones = np.ones_like(t)
    ops: list[Op] = []
    if moe.num_experts > 1:  # replicated on every rank; kept in bf16 in released checkpoints
        ops.append(("mlp_up_proj", *_gemm(t, h, moe.num_experts, d, d), t))
    if moe.shared_experts:
        ops += _mlp_ops(t, t, ones, h, moe.shared_experts * moe.expert_ffn / tp, wb, d)
    touched = expected_distinct_experts(t, moe.top_k, moe.num_experts) / ep
    # The busiest group gets `imbalance` x its fair share, never more than every pair.
    pairs = t * moe.top_k / ep * min(max(imbalance, 1.0), float(ep))
    return ops + _mlp_ops(t, pairs, touched, h, moe.expert_ffn / (tp // ep), wb, d)


def all_to_all_ms(model: ModelSpec, ep: int, gpu: GPUSpec, tokens: np.ndarray) -> np.ndarray:
    """Dispatch + combine all-to-all of one MoE layer (ms), zero without expert parallelism.

    Each of the N ranks dispatches its 1/N share of the tokens to their k experts, (N-1)/N of
    which live on other ranks, and receives the results back: per direction
    B/N x k x (N-1)/N x hidden x dtype bytes over the GPU's link at ``A2A_LINK_EFFICIENCY``.
    """
    t = np.asarray(tokens, float)
    if ep == 1 or model.moe is None:
        return np.zeros_like(t)
    message = t / ep * model.moe.top_k * (ep - 1) / ep * model.hidden_size * model.dtype_bytes
    link_bytes_per_ms = gpu.nvlink_gb_per_s * 1e9 * A2A_LINK_EFFICIENCY * 1e-3
    return 2.0 * (A2A_LATENCY_MS + message / link_bytes_per_ms)


def _ops_ms(eff: dict, ops: list[Op], gpu: GPUSpec) -> np.ndarray:
    total = np.zeros_like(ops[0][3])
    for op, flops, nbytes, lookup in ops:
        total = total + roofline.op_ms(eff, op, flops, nbytes, lookup, gpu)
    return total


def predict_linear_ms(
    eff: dict,
    model: ModelSpec,
    tp: int,
    gpu: GPUSpec,
    tokens: np.ndarray,
    *,
    expert_parallel: int = 1,
    imbalance: float = 1.0,
) -> np.ndarray:
    """Expected per-iteration linear-op ms (all layers, embedding, all-to-alls) at each token count.

    Args:
        eff: the roofline file's ``efficiency`` section.
        model: a MoE and/or MLA model (a dense one is priced as its dense layers).
        tp: GPUs per replica (attention and dense parts are split over all of them).
        gpu: the GPU whose roofs apply.
        tokens: token counts B of the batch.
        expert_parallel: expert groups N (divides ``tp``).
        imbalance: busiest group's share of token-expert pairs over the fair share (>= 1).
    """
    t = np.asarray(tokens, float)
    ops = roofline.op_work(model, tp, t)
    emb = roofline.op_ms(eff, roofline.EMB, *ops[roofline.EMB], t, gpu)
    common = _ops_ms(eff, _common_ops(model, tp, t), gpu)
    moe = model.moe
    dense_layers = model.num_layers if moe is None else moe.dense_layers
    f = model.mlp_hidden_size / tp
    dense = _ops_ms(eff, _mlp_ops(t, t, np.ones_like(t), model.hidden_size, f, model.weight_bytes_per_param,
                                  model.dtype_bytes), gpu)
    total = model.num_layers * common + dense_layers * dense + emb
    if moe is not None:
        moe_ms = _ops_ms(eff, _moe_ops(model, moe, tp, expert_parallel, t, imbalance), gpu)
        total = total + (model.num_layers - moe.dense_layers) * (moe_ms + all_to_all_ms(model, expert_parallel, gpu, t))
    return total
