"""Running requests as slots (struct of arrays) and the decode group over them.

The fast path keeps no object per request. A request holding a batch slot of a replica
occupies a *slot*: an index into plain lists (its id, lengths, computed tokens, blocks,
phase, and its decode-group fields). :class:`SlotGroup` is
:class:`sim.serving.sequences.DecodeGroup` over slots, with the same arithmetic and the same
stream events (inter-token gaps), so both paths write the same records: a step clock, the
count and context sum of its members, the members per residue modulo the block size (paged
memory), and a heap of finish steps packed into one int each (finish step, join number,
slot), ordered as the general path orders its ``(finish step, join number)`` entries.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any

from sim.metrics.itl import ITLRecorder

PREFILL, DECODE, IDLE_SLOT, GONE = range(4)
"""Phases of a slot's request, as :mod:`sim.serving.sequences` names them."""

_NO_SLOTS: list[int] = []  # what ``advance`` returns when no one completes (never appended to)

SLOT_BITS = 24
JOIN_BITS = 38
FINISH_SHIFT = SLOT_BITS + JOIN_BITS
SLOT_MASK = (1 << SLOT_BITS) - 1
JOIN_MASK = (1 << JOIN_BITS) - 1


class Slots:
    """Per-slot columns of one replica's running requests (plain lists, grown on demand).

    Attributes:
        rid, prompt, output: the request and its lengths.
        target, computed: tokens to compute before its next token, and those computed so far.
        blocks: KV blocks held while prefilling, or the reservation (reserve memory).
        phase: PREFILL, DECODE, IDLE_SLOT (finished, keeping a static slot) or GONE (free).
        key: (first send time, rid): arrival order, for preemption victims.
        start_step, start_context, residue, last_s, join: decode-group fields (see SlotGroup).
    """

    __slots__ = (
        "rid", "prompt", "output", "target", "computed", "blocks", "phase", "key",
        "start_step", "start_context", "residue", "last_s", "join", "_free",
    )  # fmt: skip

    rid: list[int]
    prompt: list[int]
    output: list[int]
    target: list[int]
    computed: list[int]
    blocks: list[int]
    phase: list[int]
    key: list[tuple[float, int]]
    start_step: list[int]
    start_context: list[int]
    residue: list[int]
    last_s: list[float]
    join: list[int]

    def __init__(self) -> None:
        for name in self.__slots__[:-1]:
            setattr(self, name, [])
        self._free: list[int] = []

    def take(self, rid: int, prompt: int, output: int, target: int, key: tuple[float, int]) -> int:
        """A free slot for a request starting its (re)prefill of ``target`` tokens."""
        if self._free:
            slot = self._free.pop()
            self.rid[slot], self.prompt[slot], self.output[slot], self.target[slot] = rid, prompt, output, target
            self.computed[slot] = self.blocks[slot] = 0
            self.phase[slot], self.key[slot] = PREFILL, key
            return slot
        slot = len(self.rid)
        fields: tuple[tuple[list[Any], Any], ...] = (
            (self.rid, rid), (self.prompt, prompt), (self.output, output), (self.target, target),
            (self.computed, 0), (self.blocks, 0), (self.phase, PREFILL), (self.key, key),
            (self.start_step, 0), (self.start_context, 0), (self.residue, 0), (self.last_s, 0.0), (self.join, 0),
        )  # fmt: skip
        for column, value in fields:
            column.append(value)
        return slot

    def give_back(self, slot: int) -> None:
        """The slot's request left the batch."""
        self.phase[slot] = GONE
        self._free.append(slot)


class SlotGroup:
    """The decoding slots of one replica, advanced together one token per step (a part of the replica's state).

    Same state and arithmetic as :class:`sim.serving.sequences.DecodeGroup` (read its
    docstring): a member's context is ``start_context + step - start_step``; ``veterans``
    had the group's last stream event, ``joiners`` counts the others by the time of their
    last token. ``count`` and ``kv_tokens`` are the members and the sum of their contexts.
    """

    slots: Slots
    block_size: int

    def init_group(self, itl: ITLRecorder) -> None:
        """An empty group whose stream events go to ``itl`` (the run's recorder)."""
        events = itl.new_stream()
        self.times = events.times
        self._run_starts, self._run_counts = events.run_starts, events.run_counts
        self._gaps, self._counts = events.gaps, events.counts
        self.run_veterans = 0
        self.step = 0
        self.count = 0
        self.kv_tokens = 0
        self.event_s = 0.0
        self.event_step = 0
        self.veterans = 0
        self.joiners: dict[float, int] = {}
        self.per_residue = [0] * self.block_size
        self.heap: list[int] = []
        self.joins = 0

    # ------------------------------------------------------------------ questions
    def context(self, slot: int) -> int:
        """Tokens the member's next step attends to."""
        slots = self.slots
        return slots.start_context[slot] + self.step - slots.start_step[slot]

    def generated(self, slot: int) -> int:
        """Output tokens the member has produced so far."""
        slots = self.slots
        return slots.start_context[slot] + self.step - slots.start_step[slot] - slots.prompt[slot]

    def cached_blocks(self, slot: int) -> int:
        """Blocks holding the member's cached tokens (paged memory), between steps."""
        return -(-(self.context(slot) - 1) // self.block_size)

    def blocks_needed(self) -> int:
        """New blocks the next step needs under paged memory."""
        return self.per_residue[-self.step % self.block_size]

    def crosses_next(self, slot: int) -> bool:
        """Whether the member needs a new block in the next step (paged memory)."""
        return self.slots.residue[slot] == -self.step % self.block_size

    def last_event_s(self, slot: int) -> float:
        """When the member last received tokens."""
        return self.event_s if self.slots.start_step[slot] < self.event_step else self.slots.last_s[slot]

    def steps_before_finish(self) -> int:
        """Steps the group can take before one gives a member its last token (stale entries dropped)."""
        heap, slots = self.heap, self.slots
        phase, join = slots.phase, slots.join
        while heap:
            key = heap[0]
            slot = key & SLOT_MASK
            if phase[slot] == DECODE and join[slot] == (key >> SLOT_BITS) & JOIN_MASK:
                return (key >> FINISH_SHIFT) - self.step - 1
            heappop(heap)  # a member that left: the general path skips it when it comes due
        return 1 << 62

    def block_need_cycle(self) -> list[int]:
        """New blocks of each of the next steps from the one after the next on (``DecodeGroup.block_need_cycle``)."""
        per_residue, first = self.per_residue, -(self.step + 1) % self.block_size
        return per_residue[first::-1] + per_residue[:first:-1]

    # ------------------------------------------------------------------ changes
    def add(self, slot: int, now_s: float) -> None:
        """The slot's prefill emitted a token at ``now_s``: it joins the group."""
        slots = self.slots
        context = slots.target[slot] + 1
        step = self.step
        slots.phase[slot] = DECODE
        slots.start_step[slot] = step
        slots.start_context[slot] = context
        residue = slots.residue[slot] = (context - 1 - step) % self.block_size
        finish = step + slots.output[slot] - (context - slots.prompt[slot])
        self.count += 1
        self.kv_tokens += context
        self.per_residue[residue] += 1
        self.joins = joins = self.joins + 1
        slots.join[slot] = joins
        heappush(self.heap, (finish << FINISH_SHIFT) | (joins << SLOT_BITS) | slot)
        slots.last_s[slot] = now_s
        joiners = self.joiners
        joiners[now_s] = joiners.get(now_s, 0) + 1

    def remove(self, slot: int) -> None:
        """The member leaves (finished, preempted or cancelled); its slot's phase is the caller's."""
        slots = self.slots
        self.count -= 1
        self.kv_tokens -= slots.start_context[slot] + self.step - slots.start_step[slot]
        self.per_residue[slots.residue[slot]] -= 1
        if slots.start_step[slot] < self.event_step:
            self.veterans -= 1
        else:
            joiners, last_s = self.joiners, slots.last_s[slot]
            left = joiners[last_s] - 1
            if left:
                joiners[last_s] = left
            else:
                del joiners[last_s]

    def advance(self, event_s: float | None) -> list[int]:
        """One decode step (with a stream event at ``event_s``, unless None); the slots now complete."""
        self.step = step = self.step + 1
        self.kv_tokens += self.count
        if event_s is not None:
            if self.veterans == self.run_veterans == self.count and not self.joiners:  # only the time is new
                self.times.append(event_s)
                self.event_s, self.event_step = event_s, step
            else:
                self.event(event_s)
        heap = self.heap
        limit = (step + 1) << FINISH_SHIFT
        if not heap or heap[0] >= limit:
            return _NO_SLOTS
        slots = self.slots
        phase, join = slots.phase, slots.join
        finished = []
        while heap and heap[0] < limit:
            key = heappop(heap)
            slot = key & SLOT_MASK
            if phase[slot] == DECODE and join[slot] == (key >> SLOT_BITS) & JOIN_MASK:
                finished.append(slot)
        return finished

    def event(self, now_s: float) -> None:
        """Every member receives its tokens now (``DecodeGroup.event``)."""
        if self.veterans != self.run_veterans:
            self._run_starts.append(len(self.times))
            self._run_counts.append(self.veterans)
            self.run_veterans = self.veterans
        self.times.append(now_s)
        if self.joiners:
            gaps, counts = self._gaps, self._counts
            for last_s, count in self.joiners.items():
                gaps.append(now_s - last_s)
                counts.append(count)
            self.joiners.clear()
        self.veterans = self.count
        self.event_s = now_s
        self.event_step = self.step

    def advance_steps(self, event_times: list[float]) -> None:
        """``advance(t)`` for each ``t`` of ``event_times``, no member finishing (``DecodeGroup.advance_steps``)."""
        steady = 0
        for event_s in event_times:
            if self.veterans == self.run_veterans and not self.joiners and self.veterans == self.count:
                break
            self.step += 1
            self.kv_tokens += self.count
            self.event(event_s)
            steady += 1
        rest = len(event_times) - steady
        if rest:
            self.step += rest
            self.kv_tokens += self.count * rest
            self.times.extend(event_times[steady:])
            self.event_s = event_times[-1]
            self.event_step = self.step
