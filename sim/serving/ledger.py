"""Tentative KV bookkeeping for one scheduling decision.

While a policy builds its plan it asks "does this still fit?" many times; every yes
must account for the blocks earlier answers already promised. The ledger keeps that
running tally on top of the replica's real state, which it never changes: the engine
applies the finished plan afterwards (and the allocator refuses anything the ledger
got wrong). Policies never do block arithmetic; they only get yes/no answers. Each yes is
reported to the source (``planned_*``), in the plan's order: with prefix caching a joiner's
cache hits depend on the allocations granted before it (:mod:`sim.serving.prefix_plan`).
"""

from __future__ import annotations

from typing import Protocol


class LedgerSource(Protocol):
    """What the ledger needs to know about a replica (implemented by ReplicaState)."""

    def free_blocks_now(self) -> int: ...
    def admission_blocks(self, rid: int, tokens: int) -> int: ...
    def extension_blocks(self, rid: int, tokens: int) -> int: ...
    def decode_blocks_needed(self, steps: int = 1) -> int: ...
    def held_blocks(self, rid: int) -> int: ...
    def decode_growth_blocks(self, rid: int, steps: int = 1) -> int: ...
    def planned_pops(self, blocks: int) -> None: ...
    def planned_extension(self, rid: int, tokens: int, blocks: int) -> None: ...
    def planned_admission(self, rid: int, tokens: int) -> None: ...


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
        self._decode_steps = 0  # decode steps promised to every decoding request (0: none yet)
        self._released: list[int] = []  # victims released before the decode promise

    def reset(self, free_blocks: int | None = None) -> None:
        """Start a new plan from the replica's current state (``free_blocks``: its free
        blocks, if the caller has them at hand; else the source is asked)."""
        self.free_blocks = self._source.free_blocks_now() if free_blocks is None else free_blocks
        if self._taken:
            self._taken.clear()
        self._decode_steps = 0
        if self._released:
            self._released.clear()

    def try_admit(self, rid: int, tokens: int, keep_free_fraction: float = 0.0) -> bool:
        """Promise room for waiting request ``rid`` to start, computing ``tokens`` tokens now.

        Under reserve memory (static, continuous) this is its whole reservation.
        ``keep_free_fraction`` of the capacity must stay free afterwards (vLLM's watermark).
        """
        blocks = self._source.admission_blocks(rid, tokens)
        if blocks + int(keep_free_fraction * self._total_blocks) > self.free_blocks:
            return False
        self._take(rid, blocks)
        self._source.planned_admission(rid, tokens)
        return True

    def try_extend(self, rid: int, tokens: int) -> bool:
        """Promise room for running request ``rid`` to compute ``tokens`` more prompt tokens."""
        blocks = self._source.extension_blocks(rid, tokens)
        if not self._take(rid, blocks):
            return False
        self._source.planned_extension(rid, tokens, blocks)
        return True

    def try_decode_step(self) -> bool:
        """Promise room for every decoding request to append one token (idempotent once yes)."""
        if self._decode_steps:
            return True
        return self._promise_decode(1, self._source.decode_blocks_needed())

    def try_decode_steps(self, steps: int) -> bool:
        """Promise room for every decoding request to append ``steps`` tokens, one per step
        (a multi-step block: vLLM's lookahead slots); a request stops growing at its last
        token. Idempotent once yes; one plan asks for one number of steps.
        """
        if steps == 1:
            return self.try_decode_step()
        if self._decode_steps:
            if self._decode_steps != steps:
                raise ValueError(f"decode steps already promised: {self._decode_steps}, asked {steps}")
            return True
        return self._promise_decode(steps, self._source.decode_blocks_needed(steps))

    def _promise_decode(self, steps: int, need: int) -> bool:
        """Take ``need`` blocks, less the growth of victims released so far, if they are free."""
        if self._released:
            source = self._source
            need -= sum(source.decode_growth_blocks(rid, steps) for rid in self._released)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self._decode_steps = steps
        self._source.planned_pops(need)
        return True

    def release(self, rid: int) -> None:
        """Count running request ``rid`` as preempted: its blocks and promises come back."""
        source = self._source
        returned = self._taken.pop(rid, 0)
        if self._decode_steps:
            returned += source.decode_growth_blocks(rid, self._decode_steps)
        else:
            self._released.append(rid)
        self.free_blocks += source.held_blocks(rid) + returned
        if returned:
            source.planned_pops(-returned)

    def _take(self, rid: int, blocks: int) -> bool:
        if blocks > self.free_blocks:
            return False
        self.free_blocks -= blocks
        if blocks:
            self._taken[rid] = self._taken.get(rid, 0) + blocks
        return True
