"""Per-policy summary: pure functions from request and iteration records to one row.

``summarize_run`` turns the requests DataFrame (one row per request) and the
iterations DataFrame (one row per forward pass) of one policy run into the row that
``summary.csv`` holds. Every column is defined with symbols and units in
``docs/metrics.md``. Nothing here knows about SimPy or files; a metric that cannot be
computed (no completed request, no SLO, no price) is NaN, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.config import SLOConfig
from sim.metrics.energy import ENERGY_COLUMNS, energy_cost_stats
from sim.metrics.itl import itl_stats
from sim.metrics.speculative import spec_stats

if TYPE_CHECKING:
    from sim.hardware.utilization import PassWork
    from sim.metrics.energy import Pool

SUMMARY_COLUMNS: tuple[str, ...] = (
    "scenario", "policy", "requests", "completed", "duration_s", "throughput_rps",
    "output_tps", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "norm_latency_mean_s",
    "queue_p50_s", "gpu_busy_frac", "kv_peak_frac", "mean_batch_size", "preemptions",
)  # fmt: skip
"""The columns every ``summary.csv`` starts with, in this order (a published contract)."""

EXTRA_COLUMNS: tuple[str, ...] = (
    "timed_out", "rejected", "retries", "iterations", "replicas",
    "ttft_mean_s", "tpot_mean_s", "tpot_p90_s", "e2e_max_s",
    "queue_mean_s", "queue_p90_s", "queue_p99_s", "kv_mean_frac",
    "slo_attainment", "goodput_rps", "rps_per_gpu", "requests_per_usd",
    "frontend_p50_s", "itl_mean_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
    "mfu_mean", "mbu_mean", "mfu_busy", "mbu_busy", "total_tps",
    "spec_tokens_per_step", "spec_acceptance", "spec_wasted_frac",
    "num_gpus", "goodput_per_gpu", "prefill_gpu_busy_frac", "decode_gpu_busy_frac",
    "kv_transfer_p50_s", "kv_transfer_p99_s",
    "prefix_hit_rate", "cached_prompt_tokens", "prefill_tokens_computed", "replica_busy_imbalance",
    "load_frac", *ENERGY_COLUMNS,
)  # fmt: skip
"""Columns that follow ``SUMMARY_COLUMNS``; always present, NaN when not applicable."""

DISAGGREGATION_COLUMNS: tuple[str, ...] = (
    "prefill_gpu_busy_frac", "decode_gpu_busy_frac", "kv_transfer_p50_s", "kv_transfer_p99_s",
)  # fmt: skip
"""Columns only a disaggregated deployment's row fills (NaN for colocated policies)."""

REQUEST_COLUMNS: tuple[str, ...] = (
    "arrival_s", "output_tokens", "status", "first_scheduled_s", "first_token_s",
    "completion_s", "queue_delay_s", "ttft_s", "tpot_s", "e2e_s", "norm_latency_s",
    "preemptions", "retries",
)  # fmt: skip
"""Request columns the summary reads."""

ITERATION_COLUMNS: tuple[str, ...] = (
    "replica",
    "start_s",
    "duration_s",
    "batch_size",
    "kv_blocks_used",
    "kv_blocks_total",
)
"""Iteration columns the summary reads."""

# Summary column -> (request column, statistic): a percentile in [0, 100], "mean" or "max".
_LATENCY_STATS: dict[str, tuple[str, float | str]] = {
    "ttft_p50_s": ("ttft_s", 50), "ttft_p90_s": ("ttft_s", 90), "ttft_p99_s": ("ttft_s", 99),
    "ttft_mean_s": ("ttft_s", "mean"),
    "tpot_p50_s": ("tpot_s", 50), "tpot_p90_s": ("tpot_s", 90), "tpot_p99_s": ("tpot_s", 99),
    "tpot_mean_s": ("tpot_s", "mean"),
    "e2e_mean_s": ("e2e_s", "mean"), "e2e_p50_s": ("e2e_s", 50), "e2e_p90_s": ("e2e_s", 90),
    "e2e_p99_s": ("e2e_s", 99), "e2e_max_s": ("e2e_s", "max"),
    "norm_latency_mean_s": ("norm_latency_s", "mean"),
    "queue_mean_s": ("queue_delay_s", "mean"), "queue_p50_s": ("queue_delay_s", 50),
    "queue_p90_s": ("queue_delay_s", 90), "queue_p99_s": ("queue_delay_s", 99),
}  # fmt: skip

_SECONDS_PER_HOUR = 3600.0
_TIME_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s")
# Only these columns of the selected requests are copied (a run may hold millions of rows).
_LATENCY_SOURCES = list(dict.fromkeys(source for source, _ in _LATENCY_STATS.values()))
_SLO_COLUMNS = ["status", "ttft_s", "tpot_s", "e2e_s"]


def summarize_run(
    requests: pd.DataFrame,
    iterations: pd.DataFrame,
    *,
    scenario: str,
    policy: str,
    num_gpus: int = 1,
    warmup_s: float = 0.0,
    slo: SLOConfig | None = None,
    gpu_hour_usd: float | None = None,
    replicas: int | None = None,
    itl: pd.DataFrame | None = None,
    work: PassWork | None = None,
    pools: Sequence[Pool] | None = None,
    input_price_ratio: float = 0.0,
) -> dict[str, Any]:
    """Summarize one policy run into one ``summary.csv`` row.

    Args:
        requests: one row per request (columns ``REQUEST_COLUMNS``; NaN latencies where
            not applicable).
        iterations: one row per forward pass, all of them (columns ``ITERATION_COLUMNS``).
        scenario: scenario name, copied into the row.
        policy: policy label, copied into the row.
        num_gpus: GPUs used by the run (replicas x pipeline stages x tensor-parallel degree), for the
            per-GPU and per-dollar columns.
        warmup_s: requests that arrived before this time are left out of latency
            statistics and SLO attainment (they still count as requests and completions).
        slo: latency bounds; without it ``slo_attainment`` and ``goodput_rps`` are NaN.
        gpu_hour_usd: price of one GPU-hour; without it ``requests_per_usd`` is NaN.
        replicas: GPU workers (replicas x pipeline stages); default: distinct ``replica`` ids in
            ``iterations`` ((replica, stage) pairs when it has a ``stage`` column).
        itl: the run's inter-token gaps as (gap_s, count) rows (``SimOutput.itl``); without it
            the ITL columns are NaN. Every stream event counts, warm-up included.
        work: FLOPs and bytes per pass of the run's model and GPUs
            (:class:`sim.hardware.utilization.PassWork`); without it the MFU and MBU columns
            are NaN. It reads the iteration columns ``PassWork.REQUIRED_COLUMNS``.
        pools: the deployment's GPUs, their power and price (:class:`sim.metrics.energy.Pool`);
            without them the energy and cost columns (``ENERGY_COLUMNS``) are NaN.
        input_price_ratio: what one prompt token costs in output tokens when the bill is split
            (``usd_per_mtok``); 0 puts it all on output tokens.

    Returns:
        A dict with exactly the keys ``SUMMARY_COLUMNS + EXTRA_COLUMNS``, in that order.

    Raises:
        ValueError: a required column is missing or ``num_gpus``/``replicas`` < 1.
    """
    _require_columns(requests, REQUEST_COLUMNS, "requests")
    _require_columns(iterations, ITERATION_COLUMNS, "iterations")
    workers = _replica_count(iterations) if replicas is None else replicas
    if num_gpus < 1 or workers < 1:
        raise ValueError(f"num_gpus ({num_gpus}) and replicas ({workers}) must be >= 1")
    start_s, end_s = run_window_s(requests, iterations)
    duration_s = end_s - start_s
    completed = (requests["status"] == "completed").to_numpy()
    post_warmup = (requests["arrival_s"] >= warmup_s).to_numpy()
    row: dict[str, Any] = {"scenario": scenario, "policy": policy}
    row |= _counts(requests, iterations, completed, workers)
    row |= _rates(requests, completed, duration_s, num_gpus, gpu_hour_usd)
    row |= _latency_stats(requests.loc[completed & post_warmup, _LATENCY_SOURCES])
    row |= _gpu_stats(iterations, duration_s, workers)
    goodput_window_s = end_s - max(start_s, warmup_s)
    row |= _slo_stats(requests.loc[post_warmup, _SLO_COLUMNS], slo, goodput_window_s)
    row["frontend_p50_s"] = _frontend_p50(requests, post_warmup)
    row |= itl_stats(itl["gap_s"], itl["count"]) if itl is not None else itl_stats(np.empty(0), np.empty(0))
    row |= _utilization_stats(iterations, work, duration_s * workers)
    row |= spec_stats(requests)
    row["num_gpus"] = num_gpus
    row["goodput_per_gpu"] = row["goodput_rps"] / num_gpus  # DistServe's per-GPU goodput at this load
    row |= dict.fromkeys(DISAGGREGATION_COLUMNS, math.nan)  # filled by sim.disaggregation for its row
    row |= prefix_stats(requests, iterations)
    # Offered load / capacity needs a capacity replay (a simulation): sim.runner fills it in.
    row["load_frac"] = math.nan
    row |= energy_cost_stats(requests, iterations, completed, pools, duration_s, input_price_ratio)
    return {column: row[column] for column in SUMMARY_COLUMNS + EXTRA_COLUMNS}


def prefix_stats(requests: pd.DataFrame, iterations: pd.DataFrame) -> dict[str, float]:
    """Prefix-cache figures: hit rate H = sum cached / sum prompt tokens of the requests that were
    scheduled, the cached and the computed prefill tokens, and the busiest replica's busy time
    over the mean (1 = balanced). NaN where the records lack the columns."""
    nan = math.nan
    scheduled = requests["first_scheduled_s"].notna().to_numpy()
    prompt, cached = (
        float(requests[c].to_numpy()[scheduled].sum()) if c in requests else nan
        for c in ("prompt_tokens", "cached_prompt_tokens")
    )
    passes = model_passes(iterations)
    computed = float(passes["prefill_tokens"].sum()) if "prefill_tokens" in passes else nan
    busy = iterations.groupby("replica")["duration_s"].sum() if len(iterations) else pd.Series(dtype=float)
    imbalance = float(busy.max() / busy.mean()) if len(busy) and busy.mean() > 0 else nan
    return {
        "prefix_hit_rate": _ratio(cached, prompt) if prompt == prompt else nan,
        "cached_prompt_tokens": cached,
        "prefill_tokens_computed": computed,
        "replica_busy_imbalance": imbalance,
    }


def model_passes(iterations: pd.DataFrame) -> pd.DataFrame:
    """One row per forward pass of the model: ``iterations`` itself, or under pipeline parallelism (a
    ``stage`` column, one row per stage of each micro-batch) the first stage's rows."""
    if "stage" not in iterations.columns:
        return iterations
    return iterations[iterations["stage"].to_numpy() == 0]


def _frontend_p50(requests: pd.DataFrame, post_warmup: np.ndarray) -> float:
    """Median time in the API front end (NaN without a front end or an older requests table)."""
    if "frontend_s" not in requests:
        return float("nan")
    return percentile(_finite(requests["frontend_s"].to_numpy()[post_warmup]), 50)


def summarize(runs: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]], **same_kwargs: Any) -> pd.DataFrame:
    """One summary row per policy run, in the mapping's order.

    Args:
        runs: policy label -> (requests, iterations) of that policy's run.
        **same_kwargs: keyword arguments of :func:`summarize_run` shared by every run
            (``scenario`` is required; ``policy`` comes from the mapping's keys).

    Returns:
        A DataFrame with columns ``SUMMARY_COLUMNS + EXTRA_COLUMNS``.
    """
    rows = [
        summarize_run(requests, iterations, policy=policy, **same_kwargs)
        for policy, (requests, iterations) in runs.items()
    ]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS + EXTRA_COLUMNS))


def percentile(values: np.ndarray | pd.Series, q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of the non-NaN values; NaN if none."""
    finite = _finite(values)
    return float(np.percentile(finite, q)) if finite.size else math.nan


def run_window_s(requests: pd.DataFrame, iterations: pd.DataFrame) -> tuple[float, float]:
    """(start, end) of a run in seconds: first send to the last request event or
    iteration end, whichever is later. NaN when there is nothing to measure."""
    ends = [_nanmax(requests[c]) for c in _TIME_COLUMNS if c in requests.columns]
    ends.append(_nanmax(iterations["start_s"] + iterations["duration_s"]))
    start_s = _nanmin(requests["arrival_s"])
    if math.isnan(start_s):
        start_s = _nanmin(iterations["start_s"])
    return start_s, _nanmax(pd.Series(ends, dtype=float))


def _counts(requests: pd.DataFrame, iterations: pd.DataFrame, completed: np.ndarray, workers: int) -> dict[str, int]:
    status = requests["status"]
    return {
        "requests": len(requests),
        "completed": int(completed.sum()),
        "timed_out": int((status == "timed_out").sum()),
        "rejected": int((status == "rejected").sum()),
        "preemptions": int(requests["preemptions"].fillna(0).sum()),
        "retries": int(requests["retries"].fillna(0).sum()),
        "iterations": len(model_passes(iterations)),
        "replicas": workers,
    }


def _rates(
    requests: pd.DataFrame,
    completed: np.ndarray,
    duration_s: float,
    num_gpus: int,
    gpu_hour_usd: float | None,
) -> dict[str, float]:
    done = int(completed.sum())
    throughput_rps = _per_second(done, duration_s)
    gpu_hours = num_gpus * duration_s / _SECONDS_PER_HOUR
    per_usd = math.nan if gpu_hour_usd is None else _ratio(done, gpu_hours * gpu_hour_usd)
    return {
        "duration_s": duration_s,
        "throughput_rps": throughput_rps,
        "output_tps": _per_second(requests["output_tokens"][completed].sum(), duration_s),
        "rps_per_gpu": throughput_rps / num_gpus,
        "requests_per_usd": per_usd,
        "total_tps": _total_tps(requests, completed, duration_s),
    }


def _total_tps(requests: pd.DataFrame, completed: np.ndarray, duration_s: float) -> float:
    """Prompt + output tokens of completed requests per second (benchmark_serving's total
    token throughput); NaN for a requests table without prompt lengths."""
    if "prompt_tokens" not in requests.columns:
        return math.nan
    tokens = requests["prompt_tokens"][completed].sum() + requests["output_tokens"][completed].sum()
    return _per_second(tokens, duration_s)


def _latency_stats(measured: pd.DataFrame) -> dict[str, float]:
    stats = {}
    for column, (source, stat) in _LATENCY_STATS.items():
        values = measured[source]
        if stat == "mean":
            stats[column] = _nanmean(values)
        elif stat == "max":
            stats[column] = _nanmax(values)
        else:
            stats[column] = percentile(values, float(stat))
    return stats


def _gpu_stats(iterations: pd.DataFrame, duration_s: float, workers: int) -> dict[str, float]:
    busy_s = iterations["duration_s"].to_numpy(dtype=float)
    capacity_s = duration_s * workers
    stats = {"gpu_busy_frac": _clip_rounding(_ratio(busy_s.sum(), capacity_s))}
    weighted = kv_fraction(iterations)
    stats["kv_peak_frac"] = _nanmax(weighted)
    # In place, one pass-sized array at a time: np.nansum(kv_frac * busy_s) without its copies.
    # Between iterations a worker holds no running batch, so idle time counts as 0.
    np.multiply(weighted, busy_s, out=weighted)
    weighted[np.isnan(weighted)] = 0.0
    # A time-weighted mean cannot exceed the peak; clip the last-ulp excess summation can leave
    # (a constant KV fraction over a fully busy run: mean = peak x busy share = peak, up to rounding).
    stats["kv_mean_frac"] = min(_ratio(float(weighted.sum()), capacity_s), stats["kv_peak_frac"])
    del weighted
    stats["mean_batch_size"] = _nanmean(iterations["batch_size"])
    return stats


def _utilization_stats(iterations: pd.DataFrame, work: PassWork | None, capacity_s: float) -> dict[str, float]:
    """MFU and MBU over the run window (like ``gpu_busy_frac``) and over busy time only.

    sum F_i / (D x G x peak) <= sum d_i / (D x G) = gpu_busy_frac whenever every MFU_i <= 1;
    the ``_busy`` figures divide by sum d_i instead, so mean = busy x gpu_busy_frac.
    """
    if work is None:
        return dict.fromkeys(("mfu_mean", "mbu_mean", "mfu_busy", "mbu_busy"), math.nan)
    _require_columns(iterations, work.REQUIRED_COLUMNS, "iterations")
    busy_s = float(iterations["duration_s"].to_numpy(dtype=float).sum())
    flop_s = work.total_flops(iterations) / work.peak_flops_per_s  # seconds at peak FLOP/s
    byte_s = work.total_bytes(iterations) / work.peak_bytes_per_s  # seconds at peak bandwidth
    return {
        "mfu_mean": _ratio(flop_s, capacity_s),
        "mbu_mean": _ratio(byte_s, capacity_s),
        "mfu_busy": _ratio(flop_s, busy_s),
        "mbu_busy": _ratio(byte_s, busy_s),
    }


def kv_fraction(iterations: pd.DataFrame) -> np.ndarray:
    """KV blocks used / KV blocks total per iteration (NaN where the total is 0), a new array."""
    fraction = iterations["kv_blocks_used"].to_numpy(dtype=float, copy=True)
    total = iterations["kv_blocks_total"].to_numpy()
    total = total if np.issubdtype(total.dtype, np.number) else total.astype(float)
    valid = total > 0
    np.divide(fraction, total, out=fraction, where=valid)  # in place: one pass-sized array
    fraction[~valid] = np.nan
    return fraction


def _slo_stats(measured: pd.DataFrame, slo: SLOConfig | None, window_s: float) -> dict[str, float]:
    if slo is None or len(measured) == 0:
        return {"slo_attainment": math.nan, "goodput_rps": math.nan}
    met = slo_met(measured, slo)
    return {
        "slo_attainment": float(met.mean()),
        "goodput_rps": _per_second(int(met.sum()), window_s),
    }


def slo_met(requests: pd.DataFrame, slo: SLOConfig) -> np.ndarray:
    """Per request: completed and within every bound ``slo`` gives.

    A NaN TPOT (a one-token output has no inter-token gap) meets any TPOT bound.
    """
    met = (requests["status"] == "completed").to_numpy()
    bounds = {"ttft_s": slo.ttft_p99_s, "tpot_s": slo.tpot_p99_s, "e2e_s": slo.e2e_p99_s}
    for column, bound in bounds.items():
        if bound is not None:
            values = requests[column].to_numpy(dtype=float)
            nan_ok = column == "tpot_s"
            met = met & ((values <= bound) | (np.isnan(values) & nan_ok))
    return met


def _replica_count(iterations: pd.DataFrame) -> int:
    if "stage" in iterations.columns:  # a worker per replica and pipeline stage
        return max(1, len(iterations[["replica", "stage"]].drop_duplicates()))
    return max(1, int(iterations["replica"].nunique()))


def _require_columns(frame: pd.DataFrame, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} DataFrame lacks columns {missing}; it has {list(frame.columns)}")


def _finite(values: np.ndarray | pd.Series) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    missing = np.isnan(array)
    return array[~missing] if missing.any() else array  # no copy of a column without NaN


def _nanmean(values: np.ndarray | pd.Series) -> float:
    finite = _finite(values)
    return float(finite.mean()) if finite.size else math.nan


def _nanmax(values: np.ndarray | pd.Series) -> float:
    finite = _finite(values)
    return float(finite.max()) if finite.size else math.nan


def _nanmin(values: np.ndarray | pd.Series) -> float:
    finite = _finite(values)
    return float(finite.min()) if finite.size else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator) / denominator if denominator > 0 else math.nan


def _per_second(count: float, duration_s: float) -> float:
    return _ratio(count, duration_s)


def _clip_rounding(fraction: float) -> float:
    # Summed durations can exceed the elapsed span by float rounding only; a real excess
    # (overlapping iterations on one worker) is an engine bug and is left visible.
    return 1.0 if 1.0 < fraction <= 1.0 + 1e-9 else fraction
