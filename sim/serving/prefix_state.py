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

**Decode-step merging** (:mod:`sim.serving.merge`) works as for the base state (the
end-of-pass registration only concerns prefill pieces), except that it stops where an
eviction could change what the policy looked up in the cache (:meth:`repeatable_decodes`).
"""

from __future__ import annotations

from bisect import bisect_left
from functools import partial
from typing import Any

from sim.metrics.records import COMPLETED, RUNNING, WAITING
from sim.policies.base import IterationPlan
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.serving.sequences import PREFILL, Seq
from sim.serving.state import ReplicaState
from sim.workload.content import PromptContent, unique_block_keys

# The base class's hooks as plain functions for the overrides that run once per pass or per
# admission: CPython 3.11 looks ``super().name`` and ``ReplicaState.name`` up on every call.
_base_view = ReplicaState.view
_base_end = ReplicaState.end
_base_repeatable_decodes = ReplicaState.repeatable_decodes
_base_tokens_to_prefill = ReplicaState.tokens_to_prefill
_base_held_blocks = ReplicaState.held_blocks
_base_admit = ReplicaState._admit


class PrefixCacheState(ReplicaState):
    """Replica state whose KV allocator caches and shares full prompt blocks.

    Args:
        *args, **kwargs: as :class:`ReplicaState` (``reserve_output_tokens`` must be None).
        content: the stream's prompt content identity (None: every request unique).
        cached_tokens: per-request output column for the tokens served from cache at the
            request's first admission.
    """

    blocks: PrefixCacheAllocator
    # Slots keep the instance dict to the base class's attributes: CPython 3.11 shares the keys of
    # at most 30 instance attributes, and its call sites cache method lookups only when they are shared.
    __slots__ = (
        "_whole", "_content", "_cached_tokens", "_keys", "_refs", "_registered", "_peek", "_victim_refs",
        "_peek_evicted", "_anonymous", "_preemptions", "_keyed_pending", "_unkeyed",
    )  # fmt: skip

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
        self._peek_evicted = 0  # the allocator's evicted_blocks when this plan's lookups were made
        self._anonymous = content is None  # requests are unkeyed until preempted (module docstring)
        self._preemptions = self._records.preemptions
        self._keyed_pending = 0  # with no content: preempted requests not yet gone for good
        self._unkeyed = self._anonymous  # no request here is keyed (module docstring)

    def _unkeyed_mode(self, on: bool) -> None:
        """While no request here is keyed, the per-pass and per-admission hooks go straight to
        the base class, so a run without content identity pays next to nothing per pass.

        It ends with the first preemption (the victim gets keys) and returns once every
        preempted request has completed or gone. (A request runs on one replica only, so
        while this one keys nobody, no request here has keys and every lookup is a miss.)
        """
        self._unkeyed = on

    def abandon(self, rid: int, now_s: float) -> None:
        """As the base; a queued keyed request that times out may end the keyed mode."""
        queued_keyed = self._anonymous and self._records.status[rid] == WAITING and self._preemptions[rid]
        super().abandon(rid, now_s)
        if queued_keyed:
            self._keyed_gone()

    def _keyed_gone(self) -> None:
        self._keyed_pending -= 1
        if not self._keyed_pending:
            self._unkeyed_mode(True)

    # ------------------------------------------------------------------ scheduler view
    def view(self, now_s: float) -> ReplicaState:
        """Prepare a decision: forget the previous plan's lookups and victims."""
        if self._peek:
            self._peek.clear()
        if self._victim_refs:
            self._victim_refs.clear()
        return _base_view(self, now_s)

    def tokens_to_prefill(self, rid: int) -> int:
        """As the base, less the cached prefix a queued request would start with."""
        if self._unkeyed or rid in self.running or (self._anonymous and not self._preemptions[rid]):
            return _base_tokens_to_prefill(self, rid)
        return _base_tokens_to_prefill(self, rid) - self._lookup(rid)[1] * self.blocks.block_size

    def cached_prefix_blocks(self, rid: int) -> int:
        """Leading blocks of ``rid``'s prompt cached here now (what a cache-aware router asks)."""
        if self._anonymous and not self._preemptions[rid]:
            return 0
        keys = self.request_keys(rid)
        return self.blocks.match(keys, self._hit_limit(rid, len(keys)))

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """New blocks for the uncached part, plus cached hits that stop being free."""
        if self._unkeyed and not self._whole:  # no hits: the base's answer
            return self.blocks.blocks_for(tokens)
        _, hits, taken = self._lookup(rid)
        size = self.blocks.block_size
        if self._whole:
            return self.blocks.blocks_for(self.tokens_to_prefill(rid) + hits * size) - hits + taken
        return self.blocks.blocks_for(hits * size + tokens) - hits + taken

    def held_blocks(self, rid: int) -> int:
        """Blocks that become free if ``rid`` is preempted (asked by the ledger for each victim)."""
        if self._unkeyed:
            return _base_held_blocks(self, rid)
        self._peek.clear()  # a joiner looked up before this victim would miscount its hits
        refs = self._refs.get(rid)
        if not refs:  # nothing shared (an unkeyed request's blocks are all its own)
            return _base_held_blocks(self, rid)
        blocks, victims = self.blocks, self._victim_refs
        kept = 0
        for key in refs:
            held_elsewhere = blocks.holders(key) - victims.get(key, 0) > 1
            kept += held_elsewhere
            victims[key] = victims.get(key, 0) + 1
        return _base_held_blocks(self, rid) - kept

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
        if self._anonymous and not self._preemptions[rid]:
            return _NO_HITS
        found = self._peek.get(rid)
        if found is None:
            keys = self.request_keys(rid)
            hits = self.blocks.match(keys, self._hit_limit(rid, len(keys)))
            blocks, victims = self.blocks, self._victim_refs
            taken = sum(1 for key in keys[:hits] if blocks.holders(key) - victims.get(key, 0) <= 0)
            if not self._peek:  # the plan's first lookup: what the cache looked like for all of them
                self._peek_evicted = blocks.evicted_blocks
            found = self._peek[rid] = (keys, hits, taken)
        return found

    # ------------------------------------------------------------------ decode-step merging
    def repeatable_decodes(self) -> int:
        """As the base, and none once the cache the plan's lookups saw has changed.

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
        if self._peek and self.blocks.evicted_blocks != self._peek_evicted:
            return 0
        return _base_repeatable_decodes(self)

    def span_free_blocks(self) -> int:
        """All free blocks while the plan looked nothing up; else only the empty ones (no eviction)."""
        return self.blocks.empty_blocks if self._peek else self.blocks.free_blocks

    # ------------------------------------------------------------------ engine API
    def _prepare_prefills(self, pieces: list[tuple[int, int]], now_s: float) -> None:
        """Admit this pass's joiners before anything is allocated, so no allocation evicts their hits.

        Every joiner first takes its references (its hit blocks leave the free list), and only
        then are the whole-prompt grants allocated: one joiner's grant evicting the cached
        blocks the next joiner matched at planning would leave that joiner a hit on nothing.
        """
        if self._unkeyed and not self._whole:  # nothing to take, nothing granted here
            return
        running = self.running
        joiners = [self._admit(rid, now_s) for rid, _ in pieces if rid not in running]
        if self._whole:
            blocks = self.blocks
            for seq in joiners:
                grow = blocks.blocks_for(seq.target_tokens) - seq.blocks
                blocks.allocate(grow)
                seq.blocks += grow

    def _admit(self, rid: int, now_s: float) -> Seq:
        if self._unkeyed:  # an unkeyed admission caches nothing: its column stays 0
            return _base_admit(self, rid, now_s)
        found = self._lookup(rid)
        seq = _base_admit(self, rid, now_s)
        if found is _NO_HITS:  # unkeyed: nothing cached, nothing to track
            self._cached_tokens[rid] = 0
            return seq
        keys, hits, _ = found
        hit_keys = keys[:hits]
        self.blocks.acquire(hit_keys)
        self._keys[rid], self._refs[rid], self._registered[rid] = keys, hit_keys, hits
        cached = hits * self.blocks.block_size
        seq.computed_tokens = cached
        seq.blocks = hits
        self.outstanding_tokens -= cached
        if self._records.preemptions[rid] == 0:
            self._cached_tokens[rid] = cached
        return seq  # a whole-prompt grant is allocated by _prepare_prefills, after every joiner's hits

    def end(self, plan: IterationPlan, now_s: float) -> list[int]:
        """Register the blocks this pass's prefill pieces completed, then credit the pass."""
        if plan.prefill and self._keys:
            running, keyed = self.running, self._keys
            for rid, _ in plan.prefill:
                seq = running.get(rid)
                if seq is not None and seq.phase == PREFILL and rid in keyed:
                    self._register(rid, seq.computed_tokens)
        return _base_end(self, plan, now_s)

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
        if rid not in self._keys:
            self._remove_unkeyed(seq)
            return
        if self._records.status[rid] == COMPLETED:
            self._register(rid, seq.prompt_tokens + seq.output_tokens - 1)
        held = self._held(seq)
        refs = self._refs.pop(rid)
        del self._keys[rid], self._registered[rid]
        self.blocks.unreference(refs)
        self.blocks.release(held - len(refs))
        self._forget(seq)
        if self._anonymous and self._records.status[rid] != RUNNING:  # completed or cancelled: gone
            self._keyed_gone()

    def _remove_unkeyed(self, seq: Seq) -> None:
        """Free an unkeyed request's blocks as if its computed full prompt blocks had been registered."""
        blocks, full = self.blocks, seq.prompt_tokens // self.blocks.block_size
        status = self._records.status[seq.rid]
        if status == COMPLETED:  # computed up to its last token: all its full prompt blocks; nobody can hit them
            blocks.free_anonymous(self._held(seq), full)
        else:
            self._free_unkeyed_part(seq, full, status == RUNNING)
        self._forget(seq)

    def _free_unkeyed_part(self, seq: Seq, full: int, preempted: bool) -> None:
        """A preempted (or cancelled) request's computed full prompt blocks get their keys: its
        re-admission may hit them; a preempted one comes back keyed."""
        rid, blocks = seq.rid, self.blocks
        registered = min(full, seq.computed_tokens // blocks.block_size) if seq.phase == PREFILL else full
        held = self._held(seq)
        blocks.unreference(blocks.register(unique_block_keys(rid, seq.prompt_tokens, blocks.block_size)[:registered]))
        if preempted:
            self._keyed_pending += 1
            if self._keyed_pending == 1:
                self._unkeyed_mode(False)
        blocks.release(held - registered)

    def _forget(self, seq: Seq) -> None:
        self._leave_phase(seq)
        del self.running[seq.rid]
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


_NO_HITS: tuple[list[int], int, int] = ([], 0, 0)  # the lookup of an unkeyed request


def prefix_state(stream: Any, records: Any) -> Any:
    """A :class:`PrefixCacheState` factory with the stream's content and the records' column bound."""
    return partial(PrefixCacheState, content=stream.content, cached_tokens=records.cached_prompt_tokens)
