"""Summary tables as text: Markdown for ``summary.md`` and a compact terminal table.

Formatting is deterministic (fixed decimals per column, NaN shown as ``-``), so the
same summary always renders to the same bytes and committed tables diff cleanly.
Latencies below a second are shown in milliseconds, fractions as percentages. Columns
are as wide as their widest cell as a terminal shows it (:func:`display_width`: a CJK
character takes two columns, a combining mark none), so any value or name stays aligned.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim.errors import UserError, did_you_mean

MISSING = "-"


@dataclass(frozen=True)
class ColumnFormat:
    """How one summary column is shown.

    Attributes:
        header: Markdown header, with the unit.
        short: terminal header (narrow).
        scale: multiply the stored value by this (1000 for s -> ms, 100 for fraction -> %).
        decimals: fixed number of decimals; None for text columns.
    """

    header: str
    short: str
    scale: float = 1.0
    decimals: int | None = 2


def _ms(header: str, short: str, decimals: int = 1) -> ColumnFormat:
    return ColumnFormat(f"{header} (ms)", short, 1000.0, decimals)


def _pct(header: str, short: str) -> ColumnFormat:
    return ColumnFormat(f"{header} (%)", short, 100.0, 1)


FORMATS: dict[str, ColumnFormat] = {
    "scenario": ColumnFormat("scenario", "scenario", decimals=None),
    "policy": ColumnFormat("policy", "policy", decimals=None),
    "requests": ColumnFormat("requests", "reqs", decimals=0),
    "completed": ColumnFormat("completed", "done", decimals=0),
    "timed_out": ColumnFormat("timed out", "t/o", decimals=0),
    "rejected": ColumnFormat("rejected", "rej", decimals=0),
    "retries": ColumnFormat("retries", "retry", decimals=0),
    "iterations": ColumnFormat("iterations", "iters", decimals=0),
    "replicas": ColumnFormat("replicas", "repl", decimals=0),
    "duration_s": ColumnFormat("duration (s)", "dur s", decimals=1),
    "throughput_rps": ColumnFormat("throughput (req/s)", "req/s", decimals=2),
    "output_tps": ColumnFormat("output (tok/s)", "tok/s", decimals=0),
    "ttft_mean_s": _ms("TTFT mean", "TTFTavg ms"),
    "ttft_p50_s": _ms("TTFT p50", "TTFT50 ms"),
    "ttft_p90_s": _ms("TTFT p90", "TTFT90 ms"),
    "ttft_p99_s": _ms("TTFT p99", "TTFT99 ms"),
    "tpot_mean_s": _ms("TPOT mean", "TPOTavg ms", 2),
    "tpot_p50_s": _ms("TPOT p50", "TPOT50 ms", 2),
    "tpot_p90_s": _ms("TPOT p90", "TPOT90 ms", 2),
    "tpot_p99_s": _ms("TPOT p99", "TPOT99 ms", 2),
    "e2e_mean_s": ColumnFormat("E2E mean (s)", "E2Eavg s", decimals=2),
    "e2e_p50_s": ColumnFormat("E2E p50 (s)", "E2E50 s", decimals=2),
    "e2e_p90_s": ColumnFormat("E2E p90 (s)", "E2E90 s", decimals=2),
    "e2e_p99_s": ColumnFormat("E2E p99 (s)", "E2E99 s", decimals=2),
    "e2e_max_s": ColumnFormat("E2E max (s)", "E2Emax s", decimals=2),
    "norm_latency_mean_s": _ms("norm. latency mean (ms/token)", "norm ms/tok", 2),
    "queue_mean_s": _ms("queue mean", "Qavg ms"),
    "queue_p50_s": _ms("queue p50", "Q50 ms"),
    "queue_p90_s": _ms("queue p90", "Q90 ms"),
    "queue_p99_s": _ms("queue p99", "Q99 ms"),
    "gpu_busy_frac": _pct("GPU busy", "busy %"),
    "mfu_mean": _pct("MFU", "MFU %"),
    "mbu_mean": _pct("MBU", "MBU %"),
    "mfu_busy": _pct("MFU while busy", "MFUb %"),
    "mbu_busy": _pct("MBU while busy", "MBUb %"),
    "kv_peak_frac": _pct("KV peak", "KVmax %"),
    "kv_mean_frac": _pct("KV mean", "KVavg %"),
    "mean_batch_size": ColumnFormat("mean batch", "batch", decimals=1),
    "preemptions": ColumnFormat("preemptions", "preempt", decimals=0),
    "slo_attainment": _pct("SLO attained", "SLO %"),
    "goodput_rps": ColumnFormat("goodput (req/s)", "good/s", decimals=2),
    "rps_per_gpu": ColumnFormat("req/s per GPU", "req/s/GPU", decimals=2),
    "requests_per_usd": ColumnFormat("requests per USD", "req/$", decimals=0),
    "energy_j": ColumnFormat("energy (kJ)", "kJ", scale=1e-3, decimals=1),
    "power_w": ColumnFormat("power (W)", "W", decimals=0),
    "joules_per_token": ColumnFormat("energy (J/token)", "J/tok", decimals=3),
    "joules_per_request": ColumnFormat("energy (J/request)", "J/req", decimals=0),
    "fleet_usd_per_hour": ColumnFormat("fleet (USD/hour)", "$/h", decimals=2),
    "usd_per_mtok": ColumnFormat("USD per Mtok", "$/Mtok", decimals=2),
    "usd_per_mtok_input": ColumnFormat("USD per input Mtok", "$/Mtok in", decimals=2),
}
"""Display format of every known summary column; other columns get a generic one."""

MARKDOWN_COLUMNS: tuple[str, ...] = (
    "policy", "requests", "completed", "throughput_rps", "output_tps", "ttft_p50_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_mean_s", "e2e_p99_s", "queue_p50_s",
    "gpu_busy_frac", "mfu_mean", "mbu_mean", "kv_peak_frac", "mean_batch_size", "preemptions",
    "joules_per_token", "usd_per_mtok",
)  # fmt: skip
"""Default columns of ``summary.md`` (the energy and cost ones are left out where unknown: all NaN)."""

TEXT_COLUMNS: tuple[str, ...] = (
    "policy", "completed", "throughput_rps", "output_tps", "ttft_p50_s", "ttft_p99_s",
    "tpot_p50_s", "e2e_mean_s", "e2e_p99_s", "gpu_busy_frac", "kv_peak_frac",
    "mean_batch_size", "preemptions", "joules_per_token", "usd_per_mtok",
)  # fmt: skip
"""Default columns of the terminal table."""

# Shown by default only when they carry information (some overload, an SLO, a known price or power).
_IF_NONZERO = ("timed_out", "rejected")
_IF_PRESENT = ("slo_attainment", "goodput_rps")
_IF_KNOWN = ("joules_per_token", "usd_per_mtok")


def summary_markdown(summary: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """Render a summary as a Markdown table (one row per policy).

    Args:
        summary: the DataFrame from :func:`sim.metrics.summary.summarize`.
        columns: summary columns to show, in order; default ``MARKDOWN_COLUMNS`` plus
            timed-out/rejected counts when non-zero and SLO columns when an SLO was set.

    Returns:
        The table, ending with a newline; identical input gives an identical string.

    Raises:
        UserError: a requested column is not in ``summary``.
    """
    return markdown_table(*summary_cells(summary, columns))


def summary_cells(
    summary: pd.DataFrame, columns: Sequence[str] | None = None
) -> tuple[list[str], list[list[str]], list[bool]]:
    """Headers, formatted rows and which columns are numeric: the cells of ``summary.md``
    (columns chosen as by :func:`summary_markdown`), for other renderings such as HTML."""
    chosen = _choose_columns(summary, columns, MARKDOWN_COLUMNS)
    headers = [_format_of(c).header for c in chosen]
    rows = [[format_value(summary[c].iloc[i], c) + interval_suffix(summary, c, i) for c in chosen]
            for i in range(len(summary))]  # fmt: skip
    numeric = [_format_of(c).decimals is not None for c in chosen]
    return headers, rows, numeric


def interval_suffix(summary: pd.DataFrame, column: str, row: int) -> str:
    """`` ± x%`` for a figure with ``<column>_lo``/``_hi`` in ``summary`` (x: the wider side of its 90% interval,
    relative to the figure); empty without them or where the figure is 0 or missing."""
    lo_column, hi_column = f"{column}_lo", f"{column}_hi"
    if lo_column not in summary.columns or hi_column not in summary.columns:
        return ""
    value, lo, hi = (summary[c].iloc[row] for c in (column, lo_column, hi_column))
    if any(v is None or pd.isna(v) for v in (value, lo, hi)) or float(value) == 0:
        return ""
    relative = max(float(value) - float(lo), float(hi) - float(value)) / abs(float(value))
    if relative == float("inf"):  # too few requests to bound a tail percentile
        return " ± ∞"
    return f" ± {relative:.0%}" if relative >= 0.005 or relative == 0 else " ± <1%"


def trust_notes(summary: pd.DataFrame) -> str:
    """What follows the table in ``summary.md``: what ± means and what the intervals rest on, then one line per
    flag that fired (:func:`sim.uncertainty.flags.flag_lines`); a blank line for a summary without them."""
    from sim.uncertainty.flags import flag_lines

    if "interval_basis" not in summary.columns:
        return "\n"
    basis = "; ".join(f"{p}: {b}" for p, b in zip(summary["policy"], summary["interval_basis"], strict=True))
    lines = [f"± x%: the wider side of each figure's 90% interval (summary.csv <metric>_lo/_hi; docs/uncertainty.md). "
             f"It rests on {basis}."]  # fmt: skip
    return "\n" + "\n\n".join(lines + flag_lines(summary)) + "\n"


def summary_text(summary: pd.DataFrame) -> str:
    """Render a summary as a compact, space-aligned table for the terminal."""
    chosen = _choose_columns(summary, None, TEXT_COLUMNS)
    headers = [_format_of(c).short for c in chosen]
    rows = [[format_value(summary[c].iloc[i], c) for c in chosen] for i in range(len(summary))]
    numeric = [_format_of(c).decimals is not None for c in chosen]
    widths = _widths(headers, rows)
    lines = [_join(headers, widths, numeric, "  ")]
    lines += [_join(row, widths, numeric, "  ") for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def frame_markdown(frame: pd.DataFrame) -> str:
    """Any DataFrame as a padded pipe table: floats to 4 significant digits, numeric columns
    right-aligned (the reports' tables that are not summaries)."""
    rows = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    return markdown_table([str(c) for c in frame.columns], rows, numeric)


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]
) -> str:
    """A padded Markdown pipe table; numeric columns right-aligned."""
    widths = [max(w, 3) for w in _widths(headers, rows)]
    rules = [
        ("-" * (w - 1) + ":") if num else "-" * w for w, num in zip(widths, numeric, strict=True)
    ]
    lines = [_join(headers, widths, numeric, " | "), " | ".join(rules)]
    lines += [_join(row, widths, numeric, " | ") for row in rows]
    return "".join(f"| {line} |\n" for line in lines)


def format_value(value: Any, column: str) -> str:
    """Format one cell of ``column`` with that column's unit and fixed decimals."""
    fmt = _format_of(column)
    if fmt.decimals is None:
        return str(value)
    if value is None or pd.isna(value):
        return MISSING
    scaled = round(float(value) * fmt.scale, fmt.decimals) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{scaled:.{fmt.decimals}f}"


def _format_of(column: str) -> ColumnFormat:
    return FORMATS.get(column, ColumnFormat(column, column, decimals=3))


def _choose_columns(
    summary: pd.DataFrame, columns: Sequence[str] | None, default: Sequence[str]
) -> list[str]:
    if columns is not None:
        for column in columns:
            if column not in summary.columns:
                hint = did_you_mean(column, summary.columns)
                raise UserError(f"no summary column '{column}'{hint}", field="columns")
        return list(columns)
    chosen = [c for c in default if c in summary.columns and (c not in _IF_KNOWN or summary[c].notna().any())]
    chosen += [c for c in _IF_NONZERO if c in summary.columns and (summary[c].fillna(0) != 0).any()]
    chosen += [c for c in _IF_PRESENT if c in summary.columns and summary[c].notna().any()]
    return chosen


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: 2 per wide or full-width character (CJK, full-width
    forms), 0 per combining mark, 1 otherwise (``len`` counts code points, not columns)."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text
    )


def _widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([display_width(h)] + [display_width(r[i]) for r in rows]) for i, h in enumerate(headers)]


def _join(cells: Sequence[str], widths: Sequence[int], numeric: Sequence[bool], sep: str) -> str:
    """The cells padded to ``widths`` terminal columns: numbers on the right, text on the left."""
    padded = []
    for cell, width, num in zip(cells, widths, numeric, strict=True):
        pad = " " * (width - display_width(cell))
        padded.append(pad + cell if num else cell + pad)
    return sep.join(padded)
