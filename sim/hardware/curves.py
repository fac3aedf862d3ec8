"""Monotone piecewise-linear curves: the one representation every fitted cost uses.

A curve is a list of knots (x ascending, y non-decreasing). Between knots it
interpolates linearly; past the last knot it continues with the secant slope over the
upper half of the knots (one noisy last segment would otherwise set the slope); before
the first it follows the first segment down, floored at zero. Evaluation is a
``bisect`` on plain Python lists, which costs well under a microsecond on scalars
(``np.interp`` costs several); :meth:`PiecewiseLinear.table` tabulates a curve at the
integers 0..n-1, bit for bit, for the engine's hot path (a list index, no bisect).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Values = Sequence[float] | npt.NDArray[np.float64]


class PiecewiseLinear:
    """y(x) through monotone knots, with linear extrapolation on both sides.

    Args:
        xs: strictly increasing knot positions (at least two).
        ys: knot values, non-decreasing.

    Raises:
        ValueError: fewer than two knots, unsorted x, or decreasing y.
    """

    __slots__ = ("xs", "ys", "_slopes", "_tail_slope", "_x_last", "_y_last")

    def __init__(self, xs: Values, ys: Values) -> None:
        xs, ys = [float(x) for x in xs], [float(y) for y in ys]
        if len(xs) < 2 or len(xs) != len(ys):
            raise ValueError("a curve needs at least two knots and as many values as positions")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)) or any(
            b < a for a, b in zip(ys, ys[1:], strict=False)
        ):
            raise ValueError("knots must have increasing x and non-decreasing y")
        self.xs, self.ys = xs, ys
        self._slopes = [
            (y1 - y0) / (x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False)
        ]
        mid = len(xs) // 2
        self._tail_slope = (
            (ys[-1] - ys[mid]) / (xs[-1] - xs[mid]) if mid < len(xs) - 1 else self._slopes[-1]
        )
        self._x_last, self._y_last = xs[-1], ys[-1]

    def __call__(self, x: float) -> float:
        """The curve's value at ``x``."""
        if x >= self._x_last:
            return self._y_last + self._tail_slope * (x - self._x_last)
        i = bisect_right(self.xs, x) - 1
        if i < 0:
            return max(0.0, self.ys[0] + self._slopes[0] * (x - self.xs[0]))
        return self.ys[i] + self._slopes[i] * (x - self.xs[i])

    def table(self, size: int) -> list[float]:
        """The curve's values at x = 0, 1, ..., ``size`` - 1, each bitwise equal to ``self(x)``.

        Computed with the same IEEE operations as :meth:`__call__` (numpy float64,
        elementwise, no fused multiply-add), so ``table[x] == self(x)`` exactly; the
        curve is linear between its knots, so nothing is approximated.
        """
        return self.at(np.arange(size, dtype=np.float64)).tolist()

    def at(self, positions: Values) -> np.ndarray:
        """The curve at every position of an array, each value bitwise equal to ``self(x)``
        (the same IEEE operations, elementwise, as :meth:`__call__`)."""
        x = np.asarray(positions, dtype=np.float64)
        xs, ys = np.asarray(self.xs), np.asarray(self.ys)
        i = np.searchsorted(xs, x, side="right") - 1  # bisect_right - 1
        inner = np.clip(i, 0, len(self._slopes) - 1)
        slopes = np.asarray(self._slopes)
        out = ys[inner] + slopes[inner] * (x - xs[inner])
        below = ys[0] + slopes[0] * (x - xs[0])
        out = np.where(i < 0, np.where(below > 0.0, below, 0.0), out)  # max(0.0, v), -0.0 -> 0.0
        tail = self._y_last + self._tail_slope * (x - self._x_last)
        return np.where(x >= self._x_last, tail, out)

    def scaled(self, x_scale: float = 1.0, y_scale: float = 1.0) -> PiecewiseLinear:
        """The same curve with positions times ``x_scale`` and values times ``y_scale``."""
        return PiecewiseLinear([x * x_scale for x in self.xs], [y * y_scale for y in self.ys])


def running_max(values: Values) -> np.ndarray:
    """Upper monotone envelope: each value raised to the largest value before it.

    Keeps every point that is not below an earlier one exactly; dips (a faster GEMM
    kernel picked at a larger size, or timing noise) are raised to the level before them.
    """
    return np.maximum.accumulate(np.asarray(values, dtype=float))


def isotonic(values: Values) -> np.ndarray:
    """Least-squares non-decreasing fit (pool-adjacent-violators), for noisy curves."""
    from scipy.optimize import isotonic_regression  # offline fitting only (scipy >= 1.12)

    return np.asarray(isotonic_regression(np.asarray(values, dtype=float)).x)


def log_spaced_indices(xs: Values, count: int) -> list[int]:
    """Indices of about ``count`` points of sorted ``xs`` spread evenly in log(x),
    always including the first and the last."""
    logs = np.log(np.asarray(xs, dtype=float))
    targets = np.linspace(logs[0], logs[-1], count)
    picked = {int(np.abs(logs - t).argmin()) for t in targets}
    return sorted(picked | {0, len(logs) - 1})


def relative_errors(
    predicted: np.ndarray, measured: np.ndarray, min_ms: float = 0.05
) -> np.ndarray:
    """|predicted - measured| / measured on the rows where measured > ``min_ms``."""
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    keep = measured > min_ms
    return np.abs(predicted[keep] - measured[keep]) / measured[keep]


def error_summary(
    predicted: np.ndarray, measured: np.ndarray, min_ms: float = 0.05
) -> dict[str, float]:
    """MAPE, worst relative error and row count over rows above ``min_ms`` (fractions)."""
    errors = relative_errors(predicted, measured, min_ms)
    if errors.size == 0:
        return {"mape": float("nan"), "worst": float("nan"), "rows": 0}
    return {
        "mape": round(float(errors.mean()), 4),
        "worst": round(float(errors.max()), 4),
        "rows": int(errors.size),
    }
