"""Carrying a profiled fit over to another model, TP degree or GPU.

The attention profile exists for one geometry (Llama-2-70B at TP 2 on an A100) and the CPU
overheads for a few (model, TP) pairs; a calibration for anything else scales them. The
offline pipeline (:mod:`sim.calibration`) uses these rules when it writes a file, and a
run uses the same rules when it builds a calibration from a roofline file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sim.hardware.catalog import GPUS, GPUSpec, ModelSpec, get_gpu, get_model

# Geometry of the attention profile, per GPU (Llama-2-70B at TP 2).
REFERENCE_Q_HEADS, REFERENCE_KV_HEADS, REFERENCE_HEAD_DIM, REFERENCE_DTYPE_BYTES = 32, 4, 128, 2
REFERENCE_GPU = "a100-80gb"
# Latency of one PCIe transfer (ms) in the all-reduce and all-to-all rooflines of GPUs without NVLink.
PCIE_LATENCY_MS = 0.03


def attention_scales(model: ModelSpec, tp: int, gpu: GPUSpec) -> dict[str, float]:
    """Factors from the reference geometry and A100 to ``model`` at ``tp`` on ``gpu``.

    ``q``: query heads x head dim per GPU (prefill FLOPs, per-sequence work);
    ``kv``: KV bytes per token per GPU (decode reads); ``flops``/``bandwidth``: A100 peak
    over this GPU's peak.
    """
    ref = GPUS[REFERENCE_GPU]
    q = model.q_heads_per_gpu(tp) * model.head_dim / (REFERENCE_Q_HEADS * REFERENCE_HEAD_DIM)
    kv = (
        model.kv_heads_per_gpu(tp)
        * model.head_dim
        * model.dtype_bytes
        / (REFERENCE_KV_HEADS * REFERENCE_HEAD_DIM * REFERENCE_DTYPE_BYTES)
    )
    return {
        "q": q,
        "kv": kv,
        "flops": ref.peak_bf16_tflops / gpu.peak_bf16_tflops,
        "bandwidth": ref.hbm_gb_per_s / gpu.hbm_gb_per_s,
    }


def scale_attention(
    decode: dict[str, float], prefill: dict[str, float], model: ModelSpec, tp: int, gpu: GPUSpec
) -> tuple[dict[str, float], dict[str, float]]:
    """Reference-geometry coefficients carried over to ``model`` at ``tp`` on ``gpu``.

    Launch costs stay; per-sequence and per-token terms scale with query width and
    memory bandwidth, KV reads with KV bytes and bandwidth, FLOP terms with query width
    and peak FLOP/s.
    """
    s = attention_scales(model, tp, gpu)
    dec = {
        "launch_ms": decode["launch_ms"],
        "per_seq_ms": decode["per_seq_ms"] * s["q"] * s["bandwidth"],
        "per_kv_token_ms": decode["per_kv_token_ms"] * s["kv"] * s["bandwidth"],
    }
    pre = {
        "launch_ms": prefill["launch_ms"],
        "per_token_ms": prefill["per_token_ms"] * s["q"] * s["bandwidth"],
        "per_work_ms": prefill["per_work_ms"] * s["q"] * s["flops"],
        "per_sq_token_ms": prefill["per_sq_token_ms"] * s["q"] * s["flops"],
    }
    return dec, pre


def scaled_attention(
    reference: dict, model: ModelSpec, tp: int, ratios: dict
) -> tuple[dict[str, float], dict[str, float]]:
    """The A100 reference attention fit at this geometry, times the measured ratios.

    ``ratios`` holds GEMM time ratios (``bandwidth``, ``flops``) and, where this GPU's attention kernel has
    a published speed, ``prefill``: the prefill kernel's own time ratio, which then scales the whole
    prefill form (the published/profiled time ratio is flat over 512-4096 tokens, so the A100 form's shape
    carries over; :mod:`sim.calibration.attention_kernels`).
    """
    a100 = get_gpu(REFERENCE_GPU)
    dec, pre = scale_attention(reference["decode"], reference["prefill"], model, tp, a100)
    bw, fl = ratios["bandwidth"], ratios["flops"]
    dec = {
        "launch_ms": dec["launch_ms"],
        "per_seq_ms": dec["per_seq_ms"] * bw,
        "per_kv_token_ms": dec["per_kv_token_ms"] * bw,
    }
    if "prefill" in ratios:
        return dec, {term: value * ratios["prefill"] for term, value in pre.items()}
    pre = {
        "launch_ms": pre["launch_ms"],
        "per_token_ms": pre["per_token_ms"] * bw,
        "per_work_ms": pre["per_work_ms"] * fl,
        "per_sq_token_ms": pre["per_sq_token_ms"] * fl,
    }
    return dec, pre


def cpu_source(pairs: Iterable[tuple[str, int]], model: ModelSpec, tp: int) -> tuple[str, int]:
    """The profiled (model, TP) whose CPU overhead stands in for ``model`` at ``tp``.

    Exact match if profiled; else the nearest TP (CPU time grows with the workers to
    drive), then the nearest model size (sampler and bookkeeping grow with the model).
    """

    def distance(pair: tuple[str, int]) -> tuple[float, float]:
        ref_model, ref_tp = pair
        size = abs(math.log(model.num_params / get_model(ref_model).num_params))
        return abs(math.log2(tp) - math.log2(ref_tp)), size

    best = min(sorted(set(pairs)), key=distance)
    return str(best[0]), int(best[1])
