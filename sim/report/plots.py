"""Plots of runs and sweeps; every function returns a new matplotlib Figure.

Figures are built with :class:`matplotlib.figure.Figure` directly, never through the
pyplot state machine, so nothing is registered globally, nothing needs closing, and
the code runs under any backend (Agg on CI). Per-iteration inputs are binned with
exact time-weighted means in O(n log n), so million-iteration runs stay fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.errors import UserError, did_you_mean

DEFAULT_BINS = 200
"""Bins across a run when ``bin_s`` is not given."""

CDF_POINTS = 1000
"""Quantiles drawn per CDF line (enough for a smooth curve at any request count)."""

_WIDTH_IN = 7.0
_PANEL_HEIGHT_IN = 3.2
_DPI = 100
_METRIC_LABELS = {
    "ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E latency",
    "queue_delay_s": "queue delay", "norm_latency_s": "normalized latency (per token)",
}  # fmt: skip
# Savefig metadata that would otherwise embed a date or the matplotlib version.
_STABLE_METADATA: dict[str, dict[str, None]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Producer": None, "Creator": None},
}


def latency_cdf(requests: pd.DataFrame, metric: str = "ttft_s", by: str = "policy") -> Figure:
    """Empirical CDF of a per-request latency, one line per group.

    Args:
        requests: per-request records (a ``by`` column when several policies are mixed).
        metric: latency column in seconds, e.g. ``ttft_s``, ``tpot_s``, ``e2e_s``.
        by: grouping column; absent means one group.

    Returns:
        A Figure with one Axes and one line per group with completed requests.
    """
    _require(requests, [metric], "requests")
    fig, (ax,) = _figure(1)
    done = _completed(requests)
    probabilities = np.linspace(0.0, 1.0, CDF_POINTS)
    for index, (label, group) in enumerate(_groups(done, by)):
        values = group[metric].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if values.size:
            ax.plot(
                np.quantile(values, probabilities), probabilities, label=label, color=_color(index)
            )
    name = _METRIC_LABELS.get(metric, metric)
    ax.set(xlabel=f"{name} (s)", ylabel="fraction of requests", ylim=(0, 1.0), title=f"{name} CDF")
    _finish(ax)
    return fig


def timeline(iterations: pd.DataFrame, by: str = "policy", bin_s: float | None = None) -> Figure:
    """Batch size, KV-cache usage and GPU utilization over time, as time-weighted means per bin.

    Idle time counts as batch 0, KV 0 and utilization 0, and several replicas are
    averaged, so the mean of the KV line over the run equals the summary's
    ``kv_mean_frac``, and those of the busy, MFU and MBU lines ``gpu_busy_frac``,
    ``mfu_mean`` and ``mbu_mean`` (on unsampled records).

    Args:
        iterations: per-iteration records (``mfu`` and ``mbu`` columns optional: without
            them the utilization panel shows the busy fraction only).
        by: grouping column; absent means one group.
        bin_s: bin width in seconds; default: the run's span / ``DEFAULT_BINS``.

    Returns:
        A Figure with three Axes (batch size, KV fraction, utilization); one line per group
        in the first two, and per group a busy (solid), MBU (dashed) and MFU (dotted) line
        in the third.
    """
    _require(
        iterations,
        ["start_s", "duration_s", "batch_size", "kv_blocks_used", "kv_blocks_total"],
        "iterations",
    )
    fig, (batch_ax, kv_ax, use_ax) = _figure(3)
    ends = iterations["start_s"] + iterations["duration_s"]
    edges = _edges(iterations["start_s"].min(), ends.max(), bin_s)
    for index, (label, group) in enumerate(_groups(iterations, by)):
        replicas = group["replica"].nunique() if "replica" in group.columns else 1
        kv = group["kv_blocks_used"] / group["kv_blocks_total"].where(group["kv_blocks_total"] > 0)
        for ax, values in ((batch_ax, group["batch_size"]), (kv_ax, kv.fillna(0.0))):
            means = (
                binned_time_mean(group["start_s"], group["duration_s"], values, edges) / replicas
            )
            _step(ax, edges, means, label, index)
        _utilization_lines(use_ax, group, edges, replicas, label, index)
    batch_ax.set(ylabel="batch size (sequences)", title="Batch size, KV-cache usage and GPU utilization over time")
    kv_ax.set(ylabel="KV cache used (fraction)", ylim=(0, 1.05))
    use_ax.set(xlabel="time (s)", ylabel="busy / MBU / MFU (fraction)", ylim=(0, 1.05))
    for ax in (batch_ax, kv_ax, use_ax):
        _finish(ax)
    return fig


_UTILIZATION_LINES = (("busy", None, "-"), ("MBU", "mbu", "--"), ("MFU", "mfu", ":"))


def _utilization_lines(
    ax: Axes, group: pd.DataFrame, edges: np.ndarray, replicas: int, label: str, index: int
) -> None:
    """Busy fraction (nvidia-smi's figure), MBU and MFU of one group, binned like the others."""
    for name, column, style in _UTILIZATION_LINES:
        if column is not None and column not in group.columns:
            continue
        values = np.ones(len(group)) if column is None else group[column].fillna(0.0)
        means = binned_time_mean(group["start_s"], group["duration_s"], values, edges) / replicas
        ax.step(
            edges, np.append(means, means[-1:]), where="post", label=f"{label} {name}", color=_color(index),
            linestyle=style,
        )  # fmt: skip


def throughput_over_time(
    requests: pd.DataFrame, by: str = "policy", bin_s: float | None = None
) -> Figure:
    """Output tokens of completed requests per second, binned by completion time.

    Returns:
        A Figure with one Axes and one line per group.
    """
    _require(requests, ["arrival_s", "completion_s", "output_tokens"], "requests")
    fig, (ax,) = _figure(1)
    done = _completed(requests)
    edges = _edges(requests["arrival_s"].min(), done["completion_s"].max(), bin_s)
    for index, (label, group) in enumerate(_groups(done, by)):
        tokens, _ = np.histogram(group["completion_s"], bins=edges, weights=group["output_tokens"])
        _step(ax, edges, tokens / np.diff(edges), label, index)
    ax.set(xlabel="time (s)", ylabel="output tokens/s", title="Throughput of completed requests")
    _finish(ax)
    return fig


def latency_vs_load(
    sweep: pd.DataFrame,
    x: str = "workload.arrival.rate",
    y: str = "ttft_p99_s",
    by: str = "policy",
    seed_col: str = "seed",
    saturation_ratio: float = 0.9,
    log_y: bool = False,
) -> Figure:
    """A summary metric against offered load: mean over seeds with a min-max band.

    When ``x`` is an arrival rate (its name ends in ``rate``) and the sweep has
    ``throughput_rps``, each policy's saturation point is marked: the first load whose
    mean throughput falls below ``saturation_ratio`` x the offered rate, i.e. where
    throughput stops tracking load and the queue grows for the rest of the run.

    Args:
        sweep: tidy sweep results, one row per point x policy x seed.
        x: column of the swept parameter.
        y: summary column to plot.
        by: grouping column (one line per value).
        seed_col: seed column, used to report how many seeds each point averages.
        saturation_ratio: throughput/offered-load ratio below which a point is saturated.
        log_y: logarithmic y axis (latencies near saturation span orders of magnitude).

    Returns:
        A Figure with one Axes: one line (and band) per group, plus a dotted vertical
        line per group that saturates.
    """
    _require(sweep, [x, y], "sweep")
    fig, (ax,) = _figure(1)
    for index, (label, group) in enumerate(_groups(sweep, by)):
        stats = group.groupby(x, sort=True)[y].agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], marker="o", label=label, color=_color(index))
        ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.2, color=_color(index))
        saturation = _saturation_point(group, x, saturation_ratio)
        if saturation is not None:
            ax.axvline(
                saturation,
                linestyle=":",
                color=_color(index),
                gid="saturation",
                label=f"{label} saturates",
            )
    seeds = sweep[seed_col].nunique() if seed_col in sweep.columns else 1
    ax.set(xlabel=x, ylabel=y, title=f"{y} vs {x} (mean of {seeds} seed(s), band: min-max)")
    if log_y:
        ax.set_yscale("log")
    _finish(ax)
    return fig


def speedup_bars(table: pd.DataFrame) -> Figure:
    """Grouped bars per scenario: latency speedup and throughput gain of continuous batching.

    Returns:
        A Figure with one Axes holding two bar containers and a reference line at 1x.
    """
    _require(table, ["scenario", "speedup", "throughput_gain"], "speedup table")
    fig, (ax,) = _figure(1)
    positions = np.arange(len(table))
    width = 0.38
    series = (
        ("speedup", "E2E speedup (static / continuous)"),
        ("throughput_gain", "throughput gain"),
    )
    for index, (column, label) in enumerate(series):
        values = table[column].to_numpy(dtype=float)
        bars = ax.bar(
            positions + (index - 0.5) * width, values, width, label=label, color=_color(index)
        )
        ax.bar_label(
            bars, labels=[f"{v:.2f}x" if np.isfinite(v) else "" for v in values], fontsize=8
        )
    ax.axhline(1.0, color="black", linewidth=0.8, gid="parity")
    ax.set_xticks(positions, [str(s) for s in table["scenario"]], rotation=20, ha="right")
    ax.set(ylabel="ratio (x)", title="Continuous vs static batching")
    _finish(ax)
    return fig


def save_figure(fig: Figure, path: Path | str) -> None:
    """Write ``fig`` to ``path`` (format from the suffix, PNG by default) with no timestamps.

    Creates the parent folder. Changes no global matplotlib state and closes nothing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix.lstrip(".").lower() or "png"
    # SVG element ids are salted with a random uuid unless a salt is set.
    with matplotlib.rc_context({"svg.hashsalt": "batchsim"}):
        fig.savefig(path, format=fmt, dpi=_DPI, metadata=_STABLE_METADATA.get(fmt))


def binned_time_mean(
    start_s: pd.Series | np.ndarray,
    duration_s: pd.Series | np.ndarray,
    values: pd.Series | np.ndarray,
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


def _saturation_point(group: pd.DataFrame, x: str, ratio: float) -> float | None:
    if not x.endswith("rate") or "throughput_rps" not in group.columns:
        return None
    tracking = group.groupby(x, sort=True)["throughput_rps"].mean()
    offered = tracking.index.to_numpy(dtype=float)
    saturated = offered[(offered > 0) & (tracking.to_numpy(dtype=float) < ratio * offered)]
    return float(saturated[0]) if saturated.size else None


def _edges(start_s: float, end_s: float, bin_s: float | None) -> np.ndarray:
    if bin_s is not None and not bin_s > 0:
        raise UserError(f"bin_s must be > 0, got {bin_s}", field="bin_s")
    if not (np.isfinite(start_s) and np.isfinite(end_s)) or end_s <= start_s:
        return np.array([0.0, 1.0])  # nothing happened: one empty bin keeps the axes valid
    width = bin_s if bin_s is not None else (end_s - start_s) / DEFAULT_BINS
    count = max(1, int(np.ceil((end_s - start_s) / width)))
    return start_s + width * np.arange(count + 1)


def _groups(frame: pd.DataFrame, by: str) -> Iterator[tuple[str, pd.DataFrame]]:
    if by not in frame.columns:
        yield "all", frame
        return
    for label, group in frame.groupby(by, sort=False):
        yield str(label), group


def _completed(requests: pd.DataFrame) -> pd.DataFrame:
    if "status" not in requests.columns:
        return requests
    return requests[requests["status"] == "completed"]


def _require(frame: pd.DataFrame, columns: list[str], name: str) -> None:
    for column in columns:
        if column not in frame.columns:
            hint = did_you_mean(column, frame.columns)
            raise UserError(f"{name} has no column '{column}'{hint}", field=column)


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(_WIDTH_IN, _PANEL_HEIGHT_IN * panels), dpi=_DPI, layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def _step(ax: Axes, edges: np.ndarray, values: np.ndarray, label: str, index: int) -> None:
    # Repeat the last value so the final bin is drawn to its right edge.
    ax.step(edges, np.append(values, values[-1:]), where="post", label=label, color=_color(index))


def _color(index: int) -> str:
    return f"C{index % 10}"


def _finish(ax: Axes) -> None:
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
