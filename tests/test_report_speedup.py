"""Static-vs-continuous speedup table: direction, definitions, prose computed from data."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.errors import UserError
from sim.report.speedup import SPEEDUP_COLUMNS, speedup_markdown, speedup_table


def summary(
    static_e2e_s: float,
    continuous_e2e_s: float,
    static_tps: float,
    continuous_tps: float,
    labels: tuple[str, str] = ("static", "continuous"),
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "policy": [labels[0], labels[1], "vllm"],
            "e2e_mean_s": [static_e2e_s, continuous_e2e_s, 0.5],
            "output_tps": [static_tps, continuous_tps, 9999.0],
        }
    )


SUMMARIES = {
    "short": summary(2.0, 1.0, 1000.0, 1500.0),
    "long": summary(30.0, 5.0, 800.0, 2400.0),
    "uniform": summary(1.0, 1.25, 1000.0, 950.0),
}


def test_static_slower_gives_speedup_above_one():
    table = speedup_table(SUMMARIES)
    assert list(table.columns) == list(SPEEDUP_COLUMNS)
    assert list(table["scenario"]) == ["short", "long", "uniform"]
    row = table.set_index("scenario").loc["long"]
    assert row["static_e2e_mean_ms"] == pytest.approx(30000.0)
    assert row["speedup"] == pytest.approx(30.0 / 5.0)
    assert row["throughput_gain"] == pytest.approx(2400.0 / 800.0)
    assert table.set_index("scenario").loc["uniform", "speedup"] < 1.0


def test_custom_policy_labels_and_missing_policy():
    table = speedup_table(
        {"x": summary(3.0, 1.0, 1.0, 2.0, labels=("hf", "orca"))}, static="hf", continuous="orca"
    )
    assert table["speedup"].iloc[0] == pytest.approx(3.0)
    with pytest.raises(UserError, match="scenario 'x'.*continuous"):
        speedup_table({"x": summary(3.0, 1.0, 1.0, 2.0, labels=("static", "orca"))})


def test_markdown_is_stable_and_its_prose_follows_the_table():
    table = speedup_table(SUMMARIES)
    text = speedup_markdown(table)
    assert text == speedup_markdown(table.copy())
    for scenario in SUMMARIES:
        assert f"| {scenario} " in text
    assert "6.00x (long)" in text and "0.80x (uniform)" in text  # max and min speedup
    assert "Static batching had the lower mean latency in 1 scenario(s): uniform" in text
    changed = table.copy()
    changed.loc[changed["scenario"] == "long", "speedup"] = 4.5
    assert "4.50x (long)" in speedup_markdown(changed) and "6.00x" not in speedup_markdown(changed)


def test_markdown_defines_every_number():
    text = speedup_markdown(speedup_table(SUMMARIES), reference_range=None)
    for term in (
        "*Speedup*",
        "*Throughput gain*",
        "*E2E mean*",
        "variance of output",
        "batch size",
        "Load",
    ):
        assert term in text
    assert "often-quoted" not in text
