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

from collections.abc import Mapping

import numpy as np
import pandas as pd

from sim.hardware.catalog import GPUSpec, ModelSpec, get_model
from sim.hardware.curves import error_summary, log_spaced_indices
from sim.hardware.profiles import LAYER_OPS

EFFICIENCY_KNOTS = 48
WINDOW = 1.12
EMB = "emb"
LM_HEAD_OP = "mlp_up_proj"  # the LM head borrows the up-projection's efficiencies

LATENCY_MAX_TOKENS = 8
LATENCY_CAP = 0.9

EFFICIENCY_NOTE = (
    "per op: time = latency + max(FLOPs / (peak x compute), bytes / (bandwidth x memory)); "
    "latency: intercept of time vs bytes on memory-bound rows of <= 8 tokens (capped at 90% of "
    "the op's fastest time); compute and "
    "memory are medians of ideal/measured over the six profiled models and their TP degrees, "
    "on rows where "
    "that roof binds, in a +-12% token window around each knot; interpolated in log(tokens)"
)

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


def _ideal_s(flops: np.ndarray, nbytes: np.ndarray, gpu: GPUSpec) -> tuple[np.ndarray, np.ndarray]:
    return flops / (gpu.peak_bf16_tflops * 1e12), nbytes / (gpu.hbm_gb_per_s * 1e9)


def efficiency_rows(
    tables: Mapping[str, pd.DataFrame], gpu: GPUSpec, latency_ms: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """One row per (model, TP, op, tokens): ideal / (measured - latency), the binding roof,
    the memory-roof time and the measured time (seconds)."""
    latency_ms = latency_ms or {}
    frames = []
    for name, table in tables.items():
        model = get_model(name)
        for tp, rows in table.groupby("tp"):
            tokens = rows["tokens"].to_numpy(float)
            for op, (flops, nbytes) in op_work(model, int(tp), tokens).items():
                if op not in rows.columns:
                    continue
                t_c, t_m = _ideal_s(flops, nbytes, gpu)
                measured_s = rows[op].to_numpy(float) * 1e-3
                busy_s = np.maximum(measured_s - latency_ms.get(op, 0.0) * 1e-3, 1e-12)
                frames.append(
                    pd.DataFrame(
                        {
                            "model": name,
                            "op": op,
                            "tokens": tokens,
                            "ratio": np.maximum(t_c, t_m) / busy_s,
                            "compute_bound": t_c > t_m,
                            "memory_s": t_m,
                            "measured_s": measured_s,
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


def fit_latencies(rows: pd.DataFrame) -> dict[str, float]:
    """Per-op fixed latency (ms): intercept of measured time vs memory-roof time over the
    memory-bound rows of <= LATENCY_MAX_TOKENS tokens, in [0, 90% of the fastest row]."""
    latency = {}
    for op, op_rows in rows.groupby("op", sort=False):
        small = op_rows[(op_rows["tokens"] <= LATENCY_MAX_TOKENS) & ~op_rows["compute_bound"]]
        if len(small) < 2:
            latency[str(op)] = 0.0
            continue
        design = np.column_stack([np.ones(len(small)), small["memory_s"]])
        (intercept, _), *_ = np.linalg.lstsq(design, small["measured_s"], rcond=None)
        cap = LATENCY_CAP * float(op_rows["measured_s"].min())
        latency[str(op)] = round(max(0.0, min(float(intercept), cap)) * 1e3, 7)
    return latency


def _window_medians(rows: pd.DataFrame, knots: np.ndarray, bound: pd.Series) -> list[float] | None:
    """Median ratio per knot over rows bound by this roof, where they are the majority.

    Near A100's ridge both roofs are close and both efficiencies dip; knots where this
    roof binds for fewer than half the rows take the nearest majority knot's value, so
    a GPU with a different ridge does not inherit A100's knee at the wrong token count.
    """
    if not bound.any():
        return None
    values = []
    for k in knots:
        window = rows["tokens"].between(k / WINDOW, k * WINDOW)
        majority = bound[window].mean() >= 0.5
        values.append(rows.loc[window & bound, "ratio"].median() if majority else np.nan)
    return [round(float(v), 4) for v in pd.Series(values).ffill().bfill()]


def fit_efficiencies(tables: Mapping[str, pd.DataFrame], gpu: GPUSpec) -> dict:
    """Latencies and efficiency curves per op from the MLP profiles of several models.

    Returns:
        ``{"tokens": [...], "latency_ms": {op: ms}, "ops": {op: {"compute": [...] | None,
        "memory": [...]}}}`` (see the module doc).
    """
    latency = fit_latencies(efficiency_rows(tables, gpu))
    rows = efficiency_rows(tables, gpu, latency)
    grid = np.unique(rows["tokens"])
    knots = grid[log_spaced_indices(grid, EFFICIENCY_KNOTS)]
    ops = {}
    for op, op_rows in rows.groupby("op", sort=False):
        bound = op_rows["compute_bound"]
        ops[str(op)] = {
            "compute": _window_medians(op_rows, knots, bound),
            "memory": _window_medians(op_rows, knots, ~bound),
        }
    return {"tokens": [int(k) for k in knots], "latency_ms": latency, "ops": ops}


def _efficiency(curve: list[float] | None, knots: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    if curve is None:
        return np.ones_like(tokens)
    return np.interp(np.log(tokens), np.log(knots), curve)


def _op_ms(
    eff: dict, op: str, flops: np.ndarray, nbytes: np.ndarray, tokens: np.ndarray, gpu: GPUSpec
) -> np.ndarray:
    knots = np.asarray(eff["tokens"], float)
    curves = eff["ops"][op]
    t_c, t_m = _ideal_s(flops, nbytes, gpu)
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


def leave_one_model_out(tables: Mapping[str, pd.DataFrame], gpu: GPUSpec) -> dict[str, dict]:
    """Transfer error per profiled model: fit on the others, predict its linear ops.

    Returns, per held-out model, MAPE / worst / rows over every profiled (TP, tokens)
    of the per-layer linear-op sum, plus the mean signed error (``bias``).
    """
    report = {}
    for held_out, table in tables.items():
        eff = fit_efficiencies({m: t for m, t in tables.items() if m != held_out}, gpu)
        measured, predicted = _per_layer_pairs(eff, held_out, table, gpu)
        summary = error_summary(predicted, measured)
        summary["bias"] = round(float(np.mean((predicted - measured) / measured)), 4)
        report[held_out] = summary
    return report


def _per_layer_pairs(
    eff: dict, name: str, table: pd.DataFrame, gpu: GPUSpec
) -> tuple[np.ndarray, np.ndarray]:
    model = get_model(name)
    measured, predicted = [], []
    for tp, rows in table.groupby("tp"):
        tokens = rows["tokens"].to_numpy(float)
        ops = [op for op in layer_ops(model) if op in rows.columns]
        per_op = predict_ops_ms(eff, model, int(tp), gpu, tokens)
        measured.append(rows[ops].sum(axis=1).to_numpy(float))
        predicted.append(sum(per_op[op] for op in ops))
    return np.concatenate(measured), np.concatenate(predicted)


def transfer_pairs(tables: Mapping[str, pd.DataFrame], held_out: str, gpu: GPUSpec) -> pd.DataFrame:
    """Measured vs leave-one-out predicted per-layer ms of ``held_out`` (for plots)."""
    eff = fit_efficiencies({m: t for m, t in tables.items() if m != held_out}, gpu)
    table = tables[held_out]
    measured, predicted = _per_layer_pairs(eff, held_out, table, gpu)
    return pd.DataFrame(
        {
            "tp": np.concatenate([r["tp"].to_numpy() for _, r in table.groupby("tp")]),
            "tokens": np.concatenate([r["tokens"].to_numpy() for _, r in table.groupby("tp")]),
            "measured_ms": measured,
            "predicted_ms": predicted,
        }
    )
