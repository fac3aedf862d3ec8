"""Tentative KV bookkeeping for one scheduling decision.

While a policy builds its plan it asks "does this still fit?" many times; every yes
must account for the blocks earlier answers already promised. The ledger keeps that
running tally on top of the replica's real state, which it never changes: the engine
applies the finished plan afterwards (and the allocator refuses anything the ledger
got wrong). Policies never do block arithmetic; they only get yes/no answers.
"""

from __future__ import annotations

from typing import Protocol


class LedgerSource(Protocol):
    """What the ledger needs to know about a replica (implemented by ReplicaState)."""

    def free_blocks_now(self) -> int: ...
    def admission_blocks(self, rid: int, tokens: int) -> int: ...
    def extension_blocks(self, rid: int, tokens: int) -> int: ...
    def decode_blocks_needed(self) -> int: ...
    def held_blocks(self, rid: int) -> int: ...
    def crosses_block_next_step(self, rid: int) -> bool: ...


class KVLedger:
    """Yes/no answers about KV room for one plan, remembering what was already promised.

    Args:
        source: the replica whose blocks are being planned.
        total_blocks: its KV capacity.
    """

    def __init__(self, source: LedgerSource, total_blocks: int) -> None:
        self._source = source
        self._total_blocks = total_blocks
        self.free_blocks = 0
        self._taken: dict[int, int] = {}
        self._decode_taken = False
        self._released_crossings = 0

    def reset(self) -> None:
        """Start a new plan from the replica's current state."""
        self.free_blocks = self._source.free_blocks_now()
        if self._taken:
            self._taken.clear()
        self._decode_taken = False
        self._released_crossings = 0

    def try_admit(self, rid: int, tokens: int, keep_free_fraction: float = 0.0) -> bool:
        """Promise room for waiting request ``rid`` to start, computing ``tokens`` tokens now.

        Under reserve memory (static, continuous) this is its whole reservation.
        ``keep_free_fraction`` of the capacity must stay free afterwards (vLLM's watermark).
        """
        blocks = self._source.admission_blocks(rid, tokens)
        if blocks + int(keep_free_fraction * self._total_blocks) > self.free_blocks:
            return False
        return self._take(rid, blocks)

    def try_extend(self, rid: int, tokens: int) -> bool:
        """Promise room for running request ``rid`` to compute ``tokens`` more prompt tokens."""
        return self._take(rid, self._source.extension_blocks(rid, tokens))

    def try_decode_step(self) -> bool:
        """Promise room for every decoding request to append one token (idempotent once yes)."""
        if self._decode_taken:
            return True
        need = self._source.decode_blocks_needed() - self._released_crossings
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self._decode_taken = True
        return True

    def release(self, rid: int) -> None:
        """Count running request ``rid`` as preempted: its blocks and promises come back."""
        source = self._source
        self.free_blocks += source.held_blocks(rid) + self._taken.pop(rid, 0)
        if source.crosses_block_next_step(rid):
            if self._decode_taken:
                self.free_blocks += 1
            else:
                self._released_crossings += 1

    def _take(self, rid: int, blocks: int) -> bool:
        if blocks > self.free_blocks:
            return False
        self.free_blocks -= blocks
        if blocks:
            self._taken[rid] = self._taken.get(rid, 0) + blocks
        return True
