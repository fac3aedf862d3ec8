"""KV-cache block allocator of one replica.

Blocks are interchangeable (no prefix sharing; see :mod:`sim.serving.prefix_cache` for the
caching subclass), so the allocator only counts them: it
answers "is there room for n more blocks?" and refuses to go over capacity. Who holds
which blocks, and whom to preempt when there is no room, is decided elsewhere (the
replica state holds per-sequence counts; policies choose victims).
"""

from __future__ import annotations


class KVOverflowError(RuntimeError):
    """An allocation beyond capacity was attempted: an engine bug, never a user error."""


class BlockAllocator:
    """Counts the KV blocks in use on one replica.

    Args:
        total_blocks: capacity in blocks (>= 1).
        block_size: tokens per block (>= 1).
    """

    __slots__ = ("total_blocks", "block_size", "used_blocks")
    shared_surplus = 0
    """Blocks counted once per extra holder (always 0 here: no block is shared)."""

    def __init__(self, total_blocks: int, block_size: int) -> None:
        if total_blocks < 1 or block_size < 1:
            raise ValueError("total_blocks and block_size must be >= 1")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.used_blocks = 0

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any sequence."""
        return self.total_blocks - self.used_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens (ceiling division)."""
        return -(-tokens // self.block_size)

    def can_allocate(self, blocks: int) -> bool:
        """Whether ``blocks`` more blocks fit right now."""
        return blocks <= self.total_blocks - self.used_blocks

    def allocate(self, blocks: int) -> None:
        """Take ``blocks`` blocks.

        Raises:
            KVOverflowError: they do not fit (the caller should have asked first).
        """
        used = self.used_blocks + blocks
        if used > self.total_blocks or blocks < 0:
            raise KVOverflowError(
                f"allocating {blocks} blocks: {self.used_blocks} of {self.total_blocks} in use"
            )
        self.used_blocks = used

    def release(self, blocks: int) -> None:
        """Return ``blocks`` blocks.

        Raises:
            KVOverflowError: more blocks are returned than are in use.
        """
        used = self.used_blocks - blocks
        if used < 0 or blocks < 0:
            raise KVOverflowError(f"releasing {blocks} blocks: only {self.used_blocks} in use")
        self.used_blocks = used
