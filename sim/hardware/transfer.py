"""Calibrations for (model, GPU, TP) without a profile, built from the roofline file.

The result has the same shape as a committed calibration file, so one
:class:`~sim.hardware.cost_model.CostModel` constructor serves both:

* linear ops and LM head: roofline with the A100-fitted efficiencies on this GPU's
  roofs, evaluated on 128 log-spaced token counts (1..32768) and made monotone;
* attention: the reference fit scaled by heads, head dim and the GPU's roofs;
* all-reduce: A100 NVLink curve for TP GPUs, times A100 NVLink / this GPU's NVLink;
* CPU overhead: the nearest profiled (TP, model size), host-side and GPU-independent.

Mixture-of-experts and MLA models (:mod:`sim.hardware.moe`) take the same path: their expected
expert cost is a function of the token count under uniform routing, so it is folded into the
``linear`` curve, and the label says "MoE".
"""

from __future__ import annotations

import numpy as np

from sim.errors import UserError
from sim.hardware import moe, roofline, scaling
from sim.hardware.calibration_files import GPU_DIRS
from sim.hardware.catalog import GPUS, GPUSpec, ModelSpec
from sim.hardware.curves import running_max

GRID_POINTS = 128
GRID_MAX_TOKENS = 32768
PROFILED_GPU = "a100-80gb"


def _grid() -> np.ndarray:
    return np.unique(np.round(np.geomspace(1, GRID_MAX_TOKENS, GRID_POINTS)))


def label_for(gpu: GPUSpec, roof_gpu: str = PROFILED_GPU, *, moe_model: bool = False) -> str:
    """Label of a roofline cost model on ``gpu`` with efficiencies fitted on ``roof_gpu``.

    A mixture-of-experts model says so: "transferred (MoE)", "transferred (MoE, h100
    profiles)", "uncalibrated (roofline, MoE)".
    """
    tag = "MoE, " if moe_model else ""
    if gpu.name != roof_gpu:
        return "uncalibrated (roofline, MoE)" if moe_model else "uncalibrated (roofline)"
    if gpu.name == PROFILED_GPU:
        return "transferred (MoE)" if moe_model else "transferred"
    return f"transferred ({tag}{GPU_DIRS[gpu.name]} profiles)"


def _all_reduce(roof: dict, gpu: GPUSpec, tp: int) -> dict | None:
    if tp == 1:
        return None
    curves = roof["all_reduce"]["curves"]
    if str(tp) not in curves:
        raise UserError(
            f"no all-reduce profile for {tp} GPUs (profiled: {', '.join(curves)}); "
            f"use one of those tensor-parallel degrees",
            field="tensor_parallel",
        )
    section = dict(curves[str(tp)])
    factor = GPUS[roof.get("gpu", PROFILED_GPU)].nvlink_gb_per_s / gpu.nvlink_gb_per_s
    section["ms"] = [ms * factor for ms in section["ms"]]
    return section


def _cpu(roof: dict, model: ModelSpec, tp: int) -> dict:
    curves = {(c["model"], c["tp"]): c for c in roof["cpu_overhead"]["curves"]}
    src = scaling.cpu_source(curves, model, tp)
    exact = src == (model.name, tp)
    how = "profiled" if exact else "not profiled; nearest TP, then nearest model size"
    return {
        "source": f"{src[0]} TP{src[1]} ({how})",
        "batch_size": curves[src]["batch_size"],
        "ms": curves[src]["ms"],
    }


def _fit_error(roof: dict, model: ModelSpec) -> dict:
    loo = {k: v for k, v in roof["leave_one_model_out"].items() if k != "note"}
    if model.name in loo:
        linear = dict(loo[model.name], note=f"leave-one-model-out transfer error of {model.name}")
    else:
        linear = {
            "mape": max(v["mape"] for v in loo.values()),
            "worst": max(v["worst"] for v in loo.values()),
            "note": "worst leave-one-model-out transfer error over the six profiled models",
        }
        if roof.get("gpu", PROFILED_GPU) != PROFILED_GPU:
            linear["note"] = (
                f"worst leave-one-model-out transfer error over the models profiled on "
                f"{roof['gpu']}"
            )
    return {
        "linear": linear,
        **{k: v for k, v in roof["fit_error"].items() if k.startswith("attention")},
    }


def _attention(roof: dict, model: ModelSpec, gpu: GPUSpec, tp: int) -> tuple[dict, dict]:
    ref = roof["attention_reference"]
    if "attention_ratios" in roof and roof["gpu"] == gpu.name:
        return scaling.scaled_attention(ref, model, tp, roof["attention_ratios"])
    return scaling.scale_attention(ref["decode"], ref["prefill"], model, tp, gpu)


def _linear_ms(eff: dict, model: ModelSpec, gpu: GPUSpec, tp: int, grid: np.ndarray, ep: int) -> np.ndarray:
    if model.moe is None and model.mla is None:
        return roofline.predict_linear_ms(eff, model, tp, gpu, grid)
    return moe.predict_linear_ms(eff, model, tp, gpu, grid, expert_parallel=ep)


def roofline_calibration(roof: dict, model: ModelSpec, gpu: GPUSpec, tp: int, expert_parallel: int = 1) -> dict:
    """A calibration-shaped dict for ``model`` at ``tp`` on ``gpu`` from the roofline file.

    ``expert_parallel`` splits a MoE model's experts into that many groups of GPUs.

    Raises:
        UserError: no all-reduce profile for ``tp`` GPUs.
    """
    eff = roof["efficiency"]
    grid = _grid()
    decode_view, prefill_view = moe.attention_views(model)  # both the model itself unless MLA
    dec, _ = _attention(roof, decode_view, gpu, tp)
    _, pre = _attention(roof, prefill_view, gpu, tp)
    return {
        "model": model.name,
        "gpu": gpu.name,
        "tensor_parallel": tp,
        "linear": {
            "tokens": grid.tolist(),
            "ms": running_max(_linear_ms(eff, model, gpu, tp, grid, expert_parallel)).tolist(),
        },
        "lm_head": {
            "rows": grid.tolist(),
            "ms": running_max(roofline.predict_lm_head_ms(eff, model, tp, gpu, grid)).tolist(),
        },
        "attention": {"decode": dec, "prefill": pre},
        "all_reduce": _all_reduce(roof, gpu, tp),
        "cpu_overhead": _cpu(roof, model, tp),
        "fit_error": _fit_error(roof, model),
    }
