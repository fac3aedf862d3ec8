"""A replica of a disaggregated pool: hands prefilled requests off, takes transferred ones in.

:class:`PoolReplicaState` is a :class:`~sim.serving.state.ReplicaState` with three hooks
the disaggregated engine (:mod:`sim.serving.disagg`) uses; the colocated engine never
builds one, so its behaviour is untouched.

* **Hand-off (prefill pool).** When a fresh prefill emits a request's first token, the
  request leaves the batch but its KV blocks stay allocated (``sending``) until the engine
  says the transfer ended (:meth:`release_sent`).
* **Reservation and join (decode pool).** The engine reserves a request's blocks before
  its KV is sent (``receiving``), and at the next pass boundary (:meth:`view`, through
  ``on_boundary``) the arrived request joins the decode group with its prompt cached and
  its first token generated (:meth:`join_decoding`): it never prefills there, unless it
  is preempted later (then it recomputes locally, counted in ``preemptions``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

from sim.serving.sequences import Seq
from sim.serving.state import ReplicaState

Handoff = Callable[[int, int, float, float], None]
"""``handoff(rid, replica_index, pass_start_s, now_s)``: a request's prefill ended at ``now_s``."""


class PoolReplicaState(ReplicaState):
    """A replica state with the hand-off and join hooks of a disaggregated pool.

    Args:
        *args, **kwargs: as :class:`~sim.serving.state.ReplicaState`.
        handoff: prefill pool: called when a request's prefill emitted its first token
            (None: a decode-pool replica, which decodes as usual).
        on_boundary: called with the time at every scheduling decision, before the policy
            looks (the decode pool joins arrived requests there).

    Attributes:
        sending: request id -> blocks held for a KV transfer still in flight (prefill pool).
        receiving: request id -> blocks reserved for KV on its way here (decode pool).
    """

    merges_decode = False  # see ReplicaState: boundaries/acceptance make every pass differ

    def __init__(
        self,
        *args: Any,
        handoff: Handoff | None = None,
        on_boundary: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.handoff = handoff
        self.on_boundary = on_boundary
        self.sending: dict[int, int] = {}
        self.receiving: dict[int, int] = {}

    def view(self, now_s: float) -> ReplicaState:
        """Let the engine join arrived requests, then prepare the policy's view."""
        if self.on_boundary is not None:
            self.on_boundary(now_s)
        return super().view(now_s)

    # ------------------------------------------------------------------ prefill pool
    def _emit_prefill_token(self, seq: Seq, now_s: float, completed: list[int]) -> None:
        # Only a fresh prefill of a request with more tokens to come is handed off; a
        # one-token output completes here.
        fresh = seq.target_tokens == seq.prompt_tokens
        if self.handoff is None or not fresh or seq.output_tokens <= 1:
            super()._emit_prefill_token(seq, now_s, completed)
            return
        rid = seq.rid
        self.outstanding_tokens -= seq.output_tokens  # the first token, and the rest leave with it
        self._records.first_token_s[rid] = now_s
        self._records.generated_tokens[rid] = 1
        self.sending[rid] = seq.blocks
        self._leave_phase(seq)
        del self.running[rid]
        del self._order[bisect_left(self._order, seq.key)]
        self.handoff(rid, self.index, self.now_s, now_s)  # self.now_s: this pass's start

    def release_sent(self, rid: int) -> None:
        """The transfer of ``rid``'s KV ended (or was abandoned): free its blocks here."""
        self.blocks.release(self.sending.pop(rid))

    # ------------------------------------------------------------------ decode pool
    def transfer_blocks(self, rid: int) -> int:
        """Blocks ``rid`` needs here to receive its prompt's KV (reserve memory: prompt + max output)."""
        prompt = int(self._prompt[rid])
        return self.blocks.blocks_for(prompt + self._reserve if self._reserve is not None else prompt)

    def reserve_incoming(self, rid: int, blocks: int) -> None:
        """Take ``blocks`` blocks for ``rid``'s KV before it is sent."""
        self.blocks.allocate(blocks)
        self.receiving[rid] = blocks

    def drop_incoming(self, rid: int) -> None:
        """``rid`` was abandoned while its KV travelled: free its reservation."""
        self.blocks.release(self.receiving.pop(rid))

    def join_decoding(self, rid: int, first_token_s: float) -> None:
        """``rid``'s KV arrived: it joins the decode group with its prompt cached (call between passes)."""
        records = self._records
        prompt, output = int(self._prompt[rid]), int(self._output[rid])
        seq = Seq(rid, (float(records.arrival_s[rid]), rid), prompt, output, 0)
        seq.computed_tokens = seq.target_tokens
        seq.blocks = self.receiving.pop(rid)
        records.replica[rid] = self.index
        self.running[rid] = seq
        insort(self._order, seq.key)
        self.outstanding_tokens += output - 1
        self.decoders.add(seq, first_token_s)  # its next inter-token gap counts from its first token

    def audit(self, max_queue_recount: int = 4096) -> None:
        """The base invariants, with blocks of transfers in flight set aside; those must be within capacity."""
        in_flight = sum(self.sending.values()) + sum(self.receiving.values())
        blocks = self.blocks
        assert 0 <= blocks.used_blocks <= blocks.total_blocks, "KV over capacity"
        blocks.used_blocks -= in_flight  # the base audit matches blocks to running requests only
        try:
            super().audit(max_queue_recount)
        finally:
            blocks.used_blocks += in_flight
