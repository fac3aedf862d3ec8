"""A 90% interval on every headline figure of a run: seed or sampling spread, combined with model error.

For each figure of :data:`HEADLINE` (summary column -> the family of its model error):

1. **Statistical spread** of the simulation's own answer: over K >= 2 replicates
   (:mod:`sim.uncertainty.replicates`) the value becomes the replicates' mean and its spread
   mean +- t(K - 1) s / sqrt(K); with one replicate, the sampling error of the figure from the run's
   requests (:mod:`sim.uncertainty.sampling`: order statistics for a percentile, t for a mean, Poisson
   counts for a rate). A workload that no seed changes (a trace, fixed lengths at constant or burst
   arrivals, no random router or speculation) has none: its figures are exact for those requests.
2. **Model error**: the 90% half-width h of the log error of real runs in the most specific cell of the
   model-error table (:mod:`sim.uncertainty.model_error`: this policy's preset, the cost model's class, the
   run's load regime), widened for a cost-model class no real run has validated (:func:`unvalidated_error`).

Both are relative half-widths on each side (the model's: 1 - e^-h below, e^h - 1 above); they add in quadrature,
    lo = v (1 - sqrt(s_lo^2 + m_lo^2)),  hi = v (1 + sqrt(s_hi^2 + m_hi^2)),
so lo <= v <= hi always, and the width is zero exactly where both parts are (:func:`combine`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.uncertainty.model_error import ModelError, class_validated, cost_class, lookup
from sim.uncertainty.replicates import replicate_interval
from sim.uncertainty.sampling import mean_interval, percentile_interval, rate_interval

HEADLINE: dict[str, str] = {
    "ttft_p50_s": "ttft_p50", "ttft_p90_s": "ttft_p90", "ttft_p99_s": "ttft_p99",
    "tpot_p50_s": "tpot", "tpot_p99_s": "tpot",
    "e2e_mean_s": "e2e_mean", "e2e_p50_s": "e2e_p50", "e2e_p90_s": "e2e_p90", "e2e_p99_s": "e2e_p99",
    "throughput_rps": "throughput", "output_tps": "throughput", "goodput_rps": "throughput",
    "load_frac": "throughput",
}  # fmt: skip
"""Summary column with an interval -> the model-error family it takes (the real runs measured no TPOT p99: it
takes the TPOT median's; goodput and capacity (load_frac) take the throughput's)."""
INTERVAL_COLUMNS: tuple[str, ...] = tuple(f"{m}_{side}" for m in HEADLINE for side in ("lo", "hi"))
_PERCENTILES: dict[str, tuple[str, float]] = {
    "ttft_p50_s": ("ttft_s", 50), "ttft_p90_s": ("ttft_s", 90), "ttft_p99_s": ("ttft_s", 99),
    "tpot_p50_s": ("tpot_s", 50), "tpot_p99_s": ("tpot_s", 99),
    "e2e_p50_s": ("e2e_s", 50), "e2e_p90_s": ("e2e_s", 90), "e2e_p99_s": ("e2e_s", 99),
}  # fmt: skip


Bounds = dict[str, tuple[float, float]]
"""Summary column -> (lo, hi) of its statistical spread (absolute, around the row's value)."""


# --------------------------------------------------------------------------- statistical spread
def sampling_bounds(row: Mapping[str, Any], requests: pd.DataFrame, warmup_s: float, *, exact: bool) -> Bounds:
    """Sampling spread of one run's figures from its request records (one replicate).

    Args:
        row: the policy's summary row.
        requests: its request records (all of them).
        warmup_s: requests that arrived before are out of the latency figures, as in the summary.
        exact: no seed changes this run (:func:`seed_free`): every figure is exact, zero width.
    """
    if exact:
        return {m: (row[m], row[m]) for m in HEADLINE}
    measured = requests[(requests["status"] == "completed").to_numpy() & (requests["arrival_s"] >= warmup_s).to_numpy()]
    bounds: Bounds = {}
    for column, (source, q) in _PERCENTILES.items():
        value = row[column]
        bounds[column] = (value, value) if _nan(value) else percentile_interval(measured[source].to_numpy(), q, value)
    mean_lo, mean_hi = mean_interval(measured["e2e_s"].to_numpy())
    bounds["e2e_mean_s"] = (min(mean_lo, row["e2e_mean_s"]), max(mean_hi, row["e2e_mean_s"]))
    completed = int(row["completed"])
    bounds["throughput_rps"] = rate_interval(row["throughput_rps"], completed)
    bounds["output_tps"] = rate_interval(row["output_tps"], completed)
    sent = int((requests["arrival_s"] >= warmup_s).sum())
    met = 0 if _nan(row["slo_attainment"]) else round(row["slo_attainment"] * sent)
    bounds["goodput_rps"] = rate_interval(row["goodput_rps"], met)
    bounds["load_frac"] = rate_interval(row["load_frac"], len(requests))  # the offered rate of N arrivals
    return bounds


def replicate_bounds(rows: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float], Bounds]:
    """Over one policy's rows of K replicates: each figure's mean, and its spread mean +- t s / sqrt(K)."""
    means, bounds = {}, {}
    for column in HEADLINE:
        mean, lo, hi = replicate_interval([float(r[column]) for r in rows])
        means[column], bounds[column] = mean, (lo, hi)
    return means, bounds


def workload_seed_free(resolved: Any) -> bool:
    """Whether another seed draws the same requests for ``resolved`` (its stream rebuilt under seed + 1) and
    nothing the workload leaves to the engine is drawn (think times, prefix variants, session turns)."""
    from sim.workload.source import build_request_stream

    scenario, workload = resolved.scenario, resolved.scenario.workload
    if getattr(workload.arrival, "think_time_s", 0.0) > 0 or workload.shared_prefix or workload.sessions:
        return False
    other = build_request_stream(workload, scenario.seed + 1, scenario.base_dir)
    return _same_stream(resolved.stream, other)


def seed_free(resolved: Any, policy: Any, workload_fixed: bool) -> bool:
    """Whether no seed changes ``policy``'s run: a seed-free workload (``workload_fixed``,
    :func:`workload_seed_free`), no random router and no speculative acceptance draws."""
    if resolved.scenario.router == "random" or getattr(policy, "speculative", None) is not None:
        return False
    return workload_fixed


def _same_stream(a: Any, b: Any) -> bool:
    fields = ("arrival_s", "prompt_tokens", "output_tokens")
    return len(a) == len(b) and all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True) for f in fields)


# --------------------------------------------------------------------------- model error
def unvalidated_error(cost_model: Any) -> float:
    """Extra 90% log half-width for a cost model whose class no real run validated: twice its stated transfer
    MAPE (a normal error's 90% bound is ~2.06 x its mean absolute error), with the A100 roofline's cross-GPU
    MAPE added in quadrature on an uncalibrated GPU; 0 for a validated class."""
    klass = cost_class(cost_model.label)
    if class_validated(klass):
        return 0.0
    linear = float((cost_model.fit_error.get("linear") or {}).get("mape", 0.0))
    cross = _cross_gpu_mape() if klass == "roofline" else 0.0
    return 2.0 * math.hypot(linear, cross)


def _cross_gpu_mape() -> float:
    """The largest MAPE of the A100 roofline on the other profiled GPUs (their roofline files)."""
    from sim.hardware.calibration_files import CALIBRATION_DIR, read_yaml, roofline_file_name

    found = [float(read_yaml(p)["cross_gpu_from_a100"]["mape"]) for p in sorted(CALIBRATION_DIR.glob("*_roofline.yaml"))
             if p.name != roofline_file_name("a100-80gb")]  # fmt: skip
    return max(found, default=0.0)


@dataclass(frozen=True)
class ModelContext:
    """What a policy's model error depends on: its preset, its cost model's label and the extra for an
    unvalidated class."""

    preset: str | None
    cost_label: str
    extra: float = 0.0

    def error(self, load_frac: float, family: str) -> ModelError:
        """The model error of one figure family at ``load_frac``, the extra added in quadrature."""
        found = lookup(self.preset, cost_class(self.cost_label), load_frac, family)
        if not self.extra:
            return found
        return ModelError(math.hypot(found.half_width, self.extra), found.cell + " + unvalidated class", found.runs)


# --------------------------------------------------------------------------- combining
def combine(value: float, stat_lo: float, stat_hi: float, model_half_width: float) -> tuple[float, float]:
    """The interval of ``value`` from its statistical bounds and its model error's log half-width (see module)."""
    if _nan(value):
        return math.nan, math.nan
    if value <= 0:  # a zero figure has no relative model error
        return min(stat_lo, value), max(stat_hi, value)
    s_lo, s_hi = max(0.0, (value - stat_lo) / value), max(0.0, (stat_hi - value) / value)
    m_lo, m_hi = -math.expm1(-model_half_width), math.expm1(model_half_width)
    lo = value * (1.0 - math.hypot(s_lo, m_lo))
    hi = value * (1.0 + math.hypot(s_hi, m_hi))
    return max(lo, 0.0), hi


def interval_columns(row: Mapping[str, Any], bounds: Bounds, model: ModelContext) -> dict[str, float]:
    """The ``<metric>_lo``/``_hi`` columns of one summary row."""
    columns = {}
    for metric, family in HEADLINE.items():
        value = float(row[metric])
        lo, hi = bounds.get(metric, (value, value))
        error = model.error(float(row["load_frac"]), family)
        columns[f"{metric}_lo"], columns[f"{metric}_hi"] = combine(value, lo, hi, error.half_width)
    return columns


def basis_text(replicates: int, requests: int, exact: bool, model: ModelContext, load_frac: float) -> str:
    """How a row's intervals were made, for ``interval_basis``: the statistical part, then the model-error cell."""
    if exact:
        spread = "no seed spread (the same requests under every seed)"
    elif replicates > 1:
        spread = f"seed spread over {replicates} replicates"
    else:
        spread = f"sampling error of {requests} requests"
    cell = model.error(load_frac, "ttft_p50")
    return f"{spread}; model error: validation cell {cell.cell} ({cell.runs} runs)"


def _nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
