"""One replica's queue, running batch and KV blocks as plain ints and lists (the fast path's state).

:class:`FastReplica` is :class:`sim.serving.state.ReplicaState` without per-request objects:
running requests are slots (:mod:`sim.serving.fast.group`), KV memory is one block count with
the reserve or paged discipline built in (``reserve_tokens`` set: reserve; else paged, with
``whole_prompt`` granting a (re)prefill's blocks at admission). Its transitions are the
general state's, step for step, so that both paths write the same records: ``begin`` applies a
plan's preemptions, admissions and allocations, ``end`` credits the pass. What routers and
clients use (``enqueue``, ``abandon``, ``waiting_count``, ``outstanding_tokens``) is the same
interface. The policy decisions live in :mod:`sim.serving.fast.kernels`.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from types import SimpleNamespace

from sim.metrics.itl import ITLRecorder
from sim.metrics.records import COMPLETED, RUNNING, TIMED_OUT, WAITING, RequestRecords
from sim.serving.fast.columns import RecordViews
from sim.serving.fast.group import DECODE, FINISH_SHIFT, IDLE_SLOT, PREFILL, SlotGroup, Slots
from sim.serving.kv_cache import KVOverflowError

Totals = tuple[int, int, float, int, int]


class FastReplica(SlotGroup):
    """Queue, running slots and KV blocks of one replica (see the module docstring).

    Args:
        index: replica number.
        records: per-request columns shared by all replicas.
        prompt_tokens, output_tokens: the stream's lengths, as typed arrays of Python ints.
        kv_blocks, block_size: this replica's KV capacity.
        itl: the run's inter-token gaps.
        reserve_tokens: reserve memory with this many output tokens per request (None: paged).
        whole_prompt: paged memory granting a (re)prefill's blocks at admission.
        holds_slots: finished requests keep their slot and KV until the batch is done (static).
        orders_running: keep the running requests in arrival order (policies that preempt).
    """

    def __init__(
        self, index: int, records: RequestRecords, prompt_tokens: Sequence[int], output_tokens: Sequence[int],
        kv_blocks: int, block_size: int, itl: ITLRecorder, *, reserve_tokens: int | None, whole_prompt: bool,
        holds_slots: bool, orders_running: bool,
    ) -> None:  # fmt: skip
        self.index = index
        self.records = records
        self.cols = RecordViews(records)  # the same columns, read and written as Python numbers
        self._status = self.cols.status
        self._prompt = prompt_tokens
        self._output = output_tokens
        self.total_blocks = kv_blocks
        self.block_size = block_size
        self.used_blocks = 0
        self.reserve_tokens = reserve_tokens
        self.whole_prompt = whole_prompt
        self.holds_slots = holds_slots
        self._orders = orders_running
        self._itl_add = itl.add
        self.slots = Slots()
        self.init_group(itl)
        self.running: dict[int, int] = {}  # rid -> slot, in admission order
        self.order: list[tuple[float, int]] = []  # running keys, oldest arrival first (policies that preempt)
        self.prefilling: list[tuple[float, int]] = []  # keys of requests part-way through a prefill
        self.waiting: deque[int] = deque()
        self.waiting_count = 0
        self.outstanding_tokens = 0
        self.queue_area_s = 0.0
        self._queue_since_s = 0.0
        self.cancelled: list[int] = []
        self.last_token_s: dict[int, float] = {}  # preempted after a token: when it got it
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0
        self.prefill_context_tokens = 0
        self.pad = False  # the last plan charges static idle slots
        self.touched = False  # a client reached the replica since its last plan

    # ------------------------------------------------------------------ what others read
    @property
    def running_count(self) -> int:
        """Requests holding a slot (static idle slots included)."""
        return len(self.running)

    @property
    def blocks(self) -> SimpleNamespace:
        """The KV blocks as an allocator reports them (used, total, free)."""
        used = self.used_blocks
        return SimpleNamespace(used_blocks=used, total_blocks=self.total_blocks, free_blocks=self.total_blocks - used,
                               block_size=self.block_size, shared_surplus=0)  # fmt: skip

    def blocks_for(self, tokens: int) -> int:
        """Blocks holding ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def held(self, slot: int) -> int:
        """Blocks the slot's request holds now."""
        if self.reserve_tokens is None and self.slots.phase[slot] == DECODE:
            return self.cached_blocks(slot)
        return self.slots.blocks[slot]

    def pop_abandoned_heads(self) -> None:
        """Drop requests abandoned while queued from the head of the queue (lazy removal)."""
        waiting, status = self.waiting, self._status
        while waiting and status[waiting[0]] != WAITING:
            waiting.popleft()

    def queued_tokens(self, rid: int) -> int:
        """Tokens queued request ``rid`` must compute before its next token (prompt + generated)."""
        return self._prompt[rid] + self.cols.generated_tokens[rid]

    # ------------------------------------------------------------------ clients
    def enqueue(self, rid: int, now_s: float) -> None:
        """A request (re)sent to this replica joins the back of the queue."""
        records = self.cols
        self.touched = True
        self._status[rid] = WAITING
        records.replica[rid] = self.index
        records.enqueued_s[rid] = now_s
        self._queue_changed(now_s, +1)
        self.waiting.append(rid)
        self.outstanding_tokens += self._prompt[rid] + self._output[rid]

    def abandon(self, rid: int, now_s: float) -> None:
        """The client gave up on ``rid``: dropped if queued, cancelled at the end of the pass if running."""
        self.touched = True
        status = self._status[rid]
        self._status[rid] = TIMED_OUT
        self.cols.completion_s[rid] = now_s
        if status == WAITING:
            self._queue_changed(now_s, -1)
            self.outstanding_tokens -= self._prompt[rid] + self._output[rid]
            if self.last_token_s:
                self.last_token_s.pop(rid, None)
        elif status == RUNNING:
            self.cancelled.append(rid)

    # ------------------------------------------------------------------ a pass
    def begin(self, pieces: list[tuple[int, int]], preempt: list[int], decode: bool, pad: bool, now_s: float) -> Totals:
        """Apply a plan (``ReplicaState.begin``); return the cost-model totals."""
        if preempt:
            self._preempt(preempt, now_s)
        if pieces:
            running = self.running
            if not self.whole_prompt:  # a loop, not a list of joiners: this runs at every prefill pass
                for rid, _ in pieces:
                    if rid not in running:
                        self._admit(rid, now_s)
            else:  # every joiner admitted, then their whole (re)prefills granted (as the general path does)
                joiners = [self._admit(rid, now_s) for rid, _ in pieces if rid not in running]
                slots, blocks_for = self.slots, self.blocks_for
                for slot in joiners:
                    grow = blocks_for(slots.target[slot]) - slots.blocks[slot]
                    self._allocate(grow)
                    slots.blocks[slot] += grow
        if decode:
            if self.reserve_tokens is None:
                needed = self.per_residue[-self.step % self.block_size]
                if needed:
                    self._allocate(needed)
            decodes, kv_tokens = self.count, self.kv_tokens
        else:
            decodes = kv_tokens = 0
        prefill_tokens = 0
        attention_work = 0.0
        self.prefill_context_tokens = 0
        if pieces:
            prefill_tokens, attention_work = self._begin_prefills(pieces)
        if pad:
            decodes += self.idle_slots
            kv_tokens += self.idle_slot_kv_tokens
        return prefill_tokens, len(pieces), attention_work, decodes, kv_tokens

    def decode_fits(self) -> bool:
        """Whether the next decode step's new blocks are free (reserve memory: always)."""
        return self.reserve_tokens is not None or self.per_residue[-self.step % self.block_size] <= (
            self.total_blocks - self.used_blocks
        )

    def begin_decode(self) -> Totals:
        """``begin`` of the last plan again, a pure decode plan (its padding as it was): the step's blocks."""
        if self.reserve_tokens is None:
            needed = self.per_residue[-self.step % self.block_size]
            if needed:
                self._allocate(needed)
        self.prefill_context_tokens = 0
        if self.pad:
            return 0, 0, 0.0, self.count + self.idle_slots, self.kv_tokens + self.idle_slot_kv_tokens
        return 0, 0, 0.0, self.count, self.kv_tokens

    def can_repeat_decode(self) -> bool:
        """Whether the pure decode pass in flight, once ended, gives no member its last token (stale finish
        entries count) and leaves the next step's blocks free: then, nothing having reached the replica, a
        steady policy plans it again (``end_decode``, then ``begin_decode``)."""
        step = self.step + 1
        heap = self.heap
        if heap and heap[0] < (step + 1) << FINISH_SHIFT:
            return False
        return self.reserve_tokens is not None or self.per_residue[-step % self.block_size] <= (
            self.total_blocks - self.used_blocks
        )

    def end_decode(self, now_s: float) -> None:
        """``end`` of a pure decode pass that completes no one and has no cancellation waiting."""
        count = self.count
        self.outstanding_tokens -= count
        self.step = step = self.step + 1
        self.kv_tokens += count
        if self.veterans == self.run_veterans == count and not self.joiners:  # ``event`` when only its time is new
            self.times.append(now_s)
            self.event_s, self.event_step = now_s, step
        else:
            self.event(now_s)

    def _begin_prefills(self, pieces: list[tuple[int, int]]) -> tuple[int, float]:
        slots, running, paged = self.slots, self.running, self.reserve_tokens is None
        computed, blocks, target = slots.computed, slots.blocks, slots.target
        prefill_tokens = 0
        attention_work = 0.0
        context = 0
        for rid, tokens in pieces:
            slot = running[rid]
            done = computed[slot]
            if paged:
                grow = -(-(done + tokens) // self.block_size) - blocks[slot]
                if grow > 0:
                    self._allocate(grow)
                    blocks[slot] += grow
            attention_work += tokens * (done + tokens / 2)
            context += done
            computed[slot] = done + tokens
            prefill_tokens += tokens
            if not (0 < tokens and done + tokens <= target[slot]):
                raise AssertionError(f"bad prefill piece {rid}: {tokens}")
        self.prefill_context_tokens = context
        self.outstanding_tokens -= prefill_tokens
        return prefill_tokens, attention_work

    def end(self, pieces: list[tuple[int, int]], decode: bool, now_s: float) -> list[int]:
        """Credit the pass that ended at ``now_s`` (``ReplicaState.end``); return the requests it completed."""
        completed: list[int] = []
        finished: list[int] = []
        if decode:
            self.outstanding_tokens -= self.count
            if self.cancelled:
                finished = self.advance(None)
                self._drop_cancelled()
                self.event(now_s)
            else:
                finished = self.advance(now_s)
        elif self.cancelled:
            self._drop_cancelled()
        if finished:
            phase = self.slots.phase
            for slot in finished:
                if phase[slot] == DECODE:
                    self._finish(slot, now_s, completed)
        if pieces:
            slots, running = self.slots, self.running
            for rid, _ in pieces:
                held = running.get(rid)
                if held is not None and slots.phase[held] == PREFILL and slots.computed[held] == slots.target[held]:
                    self._emit_prefill_token(held, now_s, completed)
        if self.idle_slots and not self.count and not self.prefilling:
            self._end_static_batch()
        return completed

    def repeat_decodes(self, ends: list[float], new_blocks: int) -> None:
        """The pure decode passes ending at ``ends`` ended early and were begun again (a merged span)."""
        self.outstanding_tokens -= self.count * len(ends)
        self.advance_steps(ends)
        if new_blocks:
            self._allocate(new_blocks)
        self.prefill_context_tokens = 0

    # ------------------------------------------------------------------ transitions
    def _allocate(self, blocks: int) -> None:
        used = self.used_blocks + blocks
        if used > self.total_blocks or blocks < 0:
            raise KVOverflowError(f"allocating {blocks} blocks: {self.used_blocks} of {self.total_blocks} in use")
        self.used_blocks = used

    def _release(self, blocks: int) -> None:
        used = self.used_blocks - blocks
        if used < 0 or blocks < 0:
            raise KVOverflowError(f"releasing {blocks} blocks: only {self.used_blocks} in use")
        self.used_blocks = used

    def _queue_changed(self, now_s: float, delta: int) -> None:
        self.queue_area_s += self.waiting_count * (now_s - self._queue_since_s)
        self._queue_since_s = now_s
        self.waiting_count += delta

    def _admit(self, rid: int, now_s: float) -> int:
        records, status = self.cols, self._status
        if status[rid] != WAITING:
            raise RuntimeError(f"policy admitted request {rid}, which is not waiting")
        waiting = self.waiting
        if waiting[0] == rid:
            waiting.popleft()
        else:
            waiting.remove(rid)
        self._queue_changed(now_s, -1)
        status[rid] = RUNNING
        if records.first_scheduled_s[rid] != records.first_scheduled_s[rid]:  # NaN: first time
            records.first_scheduled_s[rid] = now_s
        key = (records.arrival_s[rid], rid)
        prompt = self._prompt[rid]
        slot = self.slots.take(rid, prompt, self._output[rid], prompt + records.generated_tokens[rid], key)
        if self.reserve_tokens is not None:
            blocks = self.slots.blocks[slot] = -(-(prompt + self.reserve_tokens) // self.block_size)
            self._allocate(blocks)
        self.running[rid] = slot
        if self._orders:
            insort(self.order, key)
        insort(self.prefilling, key)
        return slot

    def _emit_prefill_token(self, slot: int, now_s: float, completed: list[int]) -> None:
        slots = self.slots
        self.outstanding_tokens -= 1
        rid, prompt = slots.rid[slot], slots.prompt[slot]
        generated = slots.target[slot] - prompt + 1
        if generated == 1:
            self.cols.first_token_s[rid] = now_s
        elif self.last_token_s:  # a re-prefill after preemption: the stream resumes
            last_s = self.last_token_s.pop(rid, None)
            if last_s is not None:
                self._itl_add(now_s - last_s, 1)
        if generated >= slots.output[slot]:
            self._finish(slot, now_s, completed)
        else:
            prefilling = self.prefilling
            del prefilling[bisect_left(prefilling, slots.key[slot])]
            self.add(slot, now_s)

    def _finish(self, slot: int, now_s: float, completed: list[int]) -> None:
        slots, records = self.slots, self.cols
        rid = slots.rid[slot]
        self._status[rid] = COMPLETED
        records.completion_s[rid] = now_s
        records.generated_tokens[rid] = slots.output[slot]
        completed.append(rid)
        if not self.holds_slots:
            self._remove(slot)
            return
        slots.blocks[slot] = self.held(slot)
        self._leave_phase(slot)
        slots.phase[slot] = IDLE_SLOT
        self.idle_slots += 1
        self.idle_slot_kv_tokens += slots.prompt[slot] + slots.output[slot]

    def _end_static_batch(self) -> None:
        for slot in list(self.running.values()):
            assert self.slots.phase[slot] == IDLE_SLOT, "static batch ended with a live sequence"
            self._remove(slot)
        self.idle_slots = 0
        self.idle_slot_kv_tokens = 0

    def _preempt(self, victims: list[int], now_s: float) -> None:
        records, slots, running = self.cols, self.slots, self.running
        keys = []
        for rid in victims:
            slot = running[rid]
            if slots.phase[slot] == DECODE:  # its stream resumes with the token of its re-prefill
                self.last_token_s[rid] = self.last_event_s(slot)
            records.generated_tokens[rid] = self._generated(slot)
            records.preemptions[rid] += 1
            self.outstanding_tokens += slots.prompt[slot] + slots.output[slot] - self._remaining(slot)
            keys.append(slots.key[slot])
            self._remove(slot)
            self._status[rid] = WAITING
            records.enqueued_s[rid] = now_s
            self._queue_changed(now_s, +1)
        for key in sorted(keys, reverse=True):  # back to the head of the queue, the earliest arrival first
            self.waiting.appendleft(key[1])

    def _drop_cancelled(self) -> None:
        slots, running = self.slots, self.running
        for rid in self.cancelled:
            slot = running.get(rid)
            if slot is None or slots.phase[slot] == IDLE_SLOT:
                continue
            self.cols.generated_tokens[rid] = self._generated(slot)
            self.outstanding_tokens -= self._remaining(slot)
            self._remove(slot)
            if self.last_token_s:
                self.last_token_s.pop(rid, None)
        self.cancelled.clear()

    def _remove(self, slot: int) -> None:
        """Take a request out of the batch and give its blocks back."""
        self._release(self.held(slot))
        self._leave_phase(slot)
        slots = self.slots
        key = slots.key[slot]
        del self.running[slots.rid[slot]]
        if self._orders:
            order = self.order
            del order[bisect_left(order, key)]
        slots.give_back(slot)

    def _leave_phase(self, slot: int) -> None:
        phase = self.slots.phase[slot]
        if phase == DECODE:
            self.remove(slot)
        elif phase == PREFILL:
            prefilling = self.prefilling
            del prefilling[bisect_left(prefilling, self.slots.key[slot])]

    # ------------------------------------------------------------------ per-request numbers
    def _generated(self, slot: int) -> int:
        phase = self.slots.phase[slot]
        if phase == DECODE:
            return self.generated(slot)
        if phase == IDLE_SLOT:
            return self.slots.output[slot]
        return self.slots.target[slot] - self.slots.prompt[slot]

    def _remaining(self, slot: int) -> int:
        """Tokens still to compute or generate (what least_outstanding routing counts)."""
        slots = self.slots
        if slots.phase[slot] == IDLE_SLOT:
            return 0
        return slots.target[slot] - slots.computed[slot] + slots.output[slot] - self._generated(slot)

    def audit(self, max_queue_recount: int = 4096) -> None:
        """Check the invariants between passes (``ReplicaState.audit``).

        Raises:
            AssertionError: blocks over capacity or not matching their holders, or a drifting sum.
        """
        slots = self.slots
        held = list(self.running.values())
        assert 0 <= self.used_blocks <= self.total_blocks, "KV over capacity"
        assert sum(self.held(slot) for slot in held) == self.used_blocks, "blocks do not match their holders"
        for slot in held:
            cached = self.context(slot) - 1 if slots.phase[slot] == DECODE else slots.computed[slot]
            assert self.blocks_for(cached) <= self.held(slot), f"request {slots.rid[slot]} lacks KV blocks"
        decoding = [slot for slot in held if slots.phase[slot] == DECODE]
        assert self.count == len(decoding), "decode group size drifted"
        assert self.kv_tokens == sum(self.context(slot) for slot in decoding), "decode KV drifted"
        if len(self.waiting) <= max_queue_recount:
            queued = [rid for rid in self.waiting if self._status[rid] == WAITING]
            assert self.waiting_count == len(queued), "queue length drifted"
            work = sum(self._prompt[r] + self._output[r] for r in queued)
            work += sum(self._remaining(slot) for slot in held)
            assert self.outstanding_tokens == work, "outstanding token count drifted"

    def oldest_waiting_since_s(self) -> float:
        """When the head of the queue joined it (inf if empty)."""
        status = self._status
        head = next((rid for rid in self.waiting if status[rid] == WAITING), None)
        return math.inf if head is None else self.cols.enqueued_s[head]
