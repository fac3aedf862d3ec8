"""The prefix-caching allocator against a plain eager model of its free list.

The allocator only counts the blocks an allocation evicts and takes them off the front
of its LRU list when the list is next read; the model evicts at once. Random sequences of
requests taking shared prefixes or computing blocks without a lookup, growing, leaving
(keyed or as anonymous runs) must give the same answers to every query: hits, cached or
not, fresh registrations, counts.
"""

from __future__ import annotations

from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.prefix_cache import PrefixCacheAllocator


class EagerModel:
    """Free list as a Python list of [entry, blocks], evicted from the front at each allocation."""

    def __init__(self, total: int) -> None:
        self.total, self.used, self.evicted = total, 0, 0
        self.refcount: dict[int, int] = {}
        self.lru: list[list[object]] = []  # [key or run token, blocks], oldest first
        self.last_run: object | None = None

    def free_cached(self) -> int:
        return sum(int(n) for _, n in self.lru)  # type: ignore[call-overload]

    def cached(self, key: int) -> bool:
        return key in self.refcount or any(entry == key for entry, _ in self.lru)

    def match(self, keys: list[int]) -> int:
        hits = 0
        while hits < len(keys) and self.cached(keys[hits]):
            hits += 1
        return hits

    def acquire(self, keys: list[int]) -> None:
        for key in keys:
            if key in self.refcount:
                self.refcount[key] += 1
            else:
                self.lru = [e for e in self.lru if e[0] != key]
                self.refcount[key] = 1
                self.used += 1

    def allocate(self, blocks: int) -> None:
        self.used += blocks
        excess = self.used + self.free_cached() - self.total
        self.evicted += max(0, excess)
        while excess > 0:
            entry = self.lru[0]
            taken = min(excess, int(entry[1]))  # type: ignore[call-overload]
            entry[1] = int(entry[1]) - taken  # type: ignore[call-overload]
            excess -= taken
            if not entry[1]:
                self.lru.pop(0)

    def register(self, keys: list[int]) -> list[int]:
        fresh = [k for k in keys if not self.cached(k)]
        self.refcount.update(dict.fromkeys(fresh, 1))
        return fresh

    def unreference(self, keys: list[int]) -> None:
        for key in reversed(keys):
            self.refcount[key] -= 1
            if not self.refcount[key]:
                del self.refcount[key]
                self.lru.append([key, 1])
                self.used -= 1

    def free_anonymous(self, held: int, cached: int) -> None:
        self.used -= held
        if cached:
            if self.lru and self.lru[-1][0] is self.last_run:
                self.lru[-1][1] = int(self.lru[-1][1]) + cached  # type: ignore[call-overload]
            else:
                self.last_run = object()
                self.lru.append([self.last_run, cached])


OPS = ["take", "write", "leave", "anonymous", "grow", "probe"]
steps = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 3), st.integers(1, 6)),
    min_size=10,
    max_size=100,
)


@settings(max_examples=examples(5))
@given(steps=steps, total=st.integers(6, 24))
def test_lazy_evictions_answer_as_eager_ones(steps: list[tuple[str, int, int]], total: int) -> None:
    cache, model = PrefixCacheAllocator(total, 16), EagerModel(total)
    held: list[tuple[list[int], int]] = []  # per running request: (referenced keys, private blocks)
    for op, prefix, blocks in steps:
        if op == "probe":
            key = prefix * 100 + blocks % 5
            assert cache.is_cached(key) == model.cached(key)
        elif op == "take":
            keys = [prefix * 100 + j for j in range(blocks)]
            hits = cache.match(keys, len(keys))
            assert hits == model.match(keys)
            taking = sum(1 for k in keys[:hits] if cache.holders(k) == 0)
            if taking + blocks - hits > cache.free_blocks:
                continue
            cache.acquire(keys[:hits])
            model.acquire(keys[:hits])
            cache.allocate(blocks - hits)
            model.allocate(blocks - hits)
            fresh = cache.register(keys[hits:])
            assert fresh == model.register(keys[hits:])
            held.append((keys[:hits] + fresh, blocks - hits - len(fresh)))
        elif op == "write" and blocks <= cache.free_blocks:  # computed without a lookup (a concurrent copy)
            keys = [prefix * 100 + j for j in range(blocks)]
            cache.allocate(blocks)
            model.allocate(blocks)
            fresh = cache.register(keys)  # right after the allocation: reads the unsettled list
            assert fresh == model.register(keys)
            held.append((fresh, blocks - len(fresh)))
        elif op == "grow" and held and blocks <= cache.free_blocks:  # a decode step's new blocks
            refs, private = held.pop(prefix % len(held))
            cache.allocate(blocks)
            model.allocate(blocks)
            held.append((refs, private + blocks))
        elif op in ("leave", "anonymous") and held:
            refs, private = held.pop(prefix % len(held))
            cache.unreference(refs)
            model.unreference(refs)
            if op == "anonymous":  # its private blocks join the free list as one run
                cache.free_anonymous(private, private)
                model.free_anonymous(private, private)
            else:
                cache.release(private)
                model.free_anonymous(private, 0)
        assert (cache.used_blocks, cache.cached_free_blocks, cache.evicted_blocks) == (
            model.used,
            model.free_cached(),
            model.evicted,
        )
    cache.check()
