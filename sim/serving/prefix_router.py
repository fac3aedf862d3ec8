"""Cache-aware routing: send a request where the longest prefix of its prompt is cached.

``prefix_affinity`` (SGLang's cache-aware router, Mooncake's KV-centric scheduling, in
their simplest form) asks every replica how many leading blocks of the request's prompt
it caches now and picks the longest; ties go to the replica with the fewest outstanding
tokens. A load cap keeps one hot prefix from piling onto one replica: a replica whose
outstanding tokens exceed ``load_cap`` x the mean plus the request's own tokens is passed
over. Replicas without a prefix cache report no hits, which leaves least-outstanding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class PrefixAffinityRouter:
    """Route by longest cached prefix within a load cap (a router that needs the request id).

    Args:
        replicas: the replica states (read only).
        load_cap: multiple of the mean outstanding tokens above which affinity is ignored.
        request_tokens: prompt + output tokens per request (the slack on top of the cap).
    """

    by_request = True
    """Clients call this router with the request id."""

    def __init__(self, replicas: Sequence[Any], load_cap: float, request_tokens: Any) -> None:
        self._replicas = replicas
        self._load_cap = load_cap
        self._tokens = request_tokens

    def __call__(self, rid: int) -> int:
        """The replica for request ``rid``."""
        replicas = self._replicas
        loads = [r.outstanding_tokens for r in replicas]
        cap = self._load_cap * sum(loads) / len(loads) + int(self._tokens[rid])
        best, best_rank = 0, None
        for index, replica in enumerate(replicas):
            if loads[index] > cap:
                continue
            hits = replica.cached_prefix_blocks(rid) if hasattr(replica, "cached_prefix_blocks") else 0
            rank = (hits, -loads[index])
            if best_rank is None or rank > best_rank:
                best, best_rank = index, rank
        return best


def prefix_affinity(replicas: Sequence[Any], seed: int, load_cap: float = 1.5) -> PrefixAffinityRouter:
    """Factory in the router table's shape (``seed`` unused: the rule is deterministic)."""
    tokens = replicas[0]._prompt + replicas[0]._output if replicas else []
    return PrefixAffinityRouter(replicas, load_cap, tokens)
