"""Calibration files: exact knots at profiled token counts, refit reproducibility, fit targets.

Tests that read the raw profiles locate them at ../shared next to the repository and
skip with a reason where it is absent; the rest check the committed files alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fakes import assert_nested_close as _assert_close

from sim.calibration.calibrate import COMMITTED, calibrate, fit_roofline_file
from sim.calibration.profiles import MLP_PROFILES, ProfileSet
from sim.errors import UserError
from sim.hardware import cost_model, get_model, load_cost_model
from sim.hardware.calibration_files import CALIBRATION_DIR, ROOFLINE_FILE, calibration_filename, read_yaml

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PROFILES = SHARED / "profiles"
needs_shared = pytest.mark.skipif(
    not (PROFILES / "a100").is_dir(),
    reason=f"raw A100 profiles not found at {PROFILES} (../shared next to the repo)",
)
COMMITTED_FILES = [calibration_filename(m, "a100-80gb", tp) for m, tp in COMMITTED]


@pytest.fixture(scope="module")
def profiles() -> ProfileSet:
    return ProfileSet(PROFILES)


def _raw_linear_ms(model: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-iteration linear ms straight from the CSV: layers x sum of op medians + embedding."""
    frame = pd.read_csv(PROFILES / "a100" / "mlp" / f"{MLP_PROFILES[model]}.csv")
    frame = frame[frame["num_tensor_parallel_workers"] == tp]
    medians = [c for c in frame.columns if c.endswith(".median")]
    per_count = frame.groupby("num_tokens")[medians].mean()  # 2048 and 4096 were measured twice
    layer = per_count.drop(columns="time_stats.emb.median").sum(axis=1)
    total = get_model(model).num_layers * layer + per_count["time_stats.emb.median"]
    return per_count.index.to_numpy(), total.to_numpy()


@needs_shared
@pytest.mark.parametrize("model,tp", COMMITTED)
def test_linear_time_is_the_profile_median_at_profiled_counts(model: str, tp: int) -> None:
    cost = load_cost_model(model, "a100-80gb", tp)
    tokens, raw_ms = _raw_linear_ms(model, tp)
    got_ms = np.array(
        [
            cost.iteration_time_s(np.array([t]), np.array([0]), np.zeros(0, int), breakdown=True)[1]["linear"] * 1e3
            for t in tokens
        ]
    )
    # The least-squares non-decreasing fit: monotone, and every run of equal knots
    # (a pooled block) sits at the mean of the medians it pools (10 ns rounding in the file).
    assert np.all(np.diff(got_ms) >= -1e-9)
    block_starts = np.flatnonzero(np.r_[True, np.abs(np.diff(got_ms)) > 1e-6])
    for start, stop in zip(block_starts, np.r_[block_starts[1:], len(got_ms)], strict=True):
        np.testing.assert_allclose(got_ms[start:stop], raw_ms[start:stop].mean(), rtol=0, atol=2e-5)
    # Many counts are not pooled, so the curve is the profile median there...
    exact = np.abs(got_ms - raw_ms) < 1e-5
    assert exact.mean() > 0.2
    # ...and it is closer to the medians than the running max (the upper envelope) is.
    envelope = np.maximum.accumulate(raw_ms)
    assert np.sum((got_ms - raw_ms) ** 2) < np.sum((envelope - raw_ms) ** 2)


@needs_shared
@pytest.mark.parametrize("model,tp", COMMITTED)
def test_committed_calibration_matches_refit(profiles: ProfileSet, model: str, tp: int) -> None:
    committed = read_yaml(CALIBRATION_DIR / calibration_filename(model, "a100-80gb", tp))
    _assert_close(committed, calibrate(profiles, model, "a100-80gb", tp))


@needs_shared
def test_committed_roofline_matches_refit(profiles: ProfileSet) -> None:
    _assert_close(read_yaml(CALIBRATION_DIR / ROOFLINE_FILE), fit_roofline_file(profiles))


@pytest.mark.parametrize("name", COMMITTED_FILES)
def test_committed_fit_errors_meet_targets(name: str) -> None:
    data = read_yaml(CALIBRATION_DIR / name)
    errors = data["fit_error"]
    assert errors["linear"]["mape"] <= 0.05 and errors["linear"]["rows"] > 100
    assert errors["attention_decode"]["mape"] <= 0.10 and errors["attention_prefill"]["mape"] <= 0.10
    assert "Vidur" in data["source"] and "MIT" in data["source"]


def test_roofline_transfer_meets_target() -> None:
    loo = read_yaml(CALIBRATION_DIR / ROOFLINE_FILE)["leave_one_model_out"]
    models = [k for k in loo if k != "note"]
    assert sorted(models) == sorted(MLP_PROFILES)
    assert all(loo[m]["mape"] <= 0.10 for m in models)


def test_fitted_attention_coefficients_are_physical() -> None:
    ref = read_yaml(CALIBRATION_DIR / ROOFLINE_FILE)["attention_reference"]
    # Decode streams 2 x 4 KV heads x 128 x 2 bytes per token: the effective bandwidth is below
    # the HBM peak (2.04 TB/s) but not absurdly low.
    bytes_per_token = 2 * 4 * 128 * 2
    bandwidth = bytes_per_token / (ref["decode"]["per_kv_token_ms"] * 1e-3)
    assert 0.8e12 < bandwidth < 2.04e12
    # Prefill: 4 FLOPs per (query, key) pair per head dim x 32 heads; achieved FLOP/s is below
    # the 312 TF peak.
    flops_per_work = 4 * 32 * 128
    achieved = flops_per_work / ((ref["prefill"]["per_work_ms"] + ref["prefill"]["per_sq_token_ms"] / 2) * 1e-3)
    assert 50e12 < achieved < 312e12
    assert all(v >= 0 for part in ("decode", "prefill") for v in ref[part].values() if isinstance(v, float))


def test_corrupt_calibration_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = calibration_filename("llama-2-7b", "a100-80gb", 1)
    shutil.copy(CALIBRATION_DIR / ROOFLINE_FILE, tmp_path / ROOFLINE_FILE)
    (tmp_path / name).write_text("format: batchsim-calibration/1\nlinear: {tokens: [1, 2], ms: [2.0, 1.0]}\n")
    monkeypatch.setattr(cost_model, "CALIBRATION_DIR", tmp_path)
    with pytest.raises(UserError, match=name):
        load_cost_model("llama-2-7b", "a100-80gb", 1)
    (tmp_path / name).write_text("linear: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_cost_model("llama-2-7b", "a100-80gb", 1)


def test_missing_profiles_are_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="profile file not found"):
        calibrate(ProfileSet(tmp_path), "llama-2-7b", "a100-80gb", 1)


def test_calibrating_an_unprofiled_gpu_or_model_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="roofline"):
        calibrate(ProfileSet(tmp_path), "llama-2-7b", "h200", 1)
    with pytest.raises(UserError, match="no A100 profile"):
        calibrate(ProfileSet(tmp_path), "mistral-7b", "a100-80gb", 1)


def test_corrupt_profile_csv_is_a_user_error(tmp_path: Path) -> None:
    mlp = tmp_path / "a100" / "mlp" / f"{MLP_PROFILES['phi-2']}.csv"
    mlp.parent.mkdir(parents=True)
    mlp.write_text("num_tokens,something\n1,2\n")
    with pytest.raises(UserError, match="no column"):
        calibrate(ProfileSet(tmp_path), "phi-2", "a100-80gb", 1)
