"""Same-shape calibration: a model with a calibrated model's layer shapes prices like it, vocabulary apart.

Llama-3-70B / Llama-3.1-70B share Llama-2-70B's layers, Llama-3.1-8B / Mistral-7B Llama-3-8B's. Their
step time must be the twin's op by op except the vocabulary term (the LM head), and any change to a layer
shape must break the pairing.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.calibration import calibrate_cli
from sim.errors import UserError
from sim.hardware import COMPONENTS, get_model, load_cost_model
from sim.hardware.calibration_files import CALIBRATION_DIR
from sim.hardware.catalog import MODELS, NON_LAYER_FIELDS, layer_shapes
from sim.hardware.cost_model import calibrated_configs
from sim.hardware.same_shape import same_shape_configs, same_shape_models, twin_for
from sim.listing import catalog_lines

PAIRS = same_shape_configs(calibrated_configs())
# (prefill tokens, prefill pieces, attention work W, decode sequences, decode context tokens): a single
# token, short and long prefills with and without cached context, decode batches, and mixed batches.
BATCHES = [
    (1, 1, 0.5, 0, 0),
    (64, 1, 64 * 1000 + 64 * 32, 0, 0),
    (512, 1, 512 * 256, 0, 0),
    (2048, 1, 2048 * 1024, 0, 0),
    (5000, 2, 2500 * (1000 + 1250) * 2, 0, 0),
    (0, 0, 0.0, 1, 1024),
    (0, 0, 0.0, 16, 16 * 700),
    (0, 0, 0.0, 256, 256 * 2048),
    (256, 1, 256 * (4096 + 128), 64, 64 * 1500),
]


def test_the_catalog_pairs_are_the_known_same_shape_models() -> None:
    borrowers = {(model, twin) for model, twin, _, _ in PAIRS}
    assert borrowers == {
        ("llama-3-70b", "llama-2-70b"),
        ("llama-3.1-70b", "llama-2-70b"),
        ("llama-3.1-8b", "llama-3-8b"),
        ("mistral-7b", "llama-3-8b"),
    }
    # Every pair borrows on exactly the (GPU, TP) its twin is calibrated on, and only where it has no file.
    calibrated = set(calibrated_configs())
    for model, twin, gpu, tp in PAIRS:
        assert (twin, gpu, tp) in calibrated and (model, gpu, tp) not in calibrated


@pytest.mark.parametrize("model,twin,gpu,tp", PAIRS)
@pytest.mark.parametrize("batch", BATCHES)
def test_step_time_is_the_twins_op_by_op_except_the_lm_head(
    model: str, twin: str, gpu: str, tp: int, batch: tuple
) -> None:
    mine = load_cost_model(model, gpu, tp).breakdown_from_totals_s(*batch)
    theirs = load_cost_model(twin, gpu, tp).breakdown_from_totals_s(*batch)
    assert mine.keys() == theirs.keys() and set(mine) <= set(COMPONENTS)
    for component in mine.keys() - {"lm_head"}:
        assert mine[component] == theirs[component], component
    vocab_ratio = get_model(model).vocab_size / get_model(twin).vocab_size
    assert mine["lm_head"] == pytest.approx(theirs["lm_head"] * vocab_ratio, rel=1e-12)
    assert load_cost_model(model, gpu, tp).time_from_totals_s(*batch) == pytest.approx(
        sum(theirs.values()) - theirs["lm_head"] + theirs["lm_head"] * vocab_ratio, rel=1e-12
    )


@pytest.mark.parametrize("model,twin,gpu,tp", PAIRS)
def test_same_shape_models_are_labelled_with_their_twin(model: str, twin: str, gpu: str, tp: int) -> None:
    cost = load_cost_model(model, gpu, tp)
    assert cost.label == f"same-shape ({twin})"
    assert f"{twin}_{gpu}_tp{tp}.yaml" in cost.source and "LM head re-priced" in cost.source


def test_list_models_names_the_twin() -> None:
    lines = {line.split()[0]: line for line in catalog_lines("models")}
    assert "same-shape (llama-2-70b) on a100-80gb at TP 2,4" in lines["llama-3.1-70b"]
    assert "same-shape (llama-3-8b) on a100-80gb at TP 1" in lines["mistral-7b"]
    assert "same-shape" not in lines["llama-2-70b"] and "same-shape" not in lines["qwen2.5-72b"]


def test_a_model_with_its_own_file_or_without_a_calibrated_twin_keeps_its_label() -> None:
    assert load_cost_model("llama-2-70b", "a100-80gb", 2).label == "calibrated"
    assert load_cost_model("llama-3-70b", "a100-80gb", 8).label == "transferred"  # llama-2-70b: TP 2, 4 only
    assert load_cost_model("llama-3.1-8b", "h100-sxm", 1).label == "transferred (h100 profiles)"


def test_results_record_the_same_shape_label() -> None:
    from sim.config import Scenario
    from sim.resolve import resolve

    scenario = Scenario.model_validate(
        {
            "name": "same_shape",
            "model": "llama-3.1-8b",
            "workload": {
                "requests": 4,
                "arrival": {"kind": "poisson", "rate": 1.0},
                "prompt_tokens": {"kind": "uniform", "low": 16, "high": 32},
                "output_tokens": {"kind": "uniform", "low": 2, "high": 4},
            },
            "policies": [{"name": "continuous", "kind": "continuous", "max_batch_size": 4}],
        }
    )
    facts = resolve(scenario).facts()
    assert facts["cost_model"] == "same-shape (llama-3-8b)"
    assert "llama-3-8b_a100-80gb_tp1.yaml" in facts["calibration"]


def test_no_two_committed_calibrations_share_a_shape_on_one_gpu_and_tp() -> None:
    seen: dict[tuple, str] = {}
    for model, gpu, tp in calibrated_configs():
        key = (layer_shapes(get_model(model)), gpu, tp)
        assert key not in seen, f"{model} duplicates {seen.get(key)} on {gpu} TP{tp}"
        seen[key] = model


def test_calibrate_refuses_a_duplicate_and_writes_nothing(capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser(prog="sim")
    calibrate_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4"])
    before = sorted(p.name for p in CALIBRATION_DIR.iterdir())
    with pytest.raises(UserError, match=r"layer shapes of llama-2-70b.*llama-2-70b_h100-sxm_tp4\.yaml"):
        calibrate_cli.run(args)
    assert sorted(p.name for p in CALIBRATION_DIR.iterdir()) == before


# --------------------------------------------------------------------------- perturbed shapes
LAYER_FIELDS = [
    "num_layers", "num_q_heads", "num_kv_heads", "hidden_size", "mlp_hidden_size", "explicit_head_dim",
    "dtype_bytes", "weight_dtype_bytes",
]  # fmt: skip
FLAGS = ["gated_mlp", "rotary", "parallel_block"]
TWINS = sorted({twin for _, twin, _, _ in PAIRS})


@given(
    twin=st.sampled_from(TWINS),
    field=st.sampled_from(LAYER_FIELDS),
    delta=st.integers(min_value=1, max_value=4096),
)
def test_a_changed_layer_shape_is_never_same_shape(twin: str, field: str, delta: int) -> None:
    base = get_model(twin)
    value = getattr(base, field) or (base.head_dim if field == "explicit_head_dim" else base.dtype_bytes)
    changed = dataclasses.replace(base, name="perturbed", **{field: value + delta})
    assert layer_shapes(changed) != layer_shapes(base)
    assert twin not in same_shape_models(changed)
    for gpu, tp in {(g, t) for _, tw, g, t in PAIRS if tw == twin}:
        assert twin_for(changed, gpu, tp) is None


@given(twin=st.sampled_from(TWINS), flag=st.sampled_from(FLAGS))
def test_a_changed_architecture_flag_is_never_same_shape(twin: str, flag: str) -> None:
    base = get_model(twin)
    changed = dataclasses.replace(base, name="perturbed", **{flag: not getattr(base, flag)})
    assert twin not in same_shape_models(changed)
    assert all(twin_for(changed, gpu, tp) is None for _, tw, gpu, tp in PAIRS if tw == twin)


def test_the_fields_left_out_of_the_shape_are_model_fields() -> None:
    # A renamed field would otherwise silently join the shape (and break every pairing) unnoticed.
    assert {f.name for f in dataclasses.fields(get_model("llama-2-70b"))} >= NON_LAYER_FIELDS


@given(
    twin=st.sampled_from(TWINS),
    vocab=st.integers(min_value=1000, max_value=300_000),
    positions=st.integers(min_value=512, max_value=1 << 20),
    tied=st.booleans(),
)
def test_vocabulary_context_and_tying_leave_the_shape_alone(twin: str, vocab: int, positions: int, tied: bool) -> None:
    base = get_model(twin)
    changed = dataclasses.replace(
        base, name="new-vocab", hf_name="x/y", vocab_size=vocab, max_positions=positions, tied_embeddings=tied
    )
    with patch.dict(MODELS, {changed.name: changed}):
        for _, tw, gpu, tp in PAIRS:
            if tw != twin:
                continue
            assert twin_for(changed, gpu, tp) == twin
            mine = load_cost_model(changed.name, gpu, tp).breakdown_from_totals_s(300, 1, 300 * 150.0, 8, 8 * 900)
            theirs = load_cost_model(twin, gpu, tp).breakdown_from_totals_s(300, 1, 300 * 150.0, 8, 8 * 900)
            assert mine["linear"] == theirs["linear"] and mine["attention_decode"] == theirs["attention_decode"]
            assert mine["lm_head"] == pytest.approx(theirs["lm_head"] * vocab / base.vocab_size, rel=1e-12)


PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "profiles"


@pytest.mark.skipif(not (PROFILES / "a100").is_dir(), reason=f"raw A100 profiles not found at {PROFILES}")
def test_report_lists_the_pairs_and_measures_the_premise(tmp_path: Path) -> None:
    from sim.calibration.profiles import ProfileSet
    from sim.calibration.same_shape_report import premise_rows, same_shape_report

    text, path = same_shape_report(ProfileSet(PROFILES), tmp_path)
    assert path.read_text() == text
    assert "- llama-3.1-70b: same-shape (llama-2-70b) on a100-80gb TP 2,4; a40 TP 4,8; h100-sxm TP 2,4,8" in text
    rows = premise_rows(ProfileSet(PROFILES))
    # Llama-3-70B was profiled on the A100 itself: Llama-2-70B's curve predicts it where that curve is measured.
    within = [r for r in rows if r["model"] == "llama-3-70b" and r["tokens"].startswith("<=")]
    assert {r["tp"] for r in within} == {2, 4}
    assert all(r["rows"] > 200 and r["mape"] <= 0.03 and abs(r["bias"]) <= 0.03 for r in within)
