"""KV block allocator with automatic prefix caching (vLLM's APC, SGLang's RadixAttention).

A full KV block is identified by a *key*: an integer standing for the hash of (the
previous block's key, the block's tokens), so equal keys mean equal prefixes (see
:mod:`sim.workload.content`). A block whose tokens have been computed is *registered*
under its key; later requests whose prompts start with the same keys reuse it instead of
recomputing and reallocating it. Blocks are reference counted: a block held by running
requests is used; when the last holder leaves, the block stays cached but counts as
free (it sits in an LRU list) and is evicted only when an allocation needs room.

Counts (the KV invariants the replica state audits):

* ``used_blocks``: physical blocks held by running requests (shared ones once);
* ``cached_free_blocks``: cached blocks nobody holds (free, reusable until evicted);
* ``shared_surplus``: sum over held cached blocks of (holders - 1), so that the blocks
  the requests hold, counted per request, equal ``used_blocks + shared_surplus``;
* ``used_blocks + cached_free_blocks <= total_blocks``.

The allocator still only answers yes/no about room; who holds which keys is told to it
by the replica state (:mod:`sim.serving.prefix_state`).

Blocks that no later request can ever hit (a finished request's blocks without content
identity) keep their place in the LRU order, so eviction is unchanged, but as one
anonymous *run* entry of n blocks instead of n keyed entries (:meth:`free_anonymous`):
freeing and evicting them costs O(1) per request rather than O(blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sim.serving.kv_cache import BlockAllocator, KVOverflowError


class PrefixCacheAllocator(BlockAllocator):
    """A :class:`BlockAllocator` whose full blocks can be cached and shared by key.

    Args:
        total_blocks: capacity in blocks (>= 1).
        block_size: tokens per block (>= 1).

    Attributes:
        hits_blocks: blocks ever served from the cache (``acquire``).
        evicted_blocks: cached free blocks evicted to make room.
    """

    __slots__ = (
        "_refcount", "_lru", "_room", "_tail_run", "_settled",
        "shared_surplus", "hits_blocks", "evicted_blocks",
    )  # fmt: skip

    def __init__(self, total_blocks: int, block_size: int) -> None:
        super().__init__(total_blocks, block_size)
        self._refcount: dict[int, int] = {}  # held cached blocks: key -> holders (>= 1)
        # Cached free blocks, eviction order first: key -> 1, or an anonymous run -> its blocks.
        self._lru: OrderedDict[object, int] = OrderedDict()
        # Empty blocks: neither used nor cached (the free list holds total - used - room blocks). Kept
        # rather than the free list's size because it stays small: per-block arithmetic on it
        # allocates no int objects.
        self._room = total_blocks
        # The free list is settled only when read (_settle), so that the per-request and per-block
        # calls of a run without keys touch no entry: anonymous blocks freed since the last keyed
        # entry are one run after all entries, still a count, and the first evicted_blocks -
        # _settled blocks of the list are evicted but still there.
        self._tail_run = 0
        self._settled = 0
        self.shared_surplus = 0
        self.hits_blocks = 0
        self.evicted_blocks = 0

    @property
    def cached_free_blocks(self) -> int:
        """Cached blocks no request holds: free, but reusable until evicted."""
        return self.total_blocks - self.used_blocks - self._room

    @property
    def empty_blocks(self) -> int:
        """Free blocks holding no cached content: allocating up to this many evicts nothing."""
        return self._room

    @property
    def held_cached_blocks(self) -> int:
        """Cached blocks held by at least one request."""
        return len(self._refcount)

    def holders(self, key: int) -> int:
        """Requests holding the cached block ``key`` (0: free or not cached)."""
        return self._refcount.get(key, 0)

    def is_cached(self, key: int) -> bool:
        """Whether a block with this key is cached (held or free)."""
        if self._tail_run or self.evicted_blocks != self._settled:
            self._settle()
        return key in self._refcount or key in self._lru

    def match(self, keys: Sequence[int], limit: int) -> int:
        """Length of the longest run of leading ``keys`` that are cached, at most ``limit``."""
        if self._tail_run or self.evicted_blocks != self._settled:
            self._settle()
        refcount, lru = self._refcount, self._lru
        hits = 0
        for key in keys[:limit]:
            if key not in refcount and key not in lru:
                break
            hits += 1
        return hits

    def acquire(self, keys: Sequence[int]) -> None:
        """A request takes a reference on each cached block in ``keys`` (a prefix hit).

        A free cached block leaves the LRU list and becomes used; a held one gains a holder.

        Raises:
            KVOverflowError: a key is not cached (the caller should have matched first).
        """
        if self._tail_run or self.evicted_blocks != self._settled:
            self._settle()
        refcount, lru = self._refcount, self._lru
        shared = taken = 0  # counted here, added once: a long prompt hits hundreds of blocks
        for key in keys:
            holders = refcount.get(key, 0)
            if holders:
                refcount[key] = holders + 1
                shared += 1
            elif key in lru:
                del lru[key]
                refcount[key] = 1
                taken += 1
            else:
                raise KVOverflowError(f"block {key} is not cached")
        self.shared_surplus += shared
        self.used_blocks += taken  # they leave the free list: no room changes hands
        self.hits_blocks += len(keys)

    def evictions_for(self, blocks: int) -> int:
        """Cached free blocks that allocating ``blocks`` more blocks now would evict."""
        return max(0, blocks - self._room)

    def allocate(self, blocks: int) -> None:
        """Take ``blocks`` fresh blocks, evicting least recently freed cached blocks if needed.

        Raises:
            KVOverflowError: they do not fit even with every cached free block evicted.
        """
        used = self.used_blocks + blocks
        if used > self.total_blocks or blocks < 0:
            super().allocate(blocks)  # raises
        self.used_blocks = used
        room = self._room - blocks
        if room < 0:  # evict the shortfall now; it is taken off the free list when that is next read
            self.evicted_blocks -= room
            room = 0
        self._room = room

    def release(self, blocks: int) -> None:
        """Return ``blocks`` blocks that nobody can hit (they become empty, not cached)."""
        super().release(blocks)
        self._room += blocks

    def _settle(self) -> None:
        """Bring the free list up to date: append the pending anonymous run, then take the
        evictions off its front, oldest first.

        Whatever was freed after an eviction comes after the blocks it took, so the same
        blocks go as if each allocation had evicted at once.
        """
        self._append_tail_run()
        excess, lru = self.evicted_blocks - self._settled, self._lru
        self._settled = self.evicted_blocks
        while excess:
            key, blocks = lru.popitem(last=False)
            if blocks > excess:  # part of an anonymous run: the rest keeps its place, first
                lru[key] = blocks - excess
                lru.move_to_end(key, last=False)
                return
            excess -= blocks

    def register(self, keys: Sequence[int]) -> list[int]:
        """A request's own freshly computed blocks become cached under ``keys``.

        Returns:
            The keys now cached with that request as their one holder. A key already cached
            (computed concurrently by another request) is left out: that copy stays private
            to its request, as vLLM keeps duplicates uncached.
        """
        if self._tail_run or self.evicted_blocks != self._settled:
            self._settle()
        refcount, lru = self._refcount, self._lru
        fresh = [key for key in keys if key not in refcount and key not in lru]
        refcount.update(dict.fromkeys(fresh, 1))
        return fresh

    def unreference(self, keys: Sequence[int]) -> None:
        """A leaving request drops its references, last block first.

        Blocks that lose their last holder become cached free blocks; freeing the tail
        first makes it the first evicted, as vLLM does (a prefix outlives its extensions).
        """
        if self._tail_run:  # it was freed before these blocks
            self._append_tail_run()
        refcount, lru = self._refcount, self._lru
        shared = freed = 0
        for key in reversed(keys):
            holders = refcount[key] - 1
            if holders:
                refcount[key] = holders
                shared += 1
            else:
                del refcount[key]
                lru[key] = 1
                freed += 1
        self.shared_surplus -= shared
        self.used_blocks -= freed  # they join the free list: no room changes hands

    def free_anonymous(self, held: int, cached: int) -> None:
        """A leaving request frees its ``held`` used blocks; ``cached`` of them, that nobody can hit,
        join the free list as one run.

        They are evicted in LRU order like keyed blocks (so eviction of the others is the
        same as if they had been registered under unique keys), but cost O(1): runs freed
        one after another are one count until a keyed block follows them or the list is read.

        Raises:
            KVOverflowError: more blocks are freed than are in use, or more cached than freed.
        """
        used = self.used_blocks - held
        if used < 0 or not 0 <= cached <= held:
            raise KVOverflowError(f"freeing {held} blocks ({cached} cached): only {self.used_blocks} in use")
        self.used_blocks = used
        self._room += held - cached
        self._tail_run += cached

    def _append_tail_run(self) -> None:
        if self._tail_run:
            self._lru[_AnonymousRun()] = self._tail_run
            self._tail_run = 0

    def check(self) -> None:
        """Assert the allocator's own invariants (called from the replica audit)."""
        self._settle()
        assert self._room >= 0, "KV used + cached free > capacity"
        assert self.cached_free_blocks == sum(self._lru.values()), "cached free count drifted"
        assert len(self._refcount) <= self.used_blocks, "more held cached blocks than used blocks"
        assert self.shared_surplus == sum(self._refcount.values()) - len(self._refcount), "shared surplus drifted"
        assert not any(key in self._lru for key in self._refcount), "a held block is on the free list"


class _AnonymousRun:
    """Key of an anonymous run in the free list: equal only to itself, never to a block key."""

    __slots__ = ()
