"""``python -m sim list ...``: the catalogs a scenario may name, one line each."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from sim import config
from sim.errors import UserError


def catalog_lines(what: str) -> list[str]:
    """Human-readable lines for one catalog of ``sim.cli.CATALOGS``."""
    listers = {
        "models": _models, "gpus": _gpus, "policies": _policies, "presets": _presets,
        "arrivals": lambda: _union_lines(config.Arrival), "lengths": lambda: _union_lines(config.Length),
        "traces": _traces,
    }
    if what not in listers:
        raise UserError(f"list: unknown catalog '{what}'; allowed: {', '.join(listers)}")
    return listers[what]()


def _models() -> list[str]:
    from sim.hardware.catalog import MODELS
    from sim.hardware.cost_model import calibrated_configs
    from sim.hardware.same_shape import LABEL, same_shape_configs

    calibrated = calibrated_configs()
    # (model) -> {how it is priced: {gpu: [tp, ...]}}, in catalog then GPU order
    priced: dict[str, dict[str, dict[str, list[int]]]] = {}
    for model, gpu, tp in calibrated:
        priced.setdefault(model, {}).setdefault("calibrated", {}).setdefault(gpu, []).append(tp)
    for model, twin, gpu, tp in same_shape_configs(calibrated):
        priced.setdefault(model, {}).setdefault(LABEL.format(twin=twin), {}).setdefault(gpu, []).append(tp)
    lines = []
    for name, m in MODELS.items():
        label = "; ".join(f"{how} on " + ", ".join(f"{gpu} at TP {','.join(map(str, sorted(tps)))}"
                                                  for gpu, tps in per_gpu.items())
                          for how, per_gpu in priced.get(name, {}).items()) or "roofline transfer"
        lines.append(f"{name:<16} {m.hf_name:<36} {m.num_params / 1e9:6.1f}B params, "
                     f"{m.num_layers} layers, {m.num_kv_heads}/{m.num_q_heads} KV/Q heads — {label}")
    return lines


def _gpus() -> list[str]:
    from sim.hardware.catalog import GPUS

    return [f"{name:<12} {g.peak_bf16_tflops:7.0f} TFLOP/s bf16, {g.hbm_gb_per_s:6.0f} GB/s HBM, "
            f"{g.memory_gb:5.0f} GiB, {g.interconnect}, {_power_and_price(g)} — {_gpu_cost_model(name)}"
            for name, g in GPUS.items()]


def _power_and_price(gpu: typing.Any) -> str:
    """TDP, idle power and $/GPU-hour as the energy and cost columns use them (docs/cost.md)."""
    price = f"${gpu.usd_per_hour:.2f}/h" if gpu.usd_per_hour > 0 else "no listed $/h"
    return f"{gpu.tdp_w:.0f} W TDP, {gpu.idle_w:.0f} W idle, {price}"


def _gpu_cost_model(gpu: str) -> str:
    """How ``gpu`` is priced, with the error bar of an uncalibrated (roofline) GPU: the
    A100 roofline's cross-prediction error on the profiled non-A100 GPUs."""
    from sim.hardware.calibration_files import CALIBRATION_DIR, read_yaml, roofline_file_name
    from sim.hardware.cost_model import calibrated_configs

    count = sum(1 for _, g, _ in calibrated_configs() if g == gpu)
    if count:
        return f"{count} calibrations, other models transferred from its profiles"
    cross = [read_yaml(p)["cross_gpu_from_a100"]["mape"]
             for p in sorted(CALIBRATION_DIR.glob("*_roofline.yaml"))
             if p.name != roofline_file_name("a100-80gb")]
    bar = f" (A100 roofline vs measured on profiled GPUs: MAPE {min(cross):.0%}-{max(cross):.0%})" if cross else ""
    return f"uncalibrated (roofline){bar}"


def _policies() -> list[str]:
    from sim.policies.table import POLICIES

    return [f"{kind:<16} {(cls.config_class.__doc__ or '').strip()}" for kind, cls in POLICIES.items()]


def _presets() -> list[str]:
    from sim.presets import preset_lines

    return preset_lines()


def _traces() -> list[str]:
    from sim.workload.traces import TRACE_NAMES, local_trace_path

    lines = []
    for name, info in TRACE_NAMES.items():
        path = local_trace_path(name)
        where = f"here: {path}" if path else (
            f"not here: python -m sim traces fetch {name}" if info.url else "not here: copy it into a trace folder"
        )
        lines.append(f"{name:<22} [{where}] {info}")
    return lines


def _union_lines(union: object) -> list[str]:
    lines = []
    for cls in _members(union):
        fields = [f for f in cls.model_fields if f != "kind"]
        kind = cls.model_fields["kind"].default
        lines.append(f"{kind:<12} {{{', '.join(fields)}}}  {(cls.__doc__ or '').strip()}")
    return lines


def _members(union: object) -> list[type[BaseModel]]:
    annotated_args = typing.get_args(union)
    inner = annotated_args[0] if annotated_args else union
    return [member for member in typing.get_args(inner) if issubclass(member, BaseModel)]
