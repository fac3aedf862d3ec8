"""Markdown and terminal summary tables: units, stability, completeness."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from sim.errors import UserError
from sim.metrics.summary import EXTRA_COLUMNS, SUMMARY_COLUMNS
from sim.report.tables import display_width, format_value, summary_markdown, summary_text


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


def _huge(policies: list[str]) -> pd.DataFrame:
    """A summary with 10^9-sized cells in several columns, each in a different row."""
    summary = make_summary(policies)
    summary.loc[0, "output_tps"] = 1e9
    summary.loc[1, "completed"] = 10**9
    summary.loc[2, "ttft_p99_s"] = 1e9  # shown in ms: 13 digits
    summary.loc[len(policies) - 1, "preemptions"] = 10**9
    return summary


def test_text_table_columns_line_up_with_huge_values():
    lines = summary_text(_huge(["static", "a-much-longer-policy-name", "vllm", "s"])).rstrip("\n").splitlines()
    assert len({len(line) for line in lines}) == 1
    assert "1000000000" in lines[1] and "1000000000000.0" in lines[3]
    # Cells hold no spaces: every numeric cell of a row ends where the same cell of every other row ends.
    ends = [[m.end() for m in re.finditer(r"\S+", line)][1:] for line in lines[1:]]
    assert all(row == ends[0] for row in ends) and len(ends[0]) == len(re.split(r"\s{2,}", lines[0])) - 1


def test_text_table_columns_line_up_with_wide_and_combining_characters():
    # "连续批处理": 5 code points, 10 terminal columns; "e\u0301tat" (é by a combining accent): 5 and 4.
    names = ["static", "连续批处理", "e\u0301tat", "vllm"]
    lines = summary_text(_huge(names)).rstrip("\n").splitlines()
    columns_minus_code_points = {2: 5, 3: -1}  # by line: header, then one per policy
    assert len({len(line) + columns_minus_code_points.get(i, 0) for i, line in enumerate(lines)}) == 1
    assert {display_width(line) for line in lines} == {len(lines[0])}
