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
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from sim.metrics.itl import ITLRecorder
from sim.metrics.records import COMPLETED, RUNNING, TIMED_OUT, WAITING, RequestRecords
from sim.policies.base import IterationPlan
from sim.serving.kv_cache import BlockAllocator
from sim.serving.ledger import KVLedger
from sim.serving.sequences import DECODE, GONE, IDLE_SLOT, PREFILL, DecodeGroup, Seq

CostTotals = tuple[int, int, float, int, int]
"""(prefill tokens, prefill pieces, prefill attention work, decode sequences, decode KV tokens)."""
_NOTHING: list[Seq] = []  # shared empty result, never appended to


class ReplicaState:
    """Queue, running batch and KV blocks of one replica.

    Class attribute ``merges_decode``: the worker may merge consecutive pure decode passes
    of this state into one SimPy event (:meth:`repeatable_decodes`, :meth:`repeat_decodes`);
    subclasses whose pass outcome depends on more than the decode group (speculative
    acceptance, pool hand-offs at every boundary) set it False.

    Args:
        index: replica number.
        records: per-request columns shared by all replicas.
        prompt_tokens, output_tokens: the stream's lengths (indexed by request id).
        allocator: this replica's KV blocks.
        reserve_output_tokens: reserve KV for prompt + this many tokens at admission
            (static, continuous); None for paged allocation as tokens are computed.
        holds_slots: finished sequences keep their slot and KV until the batch is done.
        whole_prompt: paged memory, but a request's whole prompt (plus tokens it generated
            before a preemption) is allocated when it is admitted, not chunk by chunk
            (Sarathi-Serve, vLLM v0 chunked prefill).
        itl: where inter-token gaps go (shared by the replicas of a run; default: a private one).
    """

    merges_decode: ClassVar[bool] = True

    def __init__(
        self,
        index: int,
        records: RequestRecords,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        allocator: BlockAllocator,
        *,
        reserve_output_tokens: int | None,
        holds_slots: bool = False,
        whole_prompt: bool = False,
        itl: ITLRecorder | None = None,
    ) -> None:
        self.index = index
        self.now_s = 0.0
        self.blocks = allocator
        self.itl = itl if itl is not None else ITLRecorder()
        self._itl_add = self.itl.add
        self.decoders = DecodeGroup(allocator.block_size, self.itl)
        self.kv = KVLedger(self, allocator.total_blocks)
        self.running: dict[int, Seq] = {}
        self.waiting_count = 0
        self.outstanding_tokens = 0
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0
        self.prefill_context_tokens = 0  # of the pass ``begin`` last prepared
        self.queue_area_s = 0.0
        self._records = records
        self._prompt = prompt_tokens
        self._output = output_tokens
        self._reserve = reserve_output_tokens
        self._holds_slots = holds_slots
        self._whole_prompt = whole_prompt and reserve_output_tokens is None
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
        self.now_s = now_s
        self.kv.reset(self.blocks.free_blocks)
        waiting, status = self._waiting, self._records.status
        while waiting and status[waiting[0]] != WAITING:
            waiting.popleft()  # abandoned while queued (lazy removal)
        return self

    def waiting_ids(self) -> Iterator[int]:
        """Queued request ids, head first."""
        status = self._records.status
        return (rid for rid in self._waiting if status[rid] == WAITING)

    def oldest_waiting_since_s(self) -> float:
        """When the head of the queue joined it (inf if empty)."""
        head = next(self.waiting_ids(), None)
        return math.inf if head is None else float(self._records.enqueued_s[head])

    def tokens_to_prefill(self, rid: int) -> int:
        """Tokens ``rid`` must compute before its next token (prompt + generated when queued)."""
        seq = self.running.get(rid)
        if seq is not None:
            return seq.target_tokens - seq.computed_tokens
        return int(self._prompt[rid]) + int(self._records.generated_tokens[rid])

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

    # ------------------------------------------------------------------ ledger source
    def free_blocks_now(self) -> int:
        """Free KV blocks."""
        return self.blocks.free_blocks

    def admission_blocks(self, rid: int, tokens: int) -> int:
        """Blocks a queued request takes to start computing ``tokens`` tokens."""
        if self._reserve is not None:
            return self.blocks.blocks_for(int(self._prompt[rid]) + self._reserve)
        if self._whole_prompt:
            return self.blocks.blocks_for(self.tokens_to_prefill(rid))
        return self.blocks.blocks_for(tokens)

    def extension_blocks(self, rid: int, tokens: int) -> int:
        """More blocks running request ``rid`` needs to compute ``tokens`` more tokens."""
        if self._reserve is not None:
            return 0
        seq = self.running[rid]
        return max(0, self.blocks.blocks_for(seq.computed_tokens + tokens) - seq.blocks)

    def decode_blocks_needed(self, steps: int = 1) -> int:
        """New blocks the next ``steps`` decode steps need (each request stops at its last token)."""
        if self._reserve is not None:
            return 0
        return self.decoders.blocks_needed() if steps == 1 else self.decoders.blocks_needed_over(steps)

    def held_blocks(self, rid: int) -> int:
        """Blocks running request ``rid`` holds now."""
        seq = self.running[rid]
        if seq.phase == DECODE and self._reserve is None:
            return self.decoders.cached_blocks(seq)
        return seq.blocks

    def decode_growth_blocks(self, rid: int, steps: int = 1) -> int:
        """New blocks running request ``rid`` needs over the next ``steps`` decode steps."""
        seq = self.running[rid]
        if self._reserve is not None or seq.phase != DECODE:
            return 0
        if steps == 1:
            return int(self.decoders.crosses_next(seq))
        return self.decoders.growth_blocks(seq, steps)

    # ------------------------------------------------------------------ engine API
    def enqueue(self, rid: int, now_s: float) -> None:
        """A request (re)sent to this replica joins the back of the queue."""
        records = self._records
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
        records = self._records
        status = records.status[rid]
        records.status[rid] = TIMED_OUT
        records.completion_s[rid] = now_s
        if status == WAITING:
            self._queue_changed(now_s, -1)
            self.outstanding_tokens -= int(self._prompt[rid]) + int(self._output[rid])
            if self._last_event_s:
                self._last_event_s.pop(rid, None)
        elif status == RUNNING:
            self._cancelled.append(rid)

    def begin(self, plan: IterationPlan, now_s: float) -> CostTotals:
        """Apply a plan's preemptions, admissions and allocations; return the cost-model totals."""
        if plan.preempt:
            self._preempt(plan.preempt, now_s)
        if plan.prefill:
            self._prepare_prefills(plan.prefill, now_s)
        if plan.decode:
            decoders = self.decoders
            if self._reserve is None:
                needed = decoders.blocks_needed()
                if needed:  # most decode steps cross no block boundary
                    self.blocks.allocate(needed)
            decodes, kv_tokens = decoders.count, decoders.kv_tokens  # admissions below do not decode yet
        else:
            decodes = kv_tokens = 0
        prefill_tokens = 0
        attention_work = 0.0
        self.prefill_context_tokens = 0
        if plan.prefill:
            prefill_tokens, attention_work = self._begin_prefills(plan.prefill, now_s)
        if plan.charge_idle_slots:
            decodes += self.idle_slots
            kv_tokens += self.idle_slot_kv_tokens
        return prefill_tokens, len(plan.prefill), attention_work, decodes, kv_tokens

    def _prepare_prefills(self, pieces: list[tuple[int, int]], now_s: float) -> None:
        """Hook before any block of a pass is allocated (prefix caching admits joiners here)."""

    def _begin_prefills(self, pieces: list[tuple[int, int]], now_s: float) -> tuple[int, float]:
        """Admit joiners, allocate the pieces' blocks; return (prefill tokens, attention work)."""
        prefill_tokens = 0
        attention_work = 0.0
        for rid, tokens in pieces:
            seq = self.running[rid] if rid in self.running else self._admit(rid, now_s)
            if self._reserve is None:
                grow = max(0, self.blocks.blocks_for(seq.computed_tokens + tokens) - seq.blocks)
                self.blocks.allocate(grow)
                seq.blocks += grow
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
        """Credit the pass that just ended at ``now_s``; return the requests it completed."""
        completed: list[int] = []
        finished = _NOTHING
        if plan.decode:
            decoders = self.decoders
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
        if self.idle_slots and not self.decoders.count and not self._prefilling:
            self._end_static_batch()
        return completed

    def repeatable_decodes(self) -> int:
        """How many more times in a row the pure decode pass just begun may be repeated (ended
        early and begun again, as a steady policy would plan it), as far as finishing members
        and cancellations go (paged memory: each repeat's new blocks must also fit within
        :meth:`span_free_blocks`; see ``DecodeGroup.block_need_cycle``)."""
        decoders = self.decoders
        if self._cancelled or not decoders.count:
            return 0
        return max(0, decoders.steps_before_finish())

    def span_free_blocks(self) -> int:
        """Free blocks the repeats of a merged decode span may take (paged memory): all of them here;
        a subclass whose policy could see an allocation's side effects offers fewer."""
        return self.blocks.free_blocks

    @property
    def grows_per_step(self) -> bool:
        """Whether decode steps allocate blocks as they go (paged memory), not from a reservation."""
        return self._reserve is None

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
        needed = decoders.blocks_needed()
        if needed:
            self.blocks.allocate(needed)
        seqs = decoders.count + self.idle_slots
        return 0, 0, 0.0, seqs, decoders.kv_tokens + self.idle_slot_kv_tokens

    def end_block(self, now_s: float) -> list[int]:
        """The last pass of a multi-step block ended at ``now_s``: one stream event for all.

        Returns the requests the block completed (all at ``now_s``, whichever step gave
        them their last token); requests abandoned during the block are dropped now.
        """
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
        return completed

    def _park(self, seq: Seq) -> None:
        seq.blocks = self.decoders.cached_blocks(seq)
        seq.last_event_s = self.decoders.last_event_s(seq)
        self._leave_phase(seq)
        seq.phase = IDLE_SLOT
        self.idle_slots += 1
        self.idle_slot_kv_tokens += seq.prompt_tokens + seq.output_tokens
        self._parked.append(seq)

    def _unpark(self, now_s: float, completed: list[int]) -> None:
        """Complete the parked requests at the block's end (abandoned ones just leave)."""
        records = self._records
        gaps: dict[float, int] = {}  # by when they last got tokens (mostly one entry)
        for seq in self._parked:
            if records.status[seq.rid] == RUNNING:
                records.status[seq.rid] = COMPLETED
                records.completion_s[seq.rid] = now_s
                completed.append(seq.rid)
                gaps[seq.last_event_s] = gaps.get(seq.last_event_s, 0) + 1
            records.generated_tokens[seq.rid] = seq.output_tokens
            self._remove(seq)
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
        records = self._records
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
        if self._reserve is not None:
            seq.blocks = self.blocks.blocks_for(seq.prompt_tokens + self._reserve)
            self.blocks.allocate(seq.blocks)
        elif self._whole_prompt:
            seq.blocks = self.blocks.blocks_for(seq.target_tokens)
            self.blocks.allocate(seq.blocks)
        self.running[rid] = seq
        insort(self._order, key)
        insort(self._prefilling, seq, key=_seq_key)
        return seq

    def _emit_prefill_token(self, seq: Seq, now_s: float, completed: list[int]) -> None:
        self.outstanding_tokens -= 1
        generated = seq.target_tokens - seq.prompt_tokens + 1
        if generated == 1:
            self._records.first_token_s[seq.rid] = now_s
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
        records = self._records
        records.status[rid] = COMPLETED
        records.completion_s[rid] = now_s
        records.generated_tokens[rid] = seq.output_tokens
        completed.append(rid)
        if not self._holds_slots:
            self._remove(seq)
            return
        seq.blocks = self._held(seq)
        self._leave_phase(seq)
        seq.phase = IDLE_SLOT
        self.idle_slots += 1
        self.idle_slot_kv_tokens += seq.prompt_tokens + seq.output_tokens

    def _end_static_batch(self) -> None:
        for seq in list(self.running.values()):
            assert seq.phase == IDLE_SLOT, "static batch ended with a live sequence"
            self._remove(seq)
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0

    def _preempt(self, victims: list[int], now_s: float) -> None:
        records = self._records
        seqs = [self.running[rid] for rid in victims]
        for seq in seqs:
            rid = seq.rid
            if seq.phase == DECODE:  # its stream resumes with the token of its re-prefill
                self._last_event_s[rid] = self.decoders.last_event_s(seq)
            records.generated_tokens[rid] = self._generated(seq)
            records.preemptions[rid] += 1
            self.outstanding_tokens += seq.prompt_tokens + seq.output_tokens - self._remaining(seq)
            self._remove(seq)
            records.status[rid] = WAITING
            records.enqueued_s[rid] = now_s
            self._queue_changed(now_s, +1)
        # Back to the head of the queue, the earliest arrival first (vLLM's extendleft of victims).
        for seq in sorted(seqs, key=_seq_key, reverse=True):
            self._waiting.appendleft(seq.rid)

    def _drop_cancelled(self) -> None:
        for rid in self._cancelled:
            seq = self.running.get(rid)
            if seq is None or seq.phase == IDLE_SLOT:
                continue
            self._records.generated_tokens[rid] = self._generated(seq)
            self.outstanding_tokens -= self._remaining(seq)
            self._remove(seq)
            if self._last_event_s:
                self._last_event_s.pop(rid, None)
        self._cancelled.clear()

    def _remove(self, seq: Seq) -> None:
        """Take a sequence out of the batch and free its blocks."""
        self.blocks.release(self._held(seq))
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
    def _held(self, seq: Seq) -> int:
        if seq.phase == DECODE and self._reserve is None:
            return self.decoders.cached_blocks(seq)
        return seq.blocks

    def _generated(self, seq: Seq) -> int:
        if seq.phase == DECODE:
            return self.decoders.generated(seq)
        if seq.phase == IDLE_SLOT:
            return seq.output_tokens
        return seq.target_tokens - seq.prompt_tokens

    def _remaining(self, seq: Seq) -> int:
        """Tokens still to compute or generate (what least_outstanding routing counts)."""
        if seq.phase == IDLE_SLOT:
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
        blocks, decoders, seqs = self.blocks, self.decoders, self.running.values()
        held = sum(self._held(seq) for seq in seqs)
        assert 0 <= blocks.used_blocks <= blocks.total_blocks, "KV over capacity"
        assert held == blocks.used_blocks + blocks.shared_surplus, (  # shared blocks count once per holder
            f"requests hold {held} blocks, allocator {blocks.used_blocks} (+{blocks.shared_surplus} shared)"
        )
        for seq in seqs:
            cached = decoders.context(seq) - 1 if seq.phase == DECODE else seq.computed_tokens
            assert blocks.blocks_for(cached) <= self._held(seq), (
                f"request {seq.rid} lacks KV blocks"
            )
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
