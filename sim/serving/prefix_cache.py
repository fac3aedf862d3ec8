"""KV block allocator with automatic prefix caching (vLLM's APC, SGLang's RadixAttention).

A full KV block is identified by a *key*: an integer standing for the hash of (the
previous block's key, the block's tokens), so equal keys mean equal prefixes (see
:mod:`sim.workload.content`). A block whose tokens have been computed is *registered*
under its key; later requests whose prompts start with the same keys reuse it instead of
recomputing and reallocating it. Blocks are reference counted: a block held by running
requests is used; when the last holder leaves, the block stays cached but counts as free.

**One free queue**, as vLLM's ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``):
every free block, cached or not, sits in one queue in the order it was freed (all blocks,
none cached, at the start). An allocation takes blocks off its head
(``BlockPool.get_new_blocks``: ``free_block_queue.popleft_n``), evicting the cached ones
it takes (``_maybe_evict_cached_block``); freed blocks join its tail
(``BlockPool.free_blocks``: ``append_n``); a cache hit on a free block takes it out of the
middle (``BlockPool.touch``: ``free_block_queue.remove``). So a block freed long ago is
evicted before a block freed just now, whether or not either holds cached content.

Counts (the KV invariants the replica state audits):

* ``used_blocks``: physical blocks held by running requests (shared ones once);
* ``cached_free_blocks``: cached blocks nobody holds (free, reusable until evicted);
* ``shared_surplus``: sum over held cached blocks of (holders - 1), so that the blocks
  the requests hold, counted per request, equal ``used_blocks + shared_surplus``;
* every block is used or in the free queue: ``used_blocks + queue blocks == total_blocks``.

Blocks nobody can ever hit (never cached, or cached content no later request can ask
for) keep their place in the queue, so eviction is unchanged, but as one anonymous *run*
entry of n blocks instead of n entries: freeing and evicting them costs O(1) per request
rather than O(blocks). Allocations are counted and taken off the head when the queue is
next read, so runs of allocations and anonymous frees touch no entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

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
        "_refcount", "_queue", "_tail_run", "_pops", "_keyed_free",
        "shared_surplus", "hits_blocks", "evicted_blocks",
    )  # fmt: skip

    def __init__(self, total_blocks: int, block_size: int) -> None:
        super().__init__(total_blocks, block_size)
        self._refcount: dict[int, int] = {}  # held cached blocks: key -> holders (>= 1)
        # The free queue, head first: a cached block's key -> 1, or an anonymous run -> its blocks.
        self._queue: OrderedDict[object, int] = OrderedDict({_AnonymousRun(): total_blocks})
        # Pending changes, applied when the queue is next read (_settle): anonymous blocks freed
        # since the last keyed entry (one run at the tail), and blocks allocated (taken off the
        # head: none of them were freed after the allocation, so the same blocks go).
        self._tail_run = 0
        self._pops = 0
        self._keyed_free = 0  # cached blocks in the queue
        self.shared_surplus = 0
        self.hits_blocks = 0
        self.evicted_blocks = 0

    @property
    def cached_free_blocks(self) -> int:
        """Cached blocks no request holds: free, but reusable until evicted."""
        self._settle()
        return self._keyed_free

    @property
    def empty_blocks(self) -> int:
        """Free blocks at the head of the queue before its first cached one: allocating up to
        this many evicts nothing."""
        self._settle()
        blocks = 0
        for entry, count in self._queue.items():
            if not isinstance(entry, _AnonymousRun):
                break
            blocks += count
        return blocks

    @property
    def refcounts(self) -> dict[int, int]:
        """Held cached blocks: key -> holders (read only)."""
        return self._refcount

    @property
    def queued(self) -> OrderedDict[object, int]:
        """The free queue as it stands, unsettled (read only; :meth:`queue` settles it first)."""
        return self._queue

    @property
    def held_cached_blocks(self) -> int:
        """Cached blocks held by at least one request."""
        return len(self._refcount)

    def holders(self, key: int) -> int:
        """Requests holding the cached block ``key`` (0: free or not cached)."""
        return self._refcount.get(key, 0)

    def is_cached(self, key: int) -> bool:
        """Whether a block with this key is cached (held or free)."""
        self._settle()
        return key in self._refcount or key in self._queue

    def is_free_cached(self, key: int) -> bool:
        """Whether a block with this key is cached and in the free queue (settle first: see ``queue``)."""
        return key in self._queue

    def match(self, keys: Sequence[int], limit: int) -> int:
        """Length of the longest run of leading ``keys`` that are cached, at most ``limit``."""
        self._settle()
        refcount, queue = self._refcount, self._queue
        hits = 0
        for key in keys[:limit]:
            if key not in refcount and key not in queue:
                break
            hits += 1
        return hits

    def acquire(self, keys: Sequence[int]) -> None:
        """A request takes a reference on each cached block in ``keys`` (a prefix hit).

        A free cached block leaves the queue and becomes used; a held one gains a holder.

        Raises:
            KVOverflowError: a key is not cached (the caller should have matched first).
        """
        self._settle()
        refcount, queue = self._refcount, self._queue
        shared = taken = 0  # counted here, added once: a long prompt hits hundreds of blocks
        for key in keys:
            holders = refcount.get(key, 0)
            if holders:
                refcount[key] = holders + 1
                shared += 1
            elif key in queue:
                del queue[key]
                refcount[key] = 1
                taken += 1
            else:
                raise KVOverflowError(f"block {key} is not cached")
        self.shared_surplus += shared
        self.used_blocks += taken
        self._keyed_free -= taken
        self.hits_blocks += len(keys)

    def allocate(self, blocks: int) -> None:
        """Take ``blocks`` fresh blocks off the head of the free queue, evicting the cached ones.

        Raises:
            KVOverflowError: they do not fit.
        """
        used = self.used_blocks + blocks
        if used > self.total_blocks or blocks < 0:
            super().allocate(blocks)  # raises
        self.used_blocks = used
        self._pops += blocks

    def release(self, blocks: int) -> None:
        """Return ``blocks`` blocks that nobody can hit: they join the tail of the queue (one run)."""
        super().release(blocks)
        self._tail_run += blocks

    def register(self, keys: Sequence[int]) -> list[int]:
        """A request's own freshly computed blocks become cached under ``keys``.

        Returns:
            The keys now cached with that request as their one holder. A key already cached
            (computed concurrently by another request) is left out: that copy stays private
            to its request.
        """
        self._settle()
        refcount, queue = self._refcount, self._queue
        fresh = [key for key in keys if key not in refcount and key not in queue]
        refcount.update(dict.fromkeys(fresh, 1))
        return fresh

    def unreference(self, keys: Sequence[int]) -> None:
        """A leaving request drops its references, last block first.

        Blocks that lose their last holder join the tail of the queue, still cached; freeing the
        tail first makes it the first evicted (``KVCacheManager.free``: "in reverse order so that
        the tail blocks are evicted first").
        """
        if self._tail_run:  # it was freed before these blocks
            self._append_tail_run()
        refcount, queue = self._refcount, self._queue
        shared = freed = 0
        for key in reversed(keys):
            holders = refcount[key] - 1
            if holders:
                refcount[key] = holders
                shared += 1
            else:
                del refcount[key]
                queue[key] = 1
                freed += 1
        self.shared_surplus -= shared
        self.used_blocks -= freed
        self._keyed_free += freed

    def queue(self) -> Iterator[tuple[object, int]]:
        """The free queue from its head: (a cached block's key, 1) or (an anonymous run, its blocks).

        Settled first; valid while nothing changes the allocator (a plan being built reads it).
        """
        self._settle()
        return iter(self._queue.items())

    def settle(self) -> None:
        """Apply the pending allocations and frees to the queue now (what every read does first)."""
        if self._pops or self._tail_run:
            self._settle()

    def _settle(self) -> None:
        """Apply the pending changes: append the anonymous run freed last, then take the allocated
        blocks off the head, evicting the cached ones."""
        if self._tail_run:
            self._append_tail_run()
        pops = self._pops
        if not pops:
            return
        self._pops = 0
        queue, evicted = self._queue, 0
        while pops:
            entry, blocks = queue.popitem(last=False)
            if blocks > pops:  # part of an anonymous run: the rest keeps its place, first
                queue[entry] = blocks - pops
                queue.move_to_end(entry, last=False)
                break
            pops -= blocks
            if not isinstance(entry, _AnonymousRun):
                evicted += 1
        self.evicted_blocks += evicted
        self._keyed_free -= evicted

    def _append_tail_run(self) -> None:
        queue = self._queue
        last = next(reversed(queue), None) if queue else None
        if isinstance(last, _AnonymousRun):  # runs freed one after another are one run
            queue[last] += self._tail_run
        else:
            queue[_AnonymousRun()] = self._tail_run
        self._tail_run = 0

    def check(self) -> None:
        """Assert the allocator's own invariants (called from the replica audit)."""
        self._settle()
        queue = self._queue
        assert self.used_blocks + sum(queue.values()) == self.total_blocks, "KV used + free queue != capacity"
        keyed = sum(1 for entry in queue if not isinstance(entry, _AnonymousRun))
        assert self._keyed_free == keyed, "cached free count drifted"
        assert len(self._refcount) <= self.used_blocks, "more held cached blocks than used blocks"
        assert self.shared_surplus == sum(self._refcount.values()) - len(self._refcount), "shared surplus drifted"
        assert not any(key in queue for key in self._refcount), "a held block is on the free queue"
        assert all(count > 0 for count in queue.values()), "an empty run in the free queue"


class _AnonymousRun:
    """Key of an anonymous run in the free queue: equal only to itself, never to a block key."""

    __slots__ = ()
