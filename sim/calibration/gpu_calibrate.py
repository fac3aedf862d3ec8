"""What calibrating a GPU other than the A100 needs beyond its linear-op profiles.

Vidur profiled linear ops (and, on H100, NCCL all-reduce) on H100-80GB and A40-48GB, but
attention and engine CPU time only on A100-80GB. So a calibration of those GPUs takes:

* linear ops, LM head: the GPU's own profiles, fitted exactly as on the A100;
* attention: the A100 fit scaled to the model's geometry and to this GPU by *measured*
  time ratios (:func:`measured_time_ratios`): the GEMMs of the models profiled on both
  GPUs at 1 token (weight reads: bandwidth-bound) and at the largest token count
  (FLOP-bound), not the datasheet ratio; prefill on the H100 by its own attention kernel's
  published speed instead (:mod:`sim.calibration.attention_kernels`: FlashAttention-3 gains far
  more over the A100 profile than GEMMs do);
* all-reduce: H100: its DGX (NVSwitch) NCCL profile; A40: no profile and no NVLink, so a
  ring all-reduce roofline over PCIe (:func:`pcie_all_reduce_section`);
* CPU overhead: the A100 host's profile, reused (an H100 host is usually faster, so
  this errs towards overestimating per-step host time).
"""

from __future__ import annotations

import numpy as np

from sim.calibration import attention_kernels
from sim.calibration.profiles import ProfileSet
from sim.errors import UserError
from sim.hardware.catalog import ModelSpec, get_gpu
from sim.hardware.memory import kv_budget
from sim.hardware.scaling import PCIE_LATENCY_MS

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# Message sizes of the PCIe roofline curve (bytes), as the DGX profiles span.
PCIE_MESSAGE_BYTES = np.unique(np.round(np.geomspace(2048, 512 * 2**20, 40)))
CPU_REUSE_NOTE = (
    "A100-host profile reused (no CPU profile exists for this GPU's hosts); H100 hosts are "
    "usually faster, so this is taken as an upper bound on per-step host time"
)


def _gemm_ms(profiles: ProfileSet, model: str) -> tuple[float, float]:
    rows = profiles.mlp(model)
    rows = rows[rows["tp"] == 1].sort_values("tokens")
    gemm = rows[list(GEMM_OPS)].sum(axis=1).to_numpy(float)
    return float(gemm[0]), float(gemm[-1])


def measured_time_ratios(gpu_profiles: ProfileSet, a100_profiles: ProfileSet) -> dict:
    """Median GPU / A100 time of the per-layer GEMMs at TP1 over models profiled on both.

    Returns:
        ``bandwidth``: ratio at 1 token (weight reads dominate), ``flops``: ratio at the
        largest profiled token count (4096, FLOPs dominate), ``models``: how many models.
        Both multiply A100 times, as the datasheet ratios of
        :func:`sim.calibration.scaling.attention_scales` do. Where the GPU's attention kernel has a
        published benchmark (:mod:`sim.calibration.attention_kernels`) also ``prefill``, the prefill
        kernel's own time ratio (every prefill term takes it instead of the GEMM ratios), and
        ``prefill_spread``, its range over the sequence lengths it is taken at.
    """
    small, large = [], []
    for model in gpu_profiles.profiled_models():
        g_small, g_large = _gemm_ms(gpu_profiles, model)
        a_small, a_large = _gemm_ms(a100_profiles, model)
        small.append(g_small / a_small)
        large.append(g_large / a_large)
    ratios: dict = {
        "bandwidth": float(np.median(small)),
        "flops": float(np.median(large)),
        "models": len(small),
    }
    prefill = attention_kernels.prefill_time_ratio(gpu_profiles.gpu, a100_profiles)
    if prefill is not None:  # the GPU's own attention kernel, published: it replaces the GEMM ratio in prefill
        ratios["prefill"] = prefill["ratio"]
        ratios["prefill_spread"] = prefill["spread"]
    return ratios


def pcie_all_reduce_section(gpu: str, tp: int) -> dict | None:
    """Ring all-reduce over PCIe: latency + 2 (n-1)/n x bytes / link bandwidth."""
    if tp == 1:
        return None
    spec = get_gpu(gpu)
    bus_bytes = 2 * (tp - 1) / tp * PCIE_MESSAGE_BYTES
    ms = PCIE_LATENCY_MS + bus_bytes / (spec.nvlink_gb_per_s * 1e9) * 1e3
    return {
        "note": (
            f"not profiled: ring all-reduce roofline over {spec.interconnect} "
            f"({spec.nvlink_gb_per_s:g} GB/s per direction, no NVLink), "
            f"{PCIE_LATENCY_MS} ms + 2 (n-1)/n x message bytes / link bandwidth; two per "
            f"layer, message = tokens x hidden x 2 bytes"
        ),
        "gpus": tp,
        "message_bytes": [int(x) for x in PCIE_MESSAGE_BYTES],
        "ms": [round(float(v), 5) for v in ms],
    }


def fit_problem(model: ModelSpec, gpu: str, tp: int) -> str | None:
    """Why (model, TP) cannot run on ``gpu`` (weights leave no KV room), or None."""
    try:
        kv_budget(model, get_gpu(gpu), tp)
    except UserError as exc:
        return str(exc)
    return None
