"""A replica state with prefix caching: prompt blocks found in the cache are not recomputed.

:class:`PrefixCacheState` extends :class:`~sim.serving.state.ReplicaState` (paged memory
only) with three rules, vLLM v1's automatic prefix caching:

* **Admission**: a request starts with the longest run of its leading full prompt blocks
  that is cached (at most ``(tokens - 1) // block_size`` blocks: its last token is always
  computed). It takes references on them; they count as computed tokens, so the policy
  sees fewer tokens to prefill and the ledger fewer blocks to allocate. A hit on a free
  cached block still takes a free block (it stops being evictable); a hit on a held one
  costs nothing.
* **Registration**: a block becomes cached only at the end of the pass that computed it,
  so no request is served a block another request is still writing. A completed
  request's answer blocks are registered too when its content says what they hold (a
  conversation's next turn repeats them).
* **Release**: a leaving request drops its references; blocks nobody holds stay cached
  and free, evicted LRU when an allocation needs room (:mod:`sim.serving.prefix_cache`).

Preemption planning stays exact: the ledger asks ``held_blocks`` for each victim, and the
state answers with the blocks that really become free (those no other holder keeps),
remembering the victims so that a joiner's hit on a victim's block is charged a block.
"""

from __future__ import annotations

from bisect import bisect_left
from functools import partial
from typing import Any

from sim.metrics.records import COMPLETED
from sim.policies.base import IterationPlan
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.serving.sequences import PREFILL, Seq
from sim.serving.state import ReplicaState
from sim.workload.content import PromptContent, unique_block_keys


class PrefixCacheState(ReplicaState):
    """Replica state whose KV allocator caches and shares full prompt blocks.

    Args:
        *args, **kwargs: as :class:`ReplicaState` (``reserve_output_tokens`` must be None).
        content: the stream's prompt content identity (None: every request unique).
        cached_tokens: per-request output column for the tokens served from cache at the
            request's first admission.
    """

    blocks: PrefixCacheAllocator

    def __init__(self, *args: Any, content: PromptContent | None, cached_tokens: Any, **kwargs: Any) -> None:
        whole_prompt = kwargs.pop("whole_prompt", False)
        super().__init__(*args, whole_prompt=False, **kwargs)  # the whole-prompt grant is done here
        if self._reserve is not None or not isinstance(self.blocks, PrefixCacheAllocator):
            raise ValueError("prefix caching needs paged memory and a PrefixCacheAllocator")
        self._whole = whole_prompt
        self._content = content
        self._cached_tokens = cached_tokens
        self._keys: dict[int, list[int]] = {}  # running request -> its full blocks' keys
        self._refs: dict[int, list[int]] = {}  # running request -> cached blocks it references
        self._registered: dict[int, int] = {}  # running request -> blocks considered for registration
        self._peek: dict[int, tuple[list[int], int, int]] = {}  # this plan: rid -> (keys, hits, blocks hits take)
        self._victim_refs: dict[int, int] = {}  # this plan's victims: key -> victims holding it

    # ------------------------------------------------------------------ scheduler view
    def view(self, now_s: float) -> ReplicaState:
        """Prepare a decision: forget the previous plan's lookups and victims."""
        if self._peek:
            self._peek.clear()
        if self._victim_refs:
            self._victim_refs.clear()
        return super().view(now_s)

    def tokens_to_prefill(self, rid: int) -> int:
        """As the base, less the cached prefix a queued request would start with."""
        if rid in self.running:
            return super().tokens_to_prefill(rid)
        return super().tokens_to_prefill(rid) - self._lookup(rid)[1] * self.blocks.block_size

    def cached_prefix_blocks(self, rid: int) -> int:
        """Leading blocks of ``rid``'s prompt cached here now (what a cache-aware router asks)."""
        keys = self.request_keys(rid)
        return self.blocks.match(keys, self._hit_limit(rid, len(keys)))

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """New blocks for the uncached part, plus cached hits that stop being free."""
        _, hits, taken = self._lookup(rid)
        size = self.blocks.block_size
        if self._whole:
            return self.blocks.blocks_for(self.tokens_to_prefill(rid) + hits * size) - hits + taken
        return self.blocks.blocks_for(hits * size + tokens) - hits + taken

    def held_blocks(self, rid: int) -> int:
        """Blocks that become free if ``rid`` is preempted (asked by the ledger for each victim)."""
        refs = self._refs.get(rid, ())
        blocks, victims = self.blocks, self._victim_refs
        self._peek.clear()  # a joiner looked up before this victim would miscount its hits
        kept = 0
        for key in refs:
            held_elsewhere = blocks.holders(key) - victims.get(key, 0) > 1
            kept += held_elsewhere
            victims[key] = victims.get(key, 0) + 1
        return super().held_blocks(rid) - kept

    # ------------------------------------------------------------------ lookups
    def request_keys(self, rid: int) -> list[int]:
        """Keys of ``rid``'s full content blocks (unique ones when the stream has no content)."""
        keys = self._keys.get(rid)
        if keys is not None:
            return keys
        if self._content is None:
            return unique_block_keys(rid, int(self._prompt[rid]), self.blocks.block_size)
        return self._content.block_keys(rid, self.blocks.block_size)

    def _hit_limit(self, rid: int, key_count: int) -> int:
        target = int(self._prompt[rid]) + int(self._records.generated_tokens[rid])
        return min(key_count, (target - 1) // self.blocks.block_size)

    def _lookup(self, rid: int) -> tuple[list[int], int, int]:
        """(keys, cached leading blocks, of those the ones that take a free block) for a queued rid."""
        found = self._peek.get(rid)
        if found is None:
            keys = self.request_keys(rid)
            hits = self.blocks.match(keys, self._hit_limit(rid, len(keys)))
            blocks, victims = self.blocks, self._victim_refs
            taken = sum(1 for key in keys[:hits] if blocks.holders(key) - victims.get(key, 0) <= 0)
            found = self._peek[rid] = (keys, hits, taken)
        return found

    # ------------------------------------------------------------------ engine API
    def _prepare_prefills(self, pieces: list[tuple[int, int]], now_s: float) -> None:
        """Admit this pass's joiners before anything is allocated, so no allocation evicts their hits."""
        for rid, _ in pieces:
            if rid not in self.running:
                self._admit(rid, now_s)

    def _admit(self, rid: int, now_s: float) -> Seq:
        keys, hits, _ = self._lookup(rid)
        seq = super()._admit(rid, now_s)
        hit_keys = keys[:hits]
        self.blocks.acquire(hit_keys)
        self._keys[rid], self._refs[rid], self._registered[rid] = keys, hit_keys, hits
        cached = hits * self.blocks.block_size
        seq.computed_tokens = cached
        seq.blocks = hits
        self.outstanding_tokens -= cached
        if self._records.preemptions[rid] == 0:
            self._cached_tokens[rid] = cached
        if self._whole:
            grow = self.blocks.blocks_for(seq.target_tokens) - hits
            self.blocks.allocate(grow)
            seq.blocks += grow
        return seq

    def end(self, plan: IterationPlan, now_s: float) -> list[int]:
        """Register the blocks this pass's prefill pieces completed, then credit the pass."""
        if plan.prefill:
            running = self.running
            for rid, _ in plan.prefill:
                seq = running.get(rid)
                if seq is not None and seq.phase == PREFILL:
                    self._register(rid, seq.computed_tokens)
        return super().end(plan, now_s)

    def _register(self, rid: int, computed_tokens: int) -> None:
        keys, start = self._keys[rid], self._registered[rid]
        stop = min(len(keys), computed_tokens // self.blocks.block_size)
        if stop <= start:
            return
        self._refs[rid].extend(self.blocks.register(keys[start:stop]))
        self._registered[rid] = stop

    def _remove(self, seq: Seq) -> None:
        """Take a sequence out and drop its references (a completed one first caches its answer)."""
        rid = seq.rid
        if self._records.status[rid] == COMPLETED:
            self._register(rid, seq.prompt_tokens + seq.output_tokens - 1)
        held = self._held(seq)
        refs = self._refs.pop(rid)
        del self._keys[rid], self._registered[rid]
        self.blocks.unreference(refs)
        self.blocks.release(held - len(refs))
        self._leave_phase(seq)
        del self.running[rid]
        del self._order[bisect_left(self._order, seq.key)]

    def audit(self, max_queue_recount: int = 4096) -> None:
        """The base invariants, the allocator's own, and that references match the holders."""
        super().audit(max_queue_recount)
        self.blocks.check()
        holders: dict[int, int] = {}
        for refs in self._refs.values():
            for key in refs:
                holders[key] = holders.get(key, 0) + 1
        assert all(self.blocks.holders(k) == n for k, n in holders.items()), "reference counts drifted"
        assert len(holders) == self.blocks.held_cached_blocks, "a cached block is held by no running request"


def prefix_state(stream: Any, records: Any) -> Any:
    """A :class:`PrefixCacheState` factory with the stream's content and the records' column bound."""
    return partial(PrefixCacheState, content=stream.content, cached_tokens=records.cached_prompt_tokens)
