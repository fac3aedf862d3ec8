"""The cheapest fleet that serves a workload within an SLO, and the cost-vs-latency frontier.

``python -m sim capacity FILE --cheapest --slo ...``: for every GPU type x tensor-parallel degree
x policy (and, when the scenario has a ``disaggregation`` block, its deployment with both pools
on that GPU and degree), :mod:`sim.sweeps.fleet_search` finds the fewest replicas (or prefill +
decode replicas) that meet the SLO on the scenario's own requests (its arrival process, trace
or rate, is kept: the question is "what serves this stream", not "how fast can it go"). Every
fleet simulated is kept; the answer is the meeting fleet with the lowest rent per hour
(``fleet_usd_per_hour``: GPUs x catalog price, or the scenario's ``gpu_hour_usd``), and the
frontier is the meeting fleets no other meeting fleet beats on both rent and p99 TTFT.

"Meets" is :meth:`sim.sweeps.slo_capacity.CapacitySpec.meets`: each bound on its p99 and every
request completed, or with ``attainment`` A that share of requests within every bound; with
several seeds, every seed. Runs skip the ``load_frac`` capacity replay (not needed here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.errors import UserError, did_you_mean
from sim.hardware.catalog import GPUS
from sim.io.scenario import load_scenario
from sim.sweeps.backends import open_capped_backend
from sim.sweeps.cheapest_tables import config_table, mark_frontier
from sim.sweeps.fleet_search import FleetOutcome, Probe, Search, Size, search_replicas, search_split
from sim.sweeps.grid import normalize_seeds
from sim.sweeps.runner import progress_bar, report_startup
from sim.sweeps.slo_capacity import CapacitySpec, _check_search, _check_slo
from sim.sweeps.tasks import Task, TaskResult, build_scenario, execute, scenario_dict

RUN_METRICS = (
    "fleet_usd_per_hour", "usd_per_mtok", "joules_per_token", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s",
    "slo_attainment", "gpu_busy_frac", "throughput_rps", "completed", "requests", "duration_s",
)  # fmt: skip
"""Summary columns kept for every fleet simulated (means over seeds)."""

RUN_COLUMNS = (
    "fleet", "gpu", "tensor_parallel", "policy", "replicas", "prefill_replicas", "decode_replicas", "num_gpus",
    *RUN_METRICS, "meets",
)  # fmt: skip
"""Columns of the table of fleets simulated (then ``frontier`` and ``cheapest``)."""

DEFAULT_TENSOR_PARALLEL = (1, 2, 4)
DEFAULT_MAX_GPUS = 64
DEFAULT_COST_SPAN = 4.0
"""Fleets costing over this many times the cheapest meeting fleet found so far are not run."""


def fleet_point(scenario: Scenario, policies: Sequence[str] | None = None) -> pd.DataFrame:
    """Point function of the search: the summary of a run without its ``load_frac`` replay."""
    from sim.runner import run

    return run(scenario, policies=policies, load_frac=False).summary


@dataclass(frozen=True)
class FleetConfig:
    """One searched configuration: a GPU type, a TP degree and what runs on it."""

    gpu: str
    tensor_parallel: int
    policy: str
    disaggregated: bool = False
    usd_per_gpu_hour: float = math.nan

    def usd_per_hour(self, size: Size) -> float:
        """Rent of a fleet of ``size`` (NaN when the GPU has no price)."""
        return self.num_gpus(size) * self.usd_per_gpu_hour

    def overrides(self, size: Size) -> dict[str, Any]:
        """Scenario overrides of a fleet of ``size`` in this configuration."""
        change: dict[str, Any] = {"gpu": self.gpu, "tensor_parallel": self.tensor_parallel}
        if not self.disaggregated:
            return change | {"replicas": size[0]}
        for pool, replicas in zip(("prefill", "decode"), size, strict=True):
            change |= {f"disaggregation.{pool}.gpu": self.gpu, f"disaggregation.{pool}.replicas": replicas,
                       f"disaggregation.{pool}.tensor_parallel": self.tensor_parallel}  # fmt: skip
        return change

    def num_gpus(self, size: Size) -> int:
        """GPUs of a fleet of ``size``."""
        return sum(size) * self.tensor_parallel

    def label(self, size: Size) -> str:
        """E.g. ``h100-sxm TP2 x 3`` or ``a100-80gb TP1 3P:5D``."""
        count = f"x {size[0]}" if not self.disaggregated else f"{size[0]}P:{size[1]}D"
        return f"{self.gpu} TP{self.tensor_parallel} {count}"


@dataclass
class CheapestReport:
    """Everything the search found.

    Attributes:
        runs: one row per fleet simulated (configuration, size, ``RUN_METRICS``, ``meets``,
            ``frontier``, ``cheapest``).
        configs: one row per configuration: its smallest meeting fleet or why there is none.
        criterion: the SLO test in words.
        slo: the bounds, in seconds.
        elapsed_s: wall time of the search.
    """

    runs: pd.DataFrame
    configs: pd.DataFrame
    criterion: str
    slo: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def frontier(self) -> pd.DataFrame:
        """Meeting fleets no other beats on both rent and TTFT p99, cheapest first."""
        return self.runs[self.runs["frontier"]].sort_values("fleet_usd_per_hour").reset_index(drop=True)

    @property
    def best(self) -> pd.Series | None:
        """The cheapest meeting fleet (None: none met the SLO)."""
        chosen = self.runs[self.runs["cheapest"]]
        return chosen.iloc[0] if len(chosen) else None


def cheapest_fleet(
    scenario: Scenario | str | Path,
    slo: Mapping[str, float],
    *,
    gpus: Sequence[str] | None = None,
    tensor_parallel: Sequence[int] = DEFAULT_TENSOR_PARALLEL,
    policies: Sequence[str] | None = None,
    max_gpus: int = DEFAULT_MAX_GPUS,
    cost_span: float = DEFAULT_COST_SPAN,
    attainment: float | None = None,
    seeds: Sequence[int] | int | None = None,
    workers: int | None = 1,
    backend: str = "local",
    address: str | None = None,
    progress: bool = False,
    point_fn: Any = fleet_point,
) -> CheapestReport:
    """Search every configuration for its smallest fleet meeting ``slo``; the cheapest and the frontier.

    Args:
        scenario: the workload (any arrival kind) and the policies.
        slo: bounds as for :func:`sim.sweeps.slo_capacity.capacity`; they replace the scenario's.
        gpus: GPU types to try (default: every catalog GPU with a price, in the catalog or the
            scenario's ``gpu_hour_usd``). A single ``gpu_hour_usd`` prices the scenario's own GPU only.
        tensor_parallel: degrees to try (one that does not divide the model's heads is reported, not run).
        policies: policy names (or the disaggregation block's name) to size (default: all).
        max_gpus: no fleet above this many GPUs is run.
        cost_span: no fleet renting for more than this many times the cheapest meeting fleet found so far
            is run (its configuration is given up, saying so); 0 = no limit. The answer is exact either way,
            and the frontier is complete up to this multiple of the cheapest rent.
        attainment, workers, backend, address, progress: as for ``capacity``.
        seeds: seeds per fleet (an int N: 0..N-1; default: the scenario's own seed, as ``run`` uses).
        point_fn: ``(scenario, policies) -> summary`` (tests inject a cheaper one).

    Returns:
        The :class:`CheapestReport`.

    Raises:
        UserError: bad SLO, GPU, degree, policy or budget; nothing is run then.
    """
    started = time.perf_counter()
    base = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    spec = _spec(base, slo, attainment, [base.seed] if seeds is None else seeds)
    configs = _configs(spec.base, _gpus(base, gpus), _degrees(tensor_parallel), _policies(base, policies))
    if not isinstance(max_gpus, int) or max_gpus < 1:
        raise UserError(f"max_gpus = {max_gpus!r}: must be a positive number of GPUs", field="max_gpus")
    if isinstance(cost_span, bool) or not (cost_span == 0 or 1 <= cost_span < math.inf):
        raise UserError(f"cost_span = {cost_span!r}: must be 0 (no limit) or at least 1", field="cost_span")
    span_s = _arrival_span_s(spec.base)
    searches = {c: _search(c, span_s, max_gpus) for c in configs}
    runs = _Runs(spec, point_fn)
    engine, count = open_capped_backend(backend, workers, address, tasks=len(configs) * len(spec.seeds))
    with engine, progress_bar(progress, "cheapest", "run") as bar:
        report_startup(engine, bar, progress, count)
        outcomes = _drive(searches, runs, engine, bar, cost_span)
    table = mark_frontier(runs.table(configs))
    return CheapestReport(table, config_table(configs, outcomes, table), spec.criterion(), spec.slo,
                          time.perf_counter() - started)  # fmt: skip


def _spec(base: Scenario, slo: Mapping[str, float], attainment: float | None, seeds: Any) -> CapacitySpec:
    """The SLO test; the base scenario gets the SLO, and a single ``gpu_hour_usd`` becomes the price
    of its own GPU only: one number cannot price GPU types the scenario never named."""
    bounds = _check_slo(slo)
    _check_search(attainment, 0.02, None, None)
    raw = dict(scenario_dict(base), slo=bounds)
    if isinstance(base.gpu_hour_usd, int | float):
        raw["gpu_hour_usd"] = {base.gpu: float(base.gpu_hour_usd)}
    with_slo = build_scenario(raw, {}, base.base_dir)
    return CapacitySpec(
        base=with_slo,
        slo=bounds,
        attainment=attainment,
        tolerance=0.02,
        rate_low=None,
        rate_high=None,
        seeds=normalize_seeds(seeds),
    )


def _gpus(base: Scenario, gpus: Sequence[str] | None) -> list[str]:
    priced = base.gpu_hour_usd if isinstance(base.gpu_hour_usd, dict) else {}
    if gpus is None:
        return [n for n, g in GPUS.items() if g.usd_per_hour > 0 or n in priced or n == base.gpu]
    for name in gpus:
        if name not in GPUS:
            raise UserError(f"--gpus {name!r}: unknown GPU{did_you_mean(name, GPUS)}; known: {', '.join(GPUS)}",
                            field="gpus")  # fmt: skip
    return list(dict.fromkeys(gpus))


def _degrees(degrees: Sequence[int]) -> list[int]:
    for tp in degrees:
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1024:
            raise UserError(f"--tp {tp!r}: must be a tensor-parallel degree from 1 to 1024", field="tp")
    return sorted(set(degrees))


def _policies(base: Scenario, policies: Sequence[str] | None) -> list[str]:
    names = [p.name for p in base.policies] + ([base.disaggregation.name] if base.disaggregation else [])
    for name in policies or []:
        if name not in names:
            raise UserError(f"--policy {name!r} is not in the scenario{did_you_mean(name, names)}; "
                            f"policies: {', '.join(names)}", field="policy")  # fmt: skip
    return list(policies) if policies else names


def _configs(base: Scenario, gpus: list[str], degrees: list[int], policies: list[str]) -> list[FleetConfig]:
    from sim.fleet import gpu_price

    block = base.disaggregation.name if base.disaggregation else None
    return [
        FleetConfig(g, tp, p, p == block, gpu_price(base, GPUS[g])) for p in policies for g in gpus for tp in degrees
    ]


def _search(config: FleetConfig, span_s: float, max_gpus: int) -> Search:
    cap = max_gpus // config.tensor_parallel
    return search_split(span_s, cap) if config.disaggregated else search_replicas(span_s, cap)


def _arrival_span_s(base: Scenario) -> float:
    """Seconds between the stream's first and last send (NaN for a closed loop)."""
    from sim.resolve import resolve

    arrivals = resolve(base).stream.arrival_s
    finite = arrivals[np.isfinite(arrivals)]
    return float(finite.max() - finite.min()) if len(finite) > 1 else math.nan


class _Runs:
    """Summary rows of every fleet run so far, by (configuration, size); no fleet runs twice."""

    def __init__(self, spec: CapacitySpec, point_fn: Any) -> None:
        self.spec = spec
        self.fn = partial(execute, point_fn=point_fn)
        self.rows: dict[tuple[FleetConfig, Size], dict[int, dict[str, Any]]] = {}
        self.errors: dict[FleetConfig, str] = {}

    def tasks(self, wanted: Mapping[FleetConfig, Size]) -> list[Task]:
        """One task per seed of every wanted fleet not run yet."""
        return [self._task(c, size, seed) for c, size in wanted.items() if (c, size) not in self.rows
                for seed in self.spec.seeds]  # fmt: skip

    def _task(self, config: FleetConfig, size: Size, seed: int) -> Task:
        raw = scenario_dict(self.spec.base)
        if not config.disaggregated:
            raw.pop("disaggregation", None)  # a colocated fleet never needs the block's pools to fit
        overrides = config.overrides(size) | {"seed": seed}
        return Task((config, size, seed), raw, overrides, self.spec.base.base_dir, (config.policy,))

    def add(self, result: TaskResult) -> None:
        """Record one finished run; a failed one ends its configuration's search with the error."""
        config, size, seed = result.key
        if result.error or result.summary is None:
            self.errors[config] = result.error
            return
        self.rows.setdefault((config, size), {})[seed] = result.summary.iloc[0].to_dict()

    def cheapest_usd_per_hour(self) -> float:
        """Rent of the cheapest fleet that met the SLO so far (NaN: none yet)."""
        met = [
            c.usd_per_hour(size) for (c, size), by_seed in self.rows.items() if self.spec.meets(list(by_seed.values()))
        ]
        priced = [usd for usd in met if not math.isnan(usd)]
        return min(priced) if priced else math.nan

    def largest_failing(self, config: FleetConfig) -> int:
        """Replicas of the largest fleet of a colocated ``config`` that missed the SLO (0: none)."""
        failed = [
            size[0]
            for (c, size), by_seed in self.rows.items()
            if c == config and not self.spec.meets(list(by_seed.values()))
        ]
        return max(failed, default=0)

    def probe(self, config: FleetConfig, size: Size) -> Probe:
        """What the fleet's runs say: met on every seed, mean busy share, mean pass work."""
        rows = list(self.rows[(config, size)].values())
        busy = float(np.mean([r["gpu_busy_frac"] for r in rows]))
        work_s = float(np.mean([r["gpu_busy_frac"] * r["duration_s"] * sum(size) for r in rows]))
        return Probe(self.spec.meets(rows), busy, work_s)

    def table(self, configs: Sequence[FleetConfig]) -> pd.DataFrame:
        """One row per fleet run: configuration, size, mean metrics over seeds, whether it met."""
        order = {c: i for i, c in enumerate(configs)}
        records = []
        for (config, size), by_seed in sorted(self.rows.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
            frame = pd.DataFrame(list(by_seed.values()))
            records.append({
                "fleet": config.label(size), "gpu": config.gpu, "tensor_parallel": config.tensor_parallel,
                "policy": config.policy, "replicas": size[0] if not config.disaggregated else math.nan,
                "prefill_replicas": size[0] if config.disaggregated else math.nan,
                "decode_replicas": size[1] if config.disaggregated else math.nan,
                "num_gpus": config.num_gpus(size),
                **{m: float(frame[m].mean()) for m in RUN_METRICS if m in frame.columns},
                "meets": self.spec.meets(list(by_seed.values())),
            })  # fmt: skip
        return pd.DataFrame(records, columns=list(RUN_COLUMNS))


def _drive(
    searches: dict[FleetConfig, Search], runs: _Runs, engine: Any, bar: Any, cost_span: float
) -> dict[FleetConfig, FleetOutcome]:
    """Advance every search in lock-step; a round runs every search's next fleet in parallel.

    Before each round, a configuration whose cheapest possible fleet rents for more than ``cost_span``
    x the cheapest meeting fleet so far is given up: none of its fleets could be the answer, and
    every configuration's smallest meeting fleet within the span is still found.
    """
    outcomes: dict[FleetConfig, FleetOutcome] = {}
    wanted = {}
    for config, search in searches.items():
        try:
            wanted[config] = next(search)
        except StopIteration as stop:  # nothing to run (the budget holds no replica of it)
            outcomes[config] = stop.value
    while wanted:
        wanted = _within_span(wanted, searches, runs, cost_span, outcomes)
        for result in engine.imap_unordered(runs.fn, runs.tasks(wanted)):
            runs.add(result)
            bar.update(1)
        following = {}
        for config, size in wanted.items():
            if config in runs.errors:
                searches[config].close()
                outcomes[config] = FleetOutcome(None, f"{config.label(size)} failed: {runs.errors[config]}")
                continue
            try:
                following[config] = searches[config].send(runs.probe(config, size))
            except StopIteration as stop:
                outcomes[config] = stop.value
        wanted = following
    return outcomes


def _within_span(
    wanted: dict[FleetConfig, Size],
    searches: dict[FleetConfig, Search],
    runs: _Runs,
    cost_span: float,
    outcomes: dict[FleetConfig, FleetOutcome],
) -> dict[FleetConfig, Size]:
    """``wanted`` less the configurations none of whose fleets can rent within the cost span.

    A configuration's cheapest possible fleet is one replica more than its largest failing one
    (monotone in replicas); for a split, the current prefill count plus one decode replica (the
    split search only raises the prefill count). Beyond the span, its search ends with a note.
    """
    cheapest = runs.cheapest_usd_per_hour()
    if not cost_span or math.isnan(cheapest):
        return wanted
    kept = {}
    for config, size in wanted.items():
        floor = (size[0], 1) if config.disaggregated else (runs.largest_failing(config) + 1,)
        usd = config.usd_per_hour(floor)
        if usd > cost_span * cheapest:
            searches[config].close()
            note = f"given up: {config.label(floor)} or more rents for over {cost_span:g}x the cheapest meeting fleet"
            outcomes[config] = FleetOutcome(None, f"{note} (${usd:.2f} vs ${cheapest:.2f}/h)")
        else:
            kept[config] = size
    return kept
