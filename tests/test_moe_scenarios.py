"""Shipped MoE scenarios validate and run; the DeepSeek-V3 deployment that does not fit is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.cli import main
from sim.io.scenario import load_scenario
from sim.runner import run

REPO = Path(__file__).resolve().parents[1]
MOE_SCENARIOS = sorted((REPO / "scenarios" / "moe").glob("*.yaml"))


def test_there_are_moe_scenarios() -> None:
    assert len(MOE_SCENARIOS) >= 3


@pytest.mark.parametrize("path", MOE_SCENARIOS, ids=lambda p: p.stem)
def test_moe_scenario_validates_and_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(path)]) == 0
    scenario = load_scenario(path).replace(**{"workload.requests": 40})
    result = run(scenario, summary_only=True)
    assert (result.summary["completed"] == 40).all()
    assert "MoE" in result.facts["cost_model"]


def test_deepseek_v3_bf16_on_eight_a100_exits_2_with_the_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load((REPO / "scenarios" / "moe" / "deepseek_v3_h200_tp8.yaml").read_text())
    data.update(model="deepseek-v3-bf16", gpu="a100-80gb")
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    for fragment in ("deepseek-v3-bf16 does not fit on a100-80gb", "167.8 GB", "GiB short per GPU"):
        assert fragment in err
    assert not (tmp_path / "out").exists()


def test_bad_expert_parallel_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load((REPO / "scenarios" / "moe" / "mixtral_tp2.yaml").read_text())
    data["expert_parallel"] = 4  # does not divide tensor_parallel 2
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "expert_parallel" in err, err


def test_moe_report_writes_the_markdown_and_plot(tmp_path: Path) -> None:
    from sim.studies.moe import write_moe_report

    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    data = yaml.safe_load((REPO / "scenarios" / "moe" / "mixtral_tp2.yaml").read_text())
    data["workload"]["requests"] = 30
    (scenarios / "small.yaml").write_text(yaml.safe_dump(data))
    write_moe_report(tmp_path / "results", plots=True, scenarios_dir=scenarios)
    text = (tmp_path / "results" / "moe.md").read_text()
    assert "moe_mixtral_tp2" in text and "short" in text and "| fp8 | h200 |" in text
    assert (tmp_path / "results" / "moe_cost.png").stat().st_size > 10_000
    assert (tmp_path / "results" / "moe" / "moe_mixtral_tp2" / "summary.csv").is_file()
