"""One replica's queue, running batch and KV cache, without SimPy.

:class:`ReplicaState` is what a policy sees (it implements ``SchedulerView``) and what
the engine changes: ``begin(plan)`` applies preemptions, admissions and allocations
and returns the totals the cost model needs; ``end(plan)`` credits the tokens the pass
produced once its time has elapsed. Both cost O(changes), not O(batch): decoding
sequences live in a :class:`~sim.serving.sequences.DecodeGroup` with running sums.
A multi-step block (a plan with ``steps`` > 1, vLLM's ``--num-scheduler-steps``) is
``begin``, then ``block_step`` before each further pass, then ``end_block``. Every
stream event reports its inter-token gaps to an :class:`~sim.metrics.itl.ITLRecorder`.
Tests drive it as a plain state machine.

Features plug in by composition, never by subclassing: every KV question and change goes
through the replica's memory model (:mod:`sim.serving.memory`: reserve, paged, prefix
cached), speculative decoding decorates the decode step
(:class:`~sim.serving.speculative.SpeculativeDecode`), and a disaggregated pool's hand-off
and join hooks are a :class:`~sim.serving.pool_state.PoolRole`. Each feature uses the
public attributes below (``records``, ``running``, ``decoders``, ``memory``), so any of
them runs with any other.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from sim.metrics.itl import ITLRecorder
from sim.metrics.records import COMPLETED, RUNNING, TIMED_OUT, WAITING, RequestRecords
from sim.policies.base import IterationPlan
from sim.serving.ledger import KVLedger
from sim.serving.memory import Leaving
from sim.serving.memory_plan import MemoryPlan
from sim.serving.sequences import DECODE, FINISHING, GONE, IDLE_SLOT, PREFILL, DecodeGroup, Seq

CostTotals = tuple[int, int, float, int, int]
"""(prefill tokens, prefill pieces, prefill attention work, decode sequences, decode KV tokens)."""
_NOTHING: list[Seq] = []  # shared empty result, never appended to


class DecodeDecoration(Protocol):
    """What decorates a replica's decode steps (speculative decoding implements it).

    Attributes:
        pass_extra_s: time the decoration adds to the pass ``begin`` last prepared.
    """

    pass_extra_s: float

    def blocks_needed(self, state: ReplicaState, steps: int = 1) -> int:
        """New blocks the next decode step of every member needs (the ledger's question)."""
        ...

    def growth_blocks(self, state: ReplicaState, seq: Seq, steps: int = 1) -> int:
        """New blocks member ``seq`` needs for the next step (what preempting it gives back)."""
        ...

    def begin(self, state: ReplicaState, plan: IterationPlan) -> tuple[int, int, float, int]:
        """Allocate the step's blocks; return it as prefill terms (tokens, pieces, work, context read)."""
        ...

    def end(self, state: ReplicaState) -> None:
        """The pass ended: give back what it rejected, credit what it accepted."""
        ...


class PoolHooks(Protocol):
    """What plugs a replica into a disaggregated pool (``PoolRole`` implements it)."""

    def boundary(self, now_s: float) -> None:
        """A scheduling decision is about to be made at ``now_s``."""
        ...

    def hands_off(self, seq: Seq) -> bool:
        """Whether ``seq``'s prefill token ends its stay on this replica."""
        ...

    def hand_off(self, state: ReplicaState, seq: Seq, now_s: float) -> None:
        """``seq`` emitted its first token at ``now_s`` and leaves for another pool."""
        ...

    def audit_memory(self, state: ReplicaState, seqs: list[Seq]) -> None:
        """Check the memory model's invariants with transfers in flight accounted for."""
        ...


class ReplicaState:
    """Queue, running batch and KV blocks of one replica.

    Args:
        index: replica number.
        records: per-request columns shared by all replicas.
        prompt_tokens, output_tokens: the stream's lengths (indexed by request id).
        memory: the memory model to build (reserve, paged, prefix cached).
        kv_blocks, block_size: this replica's KV capacity.
        holds_slots: finished sequences keep their slot and KV until the batch is done.
        lags_outputs: a pass's outputs reach the scheduler only after the next pass is
            scheduled (vLLM V1 async scheduling), so a finished sequence keeps its slot and KV
            through the next scheduling decision (see :meth:`end`).
        itl: where inter-token gaps go (shared by the replicas of a run; default: a private one).
        speculation: decorates every decode step with drafting and verification (None: plain).
        pool: a disaggregated pool's hand-off and join hooks (None: colocated).

    Attributes:
        memory: the replica's :class:`~sim.serving.memory.KVMemory`; ``blocks`` is its allocator.
        merges_decode: the worker may merge consecutive pure decode passes into one SimPy
            event (:meth:`repeatable_decodes`, :meth:`repeat_decodes`): not when a pass's
            outcome depends on more than the decode group (speculative acceptance, pool
            hand-offs at every boundary).
    """

    def __init__(
        self,
        index: int,
        records: RequestRecords,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        memory: MemoryPlan,
        kv_blocks: int,
        block_size: int,
        *,
        holds_slots: bool = False,
        lags_outputs: bool = False,
        itl: ITLRecorder | None = None,
        speculation: DecodeDecoration | None = None,
        pool: PoolHooks | None = None,
    ) -> None:
        self.index = index
        self.now_s = 0.0
        self.records = records
        self.itl = itl if itl is not None else ITLRecorder()
        self._itl_add = self.itl.add
        self.decoders = DecodeGroup(block_size, self.itl)
        self.memory = memory.build(
            kv_blocks, block_size, prompt_tokens, output_tokens, records, self.decoders, lags_outputs=lags_outputs
        )
        self.blocks = self.memory.blocks
        self.kv = KVLedger(self, kv_blocks)
        self.speculation = speculation
        self.pool = pool
        self.merges_decode = speculation is None and pool is None
        self.running: dict[int, Seq] = {}
        self.waiting_count = 0
        self.outstanding_tokens = 0
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0
        self.prefill_context_tokens = 0  # of the pass ``begin`` last prepared
        self.queue_area_s = 0.0
        self._prompt = prompt_tokens
        self._output = output_tokens
        self._holds_slots = holds_slots
        self._lags = lags_outputs
        self._finishing: list[Seq] = []  # finished, their slots and KV not given back yet
        self._admissions = 0  # admissions so far: each admitted sequence's tick
        self._waiting: deque[int] = deque()
        self._order: list[tuple[float, int]] = []
        self._prefilling: list[Seq] = []
        self._cancelled: list[int] = []
        self._queue_since_s = 0.0
        self._last_event_s: dict[int, float] = {}  # preempted after a token: when it got it
        self._parked: list[Seq] = []  # finished inside the current multi-step block
        self._block_tokens = 0  # tokens generated in the current block, reported at its end

    # ------------------------------------------------------------------ scheduler view
    @property
    def running_count(self) -> int:
        """Requests holding a slot (static idle slots included)."""
        return len(self.running)

    @property
    def decoding_count(self) -> int:
        """Requests that decode in the next step."""
        return self.decoders.count

    def view(self, now_s: float) -> ReplicaState:
        """Prepare for a scheduling decision at ``now_s`` and return self as the view."""
        if self.pool is not None:
            self.pool.boundary(now_s)  # arrived KV joins before the policy looks
        self.now_s = now_s
        self.memory.new_plan()
        self.kv.reset(self.blocks.free_blocks)
        waiting, status = self._waiting, self.records.status
        while waiting and status[waiting[0]] != WAITING:
            waiting.popleft()  # abandoned while queued (lazy removal)
        return self

    def waiting_ids(self) -> Iterator[int]:
        """Queued request ids, head first."""
        status = self.records.status
        return (rid for rid in self._waiting if status[rid] == WAITING)

    def oldest_waiting_since_s(self) -> float:
        """When the head of the queue joined it (inf if empty)."""
        head = next(self.waiting_ids(), None)
        return math.inf if head is None else float(self.records.enqueued_s[head])

    def tokens_to_prefill(self, rid: int) -> int:
        """Tokens ``rid`` must compute before its next token (prompt + generated when queued,
        less what it would find in the prefix cache)."""
        seq = self.running.get(rid)
        if seq is not None:
            return seq.target_tokens - seq.computed_tokens
        recompute = int(self._prompt[rid]) + int(self.records.generated_tokens[rid])
        return recompute - self.memory.queued_cached_tokens(rid)

    def prefilling_ids(self) -> list[int]:
        """Running requests part-way through their prefill, oldest arrival first."""
        return [seq.rid for seq in self._prefilling]

    def running_newest_first(self) -> Iterator[int]:
        """Running ids, most recently arrived first."""
        return (rid for _, rid in reversed(self._order))

    def is_decoding(self, rid: int) -> bool:
        """Whether running request ``rid`` decodes in the next step."""
        seq = self.running.get(rid)
        return seq is not None and seq.phase == DECODE

    def cached_prefix_blocks(self, rid: int) -> int:
        """Leading blocks of ``rid``'s prompt cached here now (what a cache-aware router asks)."""
        ask = getattr(self.memory, "cached_prefix_blocks", None)
        return ask(rid) if ask is not None else 0

    def prompt_tokens_of(self, rid: int) -> int:
        """Prompt length of request ``rid``."""
        return int(self._prompt[rid])

    def output_tokens_of(self, rid: int) -> int:
        """Output length of request ``rid``."""
        return int(self._output[rid])

    # ------------------------------------------------------------------ ledger source
    def free_blocks_now(self) -> int:
        """Free KV blocks."""
        return self.blocks.free_blocks

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """Blocks a queued request takes to start computing ``tokens`` tokens."""
        return self.memory.admission_blocks(rid, tokens)

    def extension_blocks(self, rid: int, tokens: int) -> int:
        """More blocks running request ``rid`` needs to compute ``tokens`` more tokens."""
        return self.memory.extension_blocks(self.running[rid], tokens)

    def decode_blocks_needed(self, steps: int = 1) -> int:
        """New blocks the next ``steps`` decode steps need (each request stops at its last token)."""
        if self.speculation is not None:
            return self.speculation.blocks_needed(self, steps)
        return self.memory.decode_blocks_needed(steps)

    def held_blocks(self, rid: int) -> int:
        """Blocks that become free if running request ``rid`` is preempted now."""
        return self.memory.freed_by_preempting(self.running[rid])

    def decode_growth_blocks(self, rid: int, steps: int = 1) -> int:
        """New blocks running request ``rid`` needs over the next ``steps`` decode steps."""
        seq = self.running[rid]
        if self.speculation is not None:
            return self.speculation.growth_blocks(self, seq, steps)
        return self.memory.decode_growth_blocks(seq, steps)

    def planned_pops(self, blocks: int) -> None:
        """The plan allocates ``blocks`` more new blocks (negative: gives them back)."""
        self.memory.planned_pops(blocks)

    def planned_extension(self, rid: int, tokens: int, blocks: int) -> None:
        """The plan has running request ``rid`` compute ``tokens`` more tokens in ``blocks`` new blocks."""
        self.memory.planned_extension(self.running[rid], tokens, blocks)

    def planned_admission(self, rid: int, tokens: int) -> None:
        """The plan admits queued request ``rid`` computing ``tokens`` tokens."""
        self.memory.planned_admission(rid, tokens)

    # ------------------------------------------------------------------ engine API
    def enqueue(self, rid: int, now_s: float) -> None:
        """A request (re)sent to this replica joins the back of the queue."""
        records = self.records
        records.status[rid] = WAITING
        records.replica[rid] = self.index
        records.enqueued_s[rid] = now_s
        self._queue_changed(now_s, +1)
        self._waiting.append(rid)
        self.outstanding_tokens += int(self._prompt[rid]) + int(self._output[rid])

    def abandon(self, rid: int, now_s: float) -> None:
        """The client gave up on ``rid`` (timed out): drop it if queued, cancel it if running.

        A running request is removed, and its KV freed, at the end of the current pass.
        """
        records = self.records
        status = records.status[rid]
        records.status[rid] = TIMED_OUT
        records.completion_s[rid] = now_s
        if status == WAITING:
            self._queue_changed(now_s, -1)
            self.outstanding_tokens -= int(self._prompt[rid]) + int(self._output[rid])
            if self._last_event_s:
                self._last_event_s.pop(rid, None)
            self.memory.forget_queued(rid)
        elif status == RUNNING:
            self._cancelled.append(rid)

    def begin(self, plan: IterationPlan, now_s: float) -> CostTotals:
        """Apply a plan's preemptions, admissions and allocations; return the cost-model totals.

        KV changes in vLLM V1's order (``Scheduler.schedule``): victims are freed, the running
        requests' new blocks (decodes, chunks) allocated, then each joiner in turn looks up
        its cache hits and takes its blocks, so a joiner's hits are what the allocations
        before it left in the cache (the plan's lookups saw the same, see
        :mod:`sim.serving.prefix_plan`).
        """
        if plan.preempt:
            self._preempt(plan.preempt, now_s)
        verify = None
        if plan.decode:
            if self.speculation is not None:
                verify = self.speculation.begin(self, plan)
                decodes = kv_tokens = 0
            else:
                self.memory.grow_decode()
                decodes, kv_tokens = self.decoders.count, self.decoders.kv_tokens
        else:
            decodes = kv_tokens = 0
        prefill_tokens = 0
        attention_work = 0.0
        self.prefill_context_tokens = 0
        if plan.prefill:
            self._allocate_pieces(plan.prefill, now_s)
            prefill_tokens, attention_work = self._begin_prefills(plan.prefill)
        pieces = len(plan.prefill)
        if verify is not None:  # verification pieces go through the prefill terms
            prefill_tokens += verify[0]
            pieces += verify[1]
            attention_work += verify[2]
            self.prefill_context_tokens += verify[3]
        if plan.charge_idle_slots:
            decodes += self.idle_slots
            kv_tokens += self.idle_slot_kv_tokens
        return prefill_tokens, pieces, attention_work, decodes, kv_tokens

    def _allocate_pieces(self, pieces: list[tuple[int, int]], now_s: float) -> None:
        """The pieces' blocks: running requests' first, then each joiner's (admitted, its cache hits
        taken, its whole (re)prefill granted if the memory does that, its piece's blocks allocated)."""
        running, grow, memory = self.running, self.memory.grow_prefill, self.memory
        joiners = []
        for rid, tokens in pieces:
            seq = running.get(rid)
            if seq is None:
                joiners.append((rid, tokens))
            else:
                grow(seq, tokens)
        for rid, tokens in joiners:
            seq = self._admit(rid, now_s)
            memory.grant([seq])
            grow(seq, tokens)

    def _begin_prefills(self, pieces: list[tuple[int, int]]) -> tuple[int, float]:
        """Count the pieces' tokens as computed (their blocks are allocated); return (prefill
        tokens, attention work)."""
        prefill_tokens = 0
        attention_work = 0.0
        running = self.running
        for rid, tokens in pieces:
            seq = running[rid]
            attention_work += tokens * (seq.computed_tokens + tokens / 2)
            self.prefill_context_tokens += seq.computed_tokens  # cached KV this piece reads (MBU)
            seq.computed_tokens += tokens
            prefill_tokens += tokens
            assert 0 < tokens and seq.computed_tokens <= seq.target_tokens, (
                f"bad prefill piece {rid}: {tokens}"
            )
        self.outstanding_tokens -= prefill_tokens
        return prefill_tokens, attention_work

    def end(self, plan: IterationPlan, now_s: float) -> list[int]:
        """Credit the pass that just ended at ``now_s``; return the requests it completed.

        Completed requests give their KV back in the order they were admitted (vLLM frees them
        in ``update_from_output``, walking the step's requests in its running-list order). With
        ``lags_outputs`` the scheduler sees a pass's outputs only after it has scheduled the
        next pass (``EngineCore.step_with_batch_queue`` with a batch queue of 2: ``schedule()``,
        then ``update_from_output`` of the previous batch), so those completed by the previous
        pass are given back now, after this pass's allocations, and this pass's completed
        requests keep their slot and KV through the next decision (``AsyncScheduler`` skips
        them: ``num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens +
        max_tokens`` in ``Scheduler.schedule``, vllm/v1/core/sched/scheduler.py at v0.15.1).
        """
        if self._finishing:
            self._give_back_finished()
        completed: list[int] = []
        finished = _NOTHING
        if plan.decode:
            decoders = self.decoders
            if self.speculation is not None:
                self.speculation.end(self)  # rejected positions' blocks back, accepted tokens credited
            self.outstanding_tokens -= decoders.count
            if self._cancelled:  # a cancelled request gets no tokens: the stream event waits for it to go
                finished = decoders.advance()
                self._drop_cancelled()  # after the step: it gave back the block the step took
                decoders.event(now_s)
            else:
                finished = decoders.advance(now_s)  # the step and its stream event
        elif self._cancelled:
            self._drop_cancelled()
        for seq in finished:
            if seq.phase == DECODE:
                self._finish(seq, now_s, completed)
        for rid, _ in plan.prefill:
            piece = self.running.get(rid)  # None: cancelled during the pass
            if piece is not None and piece.phase == PREFILL and piece.prefill_left == 0:
                self._emit_prefill_token(piece, now_s, completed)
        if self._finishing and not self._lags:
            self._give_back_finished()
        if self.idle_slots and not self.decoders.count and not self._prefilling:
            self._end_static_batch()
        return completed

    def runs_nothing(self, plan: IterationPlan) -> bool:
        """Whether ``plan`` computes no token: no prefill piece, and no decoder left after its preemptions
        (a policy may preempt every decoder, e.g. to free the KV of a completed request whose output is
        in flight, ``lags_outputs``)."""
        if plan.prefill:
            return False
        if not plan.decode:
            return True
        if not plan.preempt or plan.charge_idle_slots:
            return False
        return self.decoders.count == sum(1 for rid in plan.preempt if self.is_decoding(rid))

    def flush_outputs(self, plan: IterationPlan, now_s: float) -> bool:
        """``plan`` runs nothing: apply its preemptions, and (``lags_outputs``) let the outputs of the
        pass in flight give back the KV of the requests it completed, as vLLM does when
        ``schedule()`` returns an empty step (it waits for the batch in flight). Returns whether
        anything changed (then a new decision may run someone)."""
        changed = bool(plan.preempt)
        if changed:
            self._preempt(plan.preempt, now_s)
        if self._finishing:
            self._give_back_finished()
            changed = True
        return changed

    def _give_back_finished(self) -> None:
        finishing = self._finishing
        if len(finishing) > 1:
            finishing.sort(key=_seq_tick)
        for seq in finishing:
            self._remove(seq, Leaving.COMPLETED)
        finishing.clear()

    def repeatable_decodes(self) -> int:
        """How many more times in a row the pure decode pass just begun may be repeated (ended
        early and begun again, as a steady policy would plan it), as far as finishing members,
        cancellations and the memory model go (paged memory: each repeat's new blocks must also
        fit within :meth:`span_free_blocks`; see ``DecodeGroup.block_need_cycle``)."""
        decoders = self.decoders
        if self._cancelled or self._finishing or not decoders.count or not self.memory.repeats_allowed():
            return 0
        return max(0, decoders.steps_before_finish())

    def span_free_blocks(self) -> int:
        """Free blocks the repeats of a merged decode span may take (paged memory)."""
        return self.memory.span_free_blocks()

    @property
    def grows_per_step(self) -> bool:
        """Whether decode steps allocate blocks as they go (paged memory), not from a reservation."""
        return self.memory.grows_per_step

    def repeat_decodes(self, ends: list[float], new_blocks: int) -> None:
        """``repeat_decode`` once per end time in ``ends`` (the passes ended early), at once:
        the caller checked ``repeatable_decodes`` and that the ``new_blocks`` they take are free."""
        decoders = self.decoders
        self.outstanding_tokens -= decoders.count * len(ends)
        decoders.advance_steps(ends)
        if new_blocks:
            self.blocks.allocate(new_blocks)
        self.now_s = ends[-1]
        self.prefill_context_tokens = 0

    # ------------------------------------------------------------------ multi-step blocks
    def block_step(self) -> CostTotals:
        """Inside a multi-step block: take the decode step just run, prepare the next one.

        The block's passes are decided at its start (nothing can join or leave before its
        end), so the worker may call this before their time has elapsed; what clients and
        routers can see (completions, outstanding tokens) only changes in ``end_block``.
        A request that got its last token parks: it keeps its slot and KV and is charged
        as decoding at its final context (it stays in the batch tensors) until the end.
        Returns the cost-model totals of the next pass.
        """
        decoders = self.decoders
        self._block_tokens += decoders.count
        for seq in decoders.advance():
            self._park(seq)
        self.memory.grow_decode()
        seqs = decoders.count + self.idle_slots
        return 0, 0, 0.0, seqs, decoders.kv_tokens + self.idle_slot_kv_tokens

    def end_block(self, now_s: float) -> list[int]:
        """The last pass of a multi-step block ended at ``now_s``: one stream event for all.

        Returns the requests the block completed (all at ``now_s``, whichever step gave
        them their last token); requests abandoned during the block are dropped now.
        """
        if self._finishing:
            self._give_back_finished()
        decoders = self.decoders
        self.outstanding_tokens -= self._block_tokens + decoders.count
        self._block_tokens = 0
        finished = decoders.advance()
        if self._cancelled:
            self._drop_cancelled()
        decoders.event(now_s)
        completed: list[int] = []
        for seq in finished:
            if seq.phase == DECODE:
                self._finish(seq, now_s, completed)
        if self._parked:
            self._unpark(now_s, completed)
        if self._finishing and not self._lags:
            self._give_back_finished()
        return completed

    def _park(self, seq: Seq) -> None:
        seq.blocks = self.memory.held(seq)
        seq.last_event_s = self.decoders.last_event_s(seq)
        self._leave_phase(seq)
        seq.phase = IDLE_SLOT
        self.idle_slots += 1
        self.idle_slot_kv_tokens += seq.prompt_tokens + seq.output_tokens
        self._parked.append(seq)

    def _unpark(self, now_s: float, completed: list[int]) -> None:
        """Complete the parked requests at the block's end (abandoned ones just leave)."""
        records = self.records
        gaps: dict[float, int] = {}  # by when they last got tokens (mostly one entry)
        for seq in self._parked:
            why = Leaving.CANCELLED
            if records.status[seq.rid] == RUNNING:
                records.status[seq.rid] = COMPLETED
                records.completion_s[seq.rid] = now_s
                completed.append(seq.rid)
                gaps[seq.last_event_s] = gaps.get(seq.last_event_s, 0) + 1
                why = Leaving.COMPLETED
            records.generated_tokens[seq.rid] = seq.output_tokens
            self._remove(seq, why)
        for last_s, count in gaps.items():
            self._itl_add(now_s - last_s, count)
        self._parked.clear()
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0

    # ------------------------------------------------------------------ transitions
    def _queue_changed(self, now_s: float, delta: int) -> None:
        # Time-integral of the queue length, for Little's-law checks.
        self.queue_area_s += self.waiting_count * (now_s - self._queue_since_s)
        self._queue_since_s = now_s
        self.waiting_count += delta

    def _admit(self, rid: int, now_s: float) -> Seq:
        records = self.records
        if records.status[rid] != WAITING:
            raise RuntimeError(f"policy admitted request {rid}, which is not waiting")
        waiting = self._waiting
        if waiting[0] == rid:
            waiting.popleft()
        else:
            waiting.remove(rid)
        self._queue_changed(now_s, -1)
        records.status[rid] = RUNNING
        if records.first_scheduled_s[rid] != records.first_scheduled_s[rid]:  # NaN: first time
            records.first_scheduled_s[rid] = now_s
        key = (float(records.arrival_s[rid]), rid)
        seq = Seq(
            rid,
            key,
            int(self._prompt[rid]),
            int(self._output[rid]),
            int(records.generated_tokens[rid]),
        )
        self._admissions += 1
        seq.tick = self._admissions
        self.outstanding_tokens -= self.memory.admit(seq)  # tokens served from the prefix cache
        self._insert(seq)
        insort(self._prefilling, seq, key=_seq_key)
        return seq

    def _insert(self, seq: Seq) -> None:
        self.running[seq.rid] = seq
        insort(self._order, seq.key)

    def join_decoding(self, seq: Seq, last_event_s: float) -> None:
        """A request whose prompt KV arrived from elsewhere (its first token already out at
        ``last_event_s``) joins the decode group; its blocks were taken for it beforehand."""
        self.records.replica[seq.rid] = self.index
        self._admissions += 1
        seq.tick = self._admissions
        self._insert(seq)
        self.outstanding_tokens += seq.output_tokens - 1
        self.decoders.add(seq, last_event_s)  # its next inter-token gap counts from its first token

    def _emit_prefill_token(self, seq: Seq, now_s: float, completed: list[int]) -> None:
        if self.pool is not None and self.pool.hands_off(seq):
            self.pool.hand_off(self, seq, now_s)
            return
        self.outstanding_tokens -= 1
        generated = seq.target_tokens - seq.prompt_tokens + 1
        if generated == 1:
            self.records.first_token_s[seq.rid] = now_s
        elif self._last_event_s:  # a re-prefill after preemption: the stream resumes
            last_s = self._last_event_s.pop(seq.rid, None)
            if last_s is not None:
                self._itl_add(now_s - last_s, 1)
        if generated >= seq.output_tokens:
            self._finish(seq, now_s, completed)
        else:
            self._prefilling.remove(seq)
            self.decoders.add(seq, now_s)

    def _finish(self, seq: Seq, now_s: float, completed: list[int]) -> None:
        rid = seq.rid
        records = self.records
        records.status[rid] = COMPLETED
        records.completion_s[rid] = now_s
        records.generated_tokens[rid] = seq.output_tokens
        completed.append(rid)
        seq.blocks = self.memory.held(seq)
        self._leave_phase(seq)
        if not self._holds_slots:  # given back with the pass's other completions (see end)
            seq.phase = FINISHING
            self._finishing.append(seq)
            return
        seq.phase = IDLE_SLOT
        self.idle_slots += 1
        self.idle_slot_kv_tokens += seq.prompt_tokens + seq.output_tokens

    def _end_static_batch(self) -> None:
        for seq in list(self.running.values()):
            assert seq.phase == IDLE_SLOT, "static batch ended with a live sequence"
            self._remove(seq, Leaving.COMPLETED)
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0

    def _preempt(self, victims: list[int], now_s: float) -> None:
        records = self.records
        seqs = [self.running[rid] for rid in victims]
        requeued = []
        for seq in seqs:
            rid = seq.rid
            if seq.phase == FINISHING:  # completed, its output in flight: vLLM frees its KV now, it ends as it was
                self._finishing.remove(seq)
                self._remove(seq, Leaving.COMPLETED)
                continue
            requeued.append(seq)
            if seq.phase == DECODE:  # its stream resumes with the token of its re-prefill
                self._last_event_s[rid] = self.decoders.last_event_s(seq)
            records.generated_tokens[rid] = self._generated(seq)
            records.preemptions[rid] += 1
            self.outstanding_tokens += seq.prompt_tokens + seq.output_tokens - self._remaining(seq)
            self._remove(seq, Leaving.PREEMPTED)
            records.status[rid] = WAITING
            records.enqueued_s[rid] = now_s
            self._queue_changed(now_s, +1)
        # Back to the head of the queue, the earliest arrival first (vLLM's extendleft of victims).
        for seq in sorted(requeued, key=_seq_key, reverse=True):
            self._waiting.appendleft(seq.rid)

    def _drop_cancelled(self) -> None:
        for rid in self._cancelled:
            seq = self.running.get(rid)
            if seq is None or seq.phase == IDLE_SLOT or seq.phase == FINISHING:
                continue
            self.records.generated_tokens[rid] = self._generated(seq)
            self.outstanding_tokens -= self._remaining(seq)
            self._remove(seq, Leaving.CANCELLED)
            if self._last_event_s:
                self._last_event_s.pop(rid, None)
        self._cancelled.clear()

    def _remove(self, seq: Seq, why: Leaving) -> None:
        """Take a sequence out of the batch and give its blocks back to the memory model."""
        self.memory.release(seq, why)
        self.detach(seq)

    def detach(self, seq: Seq) -> None:
        """Take a sequence out of the batch without touching its blocks (a pool hands it off)."""
        self._leave_phase(seq)
        del self.running[seq.rid]
        del self._order[bisect_left(self._order, seq.key)]

    def _leave_phase(self, seq: Seq) -> None:
        if seq.phase == DECODE:
            self.decoders.remove(seq)
        elif seq.phase == PREFILL:
            self._prefilling.remove(seq)
        seq.phase = GONE

    # ------------------------------------------------------------------ per-sequence numbers
    def _generated(self, seq: Seq) -> int:
        if seq.phase == DECODE:
            return self.decoders.generated(seq)
        if seq.phase == IDLE_SLOT or seq.phase == FINISHING:
            return seq.output_tokens
        return seq.target_tokens - seq.prompt_tokens

    def _remaining(self, seq: Seq) -> int:
        """Tokens still to compute or generate (what least_outstanding routing counts)."""
        if seq.phase == IDLE_SLOT or seq.phase == FINISHING:
            return 0
        return seq.target_tokens - seq.computed_tokens + seq.output_tokens - self._generated(seq)

    def audit(self, max_queue_recount: int = 4096) -> None:
        """Check the invariants that must hold between passes (called periodically).

        Costs O(batch), plus a recount of the queue when it holds at most
        ``max_queue_recount`` entries (so audits stay cheap under huge backlogs).

        Raises:
            AssertionError: blocks over capacity, blocks not matching the sequences holding
                them, a sequence without room for its cached tokens, or a drifting sum.
        """
        decoders, seqs = self.decoders, list(self.running.values())
        if self.pool is None:
            self.memory.audit(seqs)
        else:  # blocks of transfers in flight belong to no running request
            self.pool.audit_memory(self, seqs)
        decoding = [seq for seq in seqs if seq.phase == DECODE]
        assert decoders.count == len(decoding), "decode group size drifted"
        assert decoders.kv_tokens == sum(decoders.context(s) for s in decoding), "decode KV drifted"
        if len(self._waiting) <= max_queue_recount:
            queued = list(self.waiting_ids())
            assert self.waiting_count == len(queued), "queue length drifted"
            work = sum(int(self._prompt[r]) + int(self._output[r]) for r in queued)
            work += sum(self._remaining(seq) for seq in seqs)
            assert self.outstanding_tokens == work, "outstanding token count drifted"


def _seq_key(seq: Seq) -> tuple[float, int]:
    return seq.key


def _seq_tick(seq: Seq) -> int:
    return seq.tick
