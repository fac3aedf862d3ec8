"""Published attention-kernel throughput, for GPUs where Vidur measured no attention.

The A100 attention fit (Vidur's FlashAttention profile, Llama-2-70B TP2 geometry) is carried to another GPU
by a time ratio. The ratio of the two GPUs' *GEMM* times is right when both run the same kind of attention
kernel (A100 -> A40: both Ampere FlashAttention-2). It is wrong on the H100, whose engines run
FlashAttention-3 (warp-specialised wgmma + TMA): that kernel gains far more over the A100 profile than
cuBLAS GEMMs do. With the GEMM ratio (x0.338) a 2,048-token CodeLlama-34B prefill on the H100 carried
24.5 ms of attention, 10% of the step, against ~6 ms at FlashAttention-3's published speed, which is why
large TP1 prefills were priced 10-33% slow against the H100's own linear-op profiles (issue 27).

So for a GPU with a published forward-attention benchmark, the prefill ratio is the kernel's own: the
published time at each sequence length over the A100 profile's time at the same length and geometry
(32 query heads of 128, no cached context), median over the lengths both cover.
"""

from __future__ import annotations

import numpy as np

from sim.calibration.profiles import ProfileSet
from sim.hardware.scaling import REFERENCE_HEAD_DIM, REFERENCE_Q_HEADS

PUBLISHED_PREFILL_TFLOPS: dict[str, dict[int, float]] = {
    # FlashAttention-3 forward, BF16, causal mask, head dim 128, H100 80GB SXM5 (batch x seqlen = 16k tokens,
    # 16 heads): TFLOP/s at sequence length 512 .. 16k. Shah et al., "FlashAttention-3: Fast and Accurate
    # Attention with Asynchrony and Low-precision" (arXiv:2407.08608, NeurIPS 2024), benchmark figure
    # "attention forward speed, with causal mask, head dim 128 (H100 80GB SXM5)". vLLM V1 runs this kernel
    # on Hopper (flash_attn_varlen_func, FA3).
    "h100-sxm": {512: 292.0, 1024: 423.0, 2048: 521.0, 4096: 579.0, 8192: 602.0, 16384: 616.0},
}
SOURCES: dict[str, str] = {
    "h100-sxm": "FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608): forward, causal, head dim 128, BF16, H100 SXM5",
}


def causal_prefill_flops(tokens: float, q_heads: int, head_dim: int) -> float:
    """FLOPs of causal self-attention over ``tokens`` new tokens, counted as the FlashAttention papers do:
    QK^T and PV are 2 x 2 x tokens^2 x head_dim per head, halved by the causal mask."""
    return 2.0 * tokens * tokens * head_dim * q_heads


def published_prefill_ms(gpu: str, tokens: float, q_heads: int, head_dim: int) -> float:
    """Per-layer ms of a causal prefill of ``tokens`` at the published throughput, interpolated in
    log(tokens) and held flat outside the published lengths."""
    table = PUBLISHED_PREFILL_TFLOPS[gpu]
    lengths = np.log(np.array(list(table), float))
    tflops = float(np.interp(np.log(tokens), lengths, list(table.values())))
    return causal_prefill_flops(tokens, q_heads, head_dim) / (tflops * 1e12) * 1e3


def prefill_time_ratio(gpu: str, a100_profiles: ProfileSet) -> dict | None:
    """The attention-prefill time ratio ``gpu`` / A100 from the published kernel, or None without one.

    Returns:
        ``ratio`` (median over the published lengths the A100 profile covers), its ``spread`` (min and max
        of the per-length ratios) and the ``lengths`` used.
    """
    if gpu not in PUBLISHED_PREFILL_TFLOPS:
        return None
    _, prefill = a100_profiles.attention()
    alone = prefill[prefill["kv_cache_size"] == 0].set_index("chunk")["ms"]  # no cached context
    lengths = [s for s in PUBLISHED_PREFILL_TFLOPS[gpu] if s in alone.index]
    ratios = [
        published_prefill_ms(gpu, s, REFERENCE_Q_HEADS, REFERENCE_HEAD_DIM) / float(alone.loc[s]) for s in lengths
    ]
    return {
        "ratio": round(float(np.median(ratios)), 5),
        "spread": [round(min(ratios), 4), round(max(ratios), 4)],
        "lengths": lengths,
    }
