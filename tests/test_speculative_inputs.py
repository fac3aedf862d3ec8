"""Speculative decoding at the scenario level: bad inputs (one clear error, exit 2) and
bit-identical results with speculation off."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config import Scenario
from sim.errors import UserError
from sim.hardware.catalog import get_gpu, get_model
from sim.hardware.memory import kv_budget, kv_bytes_per_token, with_draft_model
from sim.io.scenario import load_scenario
from sim.resolve import resolve
from sim.runner import run

REPO = Path(__file__).resolve().parents[1]
BASE = {
    "name": "spec",
    "model": "llama-2-7b",
    "workload": {
        "requests": 30,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 64},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 40},
    },
    "policies": [{"name": "p", "kind": "paged", "speculative": {"method": "eagle"}}],
}


def _scenario(tmp_path: Path, **spec) -> Path:
    data = copy.deepcopy(BASE)
    data["policies"][0]["speculative"] |= spec
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD = {
    "acceptance above 1": ({"acceptance_rate": 1.5}, ["policies[0].speculative.acceptance_rate", "1.5", "[0, 1]"]),
    "acceptance below 0": ({"acceptance_rate": -0.1}, ["acceptance_rate", "-0.1", "[0, 1]"]),
    "unknown method": ({"method": "medusa"}, ["policies[0].speculative.method", "medusa", "eagle"]),
    "draft model missing": ({"method": "draft_model"}, ["draft_model", "needs"]),
    "draft model for eagle": ({"draft_model": "phi-2"}, ["draft_model", "only used by method draft_model"]),
    "unknown draft model": (
        {"method": "draft_model", "draft_model": "llama-2-7"},
        ["policies[0].speculative.draft_model", "llama-2-7", "did you mean"],
    ),
    "other vocabulary": (
        {"method": "draft_model", "draft_model": "llama-3-8b"},
        ["policies[0].speculative.draft_model", "vocabulary", "128256", "tokenizer"],
    ),
    "zero draft tokens": ({"num_speculative_tokens": 0}, ["num_speculative_tokens", "0"]),
    # Same vocabulary as the Llama-2-7B target, but 128 GiB of weights on one 80 GB GPU.
    "draft model does not fit": (
        {"method": "draft_model", "draft_model": "llama-2-70b"},
        ["policies[0].speculative.draft_model", "llama-2-70b does not fit", "GiB"],
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_speculative_input_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str):
    spec, fragments = BAD[case]
    code = main(["run", str(_scenario(tmp_path, **spec)), "--out", str(tmp_path / "out"), "--quiet", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from: {err}"
    assert not (tmp_path / "out").exists()


def test_multi_step_with_speculation_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = copy.deepcopy(BASE)
    data["policies"][0]["num_scheduler_steps"] = 4
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 2
    assert "num_scheduler_steps = 1" in capsys.readouterr().err


def test_a_draft_model_scenario_runs(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["policies"] = [
        {"name": "off", "kind": "paged"},
        {"name": "draft", "kind": "paged", "speculative": {"method": "draft_model", "draft_model": "phi-2"}},
    ]
    data["model"] = "phi-2"  # a self-draft: same vocabulary by construction
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    summary = run(load_scenario(path)).summary.set_index("policy")
    assert summary.loc["draft", "completed"] == 30
    assert 1 < summary.loc["draft", "spec_tokens_per_step"] < 5
    assert pd.isna(summary.loc["off", "spec_tokens_per_step"])


def test_speculation_off_leaves_quickstart_bit_identical(tmp_path: Path) -> None:
    out = tmp_path / "q"
    assert main(["run", str(REPO / "scenarios" / "quickstart.yaml"), "--out", str(out), "--no-plots", "--quiet"]) == 0
    fresh = pd.read_csv(out / "summary.csv")
    committed = pd.read_csv(REPO / "results" / "quickstart" / "summary.csv")
    for column in committed.columns:  # the committed file predates later appended columns
        pd.testing.assert_series_equal(fresh[column], committed[column], check_exact=True, obj=column)
    assert fresh[["spec_tokens_per_step", "spec_acceptance", "spec_wasted_frac"]].isna().all().all()


def _draft_scenario(**memory) -> Scenario:
    data = copy.deepcopy(BASE)
    data["model"] = "phi-2"
    data["memory"] = memory
    data["policies"] = [
        {"name": "plain", "kind": "paged"},
        {"name": "draft", "kind": "paged", "speculative": {"method": "draft_model", "draft_model": "phi-2"}},
    ]
    return Scenario(**data)


def test_a_draft_model_takes_its_weights_and_kv_from_the_target_budget() -> None:
    resolved = resolve(_draft_scenario())
    plain, draft = (resolved.kv_for(p) for p in resolved.scenario.policies)
    spec = get_model("phi-2")
    assert draft.num_blocks < plain.num_blocks
    # Everything the drafting policy holds fits in what the target alone had for its cache.
    draft_weights = spec.weight_bytes
    used = draft.num_blocks * draft.block_size * 2 * kv_bytes_per_token(spec, 1) + draft_weights
    assert used <= plain.available_bytes
    assert draft.weight_bytes_per_gpu == plain.weight_bytes_per_gpu + draft_weights


def test_a_pinned_block_count_is_kept_with_a_draft_model() -> None:
    resolved = resolve(_draft_scenario(kv_blocks=500))
    assert [resolved.kv_for(p).num_blocks for p in resolved.scenario.policies] == [500, 500]


SAME_VOCAB_PAIRS = [
    (target, draft)
    for target in ("llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "codellama-34b", "phi-2")
    for draft in ("llama-2-7b", "llama-3-8b", "phi-2", "llama-2-70b", "llama-3-70b")
    if get_model(target).vocab_size == get_model(draft).vocab_size
]


@settings(max_examples=80)
@given(
    pair=st.sampled_from(SAME_VOCAB_PAIRS),
    gpu=st.sampled_from(["a100-80gb", "h100-sxm", "a40", "l40s"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    utilization=st.floats(0.3, 1.0),
    block_size=st.sampled_from([1, 16, 32]),
)
def test_draft_budget_fits_and_uses_all_it_can(pair, gpu, tp, utilization, block_size) -> None:
    """With a draft model the blocks of both caches and its weights fit what the target left, one more
    pair of blocks would not, and a refusal happens exactly when not even one pair fits."""
    target, draft = (get_model(name) for name in pair)
    try:
        kv = kv_budget(target, get_gpu(gpu), tp, gpu_memory_utilization=utilization, block_size=block_size)
        draft_per_token = kv_bytes_per_token(draft, tp)
    except UserError:
        return  # the target (or the draft's heads at this TP) does not fit: nothing to share
    draft_weights = -(-draft.weight_bytes // tp)
    pair_block = (kv.bytes_per_token + draft_per_token) * block_size
    room = kv.available_bytes - draft_weights
    if room < pair_block:
        with pytest.raises(UserError, match=f"draft model {draft.name} does not fit"):
            with_draft_model(kv, draft, tp)
        return
    shared = with_draft_model(kv, draft, tp)
    assert 1 <= shared.num_blocks <= kv.num_blocks
    assert shared.num_blocks * pair_block <= room < (shared.num_blocks + 1) * pair_block
