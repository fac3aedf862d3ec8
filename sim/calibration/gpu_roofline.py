"""The roofline (transfer) file of a profiled GPU other than the A100.

It carries this GPU's own linear-op efficiencies, its attention time ratios to the A100,
its all-reduce curves (or the PCIe roofline), the A100 host's CPU curves, and two error
bars: leave-one-model-out on this GPU and A100 -> this GPU cross-prediction. It builds on
the A100 file of :mod:`sim.calibration.calibrate` and the helpers of
:mod:`sim.calibration.gpu_calibrate`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.calibration import attention_kernels, calibrate, fit_checks, gpu_calibrate, roofline_fit
from sim.calibration.profiles import ProfileSet
from sim.hardware.catalog import get_gpu
from sim.hardware.curves import error_summary


def _all_reduce_curves(profiles: ProfileSet, tp_degrees: tuple[int, ...]) -> dict:
    curves = {}
    for n in tp_degrees:
        section = calibrate.all_reduce_section(profiles, n) or {}
        curves[str(n)] = {k: v for k, v in section.items() if k != "note"}
    return curves


def cross_gpu_error(gpu_profiles: ProfileSet, a100_profiles: ProfileSet) -> dict:
    """A100-fitted efficiencies on this GPU's datasheet roofs vs its measured linear ops.

    The error bar of an "uncalibrated (roofline)" GPU: pooled over every model, TP and
    token count profiled on this GPU (per-layer linear-op sums, rows above 0.05 ms).
    """
    eff = roofline_fit.fit_efficiencies(a100_profiles.all_mlp(), get_gpu("a100-80gb"))
    measured, predicted = [], []
    for name, table in gpu_profiles.all_mlp(extra=True).items():
        m, p = roofline_fit.per_layer_pairs(eff, name, table, get_gpu(gpu_profiles.gpu))
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
    profiles, a100 = ProfileSet(root, gpu), ProfileSet(root)
    tables = profiles.all_mlp(extra=True)
    spec = get_gpu(gpu)
    a100_roof = calibrate.fit_roofline_file(a100)
    data = {
        "format": "batchsim-roofline/1",
        "gpu": gpu,
        "source": calibrate.licence(gpu),
        "command": f"python -m sim calibrate --all --gpu {gpu}",
        "efficiency": {"note": roofline_fit.EFFICIENCY_NOTE, **roofline_fit.fit_efficiencies(tables, spec)},
        "attention_reference": a100_roof["attention_reference"],
        "attention_ratios": {
            "note": "measured time multipliers of this GPU vs A100 (TP1 linear-op GEMMs, median "
            "over models): bandwidth at 1 token, flops at 4096 tokens"
            + (
                f"; prefill: every attention-prefill term, the published speed of this GPU's attention "
                f"kernel over the A100 profile at 512-4096 tokens, median (range: prefill_spread), "
                f"{attention_kernels.SOURCES[gpu]}"
                if gpu in attention_kernels.SOURCES
                else ""
            ),
            **{
                k: (round(v, 5) if isinstance(v, float) else v)
                for k, v in gpu_calibrate.measured_time_ratios(profiles, a100).items()
            },
        },
        "all_reduce": {
            "note": f"{gpu}: "
            + ("DGX H100 NVSwitch NCCL profile" if gpu == "h100-sxm" else "PCIe ring roofline, not profiled"),
            "curves": _all_reduce_curves(profiles, (2, 4, 8)),
        },
        "cpu_overhead": {"note": gpu_calibrate.CPU_REUSE_NOTE, "curves": a100_roof["cpu_overhead"]["curves"]},
        "leave_one_model_out": {
            "note": f"per-layer linear-op sum of each model profiled on {gpu} predicted from "
            f"efficiencies fitted on the other {len(tables) - 1}, over all its TP degrees and "
            "token counts (rows above 0.05 ms)",
            **roofline_fit.leave_one_model_out(tables, spec),
        },
        "cross_gpu_from_a100": {
            "note": f"A100-fitted efficiencies on {gpu} datasheet roofs vs {gpu}'s measured "
            "linear ops, every profiled model, TP and token count: the error bar of an "
            "uncalibrated (roofline) GPU",
            **cross_gpu_error(profiles, a100),
        },
        "fit_error": a100_roof["fit_error"],
    }
    fit_checks.check_fitted(data, f"roofline file of {gpu}")
    return data
