"""Calibrations of the H100 and A40 (and the A100 ones alongside): refit, physics, fit.

Refit tests read ../shared/profiles next to the repository and skip with a reason where
it is absent; the rest check the committed files alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import assert_nested_close as _assert_close

from sim.calibration.calibrate import calibrate, committed_configs
from sim.calibration.gpu_roofline import fit_gpu_roofline_file
from sim.calibration.profiles import ProfileSet
from sim.errors import UserError
from sim.hardware import get_gpu, get_model, load_cost_model
from sim.hardware.calibration_files import CALIBRATION_DIR, read_yaml, roofline_file_name
from sim.hardware.cost_model import calibrated_configs
from sim.hardware.memory import kv_budget

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PROFILES = SHARED / "profiles"
needs_shared = pytest.mark.skipif(
    not (PROFILES / "h100").is_dir() or not (PROFILES / "a40").is_dir(),
    reason=f"raw H100/A40 profiles not found at {PROFILES} (../shared next to the repo)",
)
ALL_CONFIGS = calibrated_configs()
NEW_GPU_CONFIGS = [c for c in ALL_CONFIGS if c[1] != "a100-80gb"]
# Held-out linear-op MAPE bound per GPU: the 3% target on every calibration. The H100
# profile steps harder at tile/wave boundaries; with running-max knots 6 of its 19
# calibrations missed 3% (up to 3.9%), with isotonic knots none does (worst 2.6%).
LINEAR_MAPE_BOUND = {"a100-80gb": 0.03, "a40": 0.03, "h100-sxm": 0.03}


def test_every_profiled_gpu_has_calibrations() -> None:
    gpus = {gpu for _, gpu, _ in ALL_CONFIGS}
    assert {"a100-80gb", "h100-sxm", "a40"} <= gpus
    assert len([c for c in NEW_GPU_CONFIGS if c[1] == "h100-sxm"]) == 19
    assert len([c for c in NEW_GPU_CONFIGS if c[1] == "a40"]) == 16


@needs_shared
@pytest.mark.parametrize("model,gpu,tp", NEW_GPU_CONFIGS)
def test_committed_gpu_calibration_matches_refit(model: str, gpu: str, tp: int) -> None:
    committed = read_yaml(CALIBRATION_DIR / f"{model}_{gpu}_tp{tp}.yaml")
    _assert_close(committed, calibrate(ProfileSet(PROFILES), model, gpu, tp))


@needs_shared
@pytest.mark.parametrize("gpu", ["h100-sxm", "a40"])
def test_committed_set_is_every_profiled_pair_that_fits(gpu: str) -> None:
    kept, skipped = committed_configs(ProfileSet(PROFILES), gpu)
    assert sorted((m, g, t) for m, t in kept for g in [gpu]) == sorted(c for c in NEW_GPU_CONFIGS if c[1] == gpu)
    assert skipped and all("does not fit" in line for line in skipped)


@pytest.mark.parametrize("model,gpu,tp", ALL_CONFIGS)
def test_held_out_linear_mape_meets_target(model: str, gpu: str, tp: int) -> None:
    linear = read_yaml(CALIBRATION_DIR / f"{model}_{gpu}_tp{tp}.yaml")["fit_error"]["linear"]
    assert linear["rows"] > 100
    assert linear["mape"] <= LINEAR_MAPE_BOUND[gpu]


@pytest.mark.parametrize("model,gpu,tp", ALL_CONFIGS)
def test_calibrations_respect_physics_floors(model: str, gpu: str, tp: int) -> None:
    spec, gpu_spec = get_model(model), get_gpu(gpu)
    cost = load_cost_model(model, gpu, tp, cpu_overhead=False)
    assert cost.label == "calibrated"
    decode_s = cost.iteration_time_s(np.zeros(0, int), np.zeros(0, int), np.array([1]))
    assert decode_s > spec.weight_bytes / tp / (gpu_spec.hbm_gb_per_s * 1e9)
    prefill_s = cost.iteration_time_s(np.array([2048]), np.array([0]), np.zeros(0, int))
    flops = 2 * spec.num_params * 2048 / tp
    assert prefill_s > flops / (gpu_spec.peak_bf16_tflops * 1e12)


def test_transferred_parts_are_labelled_in_the_file() -> None:
    data = read_yaml(CALIBRATION_DIR / "llama-2-70b_a40_tp4.yaml")
    assert "measured a40 / A100 time" in data["attention"]["note"]
    assert "PCIe" in data["all_reduce"]["note"]
    assert "A100-host profile reused" in data["cpu_overhead"]["note"]
    h100 = read_yaml(CALIBRATION_DIR / "llama-2-70b_h100-sxm_tp4.yaml")
    assert "DGX H100 node (NVSwitch)" in h100["all_reduce"]["note"]
    assert "h100/all_reduce_dgx.csv" in h100["profiles"]


def test_qwen_72b_tp1_on_a40_does_not_fit() -> None:
    with pytest.raises(UserError, match=r"does not fit on a40") as info:
        kv_budget(get_model("qwen-72b"), get_gpu("a40"), 1)
    message = str(info.value)
    assert "144.6 GB" in message and "44.99 GiB" in message and "tensor_parallel >= 4" in message


@needs_shared
@pytest.mark.parametrize("gpu", ["h100-sxm", "a40"])
def test_committed_gpu_roofline_matches_refit(gpu: str) -> None:
    committed = read_yaml(CALIBRATION_DIR / roofline_file_name(gpu))
    _assert_close(committed, fit_gpu_roofline_file(PROFILES, gpu))


# Leave-one-model-out on each GPU's own profiles: target 8% for every model. Before the
# per-kernel latency term the H100's two smallest models missed it (llama-2-7b 10.4%,
# phi-2 8.6%): one efficiency per token count cannot serve narrow and wide layers at once.
LOMO_BOUND = 0.08


@pytest.mark.parametrize("gpu", ["h100-sxm", "a40"])
def test_per_gpu_leave_one_model_out(gpu: str) -> None:
    loo = read_yaml(CALIBRATION_DIR / roofline_file_name(gpu))["leave_one_model_out"]
    scores = {m: v["mape"] for m, v in loo.items() if m != "note"}
    assert len(scores) == 6 and max(scores.values()) <= LOMO_BOUND


@pytest.mark.parametrize("gpu", ["h100-sxm", "a40"])
@needs_shared
def test_kernel_latency_is_a_few_microseconds_and_below_every_measured_time(gpu: str) -> None:
    roof = read_yaml(CALIBRATION_DIR / roofline_file_name(gpu))
    latency_ms = roof["efficiency"]["latency_ms"]
    tables = ProfileSet(PROFILES, gpu).all_mlp(extra=True)
    for op, ms in latency_ms.items():
        fastest = min(float(t[op].min()) for t in tables.values() if op in t.columns)
        assert 0 <= ms < fastest  # a launch floor cannot exceed the fastest kernel measured
        assert ms <= 0.02  # 20 us: launch + first wave, not a whole kernel


def test_unprofiled_models_on_profiled_gpus_are_labelled_transferred() -> None:
    for model in ("llama-3-8b", "mistral-7b"):
        cost = load_cost_model(model, "h100-sxm", 1)
        assert cost.label == "transferred (h100 profiles)"
        assert "h100-sxm_roofline.yaml" in cost.source
    assert load_cost_model("llama-3-8b", "a40", 1).label == "transferred (a40 profiles)"
    assert load_cost_model("llama-3-8b", "h200", 1).label == "uncalibrated (roofline)"


def test_list_gpus_gives_the_roofline_error_bar() -> None:
    from sim.listing import catalog_lines

    lines = {line.split()[0]: line for line in catalog_lines("gpus")}
    assert "uncalibrated (roofline) (A100 roofline vs measured" in lines["h200"]
    assert "19 calibrations" in lines["h100-sxm"] and "PCIe" in lines["a40"]
