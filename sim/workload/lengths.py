"""Token-length distributions for prompts and outputs.

Each ``kind`` of :data:`sim.config.Length` maps to one builder in :data:`LENGTH_KINDS`,
which turns the config into a :class:`LengthSampler`: a vectorised draw plus the
largest value the distribution can produce (the default ``max_output_tokens``).
Every draw is an int64 array with values in ``[min, max]`` (and so >= 1):

* ``fixed``: always ``value``.
* ``uniform``: integers on ``[low, high]``, both ends inclusive.
* ``normal``: ``N(mean, std)`` rounded to the nearest integer, then clipped to ``[min, max]``.
* ``lognormal``: ``median * exp(sigma * Z)`` (so ``median = exp(mu)``), rounded, clipped.
* ``zipf``: ``min - 1 + K`` with ``K ~ Zipf(a)`` from NumPy (support 1, 2, ...), so the
  power law starts at ``min`` (its most likely value) rather than piling up there;
  values above ``max`` are clipped to ``max``, the way ``max_tokens`` cuts a long
  generation short. With the default ``min: 1`` this is NumPy's Zipf clipped at ``max``.
* ``empirical``: resampled with replacement from a CSV column (a path or a registered
  trace name), each value clipped to ``[min, max]`` (``max`` defaults to the column's
  maximum).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.config import (
    EmpiricalLength,
    FixedLength,
    Length,
    LognormalLength,
    NormalLength,
    UniformLength,
    ZipfLength,
)
from sim.errors import UserError
from sim.workload.traces import load_token_column

Draw = Callable[[np.random.Generator, int], np.ndarray]


@dataclass(frozen=True)
class LengthSampler:
    """A length distribution ready to draw from.

    Attributes:
        upper_bound_tokens: the largest value ``sample`` can return.
        draw: ``draw(rng, n)`` -> int64 array of n token counts.
    """

    upper_bound_tokens: int
    draw: Draw

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` token counts (int64, within the distribution's clamps) from ``rng``."""
        return self.draw(rng, n)


def make_length_sampler(
    config: Length, base_dir: str | None = None, field: str = "tokens"
) -> LengthSampler:
    """Build the sampler for one length config.

    Args:
        config: a length distribution from the scenario (any ``kind``).
        base_dir: folder of the scenario file, for relative ``empirical`` paths.
        field: dotted name of the config in the scenario, used in error messages,
            e.g. ``"workload.output_tokens"``.

    Raises:
        UserError: an empirical file or column is missing or corrupt, or its clamps are
            inconsistent.
    """
    try:
        return LENGTH_KINDS[config.kind](config, base_dir)
    except UserError as exc:
        if exc.field is not None:
            raise
        raise type(exc)(str(exc), field=field) from None


def sample_lengths(
    config: Length, n: int, rng: np.random.Generator, base_dir: str | None = None
) -> np.ndarray:
    """Draw ``n`` token counts from ``config`` (convenience for one-off draws)."""
    return make_length_sampler(config, base_dir).sample(rng, n)


def _round_clip(values: np.ndarray, low: int, high: int) -> np.ndarray:
    # Clip before casting: a lognormal tail can be inf, which has no int64 value.
    return np.clip(np.rint(values), low, high).astype(np.int64)


def _fixed(config: FixedLength, base_dir: str | None) -> LengthSampler:
    return LengthSampler(config.value, lambda rng, n: np.full(n, config.value, dtype=np.int64))


def _uniform(config: UniformLength, base_dir: str | None) -> LengthSampler:
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(config.low, config.high, size=n, endpoint=True, dtype=np.int64)

    return LengthSampler(config.high, draw)


def _normal(config: NormalLength, base_dir: str | None) -> LengthSampler:
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return _round_clip(rng.normal(config.mean, config.std, size=n), config.min, config.max)

    return LengthSampler(config.max, draw)


def _lognormal(config: LognormalLength, base_dir: str | None) -> LengthSampler:
    mu = float(np.log(config.median))

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return _round_clip(rng.lognormal(mu, config.sigma, size=n), config.min, config.max)

    return LengthSampler(config.max, draw)


def _zipf(config: ZipfLength, base_dir: str | None) -> LengthSampler:
    span = config.max - config.min + 1

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        # Clip the rank before shifting: NumPy's Zipf can return values near 2**63.
        ranks = np.minimum(rng.zipf(config.a, size=n), span)
        return (ranks + (config.min - 1)).astype(np.int64)

    return LengthSampler(config.max, draw)


def _empirical(config: EmpiricalLength, base_dir: str | None) -> LengthSampler:
    values = load_token_column(config.path, config.column, base_dir)
    top = config.max if config.max is not None else max(int(values.max()), config.min)
    if top < config.min:
        raise UserError(f"max ({top}) must be >= min ({config.min})")
    pool = np.clip(values, config.min, top)

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return pool[rng.integers(0, len(pool), size=n)]

    return LengthSampler(top, draw)


# One explicit table: adding a length kind means a config class and one entry here.
LENGTH_KINDS: dict[str, Callable[..., LengthSampler]] = {
    "fixed": _fixed,
    "uniform": _uniform,
    "normal": _normal,
    "lognormal": _lognormal,
    "zipf": _zipf,
    "empirical": _empirical,
}
