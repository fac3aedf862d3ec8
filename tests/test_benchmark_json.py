"""benchmark.json: vLLM benchmark_serving's result keys, equal to the summary's figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim import run
from sim.io.scenario import load_scenario
from sim.metrics.benchmark import _itl_stats

REPO = Path(__file__).resolve().parents[1]

# benchmark.json key -> (summary column, factor to the JSON's unit)
SAME_AS_SUMMARY = {
    "completed": ("completed", 1), "duration": ("duration_s", 1), "request_throughput": ("throughput_rps", 1),
    "output_throughput": ("output_tps", 1), "total_token_throughput": ("total_tps", 1),
    "mean_ttft_ms": ("ttft_mean_s", 1e3), "median_ttft_ms": ("ttft_p50_s", 1e3), "p90_ttft_ms": ("ttft_p90_s", 1e3),
    "p99_ttft_ms": ("ttft_p99_s", 1e3), "mean_tpot_ms": ("tpot_mean_s", 1e3), "median_tpot_ms": ("tpot_p50_s", 1e3),
    "p99_tpot_ms": ("tpot_p99_s", 1e3), "mean_e2el_ms": ("e2e_mean_s", 1e3), "median_e2el_ms": ("e2e_p50_s", 1e3),
    "p90_e2el_ms": ("e2e_p90_s", 1e3), "p99_e2el_ms": ("e2e_p99_s", 1e3), "mean_itl_ms": ("itl_mean_s", 1e3),
    "median_itl_ms": ("itl_p50_s", 1e3), "p90_itl_ms": ("itl_p90_s", 1e3), "p99_itl_ms": ("itl_p99_s", 1e3),
}  # fmt: skip


@pytest.fixture(scope="module")
def result():
    scenario = load_scenario(REPO / "scenarios" / "overload.yaml", {"workload.requests": 150, "metrics.warmup_s": 5})
    return run(scenario)


def test_figures_equal_the_summary(result) -> None:
    for row in result.summary.to_dict("records"):
        record = result.benchmark[row["policy"]]
        for key, (column, factor) in SAME_AS_SUMMARY.items():
            expected = row[column] * factor
            assert record[key] == pytest.approx(expected, rel=1e-12, abs=1e-12), (row["policy"], key)


def test_totals_and_std_recomputed_from_the_requests(result) -> None:
    for policy, requests in result.requests.groupby("policy", observed=True):
        record = result.benchmark[str(policy)]
        done = requests[requests["status"] == "completed"]
        assert record["total_input_tokens"] == done["prompt_tokens"].sum()
        assert record["total_output_tokens"] == done["output_tokens"].sum()
        tokens = record["total_input_tokens"] + record["total_output_tokens"]
        assert record["total_token_throughput"] == pytest.approx(tokens / record["duration"], rel=1e-12)
        measured = done[done["arrival_s"] >= 5]["ttft_s"].dropna().to_numpy()
        assert record["std_ttft_ms"] == pytest.approx(1e3 * np.std(measured), rel=1e-9)
    assert (result.summary["timed_out"] > 0).any()  # completed is not num_prompts somewhere


def test_itl_std_and_percentiles_are_those_of_the_expanded_gaps() -> None:
    gaps = np.array([0.030, 0.010, 0.020, 0.015])
    counts = np.array([1, 5, 2, 0])
    stats = _itl_stats(pd.DataFrame({"gap_s": gaps, "count": counts}), [95, 99.9])
    expanded = np.repeat(gaps, counts)
    assert stats["std_itl_ms"] == pytest.approx(1e3 * expanded.std(), rel=1e-12)
    assert stats["p95_itl_ms"] == pytest.approx(1e3 * np.percentile(expanded, 95), rel=1e-12)
    assert stats["p99.9_itl_ms"] == pytest.approx(1e3 * np.percentile(expanded, 99.9), rel=1e-12)


def test_cli_json_has_configured_percentiles_and_no_nan(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sim", "run", "--set", "workload.requests=40",
           "--set", "metrics.percentiles=[99.9,25]", "--json", "--no-plots", "--quiet", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True)
    text = (out / "benchmark.json").read_text()
    document = json.loads(text)
    assert "NaN" not in text and document["metric_percentiles"] == "25,99.9"
    first = document["results"][0]
    assert {"p25_ttft_ms", "p99.9_itl_ms", "p25_e2el_ms"} <= set(first)
    assert first["p25_ttft_ms"] <= first["median_ttft_ms"] <= first["p99.9_ttft_ms"]
    # The quickstart has an SLO, so goodput is reported, not None.
    assert first["request_goodput"] is not None and not math.isnan(first["request_goodput"])


@pytest.mark.parametrize("value", ["[0]", "[101]", "[]"])
def test_bad_percentiles_are_one_clear_error(tmp_path: Path, value: str) -> None:
    cmd = [sys.executable, "-m", "sim", "validate", "scenarios/quickstart.yaml",
           "--set", f"metrics.percentiles={value}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "metrics.percentiles" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
