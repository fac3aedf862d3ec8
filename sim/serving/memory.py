"""KV memory models: how one replica's requests take and give back KV blocks.

A replica state (:mod:`sim.serving.state`) owns its queue, its running batch and its
clock; every question and every change about KV blocks goes through one memory model:

* :class:`ReserveMemory` (Orca; static and continuous batching): a request takes
  ceil((prompt + max output) / block) blocks when admitted and keeps them until it leaves.
* :class:`PagedMemory` (vLLM): a request holds the blocks of the tokens it has computed,
  allocated chunk by chunk (vLLM v1) or, with ``whole_prompt``, its whole (re)prefill at
  admission (Sarathi-Serve, vLLM v0 chunked prefill); a decode step appends one token.
* :class:`~sim.serving.prefix_memory.PrefixCachedMemory`: paged memory whose full prompt
  blocks are cached and shared by content.

The interface has three parts. *Planning* questions the KV ledger asks while a policy
builds a plan (``admission_blocks``, ``extension_blocks``, ``decode_blocks_needed``,
``freed_by_preempting``, ``decode_growth_blocks``, ``queued_cached_tokens``); they change
nothing, except that the ledger tells the memory what the plan has granted so far
(``planned_pops``, ``planned_extension``, ``planned_admission``: prefix caching looks a
joiner's hits up after the allocations planned before it). *Transitions* the state applies
once a plan is final (``admit``, ``grant``, ``grow_prefill``, ``grow_decode``,
``allocate``/``give_back`` for speculative positions, ``release``). *Merging guards* tell
the worker how far a run of pure decode passes may be advanced without asking the policy
(``repeats_allowed``, ``span_free_blocks``). Speculative decoding, disaggregated pools and
every policy use these calls only, so each feature runs on each memory model.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from sim.metrics.records import RequestRecords
from sim.serving.kv_cache import BlockAllocator
from sim.serving.sequences import DECODE, DecodeGroup, Seq


class Leaving(Enum):
    """Why a request's blocks are given back (prefix caching keeps different blocks for each)."""

    COMPLETED = "completed"  # every token generated here (its answer blocks can be cached)
    HANDED_OFF = "handed_off"  # prefill done, KV sent to a decode replica (disaggregation)
    PREEMPTED = "preempted"  # recompute preemption: it will be admitted again
    CANCELLED = "cancelled"  # the client gave up


class KVMemory:
    """Paged memory is the base: blocks for the computed tokens, allocated as they are computed.

    Args:
        allocator: the replica's blocks.
        prompt_tokens, output_tokens: the stream's lengths (indexed by request id).
        records: per-request columns (``generated_tokens`` says what a queued request recomputes).
        decoders: the replica's decode group (it knows each decoding request's cached tokens).
    """

    grows_per_step = True
    """Decode steps allocate blocks as they go (False: everything was reserved at admission)."""
    caches_prefixes = False

    def __init__(
        self, allocator: BlockAllocator, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
        records: RequestRecords, decoders: DecodeGroup,
    ) -> None:  # fmt: skip
        self.blocks = allocator
        self.blocks_for = allocator.blocks_for
        self._prompt = prompt_tokens
        self._output = output_tokens
        self._records = records
        self._decoders = decoders

    # ------------------------------------------------------------------ planning
    def new_plan(self) -> None:
        """A policy starts a new plan (forget what the last one looked up)."""

    def queued_cached_tokens(self, rid: int) -> int:
        """Tokens queued request ``rid`` would find already computed (a prefix-cache hit) if admitted now."""
        return 0

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """Blocks queued request ``rid`` takes to start, computing ``tokens`` tokens now."""
        return self.blocks_for(tokens)

    def extension_blocks(self, seq: Seq, tokens: int) -> int:
        """More blocks running ``seq`` needs to compute ``tokens`` more prompt tokens."""
        return max(0, self.blocks_for(seq.computed_tokens + tokens) - seq.blocks)

    def decode_blocks_needed(self, steps: int = 1) -> int:
        """New blocks the next ``steps`` decode steps need (each request stops at its last token)."""
        decoders = self._decoders
        return decoders.blocks_needed() if steps == 1 else decoders.blocks_needed_over(steps)

    def decode_growth_blocks(self, seq: Seq, steps: int = 1) -> int:
        """New blocks running ``seq`` needs over the next ``steps`` decode steps."""
        if seq.phase != DECODE:
            return 0
        if steps == 1:
            return int(self._decoders.crosses_next(seq))
        return self._decoders.growth_blocks(seq, steps)

    def held(self, seq: Seq) -> int:
        """Blocks running ``seq`` holds now (a shared block counts once per holder)."""
        if seq.phase == DECODE:
            return self._decoders.cached_blocks(seq)
        return seq.blocks

    def freed_by_preempting(self, seq: Seq) -> int:
        """Blocks that become free if ``seq`` is preempted in the plan being built."""
        return self.held(seq)

    def planned_pops(self, blocks: int) -> None:
        """The plan being built allocates ``blocks`` more new blocks (negative: gives them back)."""

    def planned_extension(self, seq: Seq, tokens: int, blocks: int) -> None:
        """The plan being built has running ``seq`` compute ``tokens`` more tokens in ``blocks`` new blocks."""

    def planned_admission(self, rid: int, tokens: int) -> None:
        """The plan being built admits queued ``rid`` computing ``tokens`` tokens."""

    # ------------------------------------------------------------------ transitions
    def admit(self, seq: Seq) -> int:
        """``seq`` joins the batch; returns the prompt tokens it starts with already computed."""
        return 0

    def grant(self, joiners: list[Seq]) -> None:
        """After joiners are admitted (their cache hits taken): allocate what they take up front."""

    def grow_prefill(self, seq: Seq, tokens: int) -> None:
        """Allocate the blocks of ``tokens`` more computed tokens of ``seq``."""
        grow = self.blocks_for(seq.computed_tokens + tokens) - seq.blocks
        if grow > 0:
            self.blocks.allocate(grow)
            seq.blocks += grow

    def grow_decode(self) -> None:
        """Allocate the blocks one decode step of the whole group needs."""
        needed = self._decoders.blocks_needed()
        if needed:  # most decode steps cross no block boundary
            self.blocks.allocate(needed)

    def allocate(self, blocks: int) -> None:
        """Take ``blocks`` blocks not tied to a sequence's count (speculative positions, incoming KV)."""
        self.blocks.allocate(blocks)

    def give_back(self, blocks: int) -> None:
        """Return blocks taken with :meth:`allocate`."""
        self.blocks.release(blocks)

    def release(self, seq: Seq, why: Leaving) -> None:
        """``seq`` leaves the batch: give back what it holds (call before it leaves its phase)."""
        self.blocks.release(self.held(seq))

    def forget_queued(self, rid: int) -> None:
        """Queued request ``rid`` left for good (timed out) without being admitted again."""

    # ------------------------------------------------------------------ KV arriving from elsewhere
    def incoming_blocks(self, rid: int) -> int:
        """Free blocks request ``rid`` takes here to receive its prompt's KV from another replica."""
        return self.blocks_for(int(self._prompt[rid]))

    def receive(self, seq: Seq) -> int:
        """Take the blocks ``seq``'s prompt KV will arrive in (``seq`` holds them, in no phase, until
        :meth:`arrived`); returns the prompt tokens already cached here, which need not be sent."""
        seq.blocks = self.incoming_blocks(seq.rid)
        self.blocks.allocate(seq.blocks)
        return 0

    def arrived(self, seq: Seq) -> None:
        """``seq``'s prompt KV arrived: its blocks hold computed tokens now."""
        seq.computed_tokens = seq.target_tokens

    # ------------------------------------------------------------------ merging guards
    def repeats_allowed(self) -> bool:
        """Whether a pure decode pass may be repeated without asking the policy, as far as
        memory goes (its new blocks must also fit in :meth:`span_free_blocks`)."""
        return True

    def span_free_blocks(self) -> int:
        """Free blocks the repeats of a merged decode span may take."""
        return self.blocks.free_blocks

    # ------------------------------------------------------------------ audit
    def audit(self, seqs: list[Seq]) -> None:
        """Check the blocks against the sequences holding them (between passes).

        Raises:
            AssertionError: blocks over capacity, or not matching what the sequences hold.
        """
        blocks, decoders = self.blocks, self._decoders
        assert 0 <= blocks.used_blocks <= blocks.total_blocks, "KV over capacity"
        held = sum(self.held(seq) for seq in seqs)
        assert held == blocks.used_blocks + blocks.shared_surplus, (  # shared blocks count once per holder
            f"requests hold {held} blocks, allocator {blocks.used_blocks} (+{blocks.shared_surplus} shared)"
        )
        for seq in seqs:
            cached = decoders.context(seq) - 1 if seq.phase == DECODE else seq.computed_tokens
            assert blocks.blocks_for(cached) <= self.held(seq), f"request {seq.rid} lacks KV blocks"


class PagedMemory(KVMemory):
    """vLLM's paged memory (see :class:`KVMemory`).

    Args:
        *args: as :class:`KVMemory`.
        whole_prompt: a (re)prefill's blocks are all allocated when the request is admitted,
            not chunk by chunk (Sarathi-Serve, vLLM v0 chunked prefill; disaggregated pools).
    """

    def __init__(self, *args: object, whole_prompt: bool = False) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.whole_prompt = whole_prompt

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """Blocks of the chunk computed now, or of the whole (re)prefill with ``whole_prompt``."""
        if self.whole_prompt:
            return self.blocks_for(int(self._prompt[rid]) + int(self._records.generated_tokens[rid]))
        return self.blocks_for(tokens)

    def grant(self, joiners: list[Seq]) -> None:
        """With ``whole_prompt``, each joiner's whole (re)prefill, after all of them took their hits."""
        if self.whole_prompt:
            blocks, blocks_for = self.blocks, self.blocks_for
            for seq in joiners:
                grow = blocks_for(seq.target_tokens) - seq.blocks
                blocks.allocate(grow)
                seq.blocks += grow


class ReserveMemory(KVMemory):
    """Orca's reservation: prompt + ``reserve_tokens`` (the stream's max output) at admission.

    Args:
        *args: as :class:`KVMemory`.
        reserve_tokens: output tokens reserved for every request.
    """

    grows_per_step = False

    def __init__(self, *args: object, reserve_tokens: int) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.reserve_tokens = reserve_tokens

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """The whole reservation."""
        return self.blocks_for(int(self._prompt[rid]) + self.reserve_tokens)

    def extension_blocks(self, seq: Seq, tokens: int) -> int:
        """Nothing: the reservation covers every token."""
        return 0

    def decode_blocks_needed(self, steps: int = 1) -> int:
        """Nothing: the reservation covers every token."""
        return 0

    def decode_growth_blocks(self, seq: Seq, steps: int = 1) -> int:
        """Nothing: the reservation covers every token."""
        return 0

    def held(self, seq: Seq) -> int:
        """The reservation."""
        return seq.blocks

    def admit(self, seq: Seq) -> int:
        """Take the reservation now."""
        seq.blocks = self.blocks_for(seq.prompt_tokens + self.reserve_tokens)
        self.blocks.allocate(seq.blocks)
        return 0

    def grow_prefill(self, seq: Seq, tokens: int) -> None:
        """Nothing: reserved at admission."""

    def grow_decode(self) -> None:
        """Nothing: reserved at admission."""

    def incoming_blocks(self, rid: int) -> int:
        """The whole reservation: the prompt's KV and room for the longest output."""
        return self.blocks_for(int(self._prompt[rid]) + self.reserve_tokens)
