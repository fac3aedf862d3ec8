"""Named random streams: one seed, one independent generator per purpose.

Every source of randomness in a run (arrival gaps, prompt lengths, output lengths,
think times, router tie-breaks, ...) draws from its own stream, named by a string.
Streams are derived from one :class:`numpy.random.SeedSequence` whose spawn key is a
stable digest of the name (SHA-256, not Python's per-process salted ``hash()``), so:

* the same ``(seed, name)`` gives the same numbers in any process, on any machine
  with the same NumPy bit generator (PCG64);
* streams are statistically independent of each other, and drawing more from one
  never shifts another. That is what keeps lengths identical when only the arrival
  rate changes in a sweep (common random numbers).

Nothing here touches the global ``random`` or ``np.random`` state.
"""

from __future__ import annotations

import hashlib

import numpy as np

from sim.errors import UserError

# Words of the name digest used as the spawn key: 4 x 32 bits makes collisions
# between distinct names astronomically unlikely.
_KEY_WORDS = 4


def _name_key(name: str) -> tuple[int, ...]:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return tuple(int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(_KEY_WORDS))


class RandomStreams:
    """Factory of reproducible, independent random generators keyed by name.

    Args:
        seed: the scenario seed (a non-negative integer).

    Raises:
        UserError: the seed is negative or not an integer.

    Example:
        >>> streams = RandomStreams(42)
        >>> gaps_s = streams.generator("arrivals").exponential(0.5, size=3)
    """

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise UserError(f"seed must be a non-negative integer, got {seed!r}", field="seed")
        self._seed = int(seed)

    @property
    def seed(self) -> int:
        """The seed every stream is derived from."""
        return self._seed

    def generator(self, name: str) -> np.random.Generator:
        """A new generator positioned at the start of stream ``name``.

        Each call returns a fresh generator, so two calls with the same name yield the
        same numbers; keep the returned object to draw a longer sequence.

        Args:
            name: purpose of the stream, e.g. ``"arrivals"`` or ``"output_tokens"``.
        """
        sequence = np.random.SeedSequence(entropy=self._seed, spawn_key=_name_key(name))
        return np.random.Generator(np.random.PCG64(sequence))

    def __repr__(self) -> str:
        return f"RandomStreams(seed={self._seed})"
