"""Roofline model of the linear ops, with efficiencies fitted on the profiled models.

Each op's ideal time is max(FLOPs / peak, bytes / bandwidth) on the GPU's datasheet
roofs; the measured time is a fixed per-kernel latency plus the ideal time divided by an
efficiency. The latency (a few microseconds: launch and the first wave's fill) is the
intercept of time against bytes over the memory-bound rows of <= 8 tokens, capped at 90%
of the op's fastest measured time; without it one efficiency per token count cannot
serve a 2560-wide and an 8192-wide model at once (small layers ran ~8% slower than
predicted on the H100). For every
op we fit two efficiency curves against the token count: a compute efficiency (median
over the profiled models and TP degrees of ideal/measured, on rows where the compute
roof binds) and a memory efficiency (the same on memory-bound rows), each on ~48
log-spaced token knots (median over a +-12% window). A model without a profile then
costs latency + max(FLOPs / (peak x e_c(T)), bytes / (bandwidth x e_m(T))) per op, on A100
(label "transferred") or any catalog GPU, whose roofs replace A100's
("uncalibrated (roofline)"). Leave-one-model-out fits measure how well this transfers.

FLOPs and bytes per op and GPU, for T tokens (h hidden, q/kv query/KV width per GPU,
f MLP width per GPU, d dtype bytes): a GEMM [T x k] x [k x n] costs 2Tkn FLOPs and
d(kn + Tk + Tn) bytes; norms read and write T x h, rope T x (q + kv), the residual add
reads two and writes one T x h, the activation reads 2f (gated) or f and writes f per
token, the embedding gathers T rows of h.
"""

from __future__ import annotations

import numpy as np

from sim.hardware.catalog import GPUSpec, ModelSpec

# Per-layer ops of the MLP profile, in forward order ("emb" runs once per model).
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
EMB = "emb"
LM_HEAD_OP = "mlp_up_proj"  # the LM head borrows the up-projection's efficiencies


OpWork = dict[str, tuple[np.ndarray, np.ndarray]]


def _gemm(tokens: np.ndarray, k: float, n: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    return 2.0 * tokens * k * n, d * (k * n + tokens * k + tokens * n)


def layer_ops(model: ModelSpec) -> list[str]:
    """The per-layer ops this architecture runs (subset of the profile's ops)."""
    skip = {"post_attention_layernorm"} if model.parallel_block else set()
    if not model.rotary:
        skip.add("attn_rope")
    return [op for op in LAYER_OPS if op not in skip]


def op_work(model: ModelSpec, tp: int, tokens: np.ndarray) -> OpWork:
    """(FLOPs, bytes) of each per-layer op and of the embedding, for each token count."""
    t, d, h = np.asarray(tokens, float), model.dtype_bytes, model.hidden_size
    q = model.q_heads_per_gpu(tp) * model.head_dim
    kv = model.kv_heads_per_gpu(tp) * model.head_dim
    f = model.mlp_hidden_size / tp
    zero = np.zeros_like(t)
    work = {
        "attn_pre_proj": _gemm(t, h, q + 2 * kv, d),
        "attn_post_proj": _gemm(t, q, h, d),
        "mlp_up_proj": _gemm(t, h, f * (2 if model.gated_mlp else 1), d),
        "mlp_down_proj": _gemm(t, f, h, d),
        "mlp_act": (zero, d * t * f * (3 if model.gated_mlp else 2)),
        "input_layernorm": (zero, 2.0 * d * t * h),
        "post_attention_layernorm": (zero, 2.0 * d * t * h),
        "attn_rope": (zero, 2.0 * d * t * (q + kv)),
        "add": (zero, 3.0 * d * t * h),
        EMB: (zero, (2.0 if model.rotary else 4.0) * d * t * h),
    }
    return {op: work[op] for op in [*layer_ops(model), EMB]}


def lm_head_work(model: ModelSpec, tp: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) of the LM head for ``rows`` sampled sequences."""
    return _gemm(
        np.asarray(rows, float), model.hidden_size, model.vocab_size / tp, model.dtype_bytes
    )


def ideal_s(flops: np.ndarray, nbytes: np.ndarray, gpu: GPUSpec) -> tuple[np.ndarray, np.ndarray]:
    return flops / (gpu.peak_bf16_tflops * 1e12), nbytes / (gpu.hbm_gb_per_s * 1e9)


def _efficiency(curve: list[float] | None, knots: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    if curve is None:
        return np.ones_like(tokens)
    return np.interp(np.log(tokens), np.log(knots), curve)


def _op_ms(
    eff: dict, op: str, flops: np.ndarray, nbytes: np.ndarray, tokens: np.ndarray, gpu: GPUSpec
) -> np.ndarray:
    knots = np.asarray(eff["tokens"], float)
    curves = eff["ops"][op]
    t_c, t_m = ideal_s(flops, nbytes, gpu)
    compute = t_c / _efficiency(curves["compute"], knots, tokens)
    memory = t_m / _efficiency(curves["memory"], knots, tokens)
    # Files fitted before latencies existed have none: their efficiencies absorbed it.
    return eff.get("latency_ms", {}).get(op, 0.0) + np.maximum(compute, memory) * 1e3


def op_ms(
    eff: dict, op: str, flops: np.ndarray, nbytes: np.ndarray, tokens: np.ndarray, gpu: GPUSpec
) -> np.ndarray:
    """ms of one op of ``flops`` and ``nbytes`` with ``op``'s latency and efficiencies at ``tokens``.

    ``tokens`` is the row count the kernel sees, which for an expert GEMM is the tokens per
    expert, not the batch (:mod:`sim.hardware.moe`).
    """
    return _op_ms(eff, op, np.asarray(flops, float), np.asarray(nbytes, float), np.asarray(tokens, float), gpu)


def predict_ops_ms(
    eff: dict, model: ModelSpec, tp: int, gpu: GPUSpec, tokens: np.ndarray
) -> dict[str, np.ndarray]:
    """Predicted ms of each per-layer op (and the embedding) at each token count."""
    tokens = np.asarray(tokens, float)
    return {
        op: _op_ms(eff, op, flops, nbytes, tokens, gpu)
        for op, (flops, nbytes) in op_work(model, tp, tokens).items()
    }


def predict_linear_ms(
    eff: dict, model: ModelSpec, tp: int, gpu: GPUSpec, tokens: np.ndarray
) -> np.ndarray:
    """Predicted per-iteration linear-op ms: layers x per-layer sum + embedding."""
    per_op = predict_ops_ms(eff, model, tp, gpu, tokens)
    per_layer = sum(ms for op, ms in per_op.items() if op != EMB)
    return model.num_layers * per_layer + per_op[EMB]


def predict_lm_head_ms(
    eff: dict, model: ModelSpec, tp: int, gpu: GPUSpec, rows: np.ndarray
) -> np.ndarray:
    """Predicted LM-head ms for each row count (the up-projection's efficiencies)."""
    rows = np.asarray(rows, float)
    flops, nbytes = lm_head_work(model, tp, rows)
    return _op_ms(eff, LM_HEAD_OP, flops, nbytes, rows, gpu)


