"""The numbers behind the run plots, shared by the PNGs (:mod:`sim.report.plots`) and the
HTML report (:mod:`sim.report.html`), so both always show the same curves.

Latency CDFs count every request a policy was sent: completed ones at their latency,
timed-out ones at their latency when they have one (a TTFT seen before giving up) and
otherwise as a mass at the client timeout (they waited at least that long), rejected
ones never (the curve tops out below 1 by their share). Percentiles are read off that
curve, so under timeouts they can exceed the summary's, which counts completed requests.
Timelines are exact time-weighted means per bin (:func:`binned_time_mean`) of the rows
they are given; a run keeps only every k-th pass per policy beyond ``metrics.max_iteration_rows``
(:func:`sim.metrics.records.sample_every_kth`), so each kept row is counted k times: it stands
for itself and the k - 1 passes after it that were dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.errors import UserError, did_you_mean

CDF_POINTS = 1000
"""Most points drawn per CDF line (enough for a smooth curve at any request count)."""

DEFAULT_BINS = 200
"""Bins across a run when ``bin_s`` is not given."""

THROUGHPUT_WINDOWS = 60
"""About this many throughput windows across a run when ``window_s`` is not given."""

FROM_ARRIVAL = frozenset({"ttft_s", "e2e_s", "queue_delay_s"})
"""Latencies measured from arrival: a timed-out request without one waited at least the timeout."""

METRIC_NAMES = {
    "ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E latency",
    "queue_delay_s": "queue delay", "norm_latency_s": "normalized latency (per token)",
}  # fmt: skip


@dataclass(frozen=True)
class CdfSeries:
    """One policy's latency CDF, in milliseconds.

    Attributes:
        label: the policy (group) name.
        values_ms: latencies, ascending (sampled to at most ``CDF_POINTS`` points).
        fractions: fraction of sent requests at or below each value (ends at 1 - rejected share).
        p50_ms: where the curve reaches 0.5 (NaN: never, too many requests without a value).
        p99_ms: where the curve reaches 0.99 (NaN: never).
        timed_out_frac: share of sent requests that timed out.
        at_timeout_frac: share drawn as a mass at the timeout (timed out without a value).
        rejected_frac: share of sent requests refused (not on the curve).
    """

    label: str
    values_ms: np.ndarray
    fractions: np.ndarray
    p50_ms: float
    p99_ms: float
    timed_out_frac: float = 0.0
    at_timeout_frac: float = 0.0
    rejected_frac: float = 0.0


@dataclass(frozen=True)
class Timeline:
    """Binned per-group series over time.

    Attributes:
        edges: bin edges in seconds (one more than each series).
        series: per group label, per quantity (``batch``, ``kv``, ``busy``, ``mbu``, ``mfu``,
            ``queue``) the time-weighted mean per bin; ``mbu``/``mfu`` only when recorded,
            ``queue`` only when requests were given.
    """

    edges: np.ndarray
    series: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def latency_cdfs(
    requests: pd.DataFrame, metric: str = "ttft_s", by: str = "policy", timeout_s: float | None = None,
    points: int = CDF_POINTS,
) -> list[CdfSeries]:
    """The CDF of ``metric`` per group, over all sent requests (see the module docstring).

    Args:
        requests: per-request records.
        metric: latency column in seconds.
        by: grouping column; absent means one group.
        timeout_s: the client timeout (``scenario.client.timeout_s``); None: no mass drawn.
        points: most points per line.

    Returns:
        One :class:`CdfSeries` per group that has at least one value.
    """
    require(requests, [metric], "requests")
    out = []
    for label, group in groups(requests, by):
        series = _cdf(label, group, metric, timeout_s, points)
        if series is not None:
            out.append(series)
    return out


def _cdf(label: str, group: pd.DataFrame, metric: str, timeout_s: float | None, points: int) -> CdfSeries | None:
    status = group["status"] if "status" in group.columns else pd.Series("completed", index=group.index)
    values = group[metric].to_numpy(dtype=float)
    timed_out = (status == "timed_out").to_numpy()
    served = ((status == "completed").to_numpy() | timed_out) & np.isfinite(values)
    at_timeout = timed_out & ~np.isfinite(values)
    if timeout_s is None or metric not in FROM_ARRIVAL:
        at_timeout[:] = False
    drawn = np.sort(np.concatenate([values[served], np.full(int(at_timeout.sum()), float(timeout_s or 0.0))]))
    if not drawn.size:
        return None
    sent = len(group)
    index = np.unique(np.linspace(0, drawn.size - 1, min(points, drawn.size)).round().astype(int))
    padded = np.concatenate([drawn, np.full(sent - drawn.size, np.inf)])
    return CdfSeries(
        label=label,
        values_ms=np.concatenate([drawn[:1], drawn[index]]) * 1000.0,
        fractions=np.concatenate([[0.0], (index + 1) / sent]),
        p50_ms=_percentile_ms(padded, 50),
        p99_ms=_percentile_ms(padded, 99),
        timed_out_frac=float(timed_out.mean()),
        at_timeout_frac=float(at_timeout.mean()),
        rejected_frac=float((status == "rejected").mean()),
    )


BAND_PERCENTILES: dict[str, tuple[tuple[str, float], ...]] = {
    "ttft_s": (("ttft_p50_s", 0.5), ("ttft_p90_s", 0.9), ("ttft_p99_s", 0.99)),
    "tpot_s": (("tpot_p50_s", 0.5), ("tpot_p99_s", 0.99)),
    "e2e_s": (("e2e_p50_s", 0.5), ("e2e_p90_s", 0.9), ("e2e_p99_s", 0.99)),
}
"""Latency -> the summary percentiles (column, fraction) whose 90% intervals make its CDF's band."""


def interval_ratios(summary: pd.DataFrame | None, metric: str) -> dict[str, list[tuple[float, float, float]]]:
    """Per policy: (fraction, lo / value, hi / value) of the summary's 90% intervals of ``metric``'s percentiles
    (``<column>_lo``/``_hi``, :mod:`sim.uncertainty.trust`), finite ones only; empty without those columns."""
    found: dict[str, list[tuple[float, float, float]]] = {}
    if summary is None or metric not in BAND_PERCENTILES:
        return found
    for _, row in summary.iterrows():
        points = []
        for column, fraction in BAND_PERCENTILES[metric]:
            value, lo, hi = (row.get(c, math.nan) for c in (column, f"{column}_lo", f"{column}_hi"))
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (value, lo, hi)) and value > 0:
                points.append((fraction, lo / value, hi / value))
        if points:
            found[str(row["policy"])] = points
    return found


def cdf_band(cdf: CdfSeries, ratios: list[tuple[float, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The band around a CDF: each point's latency times its percentile's interval ratios, interpolated between the
    summary's percentiles (the lowest one's below it, the highest one's above it)."""
    fractions, low, high = (np.asarray(v) for v in zip(*ratios, strict=True))
    at = np.clip(cdf.fractions, fractions[0], fractions[-1])
    return cdf.values_ms * np.interp(at, fractions, low), cdf.values_ms * np.interp(at, fractions, high)


def cdf_legend(cdf: CdfSeries, rejected_note: str = "") -> str:
    """A CDF line's legend: its p50 and p99, and the timed-out and rejected shares when there are any."""
    text = f"{cdf.label}: p50 {format_ms(cdf.p50_ms)}, p99 {format_ms(cdf.p99_ms)}"
    if cdf.timed_out_frac:
        text += f", timed out {cdf.timed_out_frac:.1%}"
    if cdf.rejected_frac:
        text += f", rejected {cdf.rejected_frac:.1%}{rejected_note}"
    return text


def format_ms(value: float) -> str:
    """A latency in ms for legends: 3-4 significant figures, thousands separated; NaN: "not reached"."""
    if not math.isfinite(value):
        return "not reached"
    return f"{value:.2f} ms" if value < 10 else f"{value:,.0f} ms" if value >= 1000 else f"{value:.1f} ms"


def _percentile_ms(padded: np.ndarray, q: float) -> float:
    with np.errstate(invalid="ignore"):
        value = float(np.percentile(padded, q))
    return value * 1000.0 if math.isfinite(value) else math.nan


def timeline(
    iterations: pd.DataFrame,
    requests: pd.DataFrame | None = None,
    by: str = "policy",
    bin_s: float | None = None,
    every: int | Mapping[str, int] = 1,
    replicas: int | Mapping[str, int] | None = None,
) -> Timeline:
    """Batch size, KV fraction, busy/MBU/MFU (mean per replica) and queue length (all replicas) per bin.

    Idle time counts as 0 and replicas are averaged, so over bins spanning the run the KV
    series averages to the summary's ``kv_mean_frac`` and busy/MFU/MBU to ``gpu_busy_frac``,
    ``mfu_mean``, ``mbu_mean`` (exactly on unsampled records, up to the sampling error on
    every k-th pass). The queue counts requests between arrival and first scheduling (or
    their end, if never scheduled).

    Args:
        iterations: per-iteration records.
        requests: per-request records; given, a ``queue`` series is added.
        by: grouping column; absent means one group.
        bin_s: bin width in seconds; default: the span / ``DEFAULT_BINS``.
        every: the sampling factor k of ``iterations``: one for all groups, or per group label
            (a run's ``facts["iterations_every"]``); each row counts as k passes.
        replicas: GPU workers to average over, for all groups or per group label (the
            summary's ``replicas``); None: the distinct ``replica`` ids (with a ``stage``
            column, (replica, stage) pairs) among the rows, which misses a worker that ran no
            kept pass.
    """
    require(iterations, ["start_s", "duration_s", "batch_size", "kv_blocks_used", "kv_blocks_total"], "iterations")
    ends = iterations["start_s"] + iterations["duration_s"]
    edges = edges_for(iterations["start_s"].min(), ends.max(), bin_s)
    out = Timeline(edges)
    for label, group in groups(iterations, by):
        workers = _replica_count(group) if replicas is None else per_group(replicas, label, "replicas")
        out.series[label] = _iteration_series(group, edges, per_group(every, label, "every") / workers)
    if requests is not None and {"arrival_s", "first_scheduled_s"} <= set(requests.columns):
        for label, group in groups(requests, by):
            if label in out.series:
                out.series[label]["queue"] = queue_length(group, edges)
    return out


def per_group(value: int | Mapping[str, int], label: str, name: str) -> int:
    """``value`` itself, or its entry for group ``label``: a positive integer.

    Raises:
        UserError: ``value`` is a mapping without ``label``, or the count is not an integer >= 1.
    """
    if isinstance(value, Mapping):
        if label not in value:
            raise UserError(f"{name} has no entry for {label!r}; it has {sorted(value)!r}"[:200], field=name)
        value = value[label]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{name} must be an integer >= 1, got {value!r}"[:200], field=name)
    return int(value)


def _replica_count(group: pd.DataFrame) -> int:
    """Distinct workers among the rows: replicas, or (replica, stage) pairs under pipeline parallelism."""
    if "replica" not in group.columns:
        return 1
    if "stage" in group.columns:
        return max(1, len(group[["replica", "stage"]].drop_duplicates()))
    return max(1, group["replica"].nunique())


def _iteration_series(group: pd.DataFrame, edges: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    """Each quantity's time-weighted mean per bin, times ``scale`` = passes per row / workers.

    A kept row stands for k passes: weighting it by k keeps each integral (busy seconds,
    batch x seconds, ...) that of all passes instead of 1/k of it. The mass stays where the
    sampled pass ran, so a bin holding few kept rows is noisy but never shifted in time.
    """
    total = group["kv_blocks_total"].where(group["kv_blocks_total"] > 0)
    quantities = {
        "batch": group["batch_size"],
        "kv": (group["kv_blocks_used"] / total).fillna(0.0),
        "busy": np.ones(len(group)),
    }
    for column in ("mbu", "mfu"):
        if column in group.columns:
            quantities[column] = group[column].fillna(0.0)
    return {
        name: binned_time_mean(group["start_s"], group["duration_s"], values, edges) * scale
        for name, values in quantities.items()
    }


def queue_length(requests: pd.DataFrame, edges: np.ndarray) -> np.ndarray:
    """Mean number of requests waiting (arrived, not yet scheduled) per bin."""
    arrival = requests["arrival_s"].to_numpy(dtype=float)
    until = requests["first_scheduled_s"].to_numpy(dtype=float)
    if "completion_s" in requests.columns:
        until = np.where(np.isfinite(until), until, requests["completion_s"].to_numpy(dtype=float))
    wait = np.nan_to_num(until - arrival, nan=0.0).clip(min=0.0)
    return binned_time_mean(arrival, wait, np.ones(len(arrival)), edges)


def throughput(
    requests: pd.DataFrame, by: str = "policy", window_s: float | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray], float]:
    """Output tokens/s of completed requests, mean per window of completion time.

    Returns:
        (window edges in seconds, tokens/s per window per group, the window in seconds).
    """
    require(requests, ["arrival_s", "completion_s", "output_tokens"], "requests")
    done = completed(requests)
    start, end = requests["arrival_s"].min(), done["completion_s"].max()
    if window_s is None:
        window_s = nice_width((end - start) / THROUGHPUT_WINDOWS) if np.isfinite(end - start) else 1.0
    edges = edges_for(start, end, window_s)
    rates = {}
    for label, group in groups(done, by):
        tokens, _ = np.histogram(group["completion_s"], bins=edges, weights=group["output_tokens"])
        rates[label] = tokens / np.diff(edges)
    return edges, rates, float(window_s)


def nice_width(raw_s: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at or above ``raw_s`` (a window width one can state)."""
    if not raw_s > 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw_s))
    return next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= raw_s * (1 - 1e-9))


def binned_time_mean(
    start_s: pd.Series | np.ndarray, duration_s: pd.Series | np.ndarray, values: pd.Series | np.ndarray,
    edges: np.ndarray,
) -> np.ndarray:
    """Time-weighted mean per bin of a quantity that holds ``values[i]`` over
    ``[start_s[i], start_s[i] + duration_s[i])`` and 0 elsewhere (intervals may overlap:
    contributions add).

    Uses the running integral G(t) = sum_i v_i (max(0, t - s_i) - max(0, t - e_i)),
    each part evaluated from sorted cumulative sums, so the cost is O(n log n).
    """
    start = np.asarray(start_s, dtype=float)
    end = start + np.asarray(duration_s, dtype=float)
    weight = np.asarray(values, dtype=float)
    integral = _ramp_integral(start, weight, edges) - _ramp_integral(end, weight, edges)
    return np.diff(integral) / np.diff(edges)


def _ramp_integral(times: np.ndarray, weight: np.ndarray, at: np.ndarray) -> np.ndarray:
    """sum_i weight_i * max(0, at - times_i), for each point of ``at``."""
    order = np.argsort(times, kind="stable")
    sorted_times, sorted_weight = times[order], weight[order]
    cum_w = np.concatenate(([0.0], np.cumsum(sorted_weight)))
    cum_wt = np.concatenate(([0.0], np.cumsum(sorted_weight * sorted_times)))
    count = np.searchsorted(sorted_times, at, side="right")
    return at * cum_w[count] - cum_wt[count]


def edges_for(start_s: float, end_s: float, bin_s: float | None) -> np.ndarray:
    """Bin edges from ``start_s`` covering ``end_s``: width ``bin_s`` or span / ``DEFAULT_BINS``."""
    if bin_s is not None and not bin_s > 0:
        raise UserError(f"bin_s must be > 0, got {bin_s}", field="bin_s")
    if not (np.isfinite(start_s) and np.isfinite(end_s)) or end_s <= start_s:
        return np.array([0.0, 1.0])  # nothing happened: one empty bin keeps the axes valid
    width = bin_s if bin_s is not None else (end_s - start_s) / DEFAULT_BINS
    count = max(1, int(np.ceil((end_s - start_s) / width)))
    return start_s + width * np.arange(count + 1)


def groups(frame: pd.DataFrame, by: str) -> Iterator[tuple[str, pd.DataFrame]]:
    """(label, rows) per value of ``by`` in order of appearance; one group "all" without it."""
    if by not in frame.columns:
        yield "all", frame
        return
    for label, group in frame.groupby(by, sort=False, observed=True):
        yield str(label), group


def completed(requests: pd.DataFrame) -> pd.DataFrame:
    """The completed requests (all of them without a ``status`` column)."""
    if "status" not in requests.columns:
        return requests
    return requests[requests["status"] == "completed"]


def require(frame: pd.DataFrame, columns: list[str], name: str) -> None:
    """Raise UserError naming the first of ``columns`` missing from ``frame``."""
    for column in columns:
        if column not in frame.columns:
            hint = did_you_mean(column, frame.columns)
            raise UserError(f"{name} has no column '{column}'{hint}", field=column)
