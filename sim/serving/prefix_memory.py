"""Paged memory with prefix caching: prompt blocks found in the cache are not recomputed.

:class:`PrefixCachedMemory` is a :class:`~sim.serving.memory.PagedMemory` whose allocator
(:class:`~sim.serving.prefix_cache.PrefixCacheAllocator`) caches and shares full blocks,
with three rules, vLLM v1's automatic prefix caching:

* **Admission**: a request starts with the longest run of its leading full prompt blocks
  that is cached (at most ``(tokens - 1) // block_size`` blocks: its last token is always
  computed, ``vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks``). It takes
  references on them; they count as computed tokens, so the policy sees fewer tokens to
  prefill and the ledger fewer blocks to allocate. A hit on a free cached block still
  takes a free block (it stops being evictable); a hit on a held one costs nothing.
  With an EAGLE-style drafter (``drop_last_hit_block``) the last block of every hit is
  dropped and recomputed: the drafter runs one token ahead of the verified prefix, so the
  KV it needs for the last matched block is not in the cache (vLLM's
  ``find_longest_cache_hit(..., use_eagle=True)`` pops it; vllm-project/vllm#51769,
  #53670 measure the hit-rate loss).
* **Registration**: a block becomes cached only at the end of the pass that computed it,
  so no request is served a block another request is still writing. A completed
  request's answer blocks are registered too when its content says what they hold (a
  conversation's next turn repeats them).
* **Release**: a leaving request drops its references; blocks nobody holds stay cached
  and free, evicted LRU when an allocation needs room (:mod:`sim.serving.prefix_cache`).

Preemption planning stays exact: the ledger asks ``freed_by_preempting`` for each
victim, and the memory answers with the blocks that really become free (those no other
holder keeps), remembering the victims so that a joiner's hit on a victim's block is
charged a block.

**Requests without content identity** (a stream with no ``content``: no trace hash ids,
shared prefix or sessions) can only ever hit their own blocks, and only after a
preemption (the recompute re-reads its prompt, as vLLM v1 finds its own freed blocks if
they were not evicted). So until a request is preempted it gets no keys at all: nothing
is looked up, registered or reference counted for it. When it leaves, what it would
have registered (its computed full prompt blocks) goes to the free list as it would
have: a completed request's as one anonymous LRU run (nobody can hit them, but they
still take their place in eviction order), a preempted one's under its unique keys
(:func:`~sim.workload.content.unique_block_keys`), tail first, so its re-admission hits
them exactly as before; from then on it is keyed like any request. Results are the same
as keying every block; the per-pass hooks are O(1) while nothing is keyed.

**Decode-step merging** (:mod:`sim.serving.merge`) works as for paged memory (the
end-of-pass registration only concerns prefill pieces), except that it stops where an
eviction could change what the policy looked up in the cache (:meth:`repeats_allowed`).
"""

from __future__ import annotations

from typing import Any

from sim.serving.memory import Leaving, PagedMemory
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.serving.sequences import PREFILL, Seq
from sim.workload.content import PromptContent, unique_block_keys

_NO_HITS: tuple[list[int], int, int] = ([], 0, 0)  # the lookup of an unkeyed request


class PrefixCachedMemory(PagedMemory):
    """Paged memory whose allocator caches and shares full prompt blocks.

    Args:
        *args: as :class:`~sim.serving.memory.KVMemory` (the allocator a PrefixCacheAllocator).
        whole_prompt: as :class:`~sim.serving.memory.PagedMemory`.
        content: the stream's prompt content identity (None: every request unique).
        drop_last_hit_block: an EAGLE-style drafter runs: every hit loses its last block.
    """

    blocks: PrefixCacheAllocator
    caches_prefixes = True

    def __init__(
        self, *args: Any, whole_prompt: bool = False, content: PromptContent | None = None,
        drop_last_hit_block: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(*args, whole_prompt=whole_prompt)
        if not isinstance(self.blocks, PrefixCacheAllocator):
            raise ValueError("prefix caching needs a PrefixCacheAllocator")
        self._content = content
        self._drop = int(drop_last_hit_block)
        self._cached_column = self._records.cached_prompt_tokens
        self._preemptions = self._records.preemptions
        self._keys: dict[int, list[int]] = {}  # running request -> its full blocks' keys
        self._refs: dict[int, list[int]] = {}  # running request -> cached blocks it references
        self._registered: dict[int, int] = {}  # running request -> blocks considered for registration
        self._peek: dict[int, tuple[list[int], int, int]] = {}  # this plan: rid -> (keys, hits, blocks hits take)
        self._victim_refs: dict[int, int] = {}  # this plan's victims: key -> victims holding it
        self._peek_evicted = 0  # the allocator's evicted_blocks when this plan's lookups were made
        self._anonymous = content is None  # requests are unkeyed until preempted (module docstring)
        self._keyed_pending = 0  # with no content: preempted requests not yet gone for good
        self._unkeyed = self._anonymous  # no request here is keyed (module docstring)

    # ------------------------------------------------------------------ planning
    def new_plan(self) -> None:
        """Forget the previous plan's lookups and victims."""
        if self._peek:
            self._peek.clear()
        if self._victim_refs:
            self._victim_refs.clear()

    def queued_cached_tokens(self, rid: int) -> int:
        """The cached prefix queued request ``rid`` would start with."""
        if self._unkeyed or (self._anonymous and not self._preemptions[rid]):
            return 0
        return self._lookup(rid)[1] * self.blocks.block_size

    def cached_prefix_blocks(self, rid: int) -> int:
        """Leading blocks of ``rid``'s prompt cached here now (what a cache-aware router asks)."""
        if self._anonymous and not self._preemptions[rid]:
            return 0
        keys = self.request_keys(rid)
        return self._hits(keys, self._hit_limit(rid, len(keys)))

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """New blocks for the uncached part, plus cached hits that stop being free."""
        if self._unkeyed and not self.whole_prompt:  # no hits: paged memory's answer
            return self.blocks_for(tokens)
        _, hits, taken = self._lookup(rid)
        size = self.blocks.block_size
        if self.whole_prompt:
            recompute = int(self._prompt[rid]) + int(self._records.generated_tokens[rid])
            return self.blocks_for(recompute) - hits + taken
        return self.blocks_for(hits * size + tokens) - hits + taken

    def freed_by_preempting(self, seq: Seq) -> int:
        """Blocks that become free if ``seq`` is preempted: those no other holder keeps."""
        if self._unkeyed:
            return self.held(seq)
        self._peek.clear()  # a joiner looked up before this victim would miscount its hits
        refs = self._refs.get(seq.rid)
        if not refs:  # nothing shared (an unkeyed request's blocks are all its own)
            return self.held(seq)
        blocks, victims = self.blocks, self._victim_refs
        kept = 0
        for key in refs:
            held_elsewhere = blocks.holders(key) - victims.get(key, 0) > 1
            kept += held_elsewhere
            victims[key] = victims.get(key, 0) + 1
        return self.held(seq) - kept

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

    def _hits(self, keys: list[int], limit: int) -> int:
        """Cached leading blocks that count as computed (less the drafter's dropped block)."""
        return max(0, self.blocks.match(keys, limit) - self._drop)

    def _lookup(self, rid: int) -> tuple[list[int], int, int]:
        """(keys, cached leading blocks, of those the ones that take a free block) for a queued rid."""
        if self._anonymous and not self._preemptions[rid]:
            return _NO_HITS
        found = self._peek.get(rid)
        if found is None:
            keys = self.request_keys(rid)
            hits = self._hits(keys, self._hit_limit(rid, len(keys)))
            blocks, victims = self.blocks, self._victim_refs
            taken = sum(1 for key in keys[:hits] if blocks.holders(key) - victims.get(key, 0) <= 0)
            if not self._peek:  # the plan's first lookup: what the cache looked like for all of them
                self._peek_evicted = blocks.evicted_blocks
            found = self._peek[rid] = (keys, hits, taken)
        return found

    # ------------------------------------------------------------------ merging guards
    def repeats_allowed(self) -> bool:
        """None once the cache the plan's lookups saw has changed.

        A merged pass skips the policy, so the policy must have nothing new to see. In a pure
        decode span nothing is registered, acquired or released, but the decode steps'
        allocations may evict cached free blocks, shortening a queued request's hit run. A
        chunk cut by the token budget then starts earlier and needs as many new blocks, but
        each evicted hit stops taking a free block: its need falls as fast as the free
        blocks, and as the decode steps' own needs vary it can fit at a later step (found by
        search; tests/test_prefix_merge.py). So passes merge while the plan looked nothing
        up, or nothing was evicted since its lookups (and, :meth:`span_free_blocks`, the
        repeats evict nothing).
        """
        return not (self._peek and self.blocks.evicted_blocks != self._peek_evicted)

    def span_free_blocks(self) -> int:
        """All free blocks while the plan looked nothing up; else only the empty ones (no eviction)."""
        return self.blocks.empty_blocks if self._peek else self.blocks.free_blocks

    # ------------------------------------------------------------------ transitions
    def admit(self, seq: Seq) -> int:
        """Take references on the cached prefix; it counts as computed."""
        if self._unkeyed:  # an unkeyed admission caches nothing: its column stays 0
            return 0
        rid = seq.rid
        found = self._lookup(rid)
        if found is _NO_HITS:  # unkeyed: nothing cached, nothing to track
            self._cached_column[rid] = 0
            return 0
        keys, hits, _ = found
        hit_keys = keys[:hits]
        self.blocks.acquire(hit_keys)
        self._keys[rid], self._refs[rid], self._registered[rid] = keys, hit_keys, hits
        cached = hits * self.blocks.block_size
        seq.computed_tokens = cached
        seq.blocks = hits
        if self._preemptions[rid] == 0:
            self._cached_column[rid] = cached
        return cached  # a whole-prompt grant is allocated by grant(), after every joiner's hits

    def pass_ended(self, pieces: list[tuple[int, int]], running: dict[int, Seq]) -> None:
        """Register the blocks this pass's prefill pieces completed."""
        if pieces and self._keys:
            keyed = self._keys
            for rid, _ in pieces:
                seq = running.get(rid)
                if seq is not None and seq.phase == PREFILL and rid in keyed:
                    self._register(rid, seq.computed_tokens)

    def _register(self, rid: int, computed_tokens: int) -> None:
        keys, start = self._keys[rid], self._registered[rid]
        stop = min(len(keys), computed_tokens // self.blocks.block_size)
        if stop <= start:
            return
        self._refs[rid].extend(self.blocks.register(keys[start:stop]))
        self._registered[rid] = stop

    def release(self, seq: Seq, why: Leaving) -> None:
        """Drop ``seq``'s references (a completed one first caches its answer)."""
        rid = seq.rid
        if rid not in self._keys:
            self._release_unkeyed(seq, why)
            return
        if why is Leaving.COMPLETED:
            self._register(rid, seq.prompt_tokens + seq.output_tokens - 1)
        held = self.held(seq)
        refs = self._refs.pop(rid)
        del self._keys[rid], self._registered[rid]
        self.blocks.unreference(refs)
        self.blocks.release(held - len(refs))
        if self._anonymous and why is not Leaving.PREEMPTED:  # gone for good
            self._keyed_gone()

    def _release_unkeyed(self, seq: Seq, why: Leaving) -> None:
        """Free an unkeyed request's blocks as if its computed full prompt blocks had been registered."""
        blocks, full = self.blocks, seq.prompt_tokens // self.blocks.block_size
        if why is Leaving.COMPLETED or why is Leaving.HANDED_OFF:  # every full prompt block computed
            blocks.free_anonymous(self.held(seq), full)  # nobody can hit them
        else:
            self._free_unkeyed_part(seq, full, why is Leaving.PREEMPTED)

    def _free_unkeyed_part(self, seq: Seq, full: int, preempted: bool) -> None:
        """A preempted (or cancelled) request's computed full prompt blocks get their keys: its
        re-admission may hit them; a preempted one comes back keyed."""
        rid, blocks = seq.rid, self.blocks
        registered = min(full, seq.computed_tokens // blocks.block_size) if seq.phase == PREFILL else full
        held = self.held(seq)
        blocks.unreference(blocks.register(unique_block_keys(rid, seq.prompt_tokens, blocks.block_size)[:registered]))
        if preempted:
            self._keyed_pending += 1
            if self._keyed_pending == 1:
                self._unkeyed = False  # a keyed request exists now: look it up
        blocks.release(held - registered)

    # ------------------------------------------------------------------ KV arriving from elsewhere
    def incoming_blocks(self, rid: int) -> int:
        """Blocks for the prompt's uncached part, plus cached hits that stop being free.

        The prompt's KV arrives computed, so every full prompt block may hit (vLLM's decode
        instance looks up its own cache first and fetches only the rest: the KV connector's
        ``get_num_new_matched_tokens`` counts from the locally computed tokens).
        """
        _, hits, taken = self._incoming_lookup(rid)
        return self.blocks_for(int(self._prompt[rid])) - hits + taken

    def receive(self, seq: Seq) -> int:
        """Take references on the cached prefix and blocks for the rest; the prefix is not sent."""
        rid = seq.rid
        keys, hits, _ = self._incoming_lookup(rid)
        fresh = self.blocks_for(seq.prompt_tokens) - hits
        self.blocks.acquire(keys[:hits])
        self.blocks.allocate(fresh)
        seq.blocks = hits + fresh
        if keys:  # keyed: it holds its hits and will register the rest when the KV is here
            self._keys[rid], self._refs[rid], self._registered[rid] = keys, keys[:hits], hits
        return hits * self.blocks.block_size

    def arrived(self, seq: Seq) -> None:
        """The prompt's KV is here: its full blocks become cached (a later request may hit them)."""
        super().arrived(seq)
        if seq.rid in self._keys:
            self._register(seq.rid, seq.prompt_tokens)

    def _incoming_lookup(self, rid: int) -> tuple[list[int], int, int]:
        """(keys, cached full prompt blocks, of those the ones that take a free block); no keys at
        all for a request without content identity (nobody here can hold its blocks)."""
        if self._content is None:
            return _NO_HITS
        keys = self._content.block_keys(rid, self.blocks.block_size)
        hits = self.blocks.match(keys, min(len(keys), int(self._prompt[rid]) // self.blocks.block_size))
        taken = sum(1 for key in keys[:hits] if self.blocks.holders(key) == 0)
        return keys, hits, taken

    def forget_queued(self, rid: int) -> None:
        """A queued preempted request that times out may end the keyed mode."""
        if self._anonymous and self._preemptions[rid]:
            self._keyed_gone()

    def _keyed_gone(self) -> None:
        """One preempted request is gone for good; with none left, nothing here is keyed again.

        (A request runs on one replica only, so while this one keys nobody, no request here
        has keys and every lookup is a miss.)
        """
        self._keyed_pending -= 1
        if not self._keyed_pending:
            self._unkeyed = True

    # ------------------------------------------------------------------ audit
    def audit(self, seqs: list[Seq]) -> None:
        """Paged memory's invariants, the allocator's own, and that references match the holders."""
        super().audit(seqs)
        self.blocks.check()
        holders: dict[int, int] = {}
        for refs in self._refs.values():
            for key in refs:
                holders[key] = holders.get(key, 0) + 1
        assert all(self.blocks.holders(k) == n for k, n in holders.items()), "reference counts drifted"
        assert len(holders) == self.blocks.held_cached_blocks, "a cached block is held by no running request"
