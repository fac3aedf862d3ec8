"""Model FLOPs and HBM bytes of a forward pass: the MFU and MBU operators quote.

nvidia-smi's "utilization" (``gpu_busy_frac``) is the share of time a kernel runs; it
says nothing about how much of the GPU that kernel uses. MFU and MBU do:

    MFU_i = F_i / (d_i x tp x F_peak)        MBU_i = B_i / (d_i x tp x BW_peak)

for pass i of duration d_i on a replica of ``tp`` GPUs with per-GPU dense BF16 peak
F_peak and HBM bandwidth BW_peak. Everything is per replica: each tensor-parallel rank
runs 1/tp of every op (the same share, so the per-GPU ratio is the same number).

F_i (FLOPs the pass executes, from :func:`sim.hardware.roofline.op_work` and
:func:`~sim.hardware.roofline.lm_head_work`, which are linear in the token count):

    F_i = f_lin x N_i + f_head x R_i + 4 x L x q x W_i + 4 x L x q x K_i

N_i = prefill tokens + decode sequences, R_i = prefill pieces + decode sequences (one
sampled row each), W_i = sum over prefill pieces of chunk x (context + chunk / 2) (the
causal attention work of the cost model), K_i = decode KV tokens, L layers, q the query
width of all heads (QK^T and PV: 2 FLOPs per multiply-add, two matrix products).

B_i (bytes moved from HBM that do not depend on kernel fusion):

    B_i = w + kv x (K_i + X_i) + kv x (C_i + D_i)

w: every weight matrix read once per pass (the op_work bytes at zero tokens: all layers'
projections and the LM head; the embedding is a gather of N_i rows, not a read of the
table), kv: KV-cache bytes of one token on the replica, X_i: tokens of cached context the
prefill pieces attend to, C_i prefill tokens and D_i decode sequences whose new K and V
are written. Activations are left out (whether they reach HBM depends on fusion), as in
the usual MBU definition of (weights + KV cache) / time / bandwidth.

Mixture-of-experts models (:mod:`sim.hardware.moe`): f_lin is 2 x the *active* non-embedding
parameters (every token passes through top-k experts, so FLOPs stay linear in N_i), and w
counts the non-routed weights plus D(N_i) x one routed expert's weights in every MoE layer,
D(N) = E x (1 - (1 - k/E)^N) the expected experts N tokens touch: the weights a pass
actually reads.

Static batching's padded slots are in N_i, R_i, K_i and D_i: the GPU computes them (as
``gpu_busy_frac`` counts them as busy), so MFU and MBU are what the hardware does, not
useful work; compare ``output_tps`` for that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from sim.hardware.catalog import GPUSpec, ModelSpec
from sim.hardware.memory import kv_bytes_per_token
from sim.hardware.roofline import EMB, lm_head_work, op_work

UTILIZATION_COLUMNS: tuple[str, ...] = ("mfu", "mbu")
"""Per-iteration columns :meth:`PassWork.add_columns` appends."""

_TOTALS = ("prefill_tokens", "batch_size", "decode_tokens", "prefill_attn_work", "decode_kv_tokens")


@dataclass(frozen=True)
class PassWork:
    """FLOPs and bytes of a pass as linear functions of the batch totals, for one replica.

    Attributes:
        flops_per_token: linear ops of all layers (and the embedding) per token (N).
        flops_per_row: LM head per sampled row (R).
        flops_per_attention_work: attention per unit of W (prefill) or per KV token (decode).
        weight_bytes: weights read once per pass (w).
        kv_bytes_per_token: KV cache of one token on all ranks (kv).
        peak_flops_per_s: tp x per-GPU dense BF16 peak.
        peak_bytes_per_s: tp x per-GPU HBM bandwidth.
        stages: pipeline stages: every iteration row is one stage's pass and is counted for an equal
            1/stages share of its pass's FLOPs and bytes, so the rows of a pass add up to the pass
            (one stage's own share differs by its layer count and the LM head on the last).
    """

    flops_per_token: float
    flops_per_row: float
    flops_per_attention_work: float
    weight_bytes: float
    kv_bytes_per_token: float
    peak_flops_per_s: float
    peak_bytes_per_s: float
    routed_expert_bytes: float = 0.0
    top_k: int = 0
    num_experts: int = 0
    stages: int = 1

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("duration_s", *_TOTALS)
    """Iteration columns read (``prefill_context_tokens`` too when present: 0 otherwise)."""

    @classmethod
    def of(cls, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int, *, stages: int = 1) -> PassWork:
        """The coefficients of ``model`` on ``tensor_parallel`` x ``gpu``, rows of ``stages`` pipeline stages."""
        work = cls._of(model, gpu, tensor_parallel)
        return work if stages == 1 else replace(work, stages=stages)

    @classmethod
    def _of(cls, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int) -> PassWork:
        tp = tensor_parallel
        zero_one = np.array([0.0, 1.0])  # op_work and lm_head_work are exactly linear in tokens
        # Per GPU: layers x per-layer ops + the embedding (no FLOPs, no weight read at 0 tokens).
        work = op_work(model, tp, zero_one)
        layers = {op: (1 if op == EMB else model.num_layers) for op in work}
        linear_flops = np.sum([layers[op] * flops for op, (flops, _) in work.items()], axis=0)
        linear_bytes = np.sum([layers[op] * nbytes for op, (_, nbytes) in work.items()], axis=0)
        head_flops, head_bytes = lm_head_work(model, tp, zero_one)
        q_width = model.q_heads_per_gpu(tp) * model.head_dim
        if model.moe is not None:
            return cls._of_moe(model, gpu, tp, float(head_flops[1]), float(head_bytes[0]), q_width)
        return cls(
            flops_per_token=tp * float(linear_flops[1]),
            flops_per_row=tp * float(head_flops[1]),
            flops_per_attention_work=tp * 4.0 * model.num_layers * q_width,
            weight_bytes=tp * float(linear_bytes[0] + head_bytes[0]),  # at 0 tokens: the weights only
            kv_bytes_per_token=tp * float(kv_bytes_per_token(model, tp)),
            peak_flops_per_s=tp * gpu.peak_bf16_tflops * 1e12,
            peak_bytes_per_s=tp * gpu.hbm_gb_per_s * 1e9,
        )

    @classmethod
    def _of_moe(
        cls, model: ModelSpec, gpu: GPUSpec, tp: int, head_flops: float, head_bytes: float, q_width: int
    ) -> PassWork:
        moe = model.moe
        assert moe is not None
        moe_layers = model.num_layers - moe.dense_layers
        expert_params = moe_layers * moe.expert_params(model.hidden_size)
        layer_params = model.num_params - model.embedding_params
        non_routed = (layer_params - moe.num_experts * expert_params) * model.weight_bytes_per_param
        return cls(
            flops_per_token=2.0 * (model.active_params - model.embedding_params),
            flops_per_row=tp * head_flops,
            flops_per_attention_work=tp * 4.0 * model.num_layers * q_width,
            weight_bytes=non_routed + tp * head_bytes,
            kv_bytes_per_token=tp * float(kv_bytes_per_token(model, tp)),
            peak_flops_per_s=tp * gpu.peak_bf16_tflops * 1e12,
            peak_bytes_per_s=tp * gpu.hbm_gb_per_s * 1e9,
            routed_expert_bytes=float(expert_params * model.weight_bytes_per_param),
            top_k=moe.top_k,
            num_experts=moe.num_experts,
        )

    def touched_expert_bytes(self, tokens: np.ndarray) -> np.ndarray:
        """Routed-expert weights a pass of ``tokens`` tokens reads (0 for a dense model)."""
        if not self.routed_expert_bytes:
            return np.zeros_like(np.asarray(tokens, float))
        touched = self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** np.asarray(tokens, float))
        return self.routed_expert_bytes * touched

    def flops(self, iterations: pd.DataFrame) -> np.ndarray:
        """F_i of every pass (a new float array)."""
        totals = {c: iterations[c].to_numpy(dtype=float) for c in _TOTALS}
        return self._flops(totals) / self.stages

    def bytes(self, iterations: pd.DataFrame) -> np.ndarray:
        """B_i of every pass (a new float array)."""
        totals = {c: iterations[c].to_numpy(dtype=float) for c in _TOTALS}
        dense = self._bytes(totals, _column(iterations, "prefill_context_tokens"), 1.0)
        return (dense + self.touched_expert_bytes(_tokens(iterations))) / self.stages

    def total_flops(self, iterations: pd.DataFrame) -> float:
        """Sum of F_i over all passes, from column sums (F is linear: no per-pass array)."""
        return float(self._flops(_sums(iterations, _TOTALS))) / self.stages

    def total_bytes(self, iterations: pd.DataFrame) -> float:
        """Sum of B_i over all passes, from column sums (B is linear: no per-pass array)."""
        context = _sums(iterations, ("prefill_context_tokens",)).get("prefill_context_tokens", 0.0)
        dense = float(self._bytes(_sums(iterations, _TOTALS), context, float(len(iterations))))
        if self.routed_expert_bytes:
            dense += float(self.touched_expert_bytes(_tokens(iterations)).sum())
        return dense / self.stages

    def mfu(self, iterations: pd.DataFrame) -> np.ndarray:
        """MFU_i = F_i / (d_i x peak FLOP/s); NaN for a pass of zero duration."""
        return _per_second(self.flops(iterations), iterations, self.peak_flops_per_s)

    def mbu(self, iterations: pd.DataFrame) -> np.ndarray:
        """MBU_i = B_i / (d_i x peak bytes/s); NaN for a pass of zero duration."""
        return _per_second(self.bytes(iterations), iterations, self.peak_bytes_per_s)

    def add_columns(self, iterations: pd.DataFrame) -> pd.DataFrame:
        """``iterations`` with ``mfu`` and ``mbu`` appended (a shallow copy; the input is untouched)."""
        out = iterations.copy(deep=False)
        out["mfu"] = self.mfu(iterations)
        out["mbu"] = self.mbu(iterations)
        return out

    def _flops(self, totals: Mapping[str, Any]) -> Any:
        tokens = totals["prefill_tokens"] + totals["decode_tokens"]
        attention = totals["prefill_attn_work"] + totals["decode_kv_tokens"]
        return (
            self.flops_per_token * tokens
            + self.flops_per_row * totals["batch_size"]
            + self.flops_per_attention_work * attention
        )

    def _bytes(self, totals: Mapping[str, Any], context_tokens: Any, passes: float) -> Any:
        read_tokens = totals["decode_kv_tokens"] + context_tokens
        written_tokens = totals["prefill_tokens"] + totals["decode_tokens"]
        return self.weight_bytes * passes + self.kv_bytes_per_token * (read_tokens + written_tokens)


def _tokens(iterations: pd.DataFrame) -> np.ndarray:
    """N_i: tokens each pass runs (prefill tokens + decode sequences)."""
    return iterations["prefill_tokens"].to_numpy(dtype=float) + iterations["decode_tokens"].to_numpy(dtype=float)


def _sums(iterations: pd.DataFrame, columns: tuple[str, ...]) -> dict[str, float]:
    """Column sums of the columns present (integers summed exactly, then made floats)."""
    return {c: float(iterations[c].to_numpy().sum()) for c in columns if c in iterations.columns}


def _column(iterations: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats; zeros when absent (records written before it existed)."""
    if name in iterations.columns:
        return iterations[name].to_numpy(dtype=float)
    return np.zeros(len(iterations))


def _per_second(amount: np.ndarray, iterations: pd.DataFrame, peak_per_s: float) -> np.ndarray:
    duration_s = iterations["duration_s"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(duration_s > 0, amount / (duration_s * peak_per_s), np.nan)
