"""Plots of runs and sweeps; every function returns a new matplotlib Figure.

Figures are built with :class:`matplotlib.figure.Figure` directly, never through the
pyplot state machine, so nothing is registered globally, nothing needs closing, and
the code runs under any backend (Agg on CI). The numbers come from
:mod:`sim.report.series` (shared with the HTML report): latencies in ms on a log axis
with p50/p99 marked, timed-out requests as a labelled mass at the client timeout, one
line style per policy so no line hides another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from sim.report import series as data
from sim.report.series import CDF_POINTS, DEFAULT_BINS, METRIC_NAMES, binned_time_mean

__all__ = [
    "CDF_POINTS", "DEFAULT_BINS", "binned_time_mean", "latency_cdf", "latency_vs_load", "save_figure",
    "speedup_bars", "throughput_over_time", "timeline",
]  # fmt: skip

_WIDTH_IN = 7.0
_PANEL_HEIGHT_IN = 3.2
_SMALL_PANEL_HEIGHT_IN = 1.9
_DPI = 100
_BAR_LABEL_HEADROOM = 0.15
"""Space above the tallest bar, as a fraction of the y range: a size-8 label and its 3-point gap
take ~15 px of a speedup chart's ~220 px axes (measured; tests check every label lies inside)."""
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2, 2, 2)))
"""One dash pattern per policy (with its colour), so overlapping lines stay distinguishable."""
AXIS_LABELS = {"workload.arrival.rate": "arrival rate (req/s)"}
"""Readable names of swept parameters; others are shown as their path."""
# Savefig metadata that would otherwise embed a date or the matplotlib version.
_STABLE_METADATA: dict[str, dict[str, None]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Producer": None, "Creator": None},
}


def latency_cdf(
    requests: pd.DataFrame, metric: str = "ttft_s", by: str = "policy", timeout_s: float | None = None,
    summary: pd.DataFrame | None = None,
) -> Figure:
    """Empirical CDF of a per-request latency over all sent requests, in ms on a log axis.

    Each line carries a p50 (circle, gid ``p50``) and p99 (triangle, gid ``p99``) marker and
    states both in the legend with the timed-out and rejected shares; timed-out requests
    without a value sit at ``timeout_s`` (a jump, dotted line gid ``timeout``, annotated).

    Args:
        requests: per-request records (a ``by`` column when several policies are mixed).
        metric: latency column in seconds, e.g. ``ttft_s``, ``tpot_s``, ``e2e_s``.
        by: grouping column; absent means one group.
        timeout_s: the client timeout (``scenario.client.timeout_s``), None when there is none.
        summary: the run's summary; with its interval columns each line gets a shaded band (gid ``band <label>``),
            its percentiles' 90% intervals (:func:`sim.report.series.cdf_band`).

    Returns:
        A Figure with one Axes and one line per group with a value.
    """
    fig, (ax,) = _figure(1)
    cdfs = data.latency_cdfs(requests, metric, by, timeout_s)
    bands = data.interval_ratios(summary, metric)
    for index, cdf in enumerate(cdfs):
        if cdf.label in bands:
            low, high = data.cdf_band(cdf, bands[cdf.label])
            ax.fill_betweenx(cdf.fractions, low, high, step="post", color=_color(index), alpha=0.15, linewidth=0,
                             gid=f"band {cdf.label}")  # fmt: skip
        ax.plot(cdf.values_ms, cdf.fractions, label=_cdf_label(cdf), drawstyle="steps-post", color=_color(index),
                linestyle=_style(index), gid=f"cdf {cdf.label}")  # fmt: skip
        for name, value, fraction, marker in (("p50", cdf.p50_ms, 0.5, "o"), ("p99", cdf.p99_ms, 0.99, "^")):
            if math.isfinite(value):
                ax.plot([value], [fraction], marker=marker, linestyle="none", color=_color(index),
                        gid=name, label=f"_{cdf.label} {name}")  # fmt: skip
    if timeout_s is not None and metric in data.FROM_ARRIVAL and any(c.timed_out_frac for c in cdfs):
        _timeout_mark(ax, timeout_s, cdfs)
    name = METRIC_NAMES.get(metric, metric)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))  # 1,000 reads faster than 10^3
    title = f"{name} CDF (o p50, ^ p99{', shaded: 90% interval' if bands else ''})"
    ax.set(xlabel=f"{name} (ms, log scale)", ylabel="fraction of sent requests", ylim=(0, 1.02), title=title)
    _finish(ax)
    return fig


def _plain_number(value: float, _position: float) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _cdf_label(cdf: data.CdfSeries) -> str:
    return data.cdf_legend(cdf, rejected_note=" (not on the curve)")


def _timeout_mark(ax: Axes, timeout_s: float, cdfs: list[data.CdfSeries]) -> None:
    at_ms = timeout_s * 1000.0
    ax.axvline(at_ms, color="grey", linestyle=":", gid="timeout", label=f"client timeout {timeout_s:g} s")
    shares = ", ".join(f"{c.label} {c.timed_out_frac:.1%}" for c in cdfs if c.timed_out_frac)
    ax.annotate(f"timed out {shares}\n(no value: drawn at {timeout_s:g} s)", (at_ms, 0.6), xytext=(-4, 0),
                textcoords="offset points", ha="right", va="center", fontsize=7, gid="timeout-label")  # fmt: skip


def timeline(
    iterations: pd.DataFrame,
    by: str = "policy",
    bin_s: float | None = None,
    requests: pd.DataFrame | None = None,
    every: int | Mapping[str, int] = 1,
    replicas: int | Mapping[str, int] | None = None,
) -> Figure:
    """Batch size, KV-cache use, queue length and GPU utilization over time, per bin.

    Time-weighted means per bin, idle time counting as 0, replicas averaged (queue: all
    replicas together), so the KV line averages to the summary's ``kv_mean_frac`` and the
    busy, MFU and MBU lines to ``gpu_busy_frac``, ``mfu_mean`` and ``mbu_mean``.

    Args:
        iterations: per-iteration records (``mfu``/``mbu`` optional).
        by: grouping column; absent means one group.
        bin_s: bin width in seconds; default: the run's span / ``DEFAULT_BINS``.
        requests: per-request records; given, a queue-length panel is added.
        every: how many passes each row stands for: a run's ``facts["iterations_every"]``
            (per policy) when its iterations were sampled, else 1.
        replicas: workers averaged over, per policy (a run's ``replicas_per_policy``);
            default: the distinct ``replica`` ids among the rows.

    Returns:
        A Figure whose shared panels (batch size, KV fraction, queue length when
        ``requests`` is given) hold one line per group in its own style, followed by one
        utilization panel per group with its busy (solid), MBU (dashed) and MFU (dotted) lines.
    """
    binned = data.timeline(iterations, requests, by, bin_s, every, replicas)
    shared = ["batch", "kv"] + (["queue"] if requests is not None else [])
    fig, axes = _figure(len(shared), small=len(binned.series))
    labels = {"batch": "batch size\n(sequences)", "kv": "KV cache used\n(fraction)", "queue": "waiting\nrequests"}
    for ax, quantity in zip(axes, shared, strict=False):
        for index, (label, values) in enumerate(binned.series.items()):
            if quantity in values:
                _step(ax, binned.edges, values[quantity], label, index)
        ax.set(ylabel=labels[quantity], ylim=(0, 1.05) if quantity == "kv" else None)
    for index, (label, values) in enumerate(binned.series.items()):
        _utilization(axes[len(shared) + index], binned.edges, values, label, index)
    axes[0].set_title("Batch size, KV-cache use, queue length and GPU utilization over time\n"
                      f"(time-weighted means per {_width(binned.edges)} bin; queue: all replicas)")  # fmt: skip
    axes[-1].set_xlabel("time (s)")
    for ax in axes:
        _finish(ax)
    return fig


_UTILIZATION_LINES = (("busy", "busy", "-"), ("MBU", "mbu", "--"), ("MFU", "mfu", ":"))


def _utilization(ax: Axes, edges: np.ndarray, values: dict[str, np.ndarray], label: str, index: int) -> None:
    """One group's busy fraction (nvidia-smi's figure), MBU and MFU in its own panel."""
    for name, key, style in _UTILIZATION_LINES:
        if key in values:
            means = values[key]
            ax.step(edges, np.append(means, means[-1:]), where="post", label=f"{label} {name}",
                    color=_color(index), linestyle=style)  # fmt: skip
    ax.set(ylabel=f"{label}\nbusy/MBU/MFU", ylim=(0, 1.05))
    ax.set_gid(f"utilization {label}")


def throughput_over_time(requests: pd.DataFrame, by: str = "policy", bin_s: float | None = None) -> Figure:
    """Output tokens per second of completed requests: mean per window of completion time.

    Args:
        requests: per-request records.
        by: grouping column; absent means one group.
        bin_s: the window in seconds; default: a round width giving about 60 windows.

    Returns:
        A Figure with one Axes and one line per group; the title states the window.
    """
    edges, rates, window_s = data.throughput(requests, by, bin_s)
    fig, (ax,) = _figure(1)
    for index, (label, values) in enumerate(rates.items()):
        _step(ax, edges, values, label, index)
    ax.set(xlabel="completion time (s)", ylabel="output tokens/s",
           title=f"Output tokens/s of completed requests (mean per {window_s:g} s window)")  # fmt: skip
    _finish(ax)
    return fig


def latency_vs_load(
    sweep: pd.DataFrame, x: str = "workload.arrival.rate", y: str = "ttft_p99_s", by: str = "policy",
    seed_col: str = "seed", saturation_ratio: float = 0.9, log_y: bool | None = None,
) -> Figure:
    """A summary metric against offered load: mean over seeds with a min-max band.

    ``y`` is shown in the summary table's unit and header (``ttft_p99_s`` as "TTFT p99 (ms)").
    When ``x`` is an arrival rate (its name ends in ``rate``) and the sweep has
    ``throughput_rps``, each policy's saturation point is marked: the first load whose
    mean throughput falls below ``saturation_ratio`` x the offered rate.

    Args:
        sweep: tidy sweep results, one row per point x policy x seed.
        x: column of the swept parameter.
        y: summary column to plot.
        by: grouping column (one line per value).
        seed_col: seed column, used to report how many seeds each point averages.
        saturation_ratio: throughput/offered-load ratio below which a point is saturated.
        log_y: logarithmic y axis; None: for latency columns (names ending in ``_s``), which
            span orders of magnitude near saturation.

    Returns:
        A Figure with one Axes: one line (and band) per group, plus a dotted vertical
        line per group that saturates.
    """
    from sim.report.tables import FORMATS

    data.require(sweep, [x, y], "sweep")
    fmt = FORMATS.get(y)
    scale, y_label = (fmt.scale, fmt.header) if fmt else (1.0, y)
    fig, (ax,) = _figure(1)
    for index, (label, group) in enumerate(data.groups(sweep, by)):
        stats = group.groupby(x, sort=True)[y].agg(["mean", "min", "max"]) * scale
        ax.plot(stats.index, stats["mean"], marker="o", label=label, color=_color(index), linestyle=_style(index))
        ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.2, color=_color(index))
        saturation = _saturation_point(group, x, saturation_ratio)
        if saturation is not None:
            ax.axvline(saturation, linestyle=":", color=_color(index), gid="saturation", label=f"{label} saturates")
    seeds = sweep[seed_col].nunique() if seed_col in sweep.columns else 1
    x_label = AXIS_LABELS.get(x, x)
    ax.set(xlabel=x_label, ylabel=y_label, title=f"{y_label} vs {x_label}\n(mean of {seeds} seed(s), band: min-max)")
    if log_y if log_y is not None else y.endswith("_s"):
        ax.set_yscale("log")
    _finish(ax)
    return fig


def speedup_bars(table: pd.DataFrame) -> Figure:
    """Grouped bars per scenario: latency speedup and throughput gain of continuous batching.

    Returns:
        A Figure with one Axes holding two bar containers and a reference line at 1x.
    """
    data.require(table, ["scenario", "speedup", "throughput_gain"], "speedup table")
    fig, (ax,) = _figure(1)
    positions = np.arange(len(table))
    width = 0.38
    series = (
        ("speedup", "E2E speedup (static / continuous)"),
        ("throughput_gain", "throughput gain"),
    )
    for index, (column, label) in enumerate(series):
        values = table[column].to_numpy(dtype=float)
        bars = ax.bar(positions + (index - 0.5) * width, values, width, label=label, color=_color(index))
        ax.bar_label(bars, labels=[f"{v:.2f}x" if np.isfinite(v) else "" for v in values], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8, gid="parity")
    ax.set_xticks(positions, [str(s) for s in table["scenario"]], rotation=20, ha="right")
    ax.set(ylabel="ratio (x)", title="Continuous vs static batching")
    # Autoscaling sees the bars, not the labels above them: leave room for one label line
    # over the tallest bar, and keep the legend below the figure, where no bar or label can be.
    ax.margins(y=_BAR_LABEL_HEADROOM)
    ax.grid(True, alpha=0.3, which="both")
    fig.legend(fontsize=7, ncols=2, loc="outside lower center", frameon=False)
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


def _saturation_point(group: pd.DataFrame, x: str, ratio: float) -> float | None:
    if not x.endswith("rate") or "throughput_rps" not in group.columns:
        return None
    tracking = group.groupby(x, sort=True)["throughput_rps"].mean()
    offered = tracking.index.to_numpy(dtype=float)
    saturated = offered[(offered > 0) & (tracking.to_numpy(dtype=float) < ratio * offered)]
    return float(saturated[0]) if saturated.size else None


def _figure(panels: int, small: int = 0) -> tuple[Figure, list[Axes]]:
    """``panels`` full-height panels then ``small`` shorter ones, stacked with a shared x axis."""
    height = _PANEL_HEIGHT_IN * panels + _SMALL_PANEL_HEIGHT_IN * small
    fig = Figure(figsize=(_WIDTH_IN, height), dpi=_DPI, layout="constrained")
    ratios = [_PANEL_HEIGHT_IN] * panels + [_SMALL_PANEL_HEIGHT_IN] * small
    axes = fig.subplots(panels + small, 1, sharex=True, squeeze=False, height_ratios=ratios)[:, 0]
    return fig, list(axes)


def _step(ax: Axes, edges: np.ndarray, values: np.ndarray, label: str, index: int) -> None:
    # Repeat the last value so the final bin is drawn to its right edge.
    ax.step(edges, np.append(values, values[-1:]), where="post", label=label, color=_color(index),
            linestyle=_style(index))  # fmt: skip


def _width(edges: np.ndarray) -> str:
    width = float(edges[1] - edges[0])
    return f"{width:.3g} s"


def _color(index: int) -> str:
    return f"C{index % 10}"


def _style(index: int) -> str | tuple:
    return LINE_STYLES[index % len(LINE_STYLES)]


def _finish(ax: Axes) -> None:
    ax.grid(True, alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
