"""The GPUs a run rents: their pass work, power and price, as :class:`sim.metrics.energy.Pool` s.

A colocated deployment is one pool (every replica of the scenario); a disaggregated one is a
prefill and a decode pool (:func:`sim.disaggregation.disaggregated_pools`). A GPU's price is the
scenario's ``gpu_hour_usd`` when set (one number for all, or a price per GPU type), else the
catalog's (``GPUSpec.usd_per_hour``, sources in :data:`sim.hardware.power.SOURCES`); NaN when
neither is known.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sim.hardware.catalog import GPUSpec
from sim.hardware.power import PowerModel
from sim.metrics.energy import Pool

if TYPE_CHECKING:
    from sim.config import Scenario
    from sim.resolve import ResolvedScenario


def gpu_price(scenario: Scenario, gpu: GPUSpec) -> float:
    """USD per hour of one ``gpu``: the scenario's ``gpu_hour_usd`` (one number for every GPU, or this
    GPU type's entry), else the catalog price, else NaN."""
    price = scenario.gpu_hour_usd
    if isinstance(price, dict):
        price = price.get(gpu.name)
    if price is not None:
        return float(price)
    return gpu.usd_per_hour if gpu.usd_per_hour > 0 else math.nan


def colocated_pools(resolved: ResolvedScenario) -> tuple[Pool, ...]:
    """The scenario's replicas as one pool (replica ids 0..replicas-1, as the engine numbers them)."""
    replicas = resolved.scenario.replicas
    pool = Pool(
        work=resolved.pass_work,
        power=PowerModel.of(resolved.gpu),
        gpus_per_replica=resolved.num_gpus // replicas,
        replicas=tuple(range(replicas)),
        usd_per_gpu_hour=gpu_price(resolved.scenario, resolved.gpu),
        stages=resolved.scenario.pipeline_parallel,
    )
    return (pool,)


def mean_gpu_price(pools: tuple[Pool, ...]) -> float | None:
    """The fleet's USD per GPU-hour averaged over its GPUs (for ``requests_per_usd``); None if unknown."""
    gpus = sum(pool.num_gpus for pool in pools)
    usd = sum(pool.num_gpus * pool.usd_per_gpu_hour for pool in pools)
    return None if not gpus or math.isnan(usd) else usd / gpus
