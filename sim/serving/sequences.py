"""Running sequences and the decode group that advances them all at once.

A request in a running batch is a :class:`Seq`. Following vLLM v1 there is no prefill
"phase" as such: a sequence has ``computed_tokens`` of its ``target_tokens`` (prompt
plus tokens generated so far, all re-prefilled after a recompute preemption); when the
two meet it emits one token and joins the :class:`DecodeGroup`.

Every decode step advances *all* decoding sequences by one token, so the group keeps
aggregates instead of per-sequence counters: a step clock, the number of sequences, the
sum of their contexts (what the cost model needs), a heap of finish steps, and (paged
memory) how many sequences sit at each residue modulo the block size, which says in
O(1) how many new blocks the next step needs. Per-step work is therefore independent
of the batch size and of the tokens generated so far.

The group also knows when its members last received tokens (a *stream event*: the end
of a decode pass, or of a multi-step block), for inter-token latencies: all members that
had the previous event share one gap, and each member that joined since (its token came
from a prefill) has its own; :meth:`DecodeGroup.event` reports them as weighted gaps.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from sim.metrics.itl import ITLRecorder

# Phases of a Seq. GONE: it left the batch (finished, preempted or cancelled); heap
# entries that still point at it are stale and skipped. FINISHING: it has all its tokens but,
# the engine's outputs lagging one step (async scheduling), still holds its slot and KV.
PREFILL, DECODE, IDLE_SLOT, GONE, FINISHING = range(5)


class Seq:
    """One request in a replica's running batch.

    Attributes:
        rid: request index.
        key: (first send time, rid): arrival order, used to pick preemption victims.
        prompt_tokens, output_tokens: the request's lengths.
        target_tokens: tokens to compute before the next token is emitted (prompt +
            tokens generated so far).
        computed_tokens: tokens of ``target_tokens`` already computed in this stint.
        blocks: KV blocks held while prefilling, or the reservation (reserve memory).
        phase: PREFILL, DECODE, IDLE_SLOT (finished, still holding a static-batch slot), FINISHING
            (finished, its output not yet seen by the scheduler) or GONE.
        tick: when it was last admitted, in the replica's admission order (vLLM's running list order).
        start_step, start_context: decode-group clock and context when it joined the group.
        residue: its class modulo the block size (paged memory; see DecodeGroup).
        finish_step: decode-group step after which it has all its output tokens.
        last_event_s: when it last received tokens, while that was not a group event (the
            prefill that emitted a token before it joined the group; see DecodeGroup).
    """

    __slots__ = (
        "rid", "key", "prompt_tokens", "output_tokens", "target_tokens", "computed_tokens",
        "blocks", "phase", "start_step", "start_context", "residue", "finish_step", "last_event_s", "tick",
    )  # fmt: skip

    def __init__(
        self,
        rid: int,
        key: tuple[float, int],
        prompt_tokens: int,
        output_tokens: int,
        generated: int,
    ) -> None:
        self.rid = rid
        self.key = key
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.target_tokens = prompt_tokens + generated
        self.computed_tokens = 0
        self.blocks = 0
        self.phase = PREFILL
        self.start_step = 0
        self.start_context = 0
        self.residue = 0
        self.finish_step = 0
        self.last_event_s = 0.0
        self.tick = 0

    @property
    def prefill_left(self) -> int:
        """Tokens still to compute before the next token is emitted."""
        return self.target_tokens - self.computed_tokens

    def __repr__(self) -> str:
        done = f"{self.computed_tokens}/{self.target_tokens}"
        return f"Seq(rid={self.rid}, phase={self.phase}, computed={done})"


class DecodeGroup:
    """All decoding sequences of one replica, advanced together one token per step.

    The context of a member is ``start_context + (step - start_step)``: the tokens its
    next decode step attends to, including the token being fed in. A step appends one
    token to each member's KV, so a member needs a new block in step ``s`` exactly when
    ``context - 1`` is a multiple of ``block_size``; the residue ``(context - 1 - step) %
    block_size`` is constant while it decodes, so counting members per residue answers
    "blocks needed by the next step" in O(1).

    Stream events (inter-token latency): ``event_s`` is the time of the group's last event
    and ``event_step`` the step it happened at. A member that joined before it
    (``start_step < event_step``) is a *veteran*: its previous tokens came with that event.
    The others joined since; ``_joiners`` counts them by the time of their own last tokens.

    Args:
        block_size: tokens per KV block.
        itl: where the gaps go (default: a private recorder).
    """

    def __init__(self, block_size: int, itl: ITLRecorder | None = None) -> None:
        self.block_size = block_size
        self.itl = itl if itl is not None else ITLRecorder()
        events = self.itl.new_stream()
        # Bound appends: the event bookkeeping runs once per decode pass.
        self._event_times, self._add_event = events.times, events.times.append
        self._add_run = events.run_starts.append, events.run_counts.append
        self._add_gap, self._add_count = events.gaps.append, events.counts.append
        self._run_veterans = 0  # veterans of the stream's current run
        self.step = 0
        self.count = 0
        self.kv_tokens = 0
        self.event_s = 0.0
        self.event_step = 0
        self.veterans = 0
        self._joiners: dict[float, int] = {}
        self._per_residue = [0] * block_size
        self._finish_heap: list[tuple[int, int, Seq]] = []
        self._joins = 0  # heap tie-breaker: a request can have stale entries from earlier stints

    def context(self, seq: Seq) -> int:
        """Tokens the member's next step attends to (its generated count is this - prompt)."""
        return seq.start_context + self.step - seq.start_step

    def generated(self, seq: Seq) -> int:
        """Output tokens the member has produced so far."""
        return seq.start_context + self.step - seq.start_step - seq.prompt_tokens

    def cached_blocks(self, seq: Seq) -> int:
        """Blocks holding the member's cached tokens (paged memory), between steps."""
        return -(-(self.context(seq) - 1) // self.block_size)

    def blocks_needed(self, ahead: int = 0) -> int:
        """New blocks the next step needs under paged memory (one per member at a block edge);
        with ``ahead`` = k, the step after k more steps, if no member leaves meanwhile."""
        return self._per_residue[-(self.step + ahead) % self.block_size]

    def finishes_by(self, step: int) -> bool:
        """Whether a member may have all its tokens by group step ``step`` (stale heap
        entries count too: a conservative answer)."""
        heap = self._finish_heap
        return bool(heap) and heap[0][0] <= step

    def crosses_next(self, seq: Seq) -> bool:
        """Whether the member needs a new block in the next step (paged memory)."""
        return seq.residue == -self.step % self.block_size

    def growth_blocks(self, seq: Seq, steps: int) -> int:
        """New blocks the member needs over the next ``steps`` steps (paged memory).

        It stops growing at its last token, so a member that finishes within the window
        only grows until then.
        """
        return self._crossings(seq, min(steps, seq.finish_step - self.step))

    def blocks_needed_over(self, steps: int) -> int:
        """New blocks the next ``steps`` steps need together (a multi-step block).

        Each member crosses a block edge once per ``block_size`` steps, so the residue
        counts answer for members that decode through the whole window in O(min(steps,
        block_size)); members that finish inside it (the front of the finish heap, each
        in one window only) are corrected one by one.
        """
        if steps == 1:
            return self.blocks_needed()
        size, per_residue = self.block_size, self._per_residue
        cycles, rest = divmod(steps, size)
        total = cycles * self.count + sum(per_residue[-(self.step + j) % size] for j in range(rest))
        for seq in self._finishing_within(steps):
            total -= self._crossings(seq, steps) - self.growth_blocks(seq, steps)
        return total

    def _crossings(self, seq: Seq, steps: int) -> int:
        """Block edges the member crosses in the next ``steps`` steps, if it decoded them all."""
        first = -(seq.residue + self.step) % self.block_size  # steps before its next crossing
        return 0 if first >= steps else (steps - 1 - first) // self.block_size + 1

    def _finishing_within(self, steps: int) -> Iterator[Seq]:
        """Members whose last step comes before ``steps`` more steps are done (heap walk)."""
        heap, limit = self._finish_heap, self.step + steps
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            finish_step, _, seq = heap[i]
            if finish_step >= limit:
                continue  # a heap: nothing below this entry finishes sooner
            if seq.phase == DECODE:  # else a stale entry
                yield seq
            stack.extend(c for c in (2 * i + 1, 2 * i + 2) if c < len(heap))

    def last_event_s(self, seq: Seq) -> float:
        """When the member last received tokens."""
        return self.event_s if seq.start_step < self.event_step else seq.last_event_s

    def event(self, now_s: float) -> None:
        """Every member receives its tokens now: record the gaps since each one's last tokens.

        The veterans share the gap since the group's previous event (recorded as this
        event's time, their count as runs); later joiners get one gap per distinct time at
        which they got their previous token. Afterwards all members are veterans.
        """
        if self.veterans != self._run_veterans:
            self._new_run()
        self._add_event(now_s)
        if self._joiners:
            self._flush_joiners(now_s)
        self.veterans = self.count
        self.event_s = now_s
        self.event_step = self.step

    def _new_run(self) -> None:
        add_start, add_count = self._add_run
        add_start(len(self._event_times))
        add_count(self.veterans)
        self._run_veterans = self.veterans

    def _flush_joiners(self, now_s: float) -> None:
        add_gap, add_count = self._add_gap, self._add_count
        for last_s, count in self._joiners.items():
            add_gap(now_s - last_s)
            add_count(count)
        self._joiners.clear()

    def add(self, seq: Seq, now_s: float = 0.0) -> None:
        """Join after its prefill emitted a token at ``now_s`` (``target_tokens`` computed)."""
        context = seq.target_tokens + 1
        seq.phase = DECODE
        seq.start_step = self.step
        seq.start_context = context
        seq.residue = (context - 1 - self.step) % self.block_size
        seq.finish_step = self.step + seq.output_tokens - (context - seq.prompt_tokens)
        self.count += 1
        self.kv_tokens += context
        self._per_residue[seq.residue] += 1
        self._joins += 1
        heapq.heappush(self._finish_heap, (seq.finish_step, self._joins, seq))
        seq.last_event_s = now_s
        self._joiners[now_s] = self._joiners.get(now_s, 0) + 1

    def advance(self, event_s: float | None = None) -> list[Seq]:
        """Run one decode step: every member gains a token; return those now complete.

        The completed ones are still members; the caller removes them. With ``event_s``
        the members also receive their tokens then (a stream event, as :meth:`event`).
        """
        self.step = step = self.step + 1
        self.kv_tokens += self.count
        if event_s is not None:  # event() inlined: this runs once per decode pass
            if self.veterans != self._run_veterans:
                self._new_run()
            self._add_event(event_s)
            if self._joiners:
                self._flush_joiners(event_s)
            self.veterans = self.count
            self.event_s = event_s
            self.event_step = step
        heap = self._finish_heap
        finished: list[Seq] = []
        while heap and heap[0][0] <= step:
            _, _, seq = heapq.heappop(heap)
            if seq.phase == DECODE:  # else a stale entry of a sequence that already left
                finished.append(seq)
        return finished

    def steps_before_finish(self) -> int:
        """Steps the group can take before one may give a member its last token: ``k`` with
        ``finishes_by(step + j)`` false for every j <= k (stale heap entries count, as there)."""
        heap = self._finish_heap
        return heap[0][0] - self.step - 1 if heap else 1 << 62

    def block_need_cycle(self) -> list[int]:
        """New blocks (paged memory) of each of the next steps, from the one after the next on:
        entry ``j % block_size`` is ``blocks_needed(j + 1)``, if no member leaves meanwhile."""
        per_residue, first = self._per_residue, -(self.step + 1) % self.block_size
        return per_residue[first::-1] + per_residue[:first:-1]  # residues first, first - 1, ... (mod size)

    def advance_steps(self, event_times: list[float]) -> None:
        """``advance(t)`` for each ``t`` of ``event_times``, where the caller knows that no member
        gets its last token (``steps_before_finish``): one stream event per step."""
        steady = 0
        for event_s in event_times:  # until the stream's run is steady, the full bookkeeping
            if self.veterans == self._run_veterans and not self._joiners and self.veterans == self.count:
                break
            self.advance(event_s)
            steady += 1
        rest = len(event_times) - steady
        if rest:  # each further event only appends its time
            self.step += rest
            self.kv_tokens += self.count * rest
            self._event_times.extend(event_times[steady:])
            self.event_s = event_times[-1]
            self.event_step = self.step

    def credit_extra(self, seq: Seq, tokens: int) -> None:
        """Give the member ``tokens`` more tokens in the coming step (accepted speculative tokens).

        Call before :meth:`advance`, which adds the step's own token. Its context, residue and
        finish step shift by ``tokens``; the old finish entry stays in the heap, later than the
        new one, and is skipped as stale once the member has left.
        """
        if tokens <= 0:
            return
        self._per_residue[seq.residue] -= 1
        seq.residue = (seq.residue + tokens) % self.block_size
        self._per_residue[seq.residue] += 1
        seq.start_context += tokens
        seq.finish_step -= tokens
        self.kv_tokens += tokens
        self._joins += 1
        heapq.heappush(self._finish_heap, (seq.finish_step, self._joins, seq))

    def remove(self, seq: Seq) -> None:
        """Leave the group (finished, preempted or cancelled)."""
        self.count -= 1
        self.kv_tokens -= self.context(seq)
        self._per_residue[seq.residue] -= 1
        if seq.start_step < self.event_step:
            self.veterans -= 1
        else:
            joiners, last_s = self._joiners, seq.last_event_s
            left = joiners[last_s] - 1
            if left:
                joiners[last_s] = left
            else:
                del joiners[last_s]
        seq.phase = GONE
