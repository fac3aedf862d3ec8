"""H100 prefill: attention carried by the attention kernel's own speed, not by the GEMM time ratio.

Issue 27: large TP1 prefills on the H100 were priced 10-33% slow against the H100's own linear-op profiles
because the A100 attention fit was carried over by the GEMM ratio (x0.338), while the H100's attention
kernel (FlashAttention-3) gains ~3x more than that. Tests that read ../shared skip with a reason without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.calibration import prefill_report
from sim.calibration.attention_kernels import PUBLISHED_PREFILL_TFLOPS, prefill_time_ratio
from sim.calibration.profiles import ProfileSet
from sim.hardware import get_gpu, get_model
from sim.hardware.calibration_files import CALIBRATION_DIR, PREFILL_TERMS, read_yaml, roofline_file_name
from sim.hardware.cost_model import calibrated_configs
from sim.hardware.scaling import scale_attention

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PROFILES = SHARED / "profiles"
needs_profiles = pytest.mark.skipif(
    not (PROFILES / "h100").is_dir(), reason=f"raw H100/A100 profiles not found at {PROFILES}"
)
needs_spans = pytest.mark.skipif(
    not (SHARED / "validation" / prefill_report.SPANS_FILE).is_file(),
    reason=f"vLLM 0.11 H100 spans not found under {SHARED / 'validation'}",
)
H100_CONFIGS = [(m, tp) for m, gpu, tp in calibrated_configs() if gpu == "h100-sxm"]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return prefill_report.profile_rows(ProfileSet(PROFILES))


@needs_profiles
def test_tp1_prefill_is_within_target_of_profile_rows_plus_attention(rows: list[dict]) -> None:
    now = [r for r in rows if "now" in r["mechanism"]]
    assert {r["model"] for r in now} == {"codellama-34b", "internlm-20b", "llama-2-7b", "phi-2"}
    for row in now:  # every profiled count in 512..4096 tokens
        assert row["rows"] > 150
        assert row["mape"] <= prefill_report.TARGET, row
        assert abs(row["bias"]) <= 0.02, row


@needs_profiles
def test_the_gemm_ratio_was_the_cause(rows: list[dict]) -> None:
    # The same check on the old carry-over fails: every model 8-22% slow on average, worse with more tokens.
    for row in (r for r in rows if "before" in r["mechanism"]):
        assert row["bias"] >= 0.05, row
        assert row["at"][4096] > row["at"][1024], row


@needs_profiles
def test_one_ratio_serves_every_length() -> None:
    # Published H100 time / A100 profiled time at each length: flat enough to scale the whole A100 form.
    found = prefill_time_ratio("h100-sxm", ProfileSet(PROFILES))
    assert found is not None and len(found["lengths"]) >= 4
    low, high = found["spread"]
    assert 0.9 * found["ratio"] <= low <= found["ratio"] <= high <= 1.1 * found["ratio"]


@needs_profiles
@needs_spans
def test_engine_prefill_spans_are_matched_only_with_the_kernel_ratio() -> None:
    spans = {r["mechanism"]: r for r in prefill_report.span_rows(SHARED / "validation") or []}
    now, before = spans["attention kernel ratio (now)"], spans["GEMM ratio (before)"]
    assert now["requests"] >= 20
    assert abs(now["bias"]) <= 0.03 and now["mape"] <= 0.08
    assert before["bias"] >= 0.10


def test_committed_h100_files_scale_every_prefill_term_by_the_kernel_ratio() -> None:
    roof = read_yaml(CALIBRATION_DIR / roofline_file_name("h100-sxm"))
    ratio = roof["attention_ratios"]["prefill"]
    reference = roof["attention_reference"]
    assert ratio < roof["attention_ratios"]["flops"] / 2  # the kernel gains far more than the GEMMs
    for model, tp in H100_CONFIGS:
        committed = read_yaml(CALIBRATION_DIR / f"{model}_h100-sxm_tp{tp}.yaml")["attention"]
        _, geometry = scale_attention(
            reference["decode"], reference["prefill"], get_model(model), tp, get_gpu("a100-80gb")
        )
        for term in PREFILL_TERMS:
            assert committed["prefill"][term] == pytest.approx(geometry[term] * ratio, rel=1e-4), (model, tp, term)


def test_gpus_without_a_published_kernel_keep_the_gemm_ratios() -> None:
    assert "a40" not in PUBLISHED_PREFILL_TFLOPS
    assert "prefill" not in read_yaml(CALIBRATION_DIR / roofline_file_name("a40"))["attention_ratios"]
