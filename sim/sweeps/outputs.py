"""Human-readable outputs of sweeps and capacity searches: Markdown tables and plots.

``sweep.md`` averages every point x policy over seeds; the latency-vs-load plots show
the mean over seeds with a min-max band (:func:`sim.report.plots.latency_vs_load`).
``capacity.md`` states the criterion, tolerance and seeds next to the answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.io.outputs import SWEEP_PLOT_METRICS
from sim.report.tables import format_value, markdown_table
from sim.sweeps.capacity_search import CHECK_FACTOR
from sim.sweeps.grid import describe_point

SWEEP_METRICS = (
    "throughput_rps",
    "ttft_p99_s",
    "tpot_p99_s",
    "e2e_mean_s",
    "e2e_p99_s",
    "slo_attainment",
    "goodput_rps",
)
"""Columns of the sweep summary table (means over seeds)."""

PLOT_METRICS = SWEEP_PLOT_METRICS
"""Latency-vs-load plots written for a sweep (named where the sweep folder's files are listed)."""

RATE_PATH = "workload.arrival.rate"

CAPACITY_COLUMNS = {
    "policy": "policy", "rate_rps": "max rate (req/s)", "goodput_rps": "goodput (req/s)",
    "rps_per_gpu": "req/s per GPU", "requests_per_usd": "requests per USD",
    "ttft_p99_s": "TTFT p99 (ms)",
    "tpot_p99_s": "TPOT p99 (ms)", "e2e_p99_s": "E2E p99 (s)", "slo_attainment": "SLO attained (%)",
    "gpu_busy_frac": "GPU busy (%)", "note": "note",
}  # fmt: skip


def sweep_means(table: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """Mean of ``SWEEP_METRICS`` over seeds per point x policy (failed rows left out)."""
    ok = table[table["error"] == ""]
    metrics = [m for m in SWEEP_METRICS if m in ok.columns and ok[m].notna().any()]
    keys = ["point", *params, "policy"]
    means = ok.groupby(keys, sort=False, dropna=False)[metrics].mean().reset_index()
    means.insert(len(keys), "seeds", ok.groupby(keys, sort=False, dropna=False).size().to_numpy())
    return means.sort_values("point", kind="stable").drop(columns="point").reset_index(drop=True)


def sweep_markdown(table: pd.DataFrame, params: Sequence[str], title: str) -> str:
    """``sweep.md``: what was swept, failures, and the mean-over-seeds table."""
    points = table["point"].nunique()
    seeds = sorted(table["seed"].unique().tolist())
    text = f"# {title}\n\n{points} points x {len(seeds)} seed(s) {seeds}; parameters: "
    text += ", ".join(f"`{p}` = {', '.join(map(str, table[p].unique()))}" for p in params) + ".\n\n"
    text += _failures_markdown(table, params)
    if (table["error"] != "").all():
        return text + "No run succeeded.\n"
    means = means_table(sweep_means(table, params), params)
    return text + "Means over seeds (failed runs left out):\n\n" + means


def means_table(means: pd.DataFrame, params: Sequence[str]) -> str:
    """A Markdown table of :func:`sweep_means` output, units as in ``summary.md``."""
    columns = list(means.columns)
    headers = [c if c in params or c in ("policy", "seeds") else _header(c) for c in columns]
    rows = [[_cell(means[c].iloc[i], c, params) for c in columns] for i in range(len(means))]
    numeric = [c not in ("policy",) for c in columns]
    return markdown_table(headers, rows, numeric)


def failures(table: pd.DataFrame, params: Sequence[str]) -> list[str]:
    """One line per failed (point, seed): its parameters and error."""
    failed = table[table["error"] != ""].drop_duplicates(["point", "seed"])
    return [
        f"point {row['point']} ({describe_point({p: row[p] for p in params})}), "
        f"seed {row['seed']}: {row['error']}"
        for _, row in failed.iterrows()
    ]


def _failures_markdown(table: pd.DataFrame, params: Sequence[str]) -> str:
    lines = failures(table, params)
    if not lines:
        return ""
    return f"**{len(lines)} failed run(s)**:\n\n" + "".join(f"- {line}\n" for line in lines) + "\n"


def write_sweep_plots(table: pd.DataFrame, params: Sequence[str], folder: Path) -> list[Path]:
    """Latency-vs-load PNGs (mean over seeds, min-max band); none if no parameter is numeric."""
    from sim.io.safe_write import atomic_file
    from sim.report.plots import latency_vs_load, save_figure

    ok = table[table["error"] == ""]
    x = load_axis(table, params)
    if x is None or ok.empty:
        return []
    frame, by = _series(ok, params, x)
    written = []
    for metric in PLOT_METRICS:
        path = folder / f"latency_vs_load_{metric}.png"
        with atomic_file(path) as tmp:
            save_figure(latency_vs_load(frame, x=x, y=metric, by=by, seed_col="seed"), tmp)
        written.append(path)
    return written


def load_axis(table: pd.DataFrame, params: Sequence[str]) -> str | None:
    """The x axis of sweep plots: the arrival rate if swept, else the first numeric parameter."""
    numeric = [
        p
        for p in params
        if pd.api.types.is_numeric_dtype(table[p]) and not pd.api.types.is_bool_dtype(table[p])
    ]
    if RATE_PATH in numeric:
        return RATE_PATH
    return numeric[0] if numeric else None


def _series(table: pd.DataFrame, params: Sequence[str], x: str) -> tuple[pd.DataFrame, str]:
    """One line per policy, or per policy x other-parameter values when there are several.

    A parameter of one policy (``policies[continuous].max_batch_size``) splits only that
    policy's line; the other policies' runs do not depend on it, so one copy is drawn.
    """
    others = [p for p in params if p != x]
    if not others:
        return table, "policy"
    labels = table["policy"].astype(str)
    keep = pd.Series(True, index=table.index)
    for p in others:
        owner = _policy_of(p)
        applies = table["policy"] == owner if owner else pd.Series(True, index=table.index)
        keep &= applies | (table[p] == table[p].iloc[0])
        labels = labels.where(~applies, labels + f" {p.rsplit('.', 1)[-1]}=" + table[p].astype(str))
    return table.assign(series=labels)[keep], "series"


def _policy_of(path: str) -> str | None:
    """``policies[continuous].max_batch_size`` -> ``continuous``; None for other paths."""
    match = re.match(r"policies\[([^\]]+)\]\.", path)
    return match.group(1) if match and not match.group(1).lstrip("-").isdigit() else None


def capacity_markdown(report: pd.DataFrame, scenario_name: str, params: Sequence[str] = ()) -> str:
    """``capacity.md``: the criterion, tolerance and seeds, then one row per policy (and grid point)."""
    first = report.iloc[0]
    text = f"# {scenario_name}: capacity within the SLO\n\n"
    text += (
        f"Highest `workload.arrival.rate` meeting the SLO ({first['criterion']}), found by "
        f"bisection to a relative tolerance of {first['tolerance']:.1%}; {CHECK_FACTOR:g}x that "
        "rate was also run and fails (see `checked_rps`; the note says when a bound was hit "
        f"instead). Seeds per rate: {first['seeds']} "
        f"(a rate meets the SLO only if it does for every seed; metrics are means over seeds).\n\n"
    )
    return text + capacity_table(report, params)


def capacity_table(report: pd.DataFrame, params: Sequence[str] = ()) -> str:
    """The capacity report as a Markdown table; the grid's parameters (``params``) first."""
    columns = [*params, *(c for c in CAPACITY_COLUMNS if c in report.columns)]
    if report["requests_per_usd"].isna().all():
        columns.remove("requests_per_usd")
    rows = [[_cell(report[c].iloc[i], c, params) for c in columns] for i in range(len(report))]
    numeric = [c not in ("policy", "note") for c in columns]
    headers = [CAPACITY_COLUMNS.get(c, c) for c in columns]
    return markdown_table(headers, rows, numeric)


def _header(column: str) -> str:
    from sim.report.tables import FORMATS

    fmt = FORMATS.get(column)
    return fmt.header if fmt else column


def _cell(value: Any, column: str, params: Sequence[str]) -> str:
    if column in params or column in ("policy", "note", "seeds"):
        return str(value)
    if column == "rate_rps":
        return "-" if pd.isna(value) else f"{value:.4g}"
    return format_value(value, column)
