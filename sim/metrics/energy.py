"""Energy and money of a run: joules and dollars per token from the passes the GPUs ran.

A deployment is one or more :class:`Pool` s (a colocated deployment is one; a disaggregated one
has a prefill and a decode pool), each a set of replicas of ``gpus_per_replica`` GPUs that run
passes priced by one :class:`sim.hardware.utilization.PassWork` and drawing power by one
:class:`sim.hardware.power.PowerModel`. Over a run window of D seconds:

    E_pass_i = P(MFU_i, MBU_i) x g x d_i          (pass i of duration d_i on g GPUs: a replica's, or
                                                   one pipeline stage's when rows are stage passes)
    E_idle   = P_idle x (G x D - sum_i g x d_i)   (G GPUs of the pool; each idles when not in a pass)
    E        = sum over pools of (sum_i E_pass_i + E_idle)

so E is the integral of the fleet's power over the window (:func:`fleet_power_w` gives that power
at any instant). The money is the rent of every GPU for the window:

    C = sum over pools of G x price x D / 3600

split between the completed requests' output tokens N_out and prompt tokens N_in in the ratio
the scenario sets (``input_price_ratio`` r: one input token costs r output tokens):

    usd_per_mtok = 1e6 x C / (N_out + r x N_in)       usd_per_mtok_input = r x usd_per_mtok

With r = 0 (the default) the whole bill is on output tokens, as ``joules_per_token`` = E / N_out is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.hardware.power import PowerModel
from sim.hardware.utilization import PassWork
from sim.metrics.running_pass import running_pass

ENERGY_COLUMNS: tuple[str, ...] = (
    "energy_j", "power_w", "joules_per_token", "joules_per_request",
    "fleet_usd_per_hour", "usd_per_mtok", "usd_per_mtok_input",
)  # fmt: skip
"""Summary columns :func:`energy_cost_stats` fills (appended after every other summary column)."""

_SECONDS_PER_HOUR = 3600.0
_CHUNK_ROWS = 1 << 20  # per-pass arrays are built this many passes at a time, so memory stays bounded


@dataclass(frozen=True)
class Pool:
    """Replicas that share one GPU type, parallel layout and pass work.

    Attributes:
        work: FLOPs and bytes of a pass on one replica.
        power: power of one of its GPUs; None when unknown (energy columns NaN).
        gpus_per_replica: GPUs one replica spans.
        replicas: the replica ids of its passes in the iterations table.
        usd_per_gpu_hour: rent of one of its GPUs per hour (NaN: unknown).
        stages: pipeline stages of a replica. With more than one, every iteration row is one stage's
            pass (``stage`` column) and runs on that stage's ``gpus_per_replica / stages`` GPUs while the
            other stages run their own rows at the same time.
    """

    work: PassWork
    power: PowerModel | None
    gpus_per_replica: int
    replicas: tuple[int, ...]
    usd_per_gpu_hour: float = math.nan
    stages: int = 1

    @property
    def num_gpus(self) -> int:
        """GPUs of the pool."""
        return self.gpus_per_replica * len(self.replicas)

    @property
    def gpus_per_row(self) -> int:
        """GPUs one iteration row occupies: the replica's, or one pipeline stage's."""
        return self.gpus_per_replica // self.stages

    def rows(self, iterations: pd.DataFrame) -> pd.DataFrame:
        """The pool's passes (all of them when it holds every replica in the table)."""
        replica = iterations["replica"].to_numpy()
        mine = np.isin(replica, self.replicas)
        return iterations if mine.all() else iterations.loc[mine]


def pass_energy_j(iterations: pd.DataFrame, pool: Pool) -> np.ndarray:
    """Joules of each of the pool's passes, in row order (empty without a power model)."""
    rows = pool.rows(iterations)
    if pool.power is None:
        return np.empty(0)
    parts = [_chunk_energy_j(rows.iloc[i : i + _CHUNK_ROWS], pool) for i in range(0, len(rows), _CHUNK_ROWS)]
    return np.concatenate(parts) if parts else np.empty(0)


def idle_energy_j(iterations: pd.DataFrame, pool: Pool, window_s: float) -> float:
    """Joules the pool's GPUs draw while running no pass during a window of ``window_s`` seconds."""
    if pool.power is None:
        return math.nan
    busy_gpu_s = pool.gpus_per_row * float(pool.rows(iterations)["duration_s"].to_numpy(dtype=float).sum())
    return pool.power.idle_w * (pool.num_gpus * window_s - busy_gpu_s)


def run_energy_j(iterations: pd.DataFrame, pools: Sequence[Pool], window_s: float) -> float:
    """E: every pool's pass energy plus its idle energy over the window (NaN if any pool lacks power)."""
    total = 0.0
    for pool in pools:
        if pool.power is None:
            return math.nan
        total += float(pass_energy_j(iterations, pool).sum()) + idle_energy_j(iterations, pool, window_s)
    return total


def fleet_power_w(iterations: pd.DataFrame, pools: Sequence[Pool], times_s: np.ndarray) -> np.ndarray:
    """The whole deployment's power at each instant of ``times_s`` (a pass covers [start, end)).

    Independent of :func:`run_energy_j`'s bookkeeping: it looks up, per replica, which pass (if
    any) runs at each instant, so integrating it over the window checks the energy total.
    """
    times = np.asarray(times_s, float)
    watts = np.zeros(len(times))
    for pool in pools:
        if pool.power is None:
            return np.full(len(times), np.nan)
        rows = pool.rows(iterations)
        pass_w = pool.power.pass_watts(pool.work.mfu(rows), pool.work.mbu(rows))
        replica = rows["replica"].to_numpy()
        stage = rows["stage"].to_numpy() if pool.stages > 1 else np.zeros(len(rows), dtype=np.int64)
        for rid in pool.replicas:
            for s in range(pool.stages):  # a stage's GPUs run its rows; the stages overlap in time
                mine = (replica == rid) & (stage == s)
                watts += pool.gpus_per_row * _replica_watts(rows.loc[mine], pass_w[mine], pool.power.idle_w, times)
    return watts


def energy_cost_stats(
    requests: pd.DataFrame,
    iterations: pd.DataFrame,
    completed: np.ndarray,
    pools: Sequence[Pool] | None,
    window_s: float,
    input_price_ratio: float = 0.0,
) -> dict[str, float]:
    """The ``ENERGY_COLUMNS`` of one run (NaN where the pools, power or prices are unknown).

    Args:
        requests: the run's requests (``output_tokens``; ``prompt_tokens`` when priced).
        iterations: every pass of the run (``replica``, ``duration_s`` and ``PassWork.REQUIRED_COLUMNS``).
        completed: which requests completed.
        pools: the deployment's pools; None gives all-NaN columns.
        window_s: the run window D.
        input_price_ratio: r, the price of an input token in output tokens.
    """
    stats = dict.fromkeys(ENERGY_COLUMNS, math.nan)
    if not pools or not window_s > 0:
        return stats
    output_tokens = float(requests["output_tokens"].to_numpy()[completed].sum())
    prompt_tokens = float(requests["prompt_tokens"].to_numpy()[completed].sum()) if "prompt_tokens" in requests else 0.0
    energy_j = run_energy_j(iterations, pools, window_s)
    done = int(np.count_nonzero(completed))
    fleet_usd_per_hour = sum(pool.num_gpus * pool.usd_per_gpu_hour for pool in pools)
    billed_tokens = output_tokens + input_price_ratio * prompt_tokens
    usd = fleet_usd_per_hour * window_s / _SECONDS_PER_HOUR
    per_mtok = 1e6 * usd / billed_tokens if billed_tokens > 0 else math.nan
    stats.update(
        energy_j=energy_j,
        power_w=energy_j / window_s,
        joules_per_token=energy_j / output_tokens if output_tokens > 0 else math.nan,
        joules_per_request=energy_j / done if done else math.nan,
        fleet_usd_per_hour=fleet_usd_per_hour,
        usd_per_mtok=per_mtok,
        usd_per_mtok_input=input_price_ratio * per_mtok,
    )
    return stats


def _chunk_energy_j(rows: pd.DataFrame, pool: Pool) -> np.ndarray:
    assert pool.power is not None
    watts = pool.power.pass_watts(pool.work.mfu(rows), pool.work.mbu(rows))
    return watts * pool.gpus_per_row * rows["duration_s"].to_numpy(dtype=float)


def _replica_watts(rows: pd.DataFrame, pass_w: np.ndarray, idle_w: float, times: np.ndarray) -> np.ndarray:
    """One GPU of one replica: the running pass's watts at each instant, idle between passes."""
    if not len(rows):
        return np.full(len(times), idle_w)
    running = running_pass(rows, times)
    return np.where(running >= 0, pass_w[np.maximum(running, 0)], idle_w)
