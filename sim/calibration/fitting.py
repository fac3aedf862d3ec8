"""Fitting each cost component to the profile tables of :mod:`sim.calibration.profiles`.

All times are per-layer or per-iteration milliseconds, as in the profiles.

* Linear ops: knots at every profiled token count, per iteration
  (layers x sum of per-layer op medians + embedding), made monotone by an isotonic
  (least-squares non-decreasing) fit. Held out, it beats the running max on every GPU:
  a running max carries a slow outlier over every faster count after it (H100 profiles
  have several), while the least-squares fit splits the difference.
* LM head (not profiled): this model's measured MLP up-projection at the same row count,
  times vocab / up-projection width. Both are GEMMs reading the same [rows x hidden]
  input; on a roofline their FLOPs and weight bytes scale by that same ratio.
* Attention: analytic forms fitted by non-negative least squares on relative error
  (rows above 0.05 ms, the regime that matters for iteration time), on the Llama-2-70B
  TP2 FlashAttention profile (32 query / 4 KV heads per GPU, head dim 128):

  decode  = launch + per_seq * seqs + per_kv_token * sum(context)
  prefill = launch + per_token * C + per_work * W + per_sq_token * min(2W, C^2)

  where C = sum of chunk tokens and W = sum of chunk * (context + chunk/2). The last
  term is sum(chunk^2) for a single piece (the only case profiled): FlashAttention's
  causal diagonal blocks run at about half the throughput of blocks over cached
  context, so prefill costs ~chunk x (context + chunk), not the causal FLOPs alone.
  For several pieces min(2W, C^2) is an upper bound on sum(chunk^2), exact when every
  piece starts from an empty cache, and it grows with every token, context or piece.
* All-reduce: isotonic fit of the NCCL medians vs message size, on ~40 log-spaced knots.
* CPU overhead: schedule + prepare inputs + sampler + process outputs vs batch size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.hardware.calibration_files import DECODE_TERMS, PREFILL_TERMS
from sim.hardware.catalog import ModelSpec
from sim.hardware.curves import isotonic, log_spaced_indices
from sim.hardware.roofline import LAYER_OPS

FIT_MIN_MS = 0.05
ALL_REDUCE_KNOTS = 40



# --------------------------------------------------------------------------- linear ops
def linear_points(mlp: pd.DataFrame, model: ModelSpec, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Profiled token counts and per-iteration linear-op ms at tensor-parallel ``tp``."""
    rows = mlp[mlp["tp"] == tp].sort_values("tokens")
    ops = [op for op in LAYER_OPS if op in rows.columns]
    total_ms = model.num_layers * rows[ops].sum(axis=1) + rows["emb"]
    return rows["tokens"].to_numpy(dtype=float), total_ms.to_numpy(dtype=float)


def monotone_knots(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knots at every point, valued by the isotonic fit of the medians (see curves)."""
    return np.asarray(xs, float), isotonic(ys)


def lm_head_points(mlp: pd.DataFrame, model: ModelSpec, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """LM head ms at the profiled row counts, scaled from the measured up-projection."""
    rows = mlp[mlp["tp"] == tp].sort_values("tokens")
    up_width = (2 if model.gated_mlp else 1) * model.mlp_hidden_size
    up_ms = isotonic(rows["mlp_up_proj"].to_numpy(dtype=float))
    return rows["tokens"].to_numpy(dtype=float), up_ms * model.vocab_size / up_width


# --------------------------------------------------------------------------- attention
def prefill_sq_tokens(
    chunk_tokens: np.ndarray | float, work: np.ndarray | float
) -> np.ndarray | float:
    """The sum(chunk^2) proxy min(2W, C^2) (see the module docstring)."""
    return np.minimum(2.0 * np.asarray(work, float), np.asarray(chunk_tokens, float) ** 2)


def decode_features(seqs: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
    """Design matrix of the decode form: [1, seqs, sum of context]."""
    seqs = np.asarray(seqs, float)
    return np.column_stack([np.ones_like(seqs), seqs, np.asarray(kv_tokens, float)])


def prefill_features(chunk_tokens: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Design matrix of the prefill form: [1, C, W, min(2W, C^2)]."""
    c = np.asarray(chunk_tokens, float)
    return np.column_stack(
        [np.ones_like(c), c, np.asarray(work, float), prefill_sq_tokens(c, work)]
    )


def _nnls_relative(features: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising squared relative error on rows > FIT_MIN_MS.

    Non-negative coefficients keep the forms non-decreasing in every input.
    """
    keep = ms > FIT_MIN_MS
    weights = 1.0 / ms[keep]
    from scipy.optimize import nnls  # offline fitting only: a run never needs scipy

    coef, _ = nnls(features[keep] * weights[:, None], ms[keep] * weights)
    return coef


def fit_decode(decode: pd.DataFrame) -> dict[str, float]:
    """Decode coefficients (per layer, reference geometry) from the decode table."""
    kv = decode["batch_size"] * decode["kv_cache_size"]
    coef = _nnls_relative(decode_features(decode["batch_size"], kv), decode["ms"].to_numpy(float))
    return dict(zip(DECODE_TERMS, map(float, coef), strict=True))


def fit_prefill(prefill: pd.DataFrame) -> dict[str, float]:
    """Prefill coefficients (per layer, reference geometry) from the prefill table."""
    chunk = prefill["chunk"].to_numpy(float)
    work = chunk * (prefill["kv_cache_size"].to_numpy(float) + chunk / 2)
    coef = _nnls_relative(prefill_features(chunk, work), prefill["ms"].to_numpy(float))
    return dict(zip(PREFILL_TERMS, map(float, coef), strict=True))


def decode_ms(coef: dict[str, float], seqs: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
    """Per-layer decode attention ms for arrays of (sequences, summed context)."""
    return decode_features(seqs, kv_tokens) @ np.array([coef[k] for k in DECODE_TERMS])


def prefill_ms(coef: dict[str, float], chunk_tokens: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Per-layer prefill attention ms for arrays of (chunk tokens, attention work)."""
    return prefill_features(chunk_tokens, work) @ np.array([coef[k] for k in PREFILL_TERMS])


# --------------------------------------------------------------------------- all-reduce
def all_reduce_knots(
    table: pd.DataFrame, count: int = ALL_REDUCE_KNOTS
) -> tuple[np.ndarray, np.ndarray]:
    """(message bytes, ms) knots: isotonic fit of the medians, thinned log-evenly.

    Convention: ``size`` is read as the message size in bytes, as Vidur's predictor
    does. Read as fp16 elements (2 x size bytes), the largest messages would move at
    312-348 GB/s bus bandwidth, above the 300 GB/s per-direction NVLink peak of an
    A100; read as bytes they move at 156-174 GB/s, a plausible NCCL figure.
    """
    size = table["size"].to_numpy(float)
    fitted = isotonic(table["ms"].to_numpy(float))
    keep = log_spaced_indices(size, count)
    return size[keep], fitted[keep]


# --------------------------------------------------------------------------- CPU overhead
def cpu_pairs(cpu: pd.DataFrame) -> list[tuple[str, int]]:
    """The (model, TP) pairs with a CPU-overhead profile."""
    return sorted({(str(m), int(t)) for m, t in zip(cpu["model"], cpu["tp"], strict=True)})


def cpu_points(cpu: pd.DataFrame, model: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(batch size, ms) of one profiled (model, TP), made non-decreasing (isotonic)."""
    rows = cpu[(cpu["model"] == model) & (cpu["tp"] == tp)].sort_values("batch_size")
    return rows["batch_size"].to_numpy(float), isotonic(rows["ms"].to_numpy(float))
