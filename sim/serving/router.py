"""Routers: which replica a (re)sent request goes to.

One explicit table, ``ROUTERS``. Routers read replica state but change nothing.
``least_outstanding`` counts each replica's queued and running work in tokens still to
compute or generate; it knows output lengths exactly (a simulator's oracle; a real
router would estimate them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sim.errors import UserError, did_you_mean
from sim.rng import RandomStreams
from sim.serving.prefix_router import prefix_affinity


class Outstanding(Protocol):
    """A replica as the router sees it."""

    outstanding_tokens: int


Router = Callable[[], int]
"""Returns the replica index for the next request."""


def round_robin(replicas: Sequence[Outstanding], seed: int) -> Router:
    """Replicas in turn: 0, 1, ..., n-1, 0, ..."""
    count = len(replicas)
    turn = [-1]

    def route() -> int:
        turn[0] = (turn[0] + 1) % count
        return turn[0]

    return route


def least_outstanding(replicas: Sequence[Outstanding], seed: int) -> Router:
    """The replica with the fewest queued + running tokens left (lowest index on ties)."""
    indices = range(len(replicas))
    return lambda: min(indices, key=lambda i: replicas[i].outstanding_tokens)


def uniform_random(replicas: Sequence[Outstanding], seed: int, draw_size: int = 4096) -> Router:
    """A uniformly random replica from the seeded ``"router"`` stream (drawn in blocks)."""
    rng = RandomStreams(seed).generator("router")
    count = len(replicas)
    pending: list[int] = []

    def route() -> int:
        if not pending:
            pending.extend(rng.integers(0, count, size=draw_size)[::-1].tolist())
        return pending.pop()

    return route


ROUTERS: dict[str, Callable[[Sequence[Outstanding], int], Any]] = {
    "round_robin": round_robin,
    "least_outstanding": least_outstanding,
    "random": uniform_random,
    "prefix_affinity": prefix_affinity,
}
"""Router name -> factory ``(replicas, seed) -> route``."""


def make_router(kind: str, replicas: Sequence[Outstanding], seed: int, load_cap: float = 1.5) -> Router:
    """Build the router called ``kind`` (``load_cap``: prefix_affinity's, see sim.serving.prefix_router).

    Raises:
        UserError: unknown router name.
    """
    if kind not in ROUTERS:
        raise UserError(
            f"unknown router {kind!r}{did_you_mean(kind, ROUTERS)}; "
            f"choose one of {', '.join(ROUTERS)}",
            field="router",
        )
    if kind == "prefix_affinity":
        return prefix_affinity(replicas, seed, load_cap)  # type: ignore[return-value]  # called with the rid
    return ROUTERS[kind](replicas, seed)
