"""Fit calibrations from the profiles and read/write them as compact YAML.

A calibration file describes one (model, GPU, TP): knots of the linear-op and LM-head
curves, attention coefficients, the all-reduce curve, the CPU-overhead curve, the
held-out fit error of each, and its provenance. The roofline file
(``a100-80gb_roofline.yaml``) holds what transfers to unprofiled models and GPUs:
per-op efficiency curves, the reference attention fit, all-reduce curves per GPU
count, CPU-overhead curves, and the leave-one-model-out transfer error.
Everything written is deterministic (no dates), so a re-fit can be compared to the
committed file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.calibration import attention_kernels, fit_checks, fitting, gpu_calibrate, holdout, roofline_fit
from sim.calibration.profiles import ATTENTION_FILE, CPU_FILE, ProfileSet, all_reduce_file, licence, mlp_file
from sim.errors import UserError
from sim.hardware import scaling
from sim.hardware.calibration_files import GPU_DIRS, LICENCE
from sim.hardware.catalog import GPUS, ModelSpec, check_tensor_parallel, get_gpu, get_model, layer_shapes

PROFILED_GPU = "a100-80gb"
ALL_REDUCE_GPUS = (2, 4, 8, 16)
# GPUs with linear-op profiles; all but the A100 take attention and CPU time from it.
PROFILED_GPUS = tuple(GPU_DIRS)
PROFILE_TPS = (1, 2, 4, 8)
# The calibrations committed to the repository (model, TP), all on A100-80GB.
COMMITTED: tuple[tuple[str, int], ...] = (
    ("llama-2-7b", 1),
    ("llama-3-8b", 1),
    ("llama-2-70b", 2),
    ("llama-2-70b", 4),
    ("codellama-34b", 2),
    ("phi-2", 1),
)
ALL_REDUCE_NOTE = (
    "two all-reduces per layer (after attention and after the MLP), message = tokens x hidden "
    "x 2 bytes; the profile's 'size' is read as message bytes (Vidur's predictor convention): "
    "read as fp16 elements the largest messages would need 312-348 GB/s bus bandwidth, above "
    "A100's 300 GB/s NVLink peak"
)
CPU_NOTE = (
    "schedule + prepare_inputs_e2e + sampler_e2e + process_model_outputs medians vs sequences "
    "in the batch; Ray driver time (ray_comm_time, ~6.3 ms at TP>1 in Vidur's engine) is left "
    "out: current engines drive TP workers without a Ray round trip per step"
)


def _r(values: Any, digits: int = 5) -> list[float]:
    return [round(float(v), digits) for v in values]


def _sig(value: float, digits: int = 5) -> float:
    return float(f"{value:.{digits}g}")


def _sig_dict(coefs: dict[str, float]) -> dict[str, float]:
    return {k: _sig(v) for k, v in coefs.items()}


def _linear_section(profiles: ProfileSet, model: ModelSpec, tp: int) -> dict:
    tokens, raw = fitting.linear_points(profiles.mlp(model.name), model, tp)
    knots_x, knots_y = fitting.monotone_knots(tokens, raw)
    excess = np.abs(knots_y / raw - 1)
    exact = excess < 1e-9
    note = (
        f"{model.num_layers} layers x per-layer op medians + embedding, per iteration; knots "
        f"are the isotonic (least-squares non-decreasing) fit of the medians: equal to the "
        f"median at {int(exact.sum())} of {len(raw)} token counts, within "
        f"{100 * float(excess.max()):.1f}% of it everywhere (median "
        f"{100 * float(np.median(excess)):.1f}%) where a larger count ran faster"
    )
    return {"note": note, "tokens": [int(t) for t in knots_x], "ms": _r(knots_y)}


def _lm_head_section(profiles: ProfileSet, model: ModelSpec, tp: int) -> dict:
    rows, ms = fitting.lm_head_points(profiles.mlp(model.name), model, tp)
    note = (
        "estimated, not profiled: this model's measured MLP up-projection at the same row "
        "count x vocab / up-projection width (same input, so FLOPs and weight bytes scale "
        "alike); one row per sequence in the batch"
    )
    return {"note": note, "rows": [int(r) for r in rows], "ms": _r(ms)}


def _attention_section(reference: dict, model: ModelSpec, tp: int, gpu: str) -> dict:
    dec, pre = scaling.scale_attention(reference["decode"], reference["prefill"], model, tp, get_gpu(gpu))
    scales = scaling.attention_scales(model, tp, get_gpu(gpu))
    note = (
        f"per layer; fitted on the Llama-2-70B TP2 FlashAttention profile (32 query / 4 KV "
        f"heads per GPU, head dim 128) and scaled to {model.q_heads_per_gpu(tp)} query / "
        f"{model.kv_heads_per_gpu(tp)} KV heads of dim {model.head_dim} (query width "
        f"x{scales['q']:.3g}, KV bytes x{scales['kv']:.3g}); decode = launch + per_seq x seqs "
        f"+ per_kv_token x sum(context); prefill = launch + per_token x C + per_work x W "
        f"+ per_sq_token x min(2W, C^2), C = sum(chunk), W = sum(chunk x (context + chunk/2))"
    )
    return {"note": note, "decode": _sig_dict(dec), "prefill": _sig_dict(pre)}


def reference_attention(profiles: ProfileSet) -> dict:
    """Decode and prefill coefficients fitted on the whole attention profile."""
    dec, pre = profiles.attention()
    return {"decode": fitting.fit_decode(dec), "prefill": fitting.fit_prefill(pre)}


def all_reduce_section(profiles: ProfileSet, tp: int) -> dict | None:
    if tp == 1:
        return None
    if all_reduce_file(profiles.gpu) is None:
        return gpu_calibrate.pcie_all_reduce_section(profiles.gpu, tp)
    xs, ys = fitting.all_reduce_knots(profiles.all_reduce(tp))
    note = ALL_REDUCE_NOTE
    if profiles.gpu != PROFILED_GPU:
        note = (
            "two all-reduces per layer, message = tokens x hidden x 2 bytes, 'size' read as "
            "message bytes as on the A100; measured on a DGX H100 node (NVSwitch), the "
            "interconnect assumed"
        )
    return {
        "note": note,
        "gpus": tp,
        "message_bytes": [int(x) for x in xs],
        "ms": _r(ys),
    }


def _cpu_section(profiles: ProfileSet, model: ModelSpec, tp: int) -> dict:
    src_model, src_tp = scaling.cpu_source(fitting.cpu_pairs(profiles.cpu()), model, tp)
    xs, ys = fitting.cpu_points(profiles.cpu(), src_model, src_tp)
    exact = (src_model, src_tp) == (model.name, tp)
    how = "profiled" if exact else "not profiled; nearest TP, then nearest model size"
    return {
        "note": CPU_NOTE,
        "source": f"{src_model} TP{src_tp} ({how})",
        "batch_size": [int(x) for x in xs],
        "ms": _r(ys),
    }


def _fit_errors(profiles: ProfileSet, model: ModelSpec, tp: int) -> dict:
    errors: dict = {h.name: h.summary() for h in holdout.component_holdouts(profiles, model, tp)}
    errors["note"] = (
        "held-out rows (fit on alternate profile rows, scored on the others), rows above "
        "0.05 ms; mape and worst are fractions; lm_head is not profiled"
    )
    if profiles.gpu != PROFILED_GPU:
        errors["note"] += (
            "; attention and cpu_overhead errors are those of the A100 fits they are carried "
            "from (no profile on this GPU to score the transfer)"
        )
    return errors


def _transferred_attention_section(profiles: ProfileSet, model: ModelSpec, tp: int) -> dict:
    ratios = gpu_calibrate.measured_time_ratios(profiles, ProfileSet(profiles.root))
    dec, pre = scaling.scaled_attention(reference_attention(profiles), model, tp, ratios)
    note = (
        f"per layer; not profiled on {profiles.gpu}: the A100 fit (Llama-2-70B TP2 "
        f"FlashAttention) scaled to {model.q_heads_per_gpu(tp)} query / "
        f"{model.kv_heads_per_gpu(tp)} KV heads of dim {model.head_dim}, then by the measured "
        f"{profiles.gpu} / A100 time of the TP1 linear-op GEMMs (median of "
        f"{ratios['models']} models): x{ratios['bandwidth']:.3g} on bandwidth terms "
        f"(1 token), x{ratios['flops']:.3g} on FLOP terms (4096 tokens)"
    )
    if "prefill" in ratios:
        note += (
            f"; prefill instead x{ratios['prefill']:.3g} on every term: the published speed of "
            f"{profiles.gpu}'s own attention kernel over the A100 profile at 512-4096 tokens "
            f"({attention_kernels.SOURCES[profiles.gpu]})"
        )
    return {"note": note, "decode": _sig_dict(dec), "prefill": _sig_dict(pre)}


def calibrate(profiles: ProfileSet, model: str, gpu: str, tp: int) -> dict:
    """Fit the calibration of (model, GPU, TP) from the profiles.

    Raises:
        UserError: unknown model/GPU, a GPU other than the profiled A100-80GB, a model
            without a profile, a bad TP, missing/corrupt profile files, or a fitted number
            that is not usable (:mod:`sim.calibration.fit_checks`).
    """
    spec = get_model(model)
    get_gpu(gpu)
    check_tensor_parallel(spec, tp)
    if gpu not in PROFILED_GPUS:
        raise UserError(
            f"profiles are from {', '.join(PROFILED_GPUS)}; cannot calibrate {gpu} (it gets the roofline)",
            field="gpu",
        )
    if profiles.gpu != gpu:
        profiles = ProfileSet(profiles.root, gpu)
    if tp not in set(profiles.mlp(model)["tp"]):
        raise UserError(
            f"{mlp_file(model, gpu)} has no TP{tp} rows; profiled: {sorted(set(profiles.mlp(model)['tp']))}",
            field="tp",
        )
    data = _assemble(profiles, spec, gpu, tp)
    what = f"calibration of {model} on {gpu} TP{tp}"
    fit_checks.check_fitted(data, what)
    fit_checks.check_loadable(data, spec, what)
    return data


def _assemble(profiles: ProfileSet, spec: ModelSpec, gpu: str, tp: int) -> dict:
    reduce_file = all_reduce_file(gpu)
    sources = [mlp_file(spec.name, gpu), ATTENTION_FILE, CPU_FILE] + ([reduce_file] if tp > 1 and reduce_file else [])
    if gpu == PROFILED_GPU:
        attention = _attention_section(reference_attention(profiles), spec, tp, gpu)
    else:
        attention = _transferred_attention_section(profiles, spec, tp)
    cpu = _cpu_section(profiles, spec, tp)
    if gpu != PROFILED_GPU:
        cpu["note"] = f"{CPU_NOTE}; {gpu_calibrate.CPU_REUSE_NOTE}"
    return {
        "format": "batchsim-calibration/1",
        "model": spec.name,
        "gpu": gpu,
        "tensor_parallel": tp,
        "source": licence(gpu),
        "profiles": sources,
        "command": f"python -m sim calibrate --model {spec.name} --gpu {gpu} --tp {tp}",
        "units": "milliseconds per iteration unless noted",
        "linear": _linear_section(profiles, spec, tp),
        "lm_head": _lm_head_section(profiles, spec, tp),
        "attention": attention,
        "all_reduce": all_reduce_section(profiles, tp),
        "cpu_overhead": cpu,
        "fit_error": _fit_errors(profiles, spec, tp),
    }


def committed_configs(profiles: ProfileSet, gpu: str) -> tuple[list[tuple[str, int]], list[str]]:
    """The (model, TP) calibrations committed for ``gpu`` and why others are skipped.

    The A100 keeps its fixed list (:data:`COMMITTED`); another profiled GPU gets every
    profiled (model, TP) whose weights leave room for a KV cache in its memory. Either way a
    pair whose layer shapes an earlier kept pair already has at that TP is skipped: the model
    prices itself with that calibration (:mod:`sim.hardware.same_shape`), never a second one.

    Returns:
        ((model, TP) pairs, one "skipped ..." line per pair left out and why).
    """
    if gpu == PROFILED_GPU:
        return _one_per_shape(list(COMMITTED), gpu)
    gpu_profiles = ProfileSet(profiles.root, gpu)
    kept, skipped = [], []
    for model in gpu_profiles.profiled_models():
        spec = get_model(model)
        for tp in sorted(set(gpu_profiles.mlp(model)["tp"]) & set(PROFILE_TPS)):
            problem = gpu_calibrate.fit_problem(spec, gpu, int(tp))
            if problem:
                skipped.append(f"skipped {model} TP{tp} on {gpu}: {problem}")
            else:
                kept.append((model, int(tp)))
    unique, duplicates = _one_per_shape(kept, gpu)
    return unique, skipped + duplicates


def _one_per_shape(pairs: list[tuple[str, int]], gpu: str) -> tuple[list[tuple[str, int]], list[str]]:
    """``pairs`` without any whose (layer shapes, TP) an earlier pair has, and a line per dropped pair."""
    first: dict[tuple, str] = {}
    kept, skipped = [], []
    for model, tp in pairs:
        key = (layer_shapes(get_model(model)), tp)
        if key in first:
            skipped.append(
                f"skipped {model} TP{tp} on {gpu}: same layer shapes as {first[key]}, whose calibration it uses"
            )
            continue
        first[key] = model
        kept.append((model, tp))
    return kept, skipped


def fit_roofline_file(profiles: ProfileSet) -> dict:
    """The transfer file: efficiencies, reference attention, all-reduce and CPU curves."""
    gpu = GPUS[PROFILED_GPU]
    reference = reference_attention(profiles)
    data = {
        "format": "batchsim-roofline/1",
        "gpu": PROFILED_GPU,
        "source": LICENCE,
        "command": "python -m sim calibrate --all",
        "efficiency": {
            "note": roofline_fit.EFFICIENCY_NOTE,
            **roofline_fit.fit_efficiencies(profiles.all_mlp(), gpu),
        },
        "attention_reference": {
            "note": "per layer, 32 query / 4 KV heads per GPU, head dim 128 (Llama-2-70B TP2), A100-80GB",
            "decode": _sig_dict(reference["decode"]),
            "prefill": _sig_dict(reference["prefill"]),
        },
        "all_reduce": {"note": ALL_REDUCE_NOTE, "curves": _all_reduce_curves(profiles)},
        "cpu_overhead": {"note": CPU_NOTE, "curves": _cpu_curves(profiles)},
        "leave_one_model_out": {
            "note": "per-layer linear-op sum of each profiled model predicted from efficiencies "
            "fitted on the other five, over all its TP degrees and token counts (rows above "
            "0.05 ms)",
            **roofline_fit.leave_one_model_out(profiles.all_mlp(), gpu),
        },
        "fit_error": _roofline_fit_errors(profiles),
    }
    fit_checks.check_fitted(data, f"roofline file of {PROFILED_GPU}")
    return data


def _all_reduce_curves(profiles: ProfileSet) -> dict[str, dict]:
    curves = {}
    for n in ALL_REDUCE_GPUS:
        section = all_reduce_section(profiles, n) or {}
        curves[str(n)] = {k: v for k, v in section.items() if k != "note"}
    return curves


def _cpu_curves(profiles: ProfileSet) -> list[dict]:
    curves = []
    for model, tp in fitting.cpu_pairs(profiles.cpu()):
        xs, ys = fitting.cpu_points(profiles.cpu(), model, tp)
        curves.append({"model": model, "tp": tp, "batch_size": [int(x) for x in xs], "ms": _r(ys)})
    return curves


def _roofline_fit_errors(profiles: ProfileSet) -> dict:
    dec, pre = profiles.attention()
    errors = {
        "attention_decode": holdout.decode_holdout(dec).summary(),
        "attention_prefill": holdout.prefill_holdout(pre).summary(),
    }
    for n in ALL_REDUCE_GPUS:
        errors[f"all_reduce_{n}gpu"] = holdout.all_reduce_holdout(profiles.all_reduce(n), n).summary()
    return errors


def write_yaml(data: dict, path: str | Path) -> Path:
    """Write ``data`` as compact YAML (flow-style number lists) and return the path.

    Through :func:`sim.io.safe_write.write_text`: atomic, and only over a new path or a regular file.

    Raises:
        UserError: a number of ``data`` is not usable (:func:`~sim.calibration.fit_checks.check_fitted`);
            nothing is written then.
    """
    from sim.io.safe_write import write_text

    fit_checks.check_fitted(data, str(path))
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110, allow_unicode=True)
    return write_text(path, text)
