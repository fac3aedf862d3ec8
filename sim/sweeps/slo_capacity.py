"""SLO capacity search: the highest arrival rate each policy sustains within a latency SLO.

For each policy, a search over ``workload.arrival.rate`` (everything else fixed, the
same request lengths at every rate) brackets the capacity by doubling or halving from
the scenario's rate, then bisects (geometric midpoints) until the highest rate that
meets the SLO and the lowest that fails are within ``tolerance`` of each other. A rate
10% above the answer is then run as well; if it meets the SLO after all (latency is
not always monotone in load), the search continues above it. So the reported rate
meets the SLO and 1.1x that rate does not, by construction.

"Meets" has two definitions:

* bounds (default): each given bound holds on its p99 column of the summary
  (``ttft_p99_s``, ``tpot_p99_s``, ``e2e_p99_s``) and every request completed
  (a rate at which clients time out or are rejected is over capacity);
* attainment A: at least a fraction A of requests completed within every bound
  (the summary's ``slo_attainment``; goodput is DistServe's: such requests per second).

With several seeds a rate meets the SLO only if it does for every seed; reported
metrics are means over seeds at the reported rate.

With a grid of deployment parameters (``params``, the ``--param PATH=V1,V2`` of a sweep, e.g.
``pipeline_parallel`` x ``tensor_parallel``) every grid point's policies are searched side by side,
one row each, so "TP 4 or PP 2 x TP 2?" is one search; a point whose model does not fit its GPUs
is reported as such, without runs (:mod:`sim.sweeps.capacity_grid`).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from sim.config import ConstantArrival, GammaArrival, PoissonArrival, Scenario
from sim.errors import UserError, did_you_mean
from sim.io.scenario import load_scenario
from sim.sweeps.backends import open_capped_backend
from sim.sweeps.capacity_grid import Lane, capacity_points, describe_lane
from sim.sweeps.capacity_search import SearchOutcome, search_rate
from sim.sweeps.grid import normalize_seeds
from sim.sweeps.runner import progress_bar, report_startup
from sim.sweeps.tasks import (
    PointFn,
    Task,
    TaskResult,
    build_scenario,
    execute,
    scenario_dict,
    summary_point,
)

RATE_ARRIVALS = (PoissonArrival, GammaArrival, ConstantArrival)
RATE_KINDS = ("poisson", "gamma", "constant")
"""Arrival kinds with a single ``rate`` the search can scale."""

SLO_COLUMNS = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
"""SLO bounds a capacity search accepts; each is checked on the summary column of that name."""

REPORTED_METRICS = (
    "goodput_rps",
    "rps_per_gpu",
    "requests_per_usd",
    "throughput_rps",
    "slo_attainment",
    "ttft_p99_s",
    "tpot_p99_s",
    "e2e_p99_s",
    "gpu_busy_frac",
    "completed",
    "requests",
)
"""Summary columns reported at each policy's capacity (means over seeds)."""

RATE_PATH = "workload.arrival.rate"

SUSTAINED_FRACTION = 0.8
"""Below this throughput / offered rate, the report notes the run was too short to show overload."""

IDLE_BUSY_FRACTION = 0.1
"""Below this GPU busy fraction at the reported rate, the report notes that the SLO holds only on an
almost idle server (and why), instead of leaving a tiny rate such as 0.0042 req/s unexplained."""


def capacity(
    scenario: Scenario | str | Path,
    slo: Mapping[str, float],
    *,
    attainment: float | None = None,
    rate_low: float | None = None,
    rate_high: float | None = None,
    tolerance: float = 0.02,
    seeds: Sequence[int] | int = (0,),
    workers: int | None = 1,
    backend: str = "local",
    address: str | None = None,
    progress: bool = False,
    params: Mapping[str, Sequence[Any]] | None = None,
) -> pd.DataFrame:
    """The highest arrival rate at which each policy meets the SLO (at each point of ``params``).

    Args:
        scenario: a Scenario or scenario YAML path with a rate-based arrival
            (poisson, gamma, constant).
        slo: bounds in seconds, keys among ``ttft_p99_s``, ``tpot_p99_s``, ``e2e_p99_s``.
            They replace the scenario's ``slo`` block for the search.
        attainment: if given, "meets" means this fraction of requests (0-1] met every bound;
            otherwise each bound must hold on the p99 and every request must complete.
        rate_low: a rate expected to meet the SLO (default: bracket from the scenario's rate).
        rate_high: a rate expected to fail it.
        tolerance: stop when the failing rate is within this relative distance of the meeting one.
        seeds: seeds per rate (an int N: 0..N-1); a rate meets only if it does for every seed.
        workers, backend, address: where the runs execute, as for :func:`sim.sweeps.sweep`.
        progress: a progress bar over runs on stderr.
        params: a grid of scenario paths to values (as a sweep's), searched point by point; None: the
            scenario as it is.

    Returns:
        One row per policy (per grid point: the parameters' columns first): ``policy``, ``rate_rps``
        (NaN if no rate tried met the SLO),
        ``fails_at_rps``, ``checked_rps`` (1.1 x rate, run and failing), ``tolerance``,
        ``criterion``, ``seeds``, the ``REPORTED_METRICS`` at ``rate_rps``, ``runs`` and ``note``.

    Raises:
        UserError: bad SLO keys/values, attainment, tolerance or rates; an arrival kind
            without a rate; a run that fails.
    """
    return find_capacity(
        scenario,
        slo,
        attainment=attainment,
        rate_low=rate_low,
        rate_high=rate_high,
        tolerance=tolerance,
        seeds=seeds,
        workers=workers,
        backend=backend,
        address=address,
        progress=progress,
        params=params,
    )


def find_capacity(
    scenario: Scenario | str | Path,
    slo: Mapping[str, float],
    *,
    point_fn: PointFn = summary_point,
    attainment: float | None = None,
    rate_low: float | None = None,
    rate_high: float | None = None,
    tolerance: float = 0.02,
    seeds: Sequence[int] | int = (0,),
    workers: int | None = 1,
    backend: str = "local",
    address: str | None = None,
    progress: bool = False,
    only: Sequence[str] | None = None,
    params: Mapping[str, Sequence[Any]] | None = None,
) -> pd.DataFrame:
    """:func:`capacity` with an injectable point function, for tests; ``only`` limits the rows searched."""
    spec = CapacitySpec.build(scenario, slo, attainment, tolerance, rate_low, rate_high, seeds, params)
    if only is not None:
        spec = replace(spec, only=tuple(only))
    runs = _Runs(spec, point_fn)
    # A round runs one rate per lane and seed at once: more workers than that would only wait.
    engine, count = open_capped_backend(backend, workers, address, tasks=max(1, len(spec.lanes)) * len(spec.seeds))
    with engine, progress_bar(progress, "capacity", "run") as bar:
        report_startup(engine, bar, progress, count)
        outcomes = _drive(spec, runs, engine, bar)
    return spec.report(outcomes, runs)


@dataclass(frozen=True)
class CapacitySpec:
    """A validated capacity question: base scenario (with the SLO set), criterion, search bounds."""

    base: Scenario
    slo: dict[str, float]
    attainment: float | None
    tolerance: float
    rate_low: float | None
    rate_high: float | None
    seeds: list[int]
    only: tuple[str, ...] | None = None
    points: tuple[dict[str, Any], ...] = ({},)
    """Grid points (overrides), in grid order; one empty point without a grid."""
    unservable: tuple[tuple[int, str], ...] = ()
    """(point, why) of the grid points whose deployment cannot serve the requests: no runs there."""

    @classmethod
    def build(
        cls,
        scenario: Scenario | str | Path,
        slo: Mapping[str, float],
        attainment: float | None,
        tolerance: float,
        rate_low: float | None,
        rate_high: float | None,
        seeds: Sequence[int] | int,
        params: Mapping[str, Sequence[Any]] | None = None,
    ) -> CapacitySpec:
        """Check every input; the base scenario gets ``slo`` as its SLO block."""
        base = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        _check_arrival(base)
        bounds = _check_slo(slo)
        _check_search(attainment, tolerance, rate_low, rate_high)
        raw = dict(scenario_dict(base), slo=bounds)
        with_slo = build_scenario(raw, {}, base.base_dir)
        points, unservable = capacity_points(with_slo, params, RATE_PATH)
        return cls(
            with_slo, bounds, attainment, tolerance, rate_low, rate_high, normalize_seeds(seeds),
            points=tuple(points), unservable=tuple(sorted(unservable.items())),
        )  # fmt: skip

    @property
    def params(self) -> list[str]:
        """The grid's scenario paths (none without a grid)."""
        return list(self.points[0])

    @property
    def lanes(self) -> list[Lane]:
        """Every search: (grid point, policy) for each point that can serve the requests."""
        skipped = dict(self.unservable)
        return [(point, name) for point in range(len(self.points)) if point not in skipped for name in self.policies]

    @property
    def start_rps(self) -> float:
        """The scenario's own arrival rate, where bracketing starts."""
        arrival = self.base.workload.arrival
        assert isinstance(arrival, RATE_ARRIVALS)  # checked in build()
        return float(arrival.rate)

    @property
    def policies(self) -> list[str]:
        """Every policy of the scenario, in order, then its disaggregated deployment (or ``only``)."""
        if self.only is not None:
            return list(self.only)
        names = [p.name for p in self.base.policies]
        block = self.base.disaggregation
        return names + [block.name] if block is not None else names

    def criterion(self) -> str:
        """The SLO test in words, for tables."""
        bounds = " and ".join(f"{c.removesuffix('_p99_s')} <= {v:g} s" for c, v in self.slo.items())
        if self.attainment is None:
            return f"p99 {bounds}, all requests completed"
        return f">= {self.attainment:.0%} of requests with {bounds}"

    def meets(self, rows: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the summary rows (one per seed) all meet the SLO."""
        return all(self._meets_one(row) for row in rows)

    def _meets_one(self, row: Mapping[str, Any]) -> bool:
        if self.attainment is not None:
            return bool(row["slo_attainment"] >= self.attainment)  # NaN compares False
        if row["completed"] < row["requests"]:
            return False
        return all(row[column] <= bound for column, bound in self.slo.items())

    def task(self, lane: Lane, rate_rps: float, seed: int) -> Task:
        """One run of a lane's policy at its grid point, at ``rate_rps`` with ``seed``."""
        point, policy = lane
        overrides = {**self.points[point], RATE_PATH: rate_rps, "seed": seed}
        return Task(
            (lane, rate_rps, seed),
            scenario_dict(self.base),
            overrides,
            self.base.base_dir,
            (policy,),
        )

    def report(self, outcomes: Mapping[Lane, SearchOutcome], runs: _Runs) -> pd.DataFrame:
        """One row per grid point and policy, in grid then scenario order."""
        skipped = dict(self.unservable)
        rows = []
        for point, overrides in enumerate(self.points):
            if point in skipped:
                rows += [{**overrides, **self._unservable_row(name, skipped[point])} for name in self.policies]
                continue
            found: dict[str, float] = {}
            for name in self.policies:
                rate = outcomes[(point, name)].rate_rps
                if rate is not None:
                    found[name] = rate
            best = max(found.items(), key=lambda item: item[1], default=None)
            rows += [{**overrides, **self._row((point, name), outcomes[(point, name)], runs, best)}
                     for name in self.policies]  # fmt: skip
        return pd.DataFrame(rows)

    def _unservable_row(self, policy: str, why: str) -> dict[str, Any]:
        nan = math.nan
        return {
            "policy": policy, "rate_rps": nan, "fails_at_rps": nan, "checked_rps": nan, "tolerance": self.tolerance,
            "criterion": self.criterion(), "seeds": len(self.seeds), **dict.fromkeys(REPORTED_METRICS, nan),
            "runs": 0, "note": f"not servable: {why}",
        }  # fmt: skip

    def _row(self, lane: Lane, outcome: SearchOutcome, runs: _Runs, best: tuple[str, float] | None) -> dict[str, Any]:
        policy = lane[1]
        rate = outcome.rate_rps
        metrics = runs.mean(lane, rate) if rate is not None else {}
        idle = self._idle_note(policy, rate, metrics, best)
        return {
            "policy": policy,
            "rate_rps": _nan(rate),
            "fails_at_rps": _nan(outcome.fail_rps),
            "checked_rps": _nan(outcome.checked_rps),
            "tolerance": self.tolerance,
            "criterion": self.criterion(),
            "seeds": len(self.seeds),
            **{m: metrics.get(m, math.nan) for m in REPORTED_METRICS},
            "runs": runs.count(lane),
            "note": _join(outcome.note, _transient_note(rate, metrics), idle),
        }

    def _idle_note(
        self, policy: str, rate_rps: float | None, metrics: Mapping[str, float], best: tuple[str, float] | None
    ) -> str:
        """Why a capacity reached only with the GPU almost idle is so low; "" for any other.

        The SLO then holds only while requests seldom arrive during another's service, so the
        rate is set by how rarely they overlap, not by what the GPU can do. That happens when
        serving one request alone takes longer than the TTFT bound and a newcomer must wait
        for it, as under static batching.
        """
        busy = metrics.get("gpu_busy_frac", math.nan)
        if rate_rps is None or not busy < IDLE_BUSY_FRACTION:  # NaN (no GPU figure) says nothing
            return ""
        note = f"met only with the GPU {busy:.1%} busy"
        if best is not None and best[1] > rate_rps:
            note += f", {best[1] / rate_rps:,.0f}x below {best[0]}'s {best[1]:.3g} req/s"
        note += ": the SLO holds only while requests seldom arrive during another's service"
        e2e_s, ttft_bound_s = metrics.get("e2e_p99_s", math.nan), self.slo.get("ttft_p99_s", math.inf)
        if e2e_s > ttft_bound_s:
            note += f" (one is served in up to {e2e_s:.3g} s, E2E p99, and the TTFT bound is {ttft_bound_s:g} s)"
        if self._kind(policy) == "static":
            note += "; a static batch admits no request until its longest output ends"
        return note

    def _kind(self, policy: str) -> str | None:
        return next((p.kind for p in self.base.policies if p.name == policy), None)


class _Runs:
    """Summary rows of every run so far, by (lane, rate); no run is repeated."""

    def __init__(self, spec: CapacitySpec, point_fn: PointFn) -> None:
        self.spec = spec
        self.fn = partial(execute, point_fn=point_fn)
        # (lane, rate) -> seed -> summary row; kept by seed so means never depend on
        # the order in which workers finished.
        self.rows: dict[tuple[Lane, float], dict[int, dict[str, Any]]] = {}

    def missing(self, wanted: Mapping[Lane, float]) -> list[Task]:
        """Tasks for the (lane, rate) pairs not run yet, every seed."""
        return [
            self.spec.task(p, r, s)
            for p, r in wanted.items()
            if (p, r) not in self.rows
            for s in self.spec.seeds
        ]

    def add(self, result: TaskResult) -> None:
        """Record one finished run; a failed run stops the search with its error."""
        lane, rate, seed = result.key
        if result.error or result.summary is None:
            raise UserError(
                f"capacity: {describe_lane(lane, self.spec.points)} at {RATE_PATH}={rate:g} (seed {seed}) failed: "
                f"{result.error}"
            )
        self.rows.setdefault((lane, rate), {})[seed] = result.summary.iloc[0].to_dict()

    def meets(self, lane: Lane, rate: float) -> bool:
        """Whether the lane's policy met the SLO at ``rate`` for every seed."""
        return self.spec.meets(list(self.rows[(lane, rate)].values()))

    def mean(self, lane: Lane, rate: float) -> dict[str, float]:
        """Reported metrics at ``rate``, averaged over seeds."""
        by_seed = self.rows[(lane, rate)]
        frame = pd.DataFrame([by_seed[seed] for seed in sorted(by_seed)])
        return {m: float(frame[m].mean()) for m in REPORTED_METRICS if m in frame.columns}

    def count(self, lane: Lane) -> int:
        """Runs made for a lane (rates x seeds)."""
        return sum(len(rows) for (key, _), rows in self.rows.items() if key == lane)


def _drive(spec: CapacitySpec, runs: _Runs, engine: Any, bar: Any) -> dict[Lane, SearchOutcome]:
    """Advance every lane's search in lock-step; a round runs the rates asked for in parallel."""
    searches = {lane: search_rate(spec.start_rps, spec.tolerance, spec.rate_low, spec.rate_high) for lane in spec.lanes}
    wanted = {lane: next(search) for lane, search in searches.items()}
    outcomes: dict[Lane, SearchOutcome] = {}
    while wanted:
        for result in engine.imap_unordered(runs.fn, runs.missing(wanted)):
            runs.add(result)
            bar.update(1)
        wanted = _advance(searches, wanted, runs, outcomes)
    return outcomes


def _advance(
    searches: dict[Lane, Generator[float, bool, SearchOutcome]],
    wanted: dict[Lane, float],
    runs: _Runs,
    outcomes: dict[Lane, SearchOutcome],
) -> dict[Lane, float]:
    following: dict[Lane, float] = {}
    for lane, rate in wanted.items():
        try:
            following[lane] = searches[lane].send(runs.meets(lane, rate))
        except StopIteration as stop:
            outcomes[lane] = stop.value
    return following


def _check_arrival(scenario: Scenario) -> None:
    kind = scenario.workload.arrival.kind
    if kind not in RATE_KINDS:
        raise UserError(
            f"workload.arrival.kind = '{kind}': a capacity search varies the arrival rate, so it "
            f"needs a rate-based arrival; allowed: {', '.join(RATE_KINDS)}",
            field="workload.arrival.kind",
        )


def _check_slo(slo: Mapping[str, float]) -> dict[str, float]:
    if not slo:
        raise UserError(
            f"capacity needs at least one SLO bound, e.g. --slo ttft_p99_s=2; "
            f"allowed: {', '.join(SLO_COLUMNS)}"
        )
    bounds: dict[str, float] = {}
    for key, value in slo.items():
        if key not in SLO_COLUMNS:
            raise UserError(
                f"--slo {key}: unknown bound{did_you_mean(key, SLO_COLUMNS)}; "
                f"allowed: {', '.join(SLO_COLUMNS)}"
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value > 0
            or math.isinf(value)
        ):
            raise UserError(f"--slo {key} = {value!r}: must be a positive number of seconds")
        bounds[key] = float(value)
    return bounds


def _check_search(
    attainment: float | None, tolerance: float, rate_low: float | None, rate_high: float | None
) -> None:
    if attainment is not None and not 0 < attainment <= 1:
        raise UserError(
            f"attainment = {attainment}: must be a fraction in (0, 1], e.g. 0.9", field="attainment"
        )
    if not 0.001 <= tolerance < 1:
        raise UserError(
            f"tolerance = {tolerance}: must be a relative tolerance in [0.001, 1), e.g. 0.02",
            field="tolerance",
        )
    for name, rate in (("rate_low", rate_low), ("rate_high", rate_high)):
        if rate is not None and not (0 < rate < math.inf):
            raise UserError(f"{name} = {rate}: must be a positive rate in requests/s", field=name)
    if rate_low is not None and rate_high is not None and rate_low >= rate_high:
        raise UserError(
            f"rate_low = {rate_low} must be below rate_high = {rate_high}", field="rate_low"
        )


def _transient_note(rate_rps: float | None, metrics: Mapping[str, float]) -> str:
    # A finite request stream can end before the queue of an overloaded server grows
    # enough to break the SLO; then the "capacity" exceeds what the server completes.
    throughput_rps = metrics.get("throughput_rps", math.nan)
    if rate_rps is None or not throughput_rps < SUSTAINED_FRACTION * rate_rps:
        return ""
    return (
        f"throughput {throughput_rps:.3g} req/s is below {SUSTAINED_FRACTION:.0%} of the "
        "offered rate: "
        f"the run ends before a queue builds up; raise workload.requests"
    )


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
