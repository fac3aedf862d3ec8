"""The prefix-caching allocator against a plain eager model of its free queue.

The allocator keeps anonymous blocks as runs and takes allocated blocks off the head of its
queue only when the queue is next read; the model is a list of blocks (a key or None),
evicted from the head at once, as vLLM's ``FreeKVCacheBlockQueue``. Random sequences of
requests taking shared prefixes or computing blocks without a lookup, growing, leaving
(keyed, or with every block anonymous) must give the same answers to every query: hits,
cached or not, fresh registrations, counts.
"""

from __future__ import annotations

from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.prefix_cache import PrefixCacheAllocator


class EagerModel:
    """The free queue as a Python list of blocks (a key, or None for a block nobody can hit), head first."""

    def __init__(self, total: int) -> None:
        self.total, self.used, self.evicted = total, 0, 0
        self.refcount: dict[int, int] = {}
        self.queue: list[int | None] = [None] * total

    def free_cached(self) -> int:
        return sum(1 for key in self.queue if key is not None)

    def cached(self, key: int) -> bool:
        return key in self.refcount or key in self.queue

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
                self.queue.remove(key)
                self.refcount[key] = 1
                self.used += 1

    def allocate(self, blocks: int) -> None:
        self.used += blocks
        taken, self.queue = self.queue[:blocks], self.queue[blocks:]
        self.evicted += sum(1 for key in taken if key is not None)

    def register(self, keys: list[int]) -> list[int]:
        fresh = [k for k in keys if not self.cached(k)]
        self.refcount.update(dict.fromkeys(fresh, 1))
        return fresh

    def unreference(self, keys: list[int]) -> None:
        for key in reversed(keys):
            self.refcount[key] -= 1
            if not self.refcount[key]:
                del self.refcount[key]
                self.queue.append(key)
                self.used -= 1

    def release(self, blocks: int) -> None:
        self.used -= blocks
        self.queue += [None] * blocks


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
            if op == "anonymous":  # its cached blocks first, then its private ones
                cache.unreference(refs)
                model.unreference(refs)
                cache.release(private)
                model.release(private)
            else:  # tail first: its private blocks, then its cached ones, last first
                cache.release(private)
                model.release(private)
                cache.unreference(refs)
                model.unreference(refs)
        assert (cache.used_blocks, cache.cached_free_blocks, cache.evicted_blocks, cache.empty_blocks) == (
            model.used,
            model.free_cached(),
            model.evicted,
            next((i for i, key in enumerate(model.queue) if key is not None), len(model.queue)),
        )
    cache.check()
