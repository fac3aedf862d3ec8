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
"""

from __future__ import annotations

import heapq

# Phases of a Seq. GONE: it left the batch (finished, preempted or cancelled); heap
# entries that still point at it are stale and skipped.
PREFILL, DECODE, IDLE_SLOT, GONE = range(4)


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
        phase: PREFILL, DECODE, IDLE_SLOT (finished, still holding a static-batch slot) or GONE.
        start_step, start_context: decode-group clock and context when it joined the group.
        residue: its class modulo the block size (paged memory; see DecodeGroup).
        finish_step: decode-group step after which it has all its output tokens.
    """

    __slots__ = (
        "rid", "key", "prompt_tokens", "output_tokens", "target_tokens", "computed_tokens",
        "blocks", "phase", "start_step", "start_context", "residue", "finish_step",
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

    Args:
        block_size: tokens per KV block.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.step = 0
        self.count = 0
        self.kv_tokens = 0
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

    def blocks_needed(self) -> int:
        """New blocks the next step needs under paged memory (one per member at a block edge)."""
        return self._per_residue[-self.step % self.block_size]

    def crosses_next(self, seq: Seq) -> bool:
        """Whether the member needs a new block in the next step (paged memory)."""
        return seq.residue == -self.step % self.block_size

    def add(self, seq: Seq) -> None:
        """Join after its prefill emitted a token (``target_tokens`` computed, one more output)."""
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

    def advance(self) -> list[Seq]:
        """Run one decode step: every member gains a token; return those now complete.

        The completed ones are still members; the caller removes them.
        """
        self.step += 1
        self.kv_tokens += self.count
        heap = self._finish_heap
        finished: list[Seq] = []
        while heap and heap[0][0] <= self.step:
            _, _, seq = heapq.heappop(heap)
            if seq.phase == DECODE:  # else a stale entry of a sequence that already left
                finished.append(seq)
        return finished

    def remove(self, seq: Seq) -> None:
        """Leave the group (finished, preempted or cancelled)."""
        self.count -= 1
        self.kv_tokens -= self.context(seq)
        self._per_residue[seq.residue] -= 1
        seq.phase = GONE
