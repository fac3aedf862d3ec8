"""The static-vs-continuous comparison: ``results/batching_speedup.md`` and ``.csv``.

One row per scenario, from that scenario's summary: mean end-to-end latency and output
throughput of the static and the continuous policy, their ratio (speedup) and the
throughput gain. The Markdown adds how each number is defined and where the gain comes
from; every number in that prose is computed from the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from sim.errors import UserError, did_you_mean
from sim.report.tables import markdown_table

SPEEDUP_COLUMNS: tuple[str, ...] = (
    "scenario", "static_e2e_mean_ms", "continuous_e2e_mean_ms", "speedup",
    "static_output_tps", "continuous_output_tps", "throughput_gain",
)  # fmt: skip
"""Columns of ``batching_speedup.csv``, in order."""

CLAIMED_SPEEDUP_RANGE: tuple[float, float] = (2.7, 6.7)
"""The widely quoted "continuous batching is 2.7x-6.7x faster" range the seed table checks."""

# Column -> (Markdown header, decimals, suffix).
_DISPLAY: dict[str, tuple[str, int, str]] = {
    "static_e2e_mean_ms": ("static E2E mean (ms)", 1, ""),
    "continuous_e2e_mean_ms": ("continuous E2E mean (ms)", 1, ""),
    "speedup": ("speedup", 2, "x"),
    "static_output_tps": ("static output (tok/s)", 0, ""),
    "continuous_output_tps": ("continuous output (tok/s)", 0, ""),
    "throughput_gain": ("throughput gain", 2, "x"),
}


def speedup_table(
    summaries: Mapping[str, pd.DataFrame], static: str = "static", continuous: str = "continuous"
) -> pd.DataFrame:
    """One row per scenario comparing its static and continuous policy rows.

    Args:
        summaries: scenario name -> that scenario's summary DataFrame (one row per policy).
        static: policy label of the static-batching row.
        continuous: policy label of the continuous-batching row.

    Returns:
        A DataFrame with columns ``SPEEDUP_COLUMNS``, scenarios in the mapping's order.
        ``speedup`` = static mean E2E / continuous mean E2E (> 1: continuous is faster);
        ``throughput_gain`` = continuous output tok/s / static output tok/s.

    Raises:
        UserError: a scenario's summary has no row for ``static`` or ``continuous``.
    """
    rows = []
    for scenario, summary in summaries.items():
        slow = _policy_row(summary, static, scenario, "static")
        fast = _policy_row(summary, continuous, scenario, "continuous")
        rows.append(_compare(scenario, slow, fast))
    return pd.DataFrame(rows, columns=list(SPEEDUP_COLUMNS))


def speedup_markdown(
    table: pd.DataFrame,
    reference_range: tuple[float, float] | None = CLAIMED_SPEEDUP_RANGE,
    conclusion: str | None = None,
) -> str:
    """The speedup table in Markdown, followed by definitions and an explanation.

    Args:
        table: the DataFrame from :func:`speedup_table`.
        reference_range: a published (low, high) speedup range to compare against, or None.
        conclusion: the closing paragraph (the speedup map's conclusion,
            :func:`sim.studies.speedup_map_text.conclusion`); None: a generic explanation of
            where the gain comes from, computed from this table alone.

    Returns:
        Markdown text ending with a newline; identical input gives an identical string.
    """
    headers = ["scenario"] + [_DISPLAY[c][0] for c in SPEEDUP_COLUMNS[1:]]
    rows = [
        [str(r.scenario)] + [_cell(getattr(r, c), c) for c in SPEEDUP_COLUMNS[1:]]
        for r in table.itertuples(index=False)
    ]
    numeric = [False] + [True] * (len(SPEEDUP_COLUMNS) - 1)
    parts = [
        "# Static vs continuous batching\n",
        markdown_table(headers, rows, numeric),
        _definitions(),
        _findings(table, reference_range),
        _explanation(table) if conclusion is None else conclusion,
    ]
    return "\n".join(parts)


def _policy_row(summary: pd.DataFrame, label: str, scenario: str, role: str) -> pd.Series:
    matches = summary[summary["policy"] == label]
    if matches.empty:
        names = [str(p) for p in summary["policy"]]
        hint = did_you_mean(label, names)
        raise UserError(
            f"scenario '{scenario}' has no {role} policy '{label}'{hint}; its policies are {names}",
            field=role,
        )
    return matches.iloc[0]


def _compare(scenario: str, slow: pd.Series, fast: pd.Series) -> dict[str, object]:
    static_ms = float(slow["e2e_mean_s"]) * 1000.0
    continuous_ms = float(fast["e2e_mean_s"]) * 1000.0
    static_tps = float(slow["output_tps"])
    continuous_tps = float(fast["output_tps"])
    return {
        "scenario": scenario,
        "static_e2e_mean_ms": static_ms,
        "continuous_e2e_mean_ms": continuous_ms,
        "speedup": _ratio(static_ms, continuous_ms),
        "static_output_tps": static_tps,
        "continuous_output_tps": continuous_tps,
        "throughput_gain": _ratio(continuous_tps, static_tps),
    }


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def _cell(value: float, column: str) -> str:
    _, decimals, suffix = _DISPLAY[column]
    if pd.isna(value):
        return "-"
    return f"{round(float(value), decimals) + 0.0:.{decimals}f}{suffix}"


def _definitions() -> str:
    return (
        "**How each number is defined.** In every scenario both policies serve the same "
        "request stream (same seed: identical arrival times, prompt and output lengths) "
        "with the same maximum batch size on the same simulated GPU. "
        "*E2E mean* is the mean over completed requests (after the warm-up window) of "
        "completion time minus arrival time, c_r - a_r, in milliseconds. "
        "*Speedup* = static E2E mean / continuous E2E mean; above 1 continuous batching "
        "answers a request faster on average. "
        "*Output tok/s* is the output tokens of completed requests divided by the run's "
        "duration (first arrival to the last request or iteration end). "
        "*Throughput gain* = continuous output tok/s / static output tok/s.\n"
    )


def _findings(table: pd.DataFrame, reference_range: tuple[float, float] | None) -> str:
    speedup = _finite_series(table, "speedup")
    gain = _finite_series(table, "throughput_gain")
    if speedup.empty:
        return "**What we measured.** No scenario completed requests under both policies.\n"
    text = (
        f"**What we measured.** Across the {len(speedup)} scenarios the speedup ranges from "
        f"{speedup.min():.2f}x ({speedup.idxmin()}) to {speedup.max():.2f}x "
        f"({speedup.idxmax()}), geometric mean {_geomean(speedup):.2f}x"
    )
    if not gain.empty:
        text += f"; the throughput gain ranges from {gain.min():.2f}x to {gain.max():.2f}x"
    text += ". " + _slower_sentence(speedup) + _reference_sentence(speedup, reference_range)
    return text.rstrip() + "\n"


def _slower_sentence(speedup: pd.Series) -> str:
    slower = speedup[speedup < 1.0]
    if slower.empty:
        return "Continuous batching had the lower mean latency in every scenario. "
    names = ", ".join(str(s) for s in slower.index)
    return f"Static batching had the lower mean latency in {len(slower)} scenario(s): {names}. "


def _reference_sentence(speedup: pd.Series, reference: tuple[float, float] | None) -> str:
    if reference is None:
        return ""
    low, high = reference
    inside = speedup[(speedup >= low) & (speedup <= high)]
    return (
        f"{len(inside)} of {len(speedup)} speedup(s) lie inside the often-quoted "
        f"{low:.1f}x-{high:.1f}x range; how far each lands depends on the output-length "
        "spread, batch size and load of its scenario, as explained below. "
    )


def _explanation(table: pd.DataFrame) -> str:
    both = table.set_index("scenario")[["speedup", "throughput_gain"]].dropna()
    amplified = int((both["speedup"] > both["throughput_gain"]).sum())
    return (
        "**Where the gain comes from.** Static (request-level) batching runs a batch until "
        "its longest sequence ends and admits nobody meanwhile: a slot whose request "
        "finished early idles (padded, still costing compute, or simply empty) while "
        "requests wait in the queue. The wasted share grows with the *variance of output "
        "lengths*: for a batch of B requests it is about 1 - (mean output length) / "
        "(expected longest of B), zero when every length is equal (then the two policies "
        "coincide) and large for long-tailed lengths. Continuous (iteration-level, Orca) "
        "batching refills a slot "
        "one iteration after it frees, so at the same *maximum batch size* the GPU runs "
        "fuller batches, and a larger batch size leaves static batching more slots to waste. "
        "*Load* turns that into latency: mean E2E includes queueing delay, which grows like "
        "rho / (1 - rho) with utilization rho, so serving the same arrivals faster lowers rho "
        "and shrinks the queue more than proportionally; near static batching's saturation "
        "a modest throughput gain becomes a large latency speedup. "
        f"Here the speedup exceeds the throughput gain in {amplified} of {len(both)} "
        "scenarios. Conversely, with open-loop arrivals below saturation both policies "
        "eventually serve the same tokens over about the same span, so their throughput "
        "gain stays near 1 while the latency speedup shows the difference; only offline "
        "(all requests at once) or overloaded runs expose the full throughput gain.\n"
    )


def _finite_series(table: pd.DataFrame, column: str) -> pd.Series:
    series = table.set_index("scenario")[column].astype(float)
    return series[np.isfinite(series)]


def _geomean(values: pd.Series) -> float:
    return float(np.exp(np.log(values.to_numpy()).mean()))
