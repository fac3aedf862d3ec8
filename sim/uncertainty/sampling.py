"""Sampling error of one run's figures: how far a figure computed from N requests may sit from its long-run value.

Distribution-free where it can be (no scipy: a run without plots imports neither scipy nor matplotlib):

- a **percentile** q of N values: the order-statistic interval [x_(l), x_(u)], with ranks l < u chosen so
  that P(l <= B < u) >= the level for B ~ Binomial(N, q/100) (the number of values below the true
  quantile); exact binomial sums up to :data:`EXACT_MAX_N` values, the normal approximation above. Where N is
  too small for a side (a p99 of fewer than 299 values has no upper bound at 95%) that side is infinite;
- a **mean**: mean +- t(N - 1) x s / sqrt(N);
- a **rate** of N counted events (completions, requests within the SLO): rate x (1 +- z / sqrt(N)), the
  Poisson count error of an open-loop stream.

Every interval contains the figure itself (``lo <= value <= hi``) and has zero width when every value
is the same. :func:`t_quantile` is Student's t at the 95th percentile (two-sided 90%).
"""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.90
"""Two-sided level of every interval batchsim states."""
Z_90 = 1.6448536269514722
"""Standard normal 95th percentile (two-sided 90%)."""
EXACT_MAX_N = 20_000
"""Largest sample whose order-statistic ranks are found from exact binomial sums."""
_T_95 = (
    6.3138, 2.9200, 2.3534, 2.1318, 2.0150, 1.9432, 1.8946, 1.8595, 1.8331, 1.8125,
    1.7959, 1.7823, 1.7709, 1.7613, 1.7531, 1.7459, 1.7396, 1.7341, 1.7291, 1.7247,
    1.7207, 1.7171, 1.7139, 1.7109, 1.7081, 1.7056, 1.7033, 1.7011, 1.6991, 1.6973,
)  # fmt: skip
"""Student's t 95th percentile for 1-30 degrees of freedom (standard tables)."""


def t_quantile(dof: int) -> float:
    """Student's t 95th percentile with ``dof`` degrees of freedom (>= 1): the table up to 30, then the
    Cornish-Fisher expansion (error below 1e-4 from 31 on)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof <= len(_T_95):
        return _T_95[dof - 1]
    z = Z_90
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def order_statistic_ranks(n: int, q: float) -> tuple[int, int]:
    """1-based ranks (l, u) of the order statistics bounding the ``q``-quantile (q in [0, 1]) of ``n`` values at
    :data:`LEVEL`, each side at half the miss rate. A side too few values can bound is 0 (no lower bound) or
    n + 1 (no upper bound): the p99 of 60 values exceeds their maximum with probability 1 - 0.99^60 = 45%."""
    if n < 1:
        raise ValueError("no values")
    if n > EXACT_MAX_N or not 0.0 < q < 1.0:
        spread = Z_90 * math.sqrt(n * q * (1.0 - q))
        low, high = math.floor(n * q - spread), math.ceil(n * q + spread) + 1
    else:
        cdf = _binomial_cdf(n, q)  # cdf[k] = P(B <= k), k = 0..n
        tail = (1.0 - LEVEL) / 2.0
        low = int(np.searchsorted(cdf, tail, side="right"))  # P(B <= low - 1) <= tail: P(B < low) small
        high = int(np.searchsorted(cdf, 1.0 - tail, side="left")) + 1  # P(B <= high - 1) >= 1 - tail
    return min(max(low, 0), n), min(max(high, 1), n + 1)


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), from log-pmf ratios (no special functions needed)."""
    k = np.arange(n, dtype=np.float64)
    log_ratio = np.log(n - k) - np.log(k + 1) + math.log(p / (1.0 - p))  # log pmf(k+1) - log pmf(k)
    log_pmf = np.concatenate(([n * math.log1p(-p)], n * math.log1p(-p) + np.cumsum(log_ratio)))
    pmf = np.exp(log_pmf - log_pmf.max())
    return np.cumsum(pmf) / pmf.sum()


def percentile_interval(values: np.ndarray, q: float, value: float | None = None) -> tuple[float, float]:
    """The order-statistic interval of the ``q``-th percentile (q in [0, 100]) of ``values`` (NaN dropped).

    Args:
        values: the sample.
        q: the percentile.
        value: the figure itself (default: numpy's linear-interpolation percentile); the interval is widened
            to contain it.

    Returns:
        (lo, hi), -inf or +inf on a side the sample is too small to bound; (NaN, NaN) for an empty sample.
    """
    finite = np.sort(np.asarray(values, dtype=np.float64)[~np.isnan(np.asarray(values, dtype=np.float64))])
    if not finite.size:
        return math.nan, math.nan
    point = float(np.percentile(finite, q)) if value is None else value
    low, high = order_statistic_ranks(finite.size, q / 100.0)
    lo = float(finite[low - 1]) if low >= 1 else -math.inf
    hi = float(finite[high - 1]) if high <= finite.size else math.inf
    return min(lo, point), max(hi, point)


def mean_interval(values: np.ndarray) -> tuple[float, float]:
    """mean +- t(N - 1) s / sqrt(N) of ``values`` (NaN dropped); the mean itself for one value, NaN for none."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[~np.isnan(finite)]
    if not finite.size:
        return math.nan, math.nan
    if np.all(finite == finite[0]):  # one value, or all alike: no spread
        return float(finite[0]), float(finite[0])
    mean = float(finite.mean())
    half = t_quantile(finite.size - 1) * float(finite.std(ddof=1)) / math.sqrt(finite.size)
    return mean - half, mean + half


def rate_interval(rate: float, events: int) -> tuple[float, float]:
    """``rate`` x (1 +- z / sqrt(events)): the Poisson count error of a rate measured from ``events`` events
    (the rate itself, zero width, for no events or a NaN rate)."""
    if not math.isfinite(rate) or events <= 0:
        return rate, rate
    half = Z_90 / math.sqrt(events)
    return max(0.0, rate * (1.0 - half)), rate * (1.0 + half)
