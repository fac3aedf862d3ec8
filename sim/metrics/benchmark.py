"""A run's figures under vLLM ``benchmark_serving``'s result keys, for its users' tooling.

``benchmark_serving --save-result`` writes one JSON object per run: counts and totals
(``completed``, ``total_input_tokens``, ``total_output_tokens``, ``duration``), rates
(``request_throughput``, ``request_goodput``, ``output_throughput``,
``total_token_throughput``) and, per latency metric m in ``ttft``, ``tpot``, ``itl``,
``e2el``, ``mean_m_ms``, ``median_m_ms``, ``std_m_ms`` and ``p<q>_m_ms`` for each
configured percentile q (``metrics.percentiles``; vLLM's ``--metric-percentiles``).
:func:`benchmark_record` builds that object for one policy, with the same meanings:

* counts, rates and durations are the summary's (``completed``, ``throughput_rps``,
  ``goodput_rps``, ``output_tps``, ``total_tps``, ``duration_s``);
* TTFT, TPOT and E2E are over the requests the summary's percentiles use (completed,
  arrived after ``metrics.warmup_s``), with the same percentile convention, so
  ``median_ttft_ms`` is ``ttft_p50_s`` in ms exactly; ``std`` is numpy's population std,
  as benchmark_serving computes it;
* ITL is over every gap between stream events (the summary's ``itl_*``: one entry per
  token event, several tokens per event under multi-step scheduling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.itl import weighted_percentile, weighted_sum
from sim.metrics.summary import percentile

LATENCY_METRICS: dict[str, str] = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}
"""benchmark_serving metric name -> request column (seconds)."""

_RATES = {
    "request_throughput": "throughput_rps",
    "request_goodput": "goodput_rps",
    "output_throughput": "output_tps",
    "total_token_throughput": "total_tps",
}


def benchmark_record(
    summary_row: dict[str, Any],
    requests: pd.DataFrame,
    itl: pd.DataFrame,
    *,
    percentiles: Sequence[float],
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """One policy's benchmark_serving-style result (JSON-ready: NaN becomes None).

    Args:
        summary_row: the policy's ``summary.csv`` row.
        requests: all its requests (the summary's input).
        itl: its weighted inter-token gaps (``gap_s``, ``count``).
        percentiles: the ``p<q>`` keys to write, each in (0, 100].
        warmup_s: as for the summary.
    """
    done = requests["status"] == "completed"
    measured = requests.loc[done & (requests["arrival_s"] >= warmup_s)]
    record: dict[str, Any] = {
        "completed": int(summary_row["completed"]),
        "num_prompts": int(summary_row["requests"]),
        "duration": summary_row["duration_s"],
        "total_input_tokens": int(requests.loc[done, "prompt_tokens"].sum()),
        "total_output_tokens": int(requests.loc[done, "output_tokens"].sum()),
    }
    record |= {key: summary_row[column] for key, column in _RATES.items()}
    for name, column in LATENCY_METRICS.items():
        values = measured[column].to_numpy(dtype=float)
        record |= _stats(name, values[np.isfinite(values)], percentiles)
    record |= _itl_stats(itl, percentiles)
    return {key: _json_value(value) for key, value in record.items()}


def _stats(name: str, values: np.ndarray, percentiles: Sequence[float]) -> dict[str, float]:
    if not values.size:
        return dict.fromkeys(_keys(name, percentiles), math.nan)
    stats = [float(values.mean()), percentile(values, 50), float(values.std())]
    stats += [percentile(values, q) for q in percentiles]
    return {key: 1000.0 * value for key, value in zip(_keys(name, percentiles), stats, strict=True)}


def _itl_stats(itl: pd.DataFrame, percentiles: Sequence[float]) -> dict[str, float]:
    gaps, counts = itl["gap_s"].to_numpy(dtype=float), itl["count"].to_numpy(dtype=np.int64)
    keep = counts > 0
    gaps, counts = gaps[keep], counts[keep]
    if not gaps.size:
        return dict.fromkeys(_keys("itl", percentiles), math.nan)
    order = np.argsort(gaps, kind="stable")
    gaps, counts = gaps[order], counts[order]
    ends = np.cumsum(counts)
    mean = weighted_sum(gaps, counts) / float(ends[-1])
    std = math.sqrt(weighted_sum((gaps - mean) ** 2, counts) / float(ends[-1]))
    stats = [mean, weighted_percentile(gaps, ends, 50), std]
    stats += [weighted_percentile(gaps, ends, q) for q in percentiles]
    return {key: 1000.0 * value for key, value in zip(_keys("itl", percentiles), stats, strict=True)}


def _keys(name: str, percentiles: Sequence[float]) -> list[str]:
    return [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms"] + [
        f"p{_label(q)}_{name}_ms" for q in percentiles
    ]


def _label(q: float) -> str:
    """``99`` for 99.0, ``99.9`` for 99.9 (benchmark_serving's key style)."""
    return str(int(q)) if float(q).is_integer() else str(q)


def _json_value(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value
