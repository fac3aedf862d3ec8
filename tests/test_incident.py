"""Regression pins on the shipped incident result (``results/incident/``), kept apart from theory tests.

What the README and docs/incident.md claim about the peak-hour incident must be what the
committed ``summary.csv`` shows: static batching times clients out with multi-second E2E
while nvidia-smi would call the GPU busy and MFU stays low; continuous batching, same load,
same batch limit, does not. ``python -m sim report`` regenerates the folder.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.io.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "results" / "incident"


@pytest.fixture(scope="module")
def summary() -> pd.DataFrame:
    return pd.read_csv(RESULT / "summary.csv").set_index("policy")


def test_result_folder_is_that_of_the_shipped_scenario(summary: pd.DataFrame) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "incident.yaml")
    assert scenario.name == RESULT.name
    assert list(summary.index) == [p.name for p in scenario.policies]
    assert (summary["requests"] == scenario.workload.requests).all()


def test_static_times_clients_out_and_continuous_far_less(summary: pd.DataFrame) -> None:
    static, continuous = summary.loc["static"], summary.loc["continuous"]
    assert static["timed_out"] >= 0.1 * static["requests"]
    assert continuous["timed_out"] <= static["timed_out"] / 10
    assert continuous["completed"] > static["completed"]


def test_static_p99_e2e_is_multi_second_and_continuous_lower(summary: pd.DataFrame) -> None:
    static, continuous = summary.loc["static"], summary.loc["continuous"]
    assert static["e2e_p99_s"] >= 5.0
    assert continuous["e2e_p99_s"] < static["e2e_p99_s"] - 2.0
    assert static["ttft_p99_s"] > 10 * continuous["ttft_p99_s"]


def test_gpu_looks_busy_but_mfu_is_low_under_static(summary: pd.DataFrame) -> None:
    """nvidia-smi's busy share is over 90%; the FLOPs used are under 15% (MFU), because
    decode is memory-bound (MBU several times MFU) and the KV cache sits mostly empty."""
    static = summary.loc["static"]
    assert static["gpu_busy_frac"] >= 0.9
    assert static["mfu_mean"] <= 0.15
    assert static["mbu_mean"] >= 4 * static["mfu_mean"]
    assert static["kv_mean_frac"] <= 0.15


def test_static_delivers_fewer_tokens_on_the_same_busy_gpu(summary: pd.DataFrame) -> None:
    static, continuous = summary.loc["static"], summary.loc["continuous"]
    assert abs(static["gpu_busy_frac"] - continuous["gpu_busy_frac"]) < 0.1
    assert continuous["output_tps"] > 1.3 * static["output_tps"]
