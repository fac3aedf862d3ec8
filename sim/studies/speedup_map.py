"""The static-vs-continuous speedup map: length class x load x max batch size.

One point of the seed table (an offline burst at batch 16) cannot say how large the gain of
continuous batching is; the map measures it over the conditions that decide it. For every
output-length class (one ``scenarios/seed_table`` file each, so prompts, model and GPU are
those of the seed table), every ``max_batch_size`` and every seed:

1. **burst**: every request queued at t = 0; static's throughput here is its *saturation*
   throughput (full batches back to back) and B / throughput its mean batch time T_batch;
2. **capacity**: :func:`sim.sweeps.slo_capacity.capacity` finds the highest Poisson rate at which
   static meets the SLO "every request completes and p99 E2E <= ``slo_batches`` x T_batch",
   searched at or below the saturation throughput (above it the queue of a long run grows
   without bound, so a higher answer could only be an artefact of a finite run);
3. **Poisson** at each load fraction x that capacity.

Every run is a :class:`sim.sweeps.tasks.Task` run by the sweep backends (a process pool), so
each map number is what :func:`sim.run` gives for the same scenario and seed, to the last
digit. Text and figures are in :mod:`sim.studies.speedup_map_text` and
:mod:`sim.studies.speedup_map_plot`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.io.scenario import load_scenario
from sim.sweeps.backends import open_backend
from sim.sweeps.slo_capacity import capacity
from sim.sweeps.tasks import Task, TaskResult, build_scenario, execute, scenario_dict

MAP_COLUMNS: tuple[str, ...] = (
    "length_class", "load", "max_batch_size", "static_e2e_mean_s", "continuous_e2e_mean_s",
    "speedup", "throughput_gain",
)  # fmt: skip
"""First columns of ``speedup_map.csv``, in this order."""

EXTRA_MAP_COLUMNS: tuple[str, ...] = (
    "static_e2e_p50_s", "continuous_e2e_p50_s", "static_output_tps", "continuous_output_tps",
    "static_throughput_rps", "continuous_throughput_rps", "rate_rps", "capacity_rps",
    "saturation_rps", "requests", "seeds", "speedup_min", "speedup_max", "speedup_spread",
    "static_e2e_spread",
)  # fmt: skip
"""Columns after ``MAP_COLUMNS``: p50s, throughputs, the rate run and seed-to-seed spread."""

BURST = "burst"
"""The ``load`` value of offline rows (every request queued at t = 0)."""

STATIC, CONTINUOUS = "static", "continuous"
"""Policy names of the seed-table scenarios compared by the map."""

CLASS_FILES: dict[str, str] = {"short": "short", "medium": "medium", "long": "long", "mixed": "mixed"}
"""Length class -> scenario file stem under ``scenarios/seed_table/``."""

_METRICS = ("e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "output_tps", "throughput_rps", "completed", "requests")


@dataclass(frozen=True)
class MapConfig:
    """What the map covers and how hard it measures each point.

    Attributes:
        classes: length classes (keys of ``CLASS_FILES``), in display order.
        loads: Poisson load fractions of static's capacity (the burst row is always added).
        batch_sizes: ``max_batch_size`` values, the same for both policies.
        seeds: seeds of every map point; numbers are means over them, spreads across them.
        batches_per_run: requests per run = this x max batch size, so every batch size sees
            the same number of static batch times (a fixed count would leave batch 64 a few
            batches long, all warm-up).
        slo_batches: static's capacity SLO, p99 E2E <= this many mean batch times.
        capacity_seeds: seeds of the capacity search (a rate meets only if it does for all).
        tolerance: relative tolerance of the capacity search.
        workers: processes running the map (0: every core); results do not depend on it.
    """

    classes: tuple[str, ...] = ("short", "medium", "long", "mixed")
    loads: tuple[float, ...] = (0.5, 0.7, 0.9, 1.1)
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64)
    seeds: tuple[int, ...] = (0, 1, 2)
    batches_per_run: int = 16
    slo_batches: float = 3.0
    capacity_seeds: tuple[int, ...] = (0,)
    tolerance: float = 0.02
    workers: int = 0

    def requests(self, batch_size: int) -> int:
        """Requests per run at ``batch_size``."""
        return self.batches_per_run * batch_size


@dataclass
class SpeedupMap:
    """A measured map: the table, the per-run rows behind it and static's capacities.

    Attributes:
        table: one row per (class, load, batch size); columns ``MAP_COLUMNS + EXTRA_MAP_COLUMNS``.
        runs: one row per (class, load, batch size, seed, policy) with the run's summary metrics.
        capacity: one row per (class, batch size): saturation, T_batch, SLO bound, capacity, note.
        config: the configuration measured.
        lengths: length class -> (low, high) of its uniform output-length distribution.
        deployment: model, GPU and prompt lengths in words.
    """

    table: pd.DataFrame
    runs: pd.DataFrame
    capacity: pd.DataFrame
    config: MapConfig = field(default_factory=MapConfig)
    lengths: dict[str, tuple[int, int]] = field(default_factory=dict)
    deployment: str = ""

    def lengths_text(self, name: str) -> str:
        """``10-99 output tokens`` for a class."""
        low, high = self.lengths[name]
        return f"{low}-{high} output tokens"


def class_scenarios(scenarios_dir: Path, classes: Iterable[str]) -> dict[str, Scenario]:
    """The seed-table scenario of each length class; raises FileNotFoundError when one is absent."""
    folder = scenarios_dir / "seed_table"
    return {name: load_scenario(folder / f"{CLASS_FILES[name]}.yaml") for name in classes}


def point_overrides(
    config: MapConfig, batch_size: int, load: str | float, rate_rps: float | None, seed: int
) -> dict[str, Any]:
    """Dotted-path overrides of one map run (``rate_rps`` is ignored for the burst)."""
    arrival: dict[str, Any] = {"kind": "burst"} if load == BURST else {"kind": "poisson", "rate": rate_rps}
    return {
        "workload.requests": config.requests(batch_size),
        "workload.arrival": arrival,
        f"policies[{STATIC}].max_batch_size": batch_size,
        f"policies[{CONTINUOUS}].max_batch_size": batch_size,
        "seed": seed,
    }


def point_scenario(base: Scenario, config: MapConfig, batch_size: int, load: str | float,
                   rate_rps: float | None, seed: int) -> Scenario:
    """The scenario of one map run, as :func:`sim.run` would take it (run only static and continuous)."""
    return base.replace(**point_overrides(config, batch_size, load, rate_rps, seed))


def measure_map(scenarios_dir: Path, config: MapConfig | None = None, *,
                log: Callable[[str], None] = print) -> SpeedupMap:
    """Run the whole map: burst points, static's capacity searches, then the Poisson points.

    Args:
        scenarios_dir: folder holding ``seed_table/{short,medium,long,mixed}.yaml``.
        config: what to measure (default: the full map).
        log: receives one line per phase.

    Returns:
        The :class:`SpeedupMap`; identical inputs give identical numbers, whatever the workers.
    """
    config = config or MapConfig()
    bases = class_scenarios(scenarios_dir, config.classes)
    burst = _run_points(bases, config, [(c, BURST, b, None) for c in config.classes for b in config.batch_sizes])
    log(f"speedup map: {len(burst)} burst runs")
    capacities = measure_capacity(bases, config, burst)
    log(f"speedup map: static capacity for {len(capacities)} (class, batch size) pairs")
    rated = capacities.set_index(["length_class", "max_batch_size"])["capacity_rps"]
    wanted = [(c, f, b, f * float(rated[(c, b)])) for c in config.classes for f in config.loads
              for b in config.batch_sizes]  # fmt: skip
    poisson = _run_points(bases, config, wanted)
    log(f"speedup map: {len(poisson)} Poisson runs")
    runs = _sorted_runs(pd.concat([burst, poisson], ignore_index=True), config)
    return SpeedupMap(map_table(runs, capacities), runs, capacities, config,
                      {name: uniform_bounds(base) for name, base in bases.items()}, deployment(bases))


def uniform_bounds(scenario: Scenario) -> tuple[int, int]:
    """(low, high) of a scenario's uniform output lengths; the wasted-slot argument needs them.

    Raises:
        ValueError: the output lengths are not uniform.
    """
    lengths = scenario.workload.output_tokens
    if lengths is None or lengths.kind != "uniform":
        raise ValueError(f"scenario '{scenario.name}': the speedup map needs uniform output lengths")
    return int(lengths.low), int(lengths.high)


def deployment(bases: Mapping[str, Scenario]) -> str:
    """The model, GPU and prompts the classes share, in words (one class's, if they differ)."""
    first = next(iter(bases.values()))
    prompts = first.workload.prompt_tokens
    low, high = getattr(prompts, "low", "?"), getattr(prompts, "high", "?")
    return f"{first.model} on {first.tensor_parallel} x {first.gpu}, prompts uniform {low}-{high} tokens"


def _run_points(bases: Mapping[str, Scenario], config: MapConfig,
                points: Sequence[tuple[str, str | float, int, float | None]]) -> pd.DataFrame:
    """Every (point, seed) as one sweep task on the pool; one row per run and policy."""
    tasks = [
        Task((name, load, batch, rate, seed), scenario_dict(bases[name]),
             point_overrides(config, batch, load, rate, seed), bases[name].base_dir, (STATIC, CONTINUOUS))
        for name, load, batch, rate in points for seed in config.seeds
    ]  # fmt: skip
    with open_backend("local", config.workers) as engine:
        results = list(engine.imap_unordered(execute, tasks))
    return pd.DataFrame([row for result in results for row in _run_rows(result)])


def _run_rows(result: TaskResult) -> list[dict[str, Any]]:
    name, load, batch, rate, seed = result.key
    if result.error or result.summary is None:
        raise RuntimeError(f"speedup map point {result.key} failed: {result.error}")
    keys = {"length_class": name, "load": load, "max_batch_size": batch, "rate_rps": rate, "seed": seed}
    return [{**keys, "policy": row["policy"], **{m: row[m] for m in _METRICS}}
            for row in result.summary.to_dict("records")]  # fmt: skip


def _sorted_runs(runs: pd.DataFrame, config: MapConfig) -> pd.DataFrame:
    """Completion order -> map order (class, load, batch size, seed, policy)."""
    order = {
        "length_class": {c: i for i, c in enumerate(config.classes)},
        "load": {load: i for i, load in enumerate((BURST, *config.loads))},
        "policy": {STATIC: 0, CONTINUOUS: 1},
    }
    keys = pd.DataFrame({k: runs[k].map(v) for k, v in order.items()})
    keys[["max_batch_size", "seed"]] = runs[["max_batch_size", "seed"]]
    index = keys.sort_values(["length_class", "load", "max_batch_size", "seed", "policy"]).index
    return runs.loc[index].reset_index(drop=True)


# --------------------------------------------------------------------------- capacity
def saturation(burst: pd.DataFrame) -> pd.DataFrame:
    """Static's saturation throughput per (class, batch size): its burst req/s, mean over seeds."""
    static = burst[(burst["policy"] == STATIC) & (burst["load"] == BURST)]
    frame = static.groupby(["length_class", "max_batch_size"], sort=False)["throughput_rps"].mean()
    frame = frame.rename("saturation_rps").reset_index()
    frame["batch_time_s"] = frame["max_batch_size"] / frame["saturation_rps"]
    return frame


def capacity_question(base: Scenario, config: MapConfig, batch_size: int,
                      saturation_rps: float) -> tuple[Scenario, dict[str, float], float]:
    """Static's capacity question: (scenario with only static, SLO bounds, highest rate to search).

    The search starts at the saturation throughput and never goes above it unless latency
    turns out to be non-monotone (then :func:`sim.sweeps.slo_capacity.capacity` says so in its note).
    """
    scenario = point_scenario(base, config, batch_size, 0.5, saturation_rps, config.capacity_seeds[0])
    raw = scenario_dict(scenario)
    raw["policies"] = [p for p in raw["policies"] if p["name"] == STATIC]
    only_static = build_scenario(raw, {}, scenario.base_dir)
    slo = {"e2e_p99_s": config.slo_batches * batch_size / saturation_rps}
    return only_static, slo, saturation_rps


def measure_capacity(bases: Mapping[str, Scenario], config: MapConfig, burst: pd.DataFrame) -> pd.DataFrame:
    """Static's SLO capacity for every (class, batch size), searched in parallel on the pool."""
    sat = saturation(burst)
    jobs = []
    for row in sat.itertuples(index=False):
        scenario, slo, high = capacity_question(bases[row.length_class], config, int(row.max_batch_size),
                                                float(row.saturation_rps))
        jobs.append(((row.length_class, int(row.max_batch_size)), scenario_dict(scenario), scenario.base_dir,
                     slo, high, config.capacity_seeds, config.tolerance))
    with open_backend("local", config.workers) as engine:
        found = dict(engine.imap_unordered(_capacity_job, jobs))
    frame = sat.copy()
    results = [found[(c, int(b))] for c, b in zip(frame["length_class"], frame["max_batch_size"], strict=True)]
    frame["slo_e2e_p99_s"] = config.slo_batches * frame["batch_time_s"]
    frame["capacity_rps"] = [r["rate_rps"] for r in results]
    frame["capacity_frac"] = frame["capacity_rps"] / frame["saturation_rps"]
    frame["criterion"] = [r["criterion"] for r in results]
    frame["note"] = [r["note"] for r in results]
    return frame


def _capacity_job(job: tuple[Any, ...]) -> tuple[tuple[str, int], dict[str, Any]]:
    """One capacity search in a pool worker (module level: it must pickle)."""
    key, raw, base_dir, slo, high, seeds, tolerance = job
    scenario = build_scenario(raw, {}, base_dir)
    report = capacity(scenario, slo, rate_high=high, seeds=seeds, tolerance=tolerance, workers=1)
    return key, report.iloc[0].to_dict()


# --------------------------------------------------------------------------- table
def map_table(runs: pd.DataFrame, capacities: pd.DataFrame) -> pd.DataFrame:
    """Aggregate per-run rows over seeds into one row per (class, load, batch size).

    E2E means, p50s and throughputs are means over seeds (every seed serves the same number
    of requests); ``speedup`` is the ratio of the two E2E columns and ``throughput_gain`` of
    the two output tok/s columns, so the table is consistent with itself by construction.
    Spreads are (max - min) / mean across seeds.
    """
    caps = capacities.set_index(["length_class", "max_batch_size"])
    rows = [_map_row(key, group, caps) for key, group in
            runs.groupby(["length_class", "load", "max_batch_size"], sort=False)]  # fmt: skip
    return pd.DataFrame(rows, columns=[*MAP_COLUMNS, *EXTRA_MAP_COLUMNS])


def _map_row(key: tuple[Any, ...], group: pd.DataFrame, caps: pd.DataFrame) -> dict[str, Any]:
    name, load, batch = key
    static = group[group["policy"] == STATIC].set_index("seed")
    fast = group[group["policy"] == CONTINUOUS].set_index("seed")
    per_seed = static["e2e_mean_s"] / fast["e2e_mean_s"]
    mean_static, mean_fast = float(static["e2e_mean_s"].mean()), float(fast["e2e_mean_s"].mean())
    tps_static, tps_fast = float(static["output_tps"].mean()), float(fast["output_tps"].mean())
    speedup = _ratio(mean_static, mean_fast)
    return {
        "length_class": name, "load": load, "max_batch_size": batch,
        "static_e2e_mean_s": mean_static, "continuous_e2e_mean_s": mean_fast, "speedup": speedup,
        "throughput_gain": _ratio(tps_fast, tps_static),
        "static_e2e_p50_s": float(static["e2e_p50_s"].mean()), "continuous_e2e_p50_s": float(fast["e2e_p50_s"].mean()),
        "static_output_tps": tps_static, "continuous_output_tps": tps_fast,
        "static_throughput_rps": float(static["throughput_rps"].mean()),
        "continuous_throughput_rps": float(fast["throughput_rps"].mean()),
        "rate_rps": float(static["rate_rps"].iloc[0]) if load != BURST else math.nan,
        "capacity_rps": float(caps.loc[(name, batch), "capacity_rps"]),
        "saturation_rps": float(caps.loc[(name, batch), "saturation_rps"]),
        "requests": int(static["requests"].iloc[0]), "seeds": len(static),
        "speedup_min": float(per_seed.min()), "speedup_max": float(per_seed.max()),
        "speedup_spread": _spread(per_seed.to_numpy(), speedup),
        "static_e2e_spread": _spread(static["e2e_mean_s"].to_numpy(), mean_static),
    }  # fmt: skip


def _spread(values: np.ndarray, centre: float) -> float:
    return float((values.max() - values.min()) / centre) if centre > 0 else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan
