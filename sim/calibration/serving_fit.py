"""Fit the serving-stack terms and a per-GPU step-cost scale on real runs: the one implementation behind
``python -m sim calibrate-serving`` and ``scripts/fit_serving.py``.

A fit varies a few named :class:`Term` s, each writing one or more values of a serving calibration
(:class:`sim.io.serving_calibration.ServingCalibration`): the API front end's time per request and its
latency, the engine's CPU time per pass and per request, per engine generation, and a factor on each GPU's
step cost. Every evaluation writes the calibration to a file and replays every case of the real data through
it exactly as a scenario naming that file runs (:func:`replay_requests`), so what is fitted is what a user's
scenario gets. The objective is the sum of squared log errors ln(simulated / measured) over every case's
figures in :data:`FITTED_METRICS`; cases at or above 0.9 of capacity are left out (:func:`unsaturated`: a
saturated run judges the capacity, not the serving stack). :func:`fit` minimises it (trust-region least
squares on finite differences, or Nelder-Mead); :func:`leave_one_out` refits without each case in turn and
predicts it, the error a user can expect on a run the fit did not see.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.io.serving_calibration import ServingCalibration, write_calibration
from sim.validation.cases import SATURATED, Case

FITTED_METRICS = frozenset({
    "ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tps",  # bursts and benchmark files
    "ttft_mean_ms", "e2e_mean_ms", "tpot_derived_ms", "req_per_s",  # stages and traces
})  # fmt: skip
"""The figures a fit matches: central latencies and throughput (tails follow from them, not the reverse)."""
DIFFERENCE_FRACTION = 4.0
"""Least squares differentiates each term over its ``step`` / this."""
MISSING_PENALTY = 5.0
"""Log error given to a figure the replay could not produce (no request completed), so the search avoids it."""
Path_ = tuple[str, ...]


@dataclass(frozen=True)
class Term:
    """One free parameter of a fit.

    Attributes:
        name: how tables call it.
        targets: the calibration values it sets, each ``("serving", generation, block, field)`` or
            ``("step_scale", gpu)``; a term shared by several (the API loop of V0 and V1) sets them all.
        start: where the search starts.
        step: its scale: the first step of Nelder-Mead, four times the finite difference of least squares.
        upper: its largest value (the lowest is 0, a scale's a tenth).
    """

    name: str
    targets: tuple[Path_, ...]
    start: float
    step: float
    upper: float

    @property
    def lower(self) -> float:
        """Its smallest value: 0, or 0.1 for a scale (a GPU ten times faster than its cost model is a typo)."""
        return 0.1 if self.targets[0][0] == "step_scale" else 0.0


def calibration_with(terms: Sequence[Term], values: Sequence[float], base: ServingCalibration | None = None,
                     fitted_on: dict | None = None) -> ServingCalibration:  # fmt: skip
    """``base`` (default: empty) with every term's targets set to its value."""
    base = base or ServingCalibration()
    serving = {g: {b: dict(t) for b, t in blocks.items()} for g, blocks in base.serving.items()}
    scales = dict(base.step_scale)
    for term, value in zip(terms, values, strict=True):
        for target in term.targets:
            if target[0] == "step_scale":
                scales[target[1]] = round(float(value), 4)
            else:
                _, generation, block, name = target
                serving.setdefault(generation, {}).setdefault(block, {})[name] = round(float(value), 4)
    return ServingCalibration(serving, scales, fitted_on if fitted_on is not None else dict(base.fitted_on))


# --------------------------------------------------------------------------- replaying
def replay_requests(case: Case, calibration_file: Path | None, folder: Path) -> pd.DataFrame:
    """The request records of ``case`` replayed under the calibration file (None: the presets alone), as a
    scenario naming that file runs; ``folder`` holds the case's workload files."""
    from sim.config import Scenario
    from sim.policy_run import simulate_policy
    from sim.resolve import resolve

    raw = case.scenario_dict(folder)
    if calibration_file is not None:
        raw["calibration"] = str(calibration_file)
    scenario = Scenario(**raw)
    return simulate_policy(resolve(scenario), scenario.policies[0]).requests


def residual_table(cases: Sequence[Case], calibration: ServingCalibration | None) -> pd.DataFrame:
    """Every fitted figure of every case under ``calibration``: case, metric, measured, simulated, log error."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="batchsim-fit-") as tmp:
        folder = Path(tmp)
        path = None
        if calibration is not None:
            path = folder / "calibration.yaml"
            write_calibration(calibration, path)
        for case in cases:
            for residual in case.compare(replay_requests(case, path, folder)):
                if residual.metric in FITTED_METRICS and residual.measured > 0:
                    rows.append({"case": case.name, "metric": residual.metric, "measured": residual.measured,
                                 "simulated": residual.simulated, "log_error": _log_error(residual)})  # fmt: skip
    return pd.DataFrame(rows, columns=["case", "metric", "measured", "simulated", "log_error"])


def _log_error(residual: object) -> float:
    simulated, measured = residual.simulated, residual.measured  # type: ignore[attr-defined]
    if not (simulated > 0 and math.isfinite(simulated)):
        return MISSING_PENALTY
    return math.log(simulated / measured)


def unsaturated(cases: Sequence[Case], log: Callable[[str], None] | None = None) -> tuple[list[Case], pd.DataFrame]:
    """The cases below :data:`SATURATED` of capacity under the presets alone, and the validation table of all
    of them (presets alone: :func:`sim.validation.report.validate_cases`, with each case's ``load_frac``)."""
    from sim.validation.report import validate_cases

    table = validate_cases(list(cases), log=log)
    load = table.groupby("run", sort=False)["load_frac"].first()
    return [c for c in cases if not load[c.name] >= SATURATED], table


# --------------------------------------------------------------------------- fitting
@dataclass
class FitResult:
    """A fit: the terms' values, the calibration they make, and how many replays of the cases it took."""

    terms: list[Term]
    values: list[float]
    calibration: ServingCalibration
    evaluations: int
    residuals: pd.DataFrame = field(default_factory=pd.DataFrame)

    def named(self) -> dict[str, float]:
        """Term name -> fitted value."""
        return {t.name: v for t, v in zip(self.terms, self.values, strict=True)}


def fit(terms: Sequence[Term], cases: Sequence[Case], *, method: str = "least_squares",
        start: Sequence[float] | None = None, max_evaluations: int = 60,
        base: ServingCalibration | None = None) -> FitResult:  # fmt: skip
    """The values of ``terms`` that minimise the squared log errors of ``cases`` (see module).

    Args:
        terms: the free parameters.
        cases: the real runs (unsaturated: :func:`unsaturated`).
        method: ``least_squares`` (scipy's trust-region reflective, bounded, finite differences over a quarter
            of each term's step) or ``nelder-mead`` (bounded by rejecting values outside).
        start: where to start (default: each term's ``start``).
        max_evaluations: most evaluations of the objective (least squares: not counting its finite differences).
        base: the calibration the terms are set on (its other values kept).
    """
    from scipy.optimize import least_squares, minimize

    terms = list(terms)
    x0 = np.array(start if start is not None else [t.start for t in terms], dtype=float)
    lower, upper = np.array([t.lower for t in terms]), np.array([t.upper for t in terms])
    x0 = np.clip(x0, lower, upper)
    count = [0]

    def vector(x: np.ndarray) -> np.ndarray:
        count[0] += 1
        return residual_table(cases, calibration_with(terms, x.tolist(), base))["log_error"].to_numpy()

    if method == "least_squares":
        steps = np.array([t.step for t in terms])
        # Differences over a quarter of each term's scale: a discrete-event replay is piecewise smooth (a request
        # joining another batch is a jump), so a finer difference measures the jumps, not the slope.
        relative = steps / DIFFERENCE_FRACTION / np.maximum(np.abs(x0), 1.0)  # scipy's step: rel x max(1, |x|)
        found = least_squares(vector, x0, bounds=(lower, upper), method="trf", diff_step=relative, x_scale=steps,
                              max_nfev=max_evaluations, xtol=1e-3, ftol=1e-4)  # fmt: skip
        values = found.x
    elif method == "nelder-mead":
        simplex = np.vstack([x0] + [x0 + np.eye(len(terms))[i] * t.step for i, t in enumerate(terms)])

        def loss(x: np.ndarray) -> float:
            return math.inf if np.any(x < lower) or np.any(x > upper) else float((vector(x) ** 2).sum())

        options = {"initial_simplex": simplex, "xatol": 0.05, "fatol": 1e-3, "maxfev": max_evaluations}
        values = minimize(loss, x0, method="Nelder-Mead", options=options).x
    else:
        raise ValueError(f"unknown method {method!r}")
    values = [round(float(v), 4) for v in values]
    calibration = calibration_with(terms, values, base)
    return FitResult(terms, values, calibration, count[0], residual_table(cases, calibration))


def leave_one_out(terms: Sequence[Term], cases: Sequence[Case], joint: FitResult, *, max_evaluations: int = 30,
                  log: Callable[[str], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Refit without each case (from the joint fit's values) and predict it: one row per case and figure with the
    measured value, the prediction and its % error, and the refit's values."""
    rows = []
    for held in cases:
        rest = [c for c in cases if c is not held]
        refit = fit(terms, rest, start=joint.values, max_evaluations=max_evaluations) if rest else joint
        predicted = residual_table([held], refit.calibration)
        for _, row in predicted.iterrows():
            error = 100.0 * (row["simulated"] - row["measured"]) / row["measured"]
            rows.append({"case": held.name, "metric": row["metric"], "measured": row["measured"],
                         "predicted": row["simulated"], "error_pct": error, "refit": refit.named()})  # fmt: skip
        if log:
            log(f"left out {held.name}: refit in {refit.evaluations} replays")
    return pd.DataFrame(rows, columns=["case", "metric", "measured", "predicted", "error_pct", "refit"])


def median_abs_errors(table: pd.DataFrame, column: str = "error_pct") -> dict[str, float]:
    """Median |error| (%) per metric of a table with ``metric`` and ``column``."""
    return {str(m): float(g[column].abs().median()) for m, g in table.groupby("metric", sort=True)}
