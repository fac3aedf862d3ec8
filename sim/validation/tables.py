"""The Markdown of a validation folder's report: one section per shape of data it holds.

Bursts and stages are wide tables, one row per run or stage, each cell ``measured /
simulated (error)``; a trace is a long table per run (metric, measured, simulated, error),
its per-request rows giving the residuals' statistics. Every section closes with the median
|error| per metric over its rows; the load column is bold where ``load_frac`` >= :data:`SATURATED`.
"""

from __future__ import annotations

import math

import pandas as pd

from sim.validation.cases import SATURATED, Case

LABELS: dict[str, tuple[str, str]] = {
    "ttft_p50_ms": ("median TTFT (ms)", "{:.0f}"), "tpot_p50_ms": ("median TPOT (ms)", "{:.1f}"),
    "e2e_p50_ms": ("median E2E (ms)", "{:.0f}"), "output_tps": ("output tok/s", "{:.0f}"),
    "duration_s": ("duration (s)", "{:.2f}"),
    "ttft_mean_ms": ("mean TTFT (ms)", "{:.1f}"), "ttft_p90_ms": ("p90 TTFT (ms)", "{:.1f}"),
    "ttft_p99_ms": ("p99 TTFT (ms)", "{:.1f}"), "e2e_mean_ms": ("mean E2E (ms)", "{:.0f}"),
    "e2e_p90_ms": ("p90 E2E (ms)", "{:.0f}"), "e2e_p99_ms": ("p99 E2E (ms)", "{:.0f}"),
    "tpot_derived_ms": ("TPOT (ms)", "{:.2f}"), "req_per_s": ("req/s", "{:.1f}"),
}  # fmt: skip
"""Metric -> (column title, number format); other metrics print with 4 significant digits."""
SECTIONS: dict[str, tuple[str, str]] = {
    "burst": (
        "Bursts (benchmark_serving)",
        "All N requests sent at t = 0. Medians as benchmark_serving computes them: TTFT over requests with "
        "text, TPOT over requests with > 1 output token, E2E over all; output tok/s = client output tokens / "
        "duration.",
    ),
    "stages": (
        "Constant-rate load stages (inference-perf)",
        "Each stage replayed at its achieved rate for its requests (a client-bound stage as a closed loop of "
        "the client's in-flight cap); TTFT and E2E from the client's send; TPOT = (mean E2E - mean TTFT) / "
        "(output tokens - 1), the tool's own TPOT columns being 2x too small.",
    ),
    "trace": (
        "Per-request traces (server spans)",
        "Arrivals replayed at the engine (no front end), each request with its own lengths. Distribution rows "
        "compare mean and percentiles; per-request rows (`_req_`) give the residuals request by request: the "
        "median signed and the median and p90 absolute % error of TTFT and E2E, the median and p90 absolute "
        "difference of the queue time (ms).",
    ),
}
"""Shape -> (section title, what was compared)."""


def report_markdown(table: pd.DataFrame, cases: list[Case], set_name: str) -> str:
    """The whole ``<folder>.md``: per shape its table and median errors, then notes, cost models, sources."""
    lines = [
        f"# Real runs vs batchsim: {set_name}",
        "",
        "Each cell: measured / simulated (error). **Bold load**: `load_frac` >= 0.9 (offered load / the "
        "policy's simulated capacity; a client-bound stage: the client's requested rate / capacity), where a "
        "small cost error becomes a large latency error. Method: docs/validation.md; regenerate with "
        "`python -m sim validate-real DIR` or `python -m sim report`.",
        "",
    ]
    for shape, rows in table.groupby("shape", sort=False):
        title, method = SECTIONS[str(shape)]
        lines += [f"## {title}", "", method, ""]
        lines += [shape_table(str(shape), rows), "", median_errors(rows), ""]
    notes = sorted({note for case in cases for note in case.notes()})
    if notes:
        lines += ["Server flags not expressed in the replay: " + "; ".join(notes) + ".", ""]
    lines += [_cost_models(table), "", "Measurements (not copied here; read from the validation folder):", ""]
    lines += [f"- {case.name}: {case.source}" for case in cases]
    return "\n".join(lines) + "\n"


def shape_table(shape: str, rows: pd.DataFrame) -> str:
    """The table of one shape's rows: wide for bursts and stages, long (one table per run) for traces."""
    if shape == "trace":
        return "\n\n".join(_long_table(run_rows) for _, run_rows in rows.groupby("run", sort=False))
    return _wide_table(shape, rows)


def _wide_table(shape: str, rows: pd.DataFrame) -> str:
    metrics = list(dict.fromkeys(rows["metric"]))
    lead = ["GPU", "model", "N", "load"] if shape == "burst" else ["stage", "N", "load"]
    header = lead + [LABELS.get(m, (m, ""))[0] for m in metrics]
    # Names left-aligned, N, load and the figures right-aligned.
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * (len(lead) - 2) + "---:|" * (2 + len(metrics))]
    for run, run_rows in rows.groupby("run", sort=False):
        first, by_metric = run_rows.iloc[0], run_rows.set_index("metric")
        cells = [str(first["gpu"]), str(first["model"]).split("/")[-1]] if shape == "burst" else [str(run)]
        cells += [str(first["n"]), _load(first["load_frac"])]
        cells += [_cell(m, by_metric.loc[m]) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _long_table(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    lines = [
        f"| {first['run']} ({str(first['model']).split('/')[-1]}, N = {first['n']}, load {_load(first['load_frac'])}) "
        "| unit | measured | simulated | error |",
        "|---|---|---:|---:|---:|",
    ]
    for _, row in rows.iterrows():
        error = "" if math.isnan(row["error_pct"]) else f"{row['error_pct']:+.1f}%"
        lines.append(
            f"| {row['metric']} | {row['unit']} | {_number(row['metric'], row['measured'])} | "
            f"{_number(row['metric'], row['simulated'])} | {error} |"
        )
    return "\n".join(lines)


def median_errors(rows: pd.DataFrame) -> str:
    """``Median |error| over N runs: metric x%, ...`` (rows without a % error, e.g. per-request, left out),
    then the same over the unsaturated runs (load_frac < 0.9) where some runs are saturated."""
    lines = [_median_line("Median |error|", rows)]
    unsaturated = rows[rows["load_frac"] < SATURATED]
    if 0 < unsaturated["run"].nunique() < rows["run"].nunique():
        lines.append(_median_line(f"Unsaturated (load < {SATURATED:g}) median |error|", unsaturated))
    return "\n\n".join(lines)


def _median_line(title: str, rows: pd.DataFrame) -> str:
    compared = rows[~rows["metric"].str.contains("_req_") & rows["error_pct"].notna()]
    medians = compared.groupby("metric", sort=False)["error_pct"].apply(lambda e: e.abs().median())
    runs = compared["run"].nunique()
    parts = [f"{LABELS.get(m, (m, ''))[0]} {v:.1f}%" for m, v in medians.items()]
    return f"{title} over {runs} run{'s' if runs != 1 else ''}: " + ", ".join(parts) + "."


def _cost_models(table: pd.DataFrame) -> str:
    per_run = table.groupby("run", sort=False)[["cost_model", "preset"]].first()
    return "Cost model (GPU time) and preset per run: " + "; ".join(
        f"{run}: {row['cost_model']}, {row['preset']}" for run, row in per_run.iterrows()
    ) + "."  # fmt: skip


def _cell(metric: str, row: pd.Series) -> str:
    measured, simulated = _number(metric, row["measured"]), _number(metric, row["simulated"])
    error = "" if math.isnan(row["error_pct"]) else f" ({row['error_pct']:+.1f}%)"
    return f"{measured} / {simulated}{error}"


def _number(metric: str, value: float) -> str:
    return LABELS.get(metric, (metric, "{:.4g}"))[1].format(value)


def _load(load_frac: float) -> str:
    if math.isnan(load_frac):
        return "—"
    return f"**{load_frac:.2f}**" if load_frac >= SATURATED else f"{load_frac:.2f}"
