"""`run --summary-only` and the warnings a run prints before or after simulating."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main

QUICK = ["scenarios/quickstart.yaml", "--set", "workload.requests=60", "--quiet", "--no-plots"]


def test_summary_only_writes_the_same_summary_and_no_records(tmp_path: Path) -> None:
    full, slim = tmp_path / "full", tmp_path / "slim"
    assert main(["run", *QUICK, "--out", str(full)]) == 0
    assert main(["run", *QUICK, "--out", str(slim), "--summary-only"]) == 0
    assert sorted(p.name for p in slim.iterdir()) == ["scenario.resolved.yaml", "summary.csv", "summary.md"]
    assert (full / "requests.csv").is_file()
    assert (slim / "summary.csv").read_bytes() == (full / "summary.csv").read_bytes()


def test_a_warm_up_beyond_the_run_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *QUICK, "--set", "metrics.warmup_s=100000", "--out", str(tmp_path / "w")]) == 0
    err = capsys.readouterr().err
    assert "warning: metrics.warmup_s = 100000 s" in err
    summary = pd.read_csv(tmp_path / "w" / "summary.csv")
    assert summary["e2e_p50_s"].isna().all() and (summary["completed"] > 0).all()


def test_a_warm_up_inside_the_run_is_not_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *QUICK, "--set", "metrics.warmup_s=1", "--out", str(tmp_path / "w")]) == 0
    assert "warning" not in capsys.readouterr().err
