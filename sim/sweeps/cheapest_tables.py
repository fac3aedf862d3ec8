"""The tables of a cheapest-fleet search: the frontier and cheapest marks, one row per configuration.

Pure functions over the runs table of :mod:`sim.sweeps.cheapest` (no simulation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from sim.sweeps.fleet_search import FleetOutcome


def mark_frontier(table: pd.DataFrame) -> pd.DataFrame:
    """Add ``frontier`` and ``cheapest``: Pareto-optimal in (rent, TTFT p99) among meeting fleets."""
    table = table.copy()
    table["frontier"] = False
    table["cheapest"] = False
    if table.empty or not table["meets"].any():
        return table
    met = table[table["meets"] & table["fleet_usd_per_hour"].notna()]
    ordered = met.sort_values(["fleet_usd_per_hour", "ttft_p99_s", "usd_per_mtok"], kind="stable")
    best_ttft = math.inf
    for index, row in ordered.iterrows():
        if row["ttft_p99_s"] < best_ttft:
            table.loc[index, "frontier"] = True
            best_ttft = row["ttft_p99_s"]
    if len(ordered):
        table.loc[ordered.index[0], "cheapest"] = True
    return table


CONFIG_METRICS = ("fleet_usd_per_hour", "usd_per_mtok", "joules_per_token", "ttft_p99_s", "tpot_p99_s")
"""Metrics of each configuration's smallest meeting fleet in the per-configuration table."""


def config_table(configs: Sequence[Any], outcomes: Mapping[Any, FleetOutcome], runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (:class:`sim.sweeps.cheapest.FleetConfig`): its smallest meeting fleet with
    that fleet's cost and latency, or the reason."""
    rows = []
    for config in configs:
        outcome = outcomes[config]
        size = outcome.size
        fleet = config.label(size) if size else "-"
        found = runs[(runs["fleet"] == fleet) & (runs["policy"] == config.policy)] if size else runs.iloc[:0]
        rows.append({
            "gpu": config.gpu, "tensor_parallel": config.tensor_parallel, "policy": config.policy,
            "smallest_fleet": fleet, "num_gpus": config.num_gpus(size) if size else math.nan,
            **{m: float(found[m].iloc[0]) if len(found) else math.nan for m in CONFIG_METRICS},
            "runs": int(((runs["gpu"] == config.gpu) & (runs["tensor_parallel"] == config.tensor_parallel)
                         & (runs["policy"] == config.policy)).sum()) if len(runs) else 0,
            "note": outcome.note,
        })  # fmt: skip
    return pd.DataFrame(rows)
