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
anonymous *run* entry of n blocks instead of n keyed entries (:meth:`cache_anonymous`):
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

    __slots__ = ("_refcount", "_lru", "_free_cached", "_last_run", "shared_surplus", "hits_blocks", "evicted_blocks")

    def __init__(self, total_blocks: int, block_size: int) -> None:
        super().__init__(total_blocks, block_size)
        self._refcount: dict[int, int] = {}  # held cached blocks: key -> holders (>= 1)
        # Cached free blocks, eviction order first: key -> 1, or an anonymous run -> its blocks.
        self._lru: OrderedDict[object, int] = OrderedDict()
        self._free_cached = 0  # blocks in _lru (runs count their blocks)
        self._last_run: _AnonymousRun | None = None  # the newest anonymous run (merged into when last)
        self.shared_surplus = 0
        self.hits_blocks = 0
        self.evicted_blocks = 0

    @property
    def cached_free_blocks(self) -> int:
        """Cached blocks no request holds: free, but reusable until evicted."""
        return self._free_cached

    @property
    def held_cached_blocks(self) -> int:
        """Cached blocks held by at least one request."""
        return len(self._refcount)

    def holders(self, key: int) -> int:
        """Requests holding the cached block ``key`` (0: free or not cached)."""
        return self._refcount.get(key, 0)

    def is_cached(self, key: int) -> bool:
        """Whether a block with this key is cached (held or free)."""
        return key in self._refcount or key in self._lru

    def match(self, keys: Sequence[int], limit: int) -> int:
        """Length of the longest run of leading ``keys`` that are cached, at most ``limit``."""
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
        refcount, lru = self._refcount, self._lru
        for key in keys:
            holders = refcount.get(key, 0)
            if holders:
                refcount[key] = holders + 1
                self.shared_surplus += 1
            elif key in lru:
                del lru[key]
                refcount[key] = 1
                self.used_blocks += 1
                self._free_cached -= 1
            else:
                raise KVOverflowError(f"block {key} is not cached")
        self.hits_blocks += len(keys)

    def evictions_for(self, blocks: int) -> int:
        """Cached free blocks that allocating ``blocks`` more blocks now would evict."""
        return max(0, self.used_blocks + blocks + self._free_cached - self.total_blocks)

    def allocate(self, blocks: int) -> None:
        """Take ``blocks`` fresh blocks, evicting least recently freed cached blocks if needed.

        Raises:
            KVOverflowError: they do not fit even with every cached free block evicted.
        """
        used = self.used_blocks + blocks
        if used > self.total_blocks or blocks < 0:
            super().allocate(blocks)  # raises
        self.used_blocks = used
        excess = used + self._free_cached - self.total_blocks
        if excess > 0:
            self._evict(excess)

    def _evict(self, excess: int) -> None:
        self._free_cached -= excess
        self.evicted_blocks += excess
        lru = self._lru
        while excess:
            key = next(iter(lru))
            blocks = lru[key]
            if blocks > excess:  # part of an anonymous run: the rest keeps its place
                lru[key] = blocks - excess
                return
            del lru[key]
            excess -= blocks

    def register(self, keys: Sequence[int]) -> list[int]:
        """A request's own freshly computed blocks become cached under ``keys``.

        Returns:
            The keys now cached with that request as their one holder. A key already cached
            (computed concurrently by another request) is left out: that copy stays private
            to its request, as vLLM keeps duplicates uncached.
        """
        refcount, lru = self._refcount, self._lru
        fresh = [key for key in keys if key not in refcount and key not in lru]
        refcount.update(dict.fromkeys(fresh, 1))
        return fresh

    def unreference(self, keys: Sequence[int]) -> None:
        """A leaving request drops its references, last block first.

        Blocks that lose their last holder become cached free blocks; freeing the tail
        first makes it the first evicted, as vLLM does (a prefix outlives its extensions).
        """
        refcount, lru = self._refcount, self._lru
        for key in reversed(keys):
            holders = refcount[key] - 1
            if holders:
                refcount[key] = holders
                self.shared_surplus -= 1
            else:
                del refcount[key]
                lru[key] = 1
                self.used_blocks -= 1
                self._free_cached += 1

    def cache_anonymous(self, blocks: int) -> None:
        """A leaving request's ``blocks`` used blocks that nobody can hit join the free list as one run.

        They are evicted in LRU order like keyed blocks (so eviction of the others is the
        same as if they had been registered under unique keys), but cost O(1).
        """
        if blocks > 0:
            self.used_blocks -= blocks
            self._free_cached += blocks
            lru = self._lru
            if lru and next(reversed(lru)) is self._last_run:
                lru[self._last_run] += blocks  # adjacent runs merge: still the most recently freed
            else:
                self._last_run = _AnonymousRun()
                lru[self._last_run] = blocks

    def check(self) -> None:
        """Assert the allocator's own invariants (called from the replica audit)."""
        assert self.used_blocks + self._free_cached <= self.total_blocks, "KV used + cached free > capacity"
        assert self._free_cached == sum(self._lru.values()), "cached free count drifted"
        assert len(self._refcount) <= self.used_blocks, "more held cached blocks than used blocks"
        assert self.shared_surplus == sum(self._refcount.values()) - len(self._refcount), "shared surplus drifted"
        assert not any(key in self._lru for key in self._refcount), "a held block is on the free list"


class _AnonymousRun:
    """Key of an anonymous run in the free list: equal only to itself, never to a block key."""

    __slots__ = ()
