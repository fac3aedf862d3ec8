"""Markdown and terminal summary tables: units, stability, completeness."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.errors import UserError
from sim.metrics.summary import EXTRA_COLUMNS, SUMMARY_COLUMNS
from sim.report.tables import format_value, summary_markdown, summary_text


def make_summary(policies: list[str]) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    frame = pd.DataFrame(
        {c: rng.uniform(0.001, 2.0, len(policies)) for c in SUMMARY_COLUMNS + EXTRA_COLUMNS}
    )
    frame["scenario"] = "demo"
    frame["policy"] = policies
    for count in (
        "requests",
        "completed",
        "preemptions",
        "timed_out",
        "rejected",
        "retries",
        "iterations",
    ):
        frame[count] = 0
    frame["requests"] = 100
    frame["completed"] = 100
    frame["slo_attainment"] = np.nan
    frame["goodput_rps"] = np.nan
    return frame


POLICIES = ["static", "continuous", "vllm", "sarathi"]


def test_markdown_is_byte_stable_and_lists_every_policy():
    summary = make_summary(POLICIES)
    first, second = summary_markdown(summary), summary_markdown(summary.copy())
    assert first == second
    for policy in POLICIES:
        assert f"| {policy} " in first
    lines = first.splitlines()
    assert len(lines) == 2 + len(POLICIES)
    assert len({len(line) for line in lines}) == 1  # padded: every row lines up


def test_latencies_in_milliseconds_and_fractions_in_percent():
    assert format_value(0.01234, "ttft_p50_s") == "12.3"
    assert format_value(0.012345, "tpot_p50_s") == "12.35"
    assert format_value(0.5, "gpu_busy_frac") == "50.0"
    assert format_value(2.346, "e2e_mean_s") == "2.35"
    assert format_value(float("nan"), "ttft_p99_s") == "-"
    assert format_value(-1e-12, "ttft_p99_s") == "0.0"  # never "-0.0"
    assert format_value(17, "completed") == "17"
    header = summary_markdown(make_summary(["a"])).splitlines()[0]
    assert "TTFT p50 (ms)" in header and "GPU busy (%)" in header


def test_overload_and_slo_columns_appear_only_when_informative():
    summary = make_summary(["a", "b"])
    plain = summary_markdown(summary)
    assert "timed out" not in plain and "SLO" not in plain
    summary.loc[1, "timed_out"] = 3
    summary["slo_attainment"] = [0.5, 0.9]
    richer = summary_markdown(summary)
    assert "timed out" in richer and "SLO attained (%)" in richer and "90.0" in richer


def test_explicit_columns_and_unknown_column_hint():
    summary = make_summary(["a"])
    table = summary_markdown(summary, columns=["policy", "e2e_p99_s"])
    assert table.splitlines()[0].count("|") == 3
    with pytest.raises(UserError, match="did you mean 'e2e_p99_s'"):
        summary_markdown(summary, columns=["policy", "e2e_p99"])


def test_text_table_has_header_and_one_line_per_policy():
    summary = make_summary(POLICIES)
    text = summary_text(summary)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) == 1 + len(POLICIES)
    assert [line.split()[0] for line in lines[1:]] == POLICIES
    assert text == summary_text(summary)
