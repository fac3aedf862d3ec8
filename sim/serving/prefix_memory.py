"""Paged memory with prefix caching: blocks found in the cache are not recomputed.

:class:`PrefixCachedMemory` is a :class:`~sim.serving.memory.PagedMemory` whose allocator
(:class:`~sim.serving.prefix_cache.PrefixCacheAllocator`: one free queue, cached and empty
blocks together) caches and shares full blocks, as vLLM V1's automatic prefix caching
(``vllm/v1/core/kv_cache_manager.py`` and ``block_pool.py`` at v0.11.0 and v0.15.1):

* **Keys**: every full block of a request's tokens has a key, its generated tokens
  included (vLLM's ``Request.block_hashes`` cover every token). Blocks the stream's
  content describes (:mod:`sim.workload.content`) get its keys; the others, which no other
  request can have (its own prompt tokens, its generated text), get keys unique to the
  request (:func:`~sim.workload.content.unique_block_keys`), so a request preempted and
  resumed can hit its own blocks past its prompt.
* **Admission**: a request starts with the longest run of its leading full blocks that
  is cached (at most ``(tokens - 1) // block_size`` blocks: its last token is always
  computed, ``get_computed_blocks``: ``max_cache_hit_length = request.num_tokens - 1``),
  looked up after the allocations scheduled before it in the same step
  (:mod:`sim.serving.prefix_plan`). It takes references on them; they count as computed
  tokens, so the policy sees fewer tokens to prefill and the ledger fewer blocks to
  allocate. A hit on a free cached block still takes a free block (it leaves the free
  queue, ``BlockPool.touch``); a hit on a held one costs nothing. With an EAGLE-style
  drafter (``drop_last_hit_block``) the last block of every hit is dropped and recomputed:
  the drafter runs one token ahead of the verified prefix (vLLM's
  ``find_longest_cache_hit(..., use_eagle=True)`` pops it; vllm-project/vllm#51769, #53670).
* **Registration**: a piece's full blocks become cached when it is scheduled, as vLLM's
  ``allocate_slots`` caches ``num_computed_tokens + num_new_tokens`` (``cache_blocks``), so a
  request scheduled later in the same step can hit them (the model writes a layer's KV
  before its attention reads it). Blocks only the request itself can ever ask for (unique
  keys) are registered when it leaves instead: nobody can look them up before.
* **Release**: a leaving request frees its blocks tail first (``KVCacheManager.free``: "in
  reverse order so that the tail blocks are evicted first"): its partial last block and
  blocks nobody can hit, then its cached blocks, last first; those nobody else holds join
  the free queue's tail, still cached, until an allocation takes them off its head.

Preemption planning stays exact: the ledger asks ``freed_by_preempting`` for each
victim, and the memory answers with the blocks that really become free (those no other
holder keeps), remembering them as freed at the queue's tail in this plan.

**Requests without content identity** (a stream with no ``content``: no trace hash ids,
shared prefix or sessions) can only ever hit their own blocks, and only after a
preemption (the recompute re-reads its tokens, as vLLM V1 finds its own freed blocks if
they were not evicted). So until a request is preempted it gets no keys at all: nothing
is looked up, registered or reference counted for it, and its blocks leave as one
anonymous run of the free queue (they take their place in eviction order all the same).
A preempted one frees its computed full blocks under its unique keys, tail first, so its
re-admission hits them exactly as if every block had been keyed; from then on it is keyed
like any request. The per-pass hooks are O(1) while nothing is keyed.

**Decode-step merging** (:mod:`sim.serving.merge`) works as for paged memory, except that
it stops where an eviction could change what the policy looked up in the cache
(:meth:`repeats_allowed`, :meth:`span_free_blocks`).
"""

from __future__ import annotations

from typing import Any

from sim.serving.memory import Leaving, PagedMemory
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.serving.prefix_plan import FREE, PlannedCache
from sim.serving.sequences import DECODE, FINISHING, IDLE_SLOT, Seq
from sim.workload.content import PromptContent, unique_block_keys

_NO_HITS: tuple[list[int], int, int] = ([], 0, 0)  # the lookup of an unkeyed request


class PrefixCachedMemory(PagedMemory):
    """Paged memory whose allocator caches and shares full blocks.

    Args:
        *args: as :class:`~sim.serving.memory.KVMemory` (the allocator a PrefixCacheAllocator).
        whole_prompt: as :class:`~sim.serving.memory.PagedMemory`.
        content: the stream's prompt content identity (None: every request unique).
        drop_last_hit_block: an EAGLE-style drafter runs: every hit loses its last block.
        lags_outputs: the engine sees each pass's outputs one pass late (async scheduling), so a
            decode step's block is cached one step after its KV is computed.
    """

    blocks: PrefixCacheAllocator
    caches_prefixes = True

    def __init__(
        self, *args: Any, whole_prompt: bool = False, content: PromptContent | None = None,
        drop_last_hit_block: bool = False, lags_outputs: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(*args, whole_prompt=whole_prompt)
        if not isinstance(self.blocks, PrefixCacheAllocator):
            raise ValueError("prefix caching needs a PrefixCacheAllocator")
        self._content = content
        self._drop = int(drop_last_hit_block)
        self._lags = lags_outputs
        self._cached_column = self._records.cached_prompt_tokens
        self._preemptions = self._records.preemptions
        self._keys: dict[int, list[int]] = {}  # running request -> its full blocks' keys (this stint)
        self._shared: dict[int, int] = {}  # running request -> its leading keys others may hit (content keys)
        self._refs: dict[int, list[int]] = {}  # running request -> cached blocks it references
        self._registered: dict[int, int] = {}  # running request -> leading keys hit or considered for registration
        self._peek: dict[int, tuple[list[int], int, int]] = {}  # rid -> (keys, hits, blocks hits take), now
        self._granted: dict[int, tuple[list[int], int, int]] = {}  # this plan's joiners: their lookups
        self._plan = PlannedCache(self.blocks)
        self._looked = False  # this plan looked something up
        self._expected_evictions = 0  # evictions its last lookup saw coming
        self._anonymous = content is None  # requests are unkeyed until preempted (module docstring)
        self._keyed_pending = 0  # with no content: preempted requests not yet gone for good
        self._unkeyed = self._anonymous  # no request here is keyed (module docstring)

    # ------------------------------------------------------------------ planning
    def new_plan(self) -> None:
        """Forget the previous plan: its lookups, victims and allocations."""
        if self._peek:
            self._peek.clear()
        if self._granted:
            self._granted.clear()
        self._looked = False
        if not self._unkeyed:
            self._plan.reset()

    def queued_cached_tokens(self, rid: int) -> int:
        """The cached prefix queued request ``rid`` would start with."""
        if self._unkeyed or (self._anonymous and not self._preemptions[rid]):
            return 0
        return self._lookup(rid)[1] * self.blocks.block_size

    def cached_prefix_blocks(self, rid: int) -> int:
        """Leading blocks of ``rid``'s tokens cached here now (what a cache-aware router asks)."""
        if self._anonymous and not self._preemptions[rid]:
            return 0
        keys = self.request_keys(rid)
        return max(0, self.blocks.match(keys, self._hit_limit(rid, len(keys))) - self._drop)

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
        """Blocks that become free if ``seq`` is preempted: those no other holder keeps (they join
        the free queue's tail in this plan: its partial block and blocks nobody can hit first)."""
        held = self.held(seq)
        if self._unkeyed:
            return held
        self._peek.clear()  # a joiner looked up before this victim would miscount its hits
        plan = self._plan
        freed_keys = [key for key in reversed(self._refs.get(seq.rid, ())) if not plan.victim_holds(key)]
        kept = len(self._refs.get(seq.rid, ())) - len(freed_keys)
        plan.victim_frees(seq.rid, held - kept - len(freed_keys), freed_keys)
        return held - kept

    def planned_pops(self, blocks: int) -> None:
        """The plan allocates ``blocks`` more blocks (a decode step) or drops ``-blocks`` (a victim's)."""
        if self._unkeyed or not blocks:
            return
        if self._peek:
            self._peek.clear()
        if blocks > 0:
            self._plan.take(blocks)
        else:
            self._plan.give_back(-blocks)

    def planned_extension(self, seq: Seq, tokens: int, blocks: int) -> None:
        """Running ``seq`` computes ``tokens`` more tokens in the plan, in ``blocks`` new blocks."""
        if self._unkeyed:
            return
        self.planned_pops(blocks)
        rid = seq.rid
        if rid in self._keys:
            stop = min(self._shared[rid], (seq.computed_tokens + tokens) // self.blocks.block_size)
            self._plan_registration(rid, self._keys[rid][self._registered[rid] : stop])

    def planned_admission(self, rid: int, tokens: int) -> None:
        """Queued ``rid`` joins the plan computing ``tokens`` tokens: it takes its hits and new blocks."""
        if self._unkeyed:
            return
        found = self._lookup(rid)
        self._granted[rid] = found
        if found is _NO_HITS:
            self.planned_pops(self.admission_blocks(rid, tokens))
            return
        keys, hits, taken = found
        plan = self._plan
        plan.touch(keys[:hits])
        self.planned_pops(self.admission_blocks(rid, tokens) - taken)
        stop = min(self._shared_count(rid, keys), (hits * self.blocks.block_size + tokens) // self.blocks.block_size)
        self._plan_registration(rid, keys[hits:stop])

    def _plan_registration(self, rid: int, keys: list[int]) -> None:
        """The keys a piece will register: those not cached when it registers them (after its allocation)."""
        if keys:
            self._plan.register(rid, self._plan.fresh(keys))
            self._peek.clear()

    # ------------------------------------------------------------------ lookups
    def request_keys(self, rid: int) -> list[int]:
        """Keys of ``rid``'s full blocks (prompt and generated tokens): the content's, then its own."""
        keys = self._keys.get(rid)
        if keys is not None:
            return keys
        size = self.blocks.block_size
        tokens = int(self._prompt[rid]) + int(self._records.generated_tokens[rid])
        content = self._content.block_keys(rid, size) if self._content is not None else []
        if len(content) >= tokens // size:
            return content
        return content + unique_block_keys(rid, tokens, size, first=len(content))

    def _shared_count(self, rid: int, keys: list[int]) -> int:
        """How many of ``rid``'s leading keys others may hit (registered as computed): its content's."""
        if self._content is None:
            return 0
        return min(len(keys), self._content.block_count(rid, self.blocks.block_size))

    def _hit_limit(self, rid: int, key_count: int) -> int:
        target = int(self._prompt[rid]) + int(self._records.generated_tokens[rid])
        return min(key_count, (target - 1) // self.blocks.block_size)

    def _lookup(self, rid: int) -> tuple[list[int], int, int]:
        """(keys, cached leading blocks, of those the ones that take a free block) for queued ``rid``
        at this point of the plan (after the allocations planned before it)."""
        if self._anonymous and not self._preemptions[rid]:
            return _NO_HITS
        found = self._peek.get(rid)
        if found is None:
            keys = self.request_keys(rid)
            statuses = self._plan.leading(keys, self._hit_limit(rid, len(keys)))
            hits = max(0, len(statuses) - self._drop)
            found = self._peek[rid] = (keys, hits, statuses[:hits].count(FREE))
            self._looked = True
            self._expected_evictions = self.blocks.evicted_blocks + self._plan.evictions()
        return found

    def _lookup_now(self, rid: int) -> tuple[list[int], int, int]:
        """The lookup of a joiner no plan looked up (a plan built by hand), on the cache as it is."""
        if self._anonymous and not self._preemptions[rid]:
            return _NO_HITS
        keys = self.request_keys(rid)
        hits = max(0, self.blocks.match(keys, self._hit_limit(rid, len(keys))) - self._drop)
        return keys, hits, sum(1 for key in keys[:hits] if not self.blocks.holders(key))

    # ------------------------------------------------------------------ merging guards
    def repeats_allowed(self) -> bool:
        """None once the cache changed in a way the plan's lookups did not see.

        A merged pass skips the policy, so the policy must have nothing new to see. In a pure
        decode span nothing is registered, acquired or released, but the decode steps'
        allocations may evict cached free blocks, shortening a queued request's hit run. A
        chunk cut by the token budget then starts earlier and needs as many new blocks, but
        each evicted hit stops taking a free block: its need falls as fast as the free
        blocks, and as the decode steps' own needs vary it can fit at a later step (found by
        search; tests/test_prefix_merge.py). So passes merge while the plan looked nothing
        up, or its allocations evicted no more than its last lookup saw coming (and,
        :meth:`span_free_blocks`, the repeats evict nothing).
        """
        if not self._looked:
            return True
        self.blocks.settle()  # evictions are counted when the allocations are taken off the queue
        return self.blocks.evicted_blocks == self._expected_evictions

    def span_free_blocks(self) -> int:
        """All free blocks while the plan looked nothing up; else those before the queue's first cached one."""
        return self.blocks.empty_blocks if self._looked else self.blocks.free_blocks

    # ------------------------------------------------------------------ transitions
    def admit(self, seq: Seq) -> int:
        """Take references on the cached prefix; it counts as computed."""
        if self._unkeyed:  # an unkeyed admission caches nothing: its column stays 0
            return 0
        rid = seq.rid
        found = self._granted.pop(rid, None)
        if found is None:
            found = self._lookup_now(rid)
        if found is _NO_HITS:  # unkeyed: nothing cached, nothing to track
            self._cached_column[rid] = 0
            return 0
        keys, hits, _ = found
        hit_keys = keys[:hits]
        self.blocks.acquire(hit_keys)
        self._keys[rid], self._refs[rid], self._registered[rid] = keys, hit_keys, hits
        self._shared[rid] = self._shared_count(rid, keys)
        cached = hits * self.blocks.block_size
        seq.computed_tokens = cached
        seq.blocks = hits
        if self._preemptions[rid] == 0:
            self._cached_column[rid] = cached
        return cached  # a whole-prompt grant is allocated by grant(), after the hits

    def grow_prefill(self, seq: Seq, tokens: int) -> None:
        """Allocate the piece's blocks and cache its full blocks others may hit (``allocate_slots``)."""
        super().grow_prefill(seq, tokens)
        if seq.rid in self._keys:
            self._register(seq.rid, seq.computed_tokens + tokens, self._shared[seq.rid])

    def _register(self, rid: int, computed_tokens: int, limit: int) -> None:
        """Cache ``rid``'s full blocks up to ``computed_tokens``, at most its first ``limit`` keys."""
        keys, start = self._keys[rid], self._registered[rid]
        stop = min(limit, computed_tokens // self.blocks.block_size)
        if stop <= start:
            return
        if stop > len(keys):  # blocks generated in this stint: keys of its own
            keys.extend(unique_block_keys(rid, stop * self.blocks.block_size, self.blocks.block_size, len(keys)))
        self._refs[rid].extend(self.blocks.register(keys[start:stop]))
        self._registered[rid] = stop

    def release(self, seq: Seq, why: Leaving) -> None:
        """Free ``seq``'s blocks tail first: those nobody can hit, then its cached ones, last first."""
        rid = seq.rid
        if rid not in self._keys:
            self._release_unkeyed(seq, why)
            return
        computed = self._cached_tokens(seq)
        # A preempted request may come back and hit all its blocks; otherwise only content keys matter.
        self._register(rid, computed, 1 << 62 if why is Leaving.PREEMPTED else self._shared[rid])
        held = self.held(seq)
        refs = self._refs.pop(rid)
        del self._keys[rid], self._registered[rid], self._shared[rid]
        self.blocks.release(held - len(refs))
        self.blocks.unreference(refs)
        if self._anonymous and why is not Leaving.PREEMPTED:  # gone for good
            self._keyed_gone()

    def _cached_tokens(self, seq: Seq) -> int:
        """Tokens whose blocks ``seq`` has cached: those whose KV it holds, less, when the engine's
        outputs lag (async scheduling), the token its last decode step computed. vLLM's
        ``allocate_slots`` caches up to ``request.num_tokens``, which does not count the token in
        flight yet, and ``AsyncScheduler._update_request_with_output`` caches up to
        ``num_computed_tokens - num_output_placeholders`` when the output comes.
        """
        computed = self._computed_tokens(seq)
        if self._lags and seq.phase == DECODE and seq.start_step < self._decoders.step:
            return computed - 1  # it decoded in the pass whose output is in flight
        return computed

    def _computed_tokens(self, seq: Seq) -> int:
        """Tokens whose KV ``seq`` holds (a completed request: all but its last token)."""
        if seq.phase == DECODE:
            return self._decoders.context(seq) - 1
        if seq.phase == FINISHING or seq.phase == IDLE_SLOT:
            return seq.prompt_tokens + seq.output_tokens - 1
        return seq.computed_tokens  # a prefill, or a prompt handed off or arriving (disaggregation)

    def _release_unkeyed(self, seq: Seq, why: Leaving) -> None:
        """Free an unkeyed request's blocks: one anonymous run, or (preempted) its computed full blocks
        under its unique keys, so that its re-admission may hit them; it comes back keyed."""
        blocks, held = self.blocks, self.held(seq)
        if why is not Leaving.PREEMPTED:
            blocks.release(held)
            return
        keys = blocks.register(unique_block_keys(seq.rid, self._cached_tokens(seq), blocks.block_size))
        blocks.release(held - len(keys))
        blocks.unreference(keys)
        self._keyed_pending += 1
        if self._keyed_pending == 1:
            self._unkeyed = False  # a keyed request exists now: look it up

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
            self._shared[rid] = len(keys)
        return hits * self.blocks.block_size

    def arrived(self, seq: Seq) -> None:
        """The prompt's KV is here: its full blocks become cached (a later request may hit them)."""
        super().arrived(seq)
        if seq.rid in self._keys:
            self._register(seq.rid, seq.prompt_tokens, self._shared[seq.rid])

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
