"""Speculative decoding at the scenario level: bad inputs (one clear error, exit 2) and
bit-identical results with speculation off."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.io.scenario import load_scenario
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
