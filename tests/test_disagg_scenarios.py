"""Disaggregated deployments end to end: direction checks against colocated serving, bad input, rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes import disagg_scenario

from sim import run
from sim.cli import main
from sim.config import Scenario

SLO = {"ttft_p99_s": 2.0, "tpot_p99_s": 0.025}


def _scenario(link: dict[str, Any] | None = None, transfer: str = "after_prefill", **top: Any) -> dict[str, Any]:
    raw = disagg_scenario(link=link or {"kind": "nvlink"}, transfer=transfer)
    return {**raw, "slo": SLO, **top}


def _rows(raw: dict[str, Any]) -> dict[str, Any]:
    summary = run(Scenario(**raw)).summary
    return {row["policy"]: row for row in summary.to_dict("records")}


def test_disaggregation_meets_a_tpot_slo_that_prefill_first_colocation_breaks() -> None:
    rows = _rows(_scenario())
    colocated, disagg = rows["vllm-v0"], rows["1p1d"]
    assert colocated["num_gpus"] == disagg["num_gpus"] == 2
    assert colocated["tpot_p99_s"] > SLO["tpot_p99_s"]  # prefills stall the decodes
    assert disagg["tpot_p99_s"] <= SLO["tpot_p99_s"]
    assert disagg["goodput_per_gpu"] > colocated["goodput_per_gpu"]


def test_a_slow_link_with_long_prompts_shrinks_the_advantage() -> None:
    fast = _rows(_scenario())["1p1d"]
    slow = _rows(_scenario(link={"kind": "pcie", "gb_per_s": 16}))["1p1d"]
    assert slow["kv_transfer_p50_s"] > 10 * fast["kv_transfer_p50_s"]
    assert slow["tpot_p99_s"] > fast["tpot_p99_s"]
    assert slow["goodput_per_gpu"] <= fast["goodput_per_gpu"]


def test_layerwise_transfer_hides_most_of_the_link_time() -> None:
    link = {"kind": "infiniband"}
    after = _rows(_scenario(link=link))["1p1d"]
    layerwise = _rows(_scenario(link=link, transfer="layerwise"))["1p1d"]
    assert layerwise["kv_transfer_p50_s"] < after["kv_transfer_p50_s"] / 5


def test_rows_columns_and_selection() -> None:
    result = run(Scenario(**_scenario()), policies=["1p1d"])
    row = result.summary.iloc[0]
    assert list(result.summary["policy"]) == ["1p1d"]
    assert 0 < row["prefill_gpu_busy_frac"] < 1 and 0 < row["decode_gpu_busy_frac"] <= 1
    assert row["replicas"] == 2 and result.facts["disaggregation"]["num_gpus"] == 2
    assert result.requests["kv_transfer_s"].notna().all()


def test_no_disaggregation_block_fills_no_pool_columns() -> None:
    raw = _scenario()
    del raw["disaggregation"]
    row = run(Scenario(**raw)).summary.iloc[0]
    assert row["num_gpus"] == 2 and row["goodput_per_gpu"] == row["goodput_rps"] / 2
    assert all(row[c] != row[c] for c in ("prefill_gpu_busy_frac", "kv_transfer_p50_s"))  # NaN


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"link": {"kind": "ethernet"}}, "disaggregation.link.kind"),
        ({"prefill": {"replicas": 1, "policy": {"name": "s", "kind": "static", "max_batch_size": 4}}}, "prefill"),
        (
            {"prefill": {"replicas": 1, "gpu": "a100-80gb", "policy": {"name": "p", "kind": "paged"}},
             "decode": {"replicas": 1, "gpu": "nope", "policy": {"name": "d", "kind": "paged"}}},
            "gpu",
        ),
        ({"name": "vllm-v0"}, "disaggregation.name"),
    ],
)
def test_bad_disaggregation_input_is_one_error_line(tmp_path: Path, capsys, change: dict, expected: str) -> None:
    raw = _scenario()
    raw["disaggregation"] = {**raw["disaggregation"], **change}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and expected in err[0]


def test_a_prefill_pool_that_does_not_fit_names_the_pool(tmp_path: Path, capsys) -> None:
    raw = _scenario(model="llama-2-70b")
    raw["replicas"], raw["tensor_parallel"] = 1, 4
    raw["workload"]["prompt_tokens"] = {"kind": "fixed", "value": 1000}  # within Llama-2's 4k window
    raw["disaggregation"]["decode"] = {**raw["disaggregation"]["decode"], "tensor_parallel": 4}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "disaggregation.prefill" in err and "error:" in err
