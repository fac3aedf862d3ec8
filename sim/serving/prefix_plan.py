"""The prefix cache as the plan being built will have left it, at each point of the plan.

vLLM V1 schedules the running requests first, allocating each one's new blocks as it goes
(``Scheduler.schedule``, RUNNING loop: ``allocate_slots``), and only then looks up each
waiting request's cache hits (WAITING loop: ``get_computed_blocks``, then its own
``allocate_slots``). Every allocation takes blocks off the head of the free queue and
evicts the cached ones among them (``BlockPool.get_new_blocks``), and caches the full
blocks it is about to compute (``cache_blocks``). So a waiting request's hits are what
the allocations scheduled before it left: a decode's new block can evict a block a
resuming request would have hit, and a request can hit blocks a request scheduled
before it in the same step is computing.

batchsim plans first and applies afterwards (``ReplicaState.begin``, in the same order),
so while the policy plans, :class:`PlannedCache` keeps what the plan has done so far: the
blocks it takes off the queue head (``pops``), the free cached blocks earlier joiners hit
(taken out of the queue), the keys its pieces register, and the blocks its victims free
(appended to the queue's tail, in their order). A lookup then asks :meth:`status`, which
walks the queue from its head as far as the plan's allocations reach (once per plan, and
only when a lookup needs it): the cached blocks walked over are the ones the plan evicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sim.serving.prefix_cache import PrefixCacheAllocator

MISS, HELD, FREE = 0, 1, 2
"""A key's state at a point of the plan: not cached, cached and held (a hit costs no block), cached
and free (a hit takes it out of the free queue)."""


class PlannedCache:
    """What the plan being built has done to one replica's prefix cache so far (see the module docstring).

    Args:
        blocks: the replica's allocator; it must not change while a plan is built.
    """

    def __init__(self, blocks: PrefixCacheAllocator) -> None:
        self._blocks = blocks
        self.pops = 0
        self.registered: dict[int, int] = {}  # key -> the running request whose piece caches it
        self._touched: set[int] = set()
        self._victim_refs: dict[int, int] = {}
        self._tail: list[tuple[int | None, int]] = []  # victims' freed blocks: (key or None: anonymous, blocks)
        self._doomed: set[int] = set()
        self._walked = 0
        self._walk: Iterator[tuple[object, int]] | None = None
        self._run_left = 0  # blocks of the anonymous run the walk stopped in
        self._tail_index = 0
        self.doomed_cached = 0  # cached blocks walked over: the plan's evictions so far
        self._settled = False  # the allocator's pending changes applied since the plan began

    def reset(self) -> None:
        """A new plan: nothing done yet (the allocator is settled when a lookup first reads it)."""
        self._settled = False
        self.pops = 0
        if self.registered:
            self.registered.clear()
        if self._touched:
            self._touched.clear()
        if self._victim_refs:
            self._victim_refs.clear()
        if self._tail:
            self._tail.clear()
        self._restart_walk()

    def _restart_walk(self) -> None:
        if self._doomed:
            self._doomed.clear()
        self._walked = self._run_left = self._tail_index = self.doomed_cached = 0
        self._walk = None

    # ------------------------------------------------------------------ what the plan does
    def take(self, blocks: int) -> None:
        """The plan allocates ``blocks`` more blocks (off the queue head)."""
        self.pops += blocks

    def give_back(self, blocks: int) -> None:
        """A victim's allocations are dropped from the plan."""
        self.pops -= blocks
        if self.pops < self._walked:
            self._restart_walk()

    def touch(self, keys: Iterable[int]) -> None:
        """A joiner hits these keys: the free ones leave the queue, all are held from now on."""
        self._touched.update(keys)

    def register(self, rid: int, keys: Iterable[int]) -> None:
        """Request ``rid``'s piece caches these (fresh) keys: held from now on."""
        self.registered.update(dict.fromkeys(keys, rid))

    def victim_holds(self, key: int) -> bool:
        """Count one more victim holding ``key``; whether another holder keeps it."""
        victims = self._victim_refs.get(key, 0) + 1
        self._victim_refs[key] = victims
        return self._blocks.holders(key) > victims

    def victim_frees(self, rid: int, anonymous: int, keys: list[int]) -> None:
        """Victim ``rid`` frees ``anonymous`` blocks nobody can hit, then ``keys`` (in that order)."""
        if anonymous:
            self._tail.append((None, anonymous))
        self._tail.extend((key, 1) for key in keys)
        dropped = [key for key, holder in self.registered.items() if holder == rid]
        for key in dropped:  # its planned piece is dropped with it
            del self.registered[key]

    def _settle(self) -> None:
        """Apply the allocator's changes from before the plan (nothing changes it while the plan is built)."""
        self._blocks.settle()
        self._settled = True

    def evictions(self) -> int:
        """Cached blocks the plan's allocations so far evict."""
        if not self._settled:
            self._settle()
        if self._walked < self.pops:
            self._advance()
        return self.doomed_cached

    # ------------------------------------------------------------------ lookups
    def leading(self, keys: list[int], limit: int) -> list[int]:
        """The statuses (HELD or FREE) of the longest run of leading ``keys`` cached now, at most ``limit``.

        :meth:`status` inlined: a lookup walks a long prompt's keys once per plan.
        """
        if not self._settled:
            self._settle()
        if self._walked < self.pops:
            self._advance()
        blocks = self._blocks
        refcount, queue = blocks.refcounts, blocks.queued
        touched, registered, victims, doomed = self._touched, self.registered, self._victim_refs, self._doomed
        run: list[int] = []
        add = run.append
        for key in keys[:limit]:
            holders = refcount.get(key, 0)
            if holders:
                if not victims or holders > victims.get(key, 0):
                    add(HELD)
                    continue
            elif key not in queue:
                if key in touched or key in registered:
                    add(HELD)
                    continue
                break
            if key in touched:  # a victim's block an earlier joiner hit
                add(HELD)
            elif key in doomed:
                break
            else:
                add(FREE)
        return run

    def fresh(self, keys: list[int]) -> list[int]:
        """Those of ``keys`` not cached at this point of the plan (what a piece registering them caches)."""
        if not self._settled:
            self._settle()
        blocks = self._blocks
        candidates = set(keys)
        cached = (
            (candidates & blocks.refcounts.keys()) | (candidates & blocks.queued.keys())
            | (candidates & self._touched) | (candidates & self.registered.keys())
        )  # fmt: skip
        if not cached:
            return keys
        status = self.status
        return [key for key in keys if key not in cached or status(key) == MISS]

    def status(self, key: int) -> int:
        """MISS, HELD or FREE: ``key`` at this point of the plan."""
        if not self._settled:
            self._settle()
        if key in self._touched or key in self.registered:
            return HELD
        blocks = self._blocks
        holders = blocks.holders(key)
        if holders:
            if holders > self._victim_refs.get(key, 0):
                return HELD
        elif not blocks.is_free_cached(key):
            return MISS
        if self._walked < self.pops:
            self._advance()
        return MISS if key in self._doomed else FREE

    def _advance(self) -> None:
        """Walk the queue (then the victims' freed blocks) from the head as far as the plan's pops."""
        need = self.pops - self._walked
        take = min(need, self._run_left)
        self._run_left -= take
        need -= take
        if need and self._walk is None:
            self._walk = self._blocks.queue()
        touched, doomed, walk = self._touched, self._doomed, self._walk
        if walk is None:  # only when nothing is left to walk (set just above otherwise)
            walk = iter(())
        while need:
            entry = next(walk, None)
            if entry is None:  # past the queue's end: the victims' blocks, freed after it
                entry = self._tail[self._tail_index]
                self._tail_index += 1
            key, blocks = entry
            if blocks == 1 and isinstance(key, int):
                if key in touched:
                    continue
                doomed.add(key)
                self.doomed_cached += 1
                need -= 1
                continue
            take = min(need, blocks)
            self._run_left = blocks - take
            need -= take
        self._walked = self.pops
