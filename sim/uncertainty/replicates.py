"""Replicates: the same scenario under K seeds, and the spread of a figure over them.

Replicate 0 runs on the scenario's own seed (a run with one replicate is today's run, unchanged);
replicate k >= 1 on a seed drawn from the named stream ``replicate/<k>`` of the scenario seed
(:mod:`sim.rng`), so replicate k's seed is the same whatever K is and a run with more replicates
extends one with fewer. Within a replicate every policy sees the same requests (common random
numbers, as in any run). A figure's value over K replicates is their mean and its interval
mean +- t(K - 1) s / sqrt(K): it narrows as replicates are added, and is zero-width exactly
where every replicate gave the same figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.errors import UserError
from sim.rng import RandomStreams
from sim.uncertainty.sampling import t_quantile

MAX_REPLICATES = 1000
"""Most replicates one run may ask for."""
MAX_SEED = 2**63 - 1
"""The largest seed a scenario accepts."""


def replicate_seed(seed: int, replicate: int) -> int:
    """The seed of replicate ``replicate`` of a scenario seeded ``seed`` (replicate 0: ``seed`` itself)."""
    if replicate == 0:
        return seed
    generator = RandomStreams(seed).generator(f"replicate/{replicate}")
    return int(generator.integers(0, MAX_SEED, endpoint=True))


def check_replicates(count: int) -> int:
    """``count`` if it is a whole number of replicates in [1, MAX_REPLICATES].

    Raises:
        UserError: (field ``replicates``) otherwise.
    """
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 1 <= count <= MAX_REPLICATES:
        raise UserError(f"{count!r} is not a number of replicates: give a whole number from 1 to {MAX_REPLICATES}",
                        field="replicates")  # fmt: skip
    return int(count)


def replicate_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, lo, hi) of one figure over replicates: mean +- t(K - 1) s / sqrt(K), NaN values dropped.

    One finite value gives zero width (no spread measured); none gives NaN.
    """
    finite = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    if not finite.size:
        return math.nan, math.nan, math.nan
    if np.all(finite == finite[0]):  # no spread (exactly: a float mean of equal values may differ in its last bit)
        return float(finite[0]), float(finite[0]), float(finite[0])
    mean = float(finite.mean())
    half = t_quantile(finite.size - 1) * float(finite.std(ddof=1)) / math.sqrt(finite.size)
    return mean, mean - half, mean + half
