"""What calibrating a GPU other than the A100 needs beyond its linear-op profiles.

Vidur profiled linear ops (and, on H100, NCCL all-reduce) on H100-80GB and A40-48GB, but
attention and engine CPU time only on A100-80GB. So a calibration of those GPUs takes:

* linear ops, LM head: the GPU's own profiles, fitted exactly as on the A100;
* attention: the A100 fit scaled to the model's geometry and to this GPU by *measured*
  time ratios (:func:`measured_time_ratios`): the GEMMs of the models profiled on both
  GPUs at 1 token (weight reads: bandwidth-bound) and at the largest token count
  (FLOP-bound), not the datasheet ratio;
* all-reduce: H100: its DGX (NVSwitch) NCCL profile; A40: no profile and no NVLink, so a
  ring all-reduce roofline over PCIe (:func:`pcie_all_reduce_section`);
* CPU overhead: the A100 host's profile, reused (an H100 host is usually faster, so
  this errs towards overestimating per-step host time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.hardware import fitting
from sim.hardware.catalog import ModelSpec, get_gpu
from sim.hardware.memory import kv_budget
from sim.hardware.profiles import ProfileSet

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# Message sizes of the PCIe roofline curve (bytes), as the DGX profiles span.
PCIE_MESSAGE_BYTES = np.unique(np.round(np.geomspace(2048, 512 * 2**20, 40)))
PCIE_LATENCY_MS = 0.03
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
        :func:`sim.hardware.fitting.attention_scales` do.
    """
    small, large = [], []
    for model in gpu_profiles.profiled_models():
        g_small, g_large = _gemm_ms(gpu_profiles, model)
        a_small, a_large = _gemm_ms(a100_profiles, model)
        small.append(g_small / a_small)
        large.append(g_large / a_large)
    return {
        "bandwidth": float(np.median(small)),
        "flops": float(np.median(large)),
        "models": len(small),
    }


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


def scaled_attention(
    reference: dict, model: ModelSpec, tp: int, ratios: dict
) -> tuple[dict[str, float], dict[str, float]]:
    """The A100 reference attention fit at this geometry, times the measured ratios."""
    a100 = get_gpu(fitting.REFERENCE_GPU)
    dec, pre = fitting.scale_attention(reference["decode"], reference["prefill"], model, tp, a100)
    bw, fl = ratios["bandwidth"], ratios["flops"]
    dec = {
        "launch_ms": dec["launch_ms"],
        "per_seq_ms": dec["per_seq_ms"] * bw,
        "per_kv_token_ms": dec["per_kv_token_ms"] * bw,
    }
    pre = {
        "launch_ms": pre["launch_ms"],
        "per_token_ms": pre["per_token_ms"] * bw,
        "per_work_ms": pre["per_work_ms"] * fl,
        "per_sq_token_ms": pre["per_sq_token_ms"] * fl,
    }
    return dec, pre


def roofline_file_name(gpu: str) -> str:
    """The per-GPU roofline (transfer) file, e.g. ``h100-sxm_roofline.yaml``."""
    return f"{gpu}_roofline.yaml"


def _all_reduce_curves(profiles: ProfileSet, tp_degrees: tuple[int, ...]) -> dict:
    from sim.hardware.calibrate import _all_reduce_section  # one fit for both file kinds

    curves = {}
    for n in tp_degrees:
        section = _all_reduce_section(profiles, n) or {}
        curves[str(n)] = {k: v for k, v in section.items() if k != "note"}
    return curves


def cross_gpu_error(gpu_profiles: ProfileSet, a100_profiles: ProfileSet) -> dict:
    """A100-fitted efficiencies on this GPU's datasheet roofs vs its measured linear ops.

    The error bar of an "uncalibrated (roofline)" GPU: pooled over every model, TP and
    token count profiled on this GPU (per-layer linear-op sums, rows above 0.05 ms).
    """
    from sim.hardware import roofline
    from sim.hardware.curves import error_summary

    eff = roofline.fit_efficiencies(a100_profiles.all_mlp(), get_gpu("a100-80gb"))
    measured, predicted = [], []
    for name, table in gpu_profiles.all_mlp(extra=True).items():
        m, p = roofline._per_layer_pairs(eff, name, table, get_gpu(gpu_profiles.gpu))
        measured.append(m)
        predicted.append(p)
    m, p = np.concatenate(measured), np.concatenate(predicted)
    summary = error_summary(p, m)
    summary["bias"] = round(float(np.mean((p - m) / m)), 4)
    return summary


def fit_gpu_roofline_file(root: str | Path, gpu: str) -> dict:
    """The transfer file of a non-A100 profiled GPU: its own efficiencies, measured
    attention ratios, its all-reduce curves, the A100 CPU curves, leave-one-model-out
    and A100 -> this GPU cross-prediction errors."""
    from sim.hardware import calibrate, roofline

    profiles, a100 = ProfileSet(root, gpu), ProfileSet(root)
    tables = profiles.all_mlp(extra=True)
    spec = get_gpu(gpu)
    a100_roof = calibrate.fit_roofline_file(a100)
    return {
        "format": "batchsim-roofline/1",
        "gpu": gpu,
        "source": calibrate.licence(gpu),
        "command": f"python -m sim calibrate --all --gpu {gpu}",
        "efficiency": {"note": roofline.EFFICIENCY_NOTE, **roofline.fit_efficiencies(tables, spec)},
        "attention_reference": a100_roof["attention_reference"],
        "attention_ratios": {
            "note": "measured time multipliers of this GPU vs A100 (TP1 linear-op GEMMs, median "
            "over models): bandwidth at 1 token, flops at 4096 tokens",
            **{
                k: (round(v, 5) if isinstance(v, float) else v) for k, v in measured_time_ratios(profiles, a100).items()
            },
        },
        "all_reduce": {
            "note": f"{gpu}: "
            + ("DGX H100 NVSwitch NCCL profile" if gpu == "h100-sxm" else "PCIe ring roofline, not profiled"),
            "curves": _all_reduce_curves(profiles, (2, 4, 8)),
        },
        "cpu_overhead": {"note": CPU_REUSE_NOTE, "curves": a100_roof["cpu_overhead"]["curves"]},
        "leave_one_model_out": {
            "note": f"per-layer linear-op sum of each model profiled on {gpu} predicted from "
            f"efficiencies fitted on the other {len(tables) - 1}, over all its TP degrees and "
            "token counts (rows above 0.05 ms)",
            **roofline.leave_one_model_out(tables, spec),
        },
        "cross_gpu_from_a100": {
            "note": f"A100-fitted efficiencies on {gpu} datasheet roofs vs {gpu}'s measured "
            "linear ops, every profiled model, TP and token count: the error bar of an "
            "uncalibrated (roofline) GPU",
            **cross_gpu_error(profiles, a100),
        },
        "fit_error": a100_roof["fit_error"],
    }
