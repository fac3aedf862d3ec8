"""`python -m sim report`: per-scenario folders, the speedup table, and skipping absent traces."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.errors import UserError
from sim.studies.regenerate import EXTRA_REPORTS, SPEEDUP_FOLDER, regenerate_results


def _scenario(name: str, arrival: dict, lengths: bool = True) -> dict:
    workload: dict = {"requests": 40, "arrival": arrival}
    if lengths:
        workload |= {"prompt_tokens": {"kind": "fixed", "value": 32},
                     "output_tokens": {"kind": "uniform", "low": 2, "high": 60}}
    return {
        "name": name,
        "workload": workload,
        "policies": [{"name": "static", "kind": "static", "max_batch_size": 8},
                     {"name": "continuous", "kind": "continuous", "max_batch_size": 8}],
    }


def test_report_writes_folders_speedup_and_skips_missing_trace(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios"
    (scenarios / SPEEDUP_FOLDER).mkdir(parents=True)
    (scenarios / "trace.yaml").write_text(yaml.safe_dump(
        _scenario("replay", {"kind": "trace", "path": "no-such-trace.csv"}, lengths=False)))
    for case in ("a", "b"):
        burst = _scenario(f"case_{case}", {"kind": "burst"})
        (scenarios / SPEEDUP_FOLDER / f"{case}.yaml").write_text(yaml.safe_dump(burst))
    messages: list[str] = []

    summaries = regenerate_results(scenarios, tmp_path / "results", plots=False, log=messages.append, studies=())

    assert set(summaries) == {"case_a", "case_b"}
    assert any(m.startswith("skipped trace.yaml") and "no-such-trace.csv" in m for m in messages)
    assert not (tmp_path / "results" / "replay").exists()
    table = pd.read_csv(tmp_path / "results" / "batching_speedup.csv")
    assert list(table.scenario) == ["case_a", "case_b"]
    for row in table.itertuples():
        summary = summaries[row.scenario].set_index("policy")
        expected = summary.loc["static", "e2e_mean_s"] / summary.loc["continuous", "e2e_mean_s"]
        assert abs(row.speedup - expected) <= 1e-5 * expected
    assert (tmp_path / "results" / "batching_speedup.md").read_text().count("case_") >= 2
    assert not [p for p in (tmp_path / "results").iterdir() if p.name.startswith(".")]


def test_only_the_named_studies_run_in_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    for name in EXTRA_REPORTS:
        monkeypatch.setitem(EXTRA_REPORTS, name, lambda out_dir, *, plots, log, name=name: ran.append(name))
    (tmp_path / "scenarios").mkdir()

    regenerate_results(tmp_path / "scenarios", tmp_path / "results", plots=False, log=lambda _: None,
                       studies=["prefix_caching", "validation"])
    assert ran == ["validation", "prefix_caching"]
    ran.clear()
    regenerate_results(tmp_path / "scenarios", tmp_path / "results", plots=False, log=lambda _: None)
    assert ran == list(EXTRA_REPORTS)


def test_an_unknown_study_is_refused_before_simulating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated although a study name is wrong")

    monkeypatch.setattr("sim.runner.run", refuse)
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "a.yaml").write_text(yaml.safe_dump(_scenario("a", {"kind": "burst"})))
    expected = r"^studies: 'valdation' is not a study \(did you mean 'validation'\?\); studies: validation, "
    with pytest.raises(UserError, match=expected):
        regenerate_results(scenarios, tmp_path / "results", plots=False, log=lambda _: None, studies=["valdation"])
    assert not (tmp_path / "results").exists()
