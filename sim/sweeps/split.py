"""Prefill:decode split search: for a fixed GPU count, the ratio with the most goodput per GPU.

For every split of ``total_gpus`` into a prefill pool and a decode pool (each a whole number of
its pool's replicas), :func:`sim.sweeps.slo_capacity.find_capacity` searches the highest arrival
rate at which the disaggregated deployment meets the SLO; the colocated policies are searched
once with ``replicas = total_gpus / tensor_parallel``. Each row reports the capacity per GPU
(``rate_rps / gpus``, DistServe's per-GPU goodput: the rate it serves within the SLO, per
GPU) and the goodput per GPU measured at that rate; ``best`` marks the disaggregated split with
the highest capacity per GPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from sim.config import Scenario
from sim.errors import UserError
from sim.io.scenario import load_scenario
from sim.sweeps.slo_capacity import find_capacity

SPLIT_COLUMNS = ("deployment", "prefill_gpus", "decode_gpus", "gpus", "rate_rps", "capacity_per_gpu",
                 "goodput_per_gpu", "ttft_p99_s", "tpot_p99_s", "slo_attainment", "best", "note")  # fmt: skip


def splits(scenario: Scenario, total_gpus: int) -> list[tuple[int, int]]:
    """(prefill GPUs, decode GPUs) pairs of ``total_gpus`` that fit whole replicas of each pool.

    Raises:
        UserError: no disaggregation block, or no split fits.
    """
    block = scenario.disaggregation
    if block is None:
        raise UserError("--split-gpus needs a scenario with a disaggregation block", field="disaggregation")
    tp_p, tp_d = block.prefill.tensor_parallel, block.decode.tensor_parallel
    pairs = [(p, total_gpus - p) for p in range(tp_p, total_gpus, tp_p) if (total_gpus - p) % tp_d == 0]
    if not pairs:
        raise UserError(
            f"--split-gpus {total_gpus}: no split into prefill replicas of {tp_p} GPUs and decode replicas of "
            f"{tp_d} GPUs; give at least {tp_p + tp_d} GPUs",
            field="split_gpus",
        )
    return pairs


def split_search(
    scenario: Scenario | str | Path, slo: dict[str, float], total_gpus: int, **kwargs: Any
) -> pd.DataFrame:
    """Capacity of every prefill:decode split of ``total_gpus`` and of the colocated policies on as many GPUs.

    Args:
        scenario: a scenario (or path) with a ``disaggregation`` block and a rate-based arrival.
        slo: the bounds, as for :func:`sim.sweeps.slo_capacity.capacity`.
        total_gpus: GPUs of every deployment compared.
        **kwargs: passed to :func:`sim.sweeps.slo_capacity.find_capacity` (attainment, seeds, workers, ...).

    Returns:
        One row per split, then one per colocated policy (``SPLIT_COLUMNS``).
    """
    base = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    pairs = splits(base, total_gpus)
    block = base.disaggregation
    assert block is not None
    rows = []
    for prefill_gpus, decode_gpus in pairs:
        variant = base.replace(**{
            "disaggregation.prefill.replicas": prefill_gpus // block.prefill.tensor_parallel,
            "disaggregation.decode.replicas": decode_gpus // block.decode.tensor_parallel,
        })  # fmt: skip
        found = find_capacity(variant, slo, only=[block.name], **kwargs).iloc[0].to_dict()
        rows.append(_row(f"{block.name} {prefill_gpus}:{decode_gpus}", prefill_gpus, decode_gpus, found))
    if total_gpus % base.tensor_parallel == 0:
        colocated = base.replace(replicas=total_gpus // base.tensor_parallel)
        names = [p.name for p in base.policies]
        for found in find_capacity(colocated, slo, only=names, **kwargs).to_dict("records"):
            rows.append(_row(found["policy"], math.nan, math.nan, found, gpus=total_gpus))
    table = pd.DataFrame(rows)
    disagg = table["prefill_gpus"].notna()
    table["best"] = False
    if disagg.any() and table.loc[disagg, "capacity_per_gpu"].notna().any():
        table.loc[table.loc[disagg, "capacity_per_gpu"].idxmax(), "best"] = True
    return table[list(SPLIT_COLUMNS)]


def _row(name: str, prefill_gpus: float, decode_gpus: float, found: dict[str, Any], gpus: int = 0) -> dict[str, Any]:
    gpus = gpus or int(prefill_gpus + decode_gpus)
    return {
        "deployment": name, "prefill_gpus": prefill_gpus, "decode_gpus": decode_gpus, "gpus": gpus,
        "rate_rps": found["rate_rps"], "capacity_per_gpu": found["rate_rps"] / gpus,
        "goodput_per_gpu": found["goodput_rps"] / gpus, "ttft_p99_s": found["ttft_p99_s"],
        "tpot_p99_s": found["tpot_p99_s"], "slo_attainment": found["slo_attainment"], "note": found["note"],
    }  # fmt: skip


def split_markdown(table: pd.DataFrame, name: str, criterion: str) -> str:
    """The split search as Markdown: every split and the colocated policies, the best split first named."""
    best = table[table["best"]]
    head = f"# {name}: prefill:decode split search\n\nSLO: {criterion}.\n\n"
    if len(best):
        row = best.iloc[0]
        head += (f"Best split: **{int(row.prefill_gpus)}:{int(row.decode_gpus)}** (prefill:decode GPUs), "
                 f"{row.capacity_per_gpu:.3g} req/s per GPU within the SLO.\n\n")  # fmt: skip
    from sim.report.tables import markdown_table

    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in table.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(table[c]) and table[c].dtype != bool for c in table.columns]
    return head + markdown_table(list(table.columns), cells, numeric)
