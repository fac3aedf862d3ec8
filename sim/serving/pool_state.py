"""A replica's role in a disaggregated pool: hand prefilled requests off, take transferred ones in.

:class:`PoolRole` plugs into a :class:`~sim.serving.state.ReplicaState` (its ``pool``)
with the hooks the disaggregated engine (:mod:`sim.serving.disagg`) uses; a colocated
replica has none, so its behaviour is untouched. The replica keeps its own memory model
(reserve, paged or prefix cached) and its own decode step (plain or speculative): a pool
runs the same engine as a colocated replica.

* **Hand-off (prefill pool).** When a fresh prefill emits a request's first token, the
  request leaves the batch but its KV blocks stay allocated (``sending``) until the engine
  says the transfer ended (:meth:`release_sent`); then the memory model gets them back as
  a finished prefill (with prefix caching they stay cached for later hits).
* **Reservation and join (decode pool).** The engine reserves a request's blocks before
  its KV is sent (``receiving``), and at the next pass boundary (:meth:`boundary`, through
  ``on_boundary``) the arrived request joins the decode group with its prompt cached and
  its first token generated (:meth:`join_decoding`): it never prefills there, unless it
  is preempted later (then it recomputes locally, counted in ``preemptions``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.serving.memory import Leaving
from sim.serving.sequences import GONE, Seq

if TYPE_CHECKING:
    from sim.serving.state import ReplicaState

Handoff = Callable[[int, int, float, float], None]
"""``handoff(rid, replica_index, pass_start_s, now_s)``: a request's prefill ended at ``now_s``."""


class PoolRole:
    """The hand-off and join hooks of one replica of a disaggregated pool.

    Args:
        handoff: prefill pool: called when a request's prefill emitted its first token
            (None: a decode-pool replica, which decodes as usual).
        on_boundary: called with the time at every scheduling decision, before the policy
            looks (the decode pool joins arrived requests there).

    Attributes:
        sending: request id -> its sequence, blocks held for a KV transfer still in flight
            (prefill pool).
        receiving: request id -> its sequence, holding the blocks its KV will arrive in (decode pool).
    """

    def __init__(self, handoff: Handoff | None = None, on_boundary: Callable[[float], None] | None = None) -> None:
        self.handoff = handoff
        self.on_boundary = on_boundary
        self.sending: dict[int, Seq] = {}
        self.receiving: dict[int, Seq] = {}
        self._state: ReplicaState | None = None

    def bind(self, state: ReplicaState) -> None:
        """The replica this role belongs to (set once, when the replica is built)."""
        self._state = state

    @property
    def state(self) -> ReplicaState:
        """The replica this role belongs to."""
        assert self._state is not None, "PoolRole used before bind()"
        return self._state

    def boundary(self, now_s: float) -> None:
        """A scheduling decision is about to be made at ``now_s`` (the state's ``view``)."""
        if self.on_boundary is not None:
            self.on_boundary(now_s)

    # ------------------------------------------------------------------ prefill pool
    def hands_off(self, seq: Seq) -> bool:
        """Whether ``seq``'s prefill token ends its stay here: a fresh prefill with more tokens to
        come (a one-token output completes here; a re-prefill after preemption stays)."""
        return self.handoff is not None and seq.target_tokens == seq.prompt_tokens and seq.output_tokens > 1

    def hand_off(self, state: ReplicaState, seq: Seq, now_s: float) -> None:
        """``seq`` emitted its first token: it leaves the batch, its blocks stay until sent."""
        assert self.handoff is not None
        rid, records = seq.rid, state.records
        state.outstanding_tokens -= seq.output_tokens  # the first token, and the rest leave with it
        records.first_token_s[rid] = now_s
        records.generated_tokens[rid] = 1
        self.sending[rid] = seq
        state.detach(seq)
        self.handoff(rid, state.index, state.now_s, now_s)  # state.now_s: this pass's start

    def release_sent(self, rid: int) -> None:
        """The transfer of ``rid``'s KV ended (or was abandoned): its blocks go back here."""
        self.state.memory.release(self.sending.pop(rid), Leaving.HANDED_OFF)

    # ------------------------------------------------------------------ decode pool
    def transfer_blocks(self, rid: int) -> int:
        """Free blocks ``rid`` takes here to receive its prompt's KV (reserve memory: prompt + max
        output; prefix caching: less the prefix cached here)."""
        return self.state.memory.incoming_blocks(rid)

    def reserve_incoming(self, rid: int) -> int:
        """Take ``rid``'s blocks before its KV is sent; returns the prompt tokens already cached
        here (they are not sent)."""
        state = self.state
        seq = Seq(rid, (float(state.records.arrival_s[rid]), rid), state.prompt_tokens_of(rid),
                  state.output_tokens_of(rid), 0)  # fmt: skip
        seq.phase = GONE  # in no phase of the batch until its KV is here
        cached = state.memory.receive(seq)
        self.receiving[rid] = seq
        return cached

    def drop_incoming(self, rid: int) -> None:
        """``rid`` was abandoned while its KV travelled: free its reservation."""
        self.state.memory.release(self.receiving.pop(rid), Leaving.CANCELLED)

    def join_decoding(self, rid: int, first_token_s: float) -> None:
        """``rid``'s KV arrived: it joins the decode group with its prompt cached (call between passes)."""
        seq = self.receiving.pop(rid)
        self.state.memory.arrived(seq)
        self.state.join_decoding(seq, first_token_s)

    # ------------------------------------------------------------------ audit
    def audit_memory(self, state: ReplicaState, seqs: list[Seq]) -> None:
        """The memory model's invariants, counting the requests being sent and received as holders."""
        state.memory.audit(seqs + list(self.sending.values()) + list(self.receiving.values()))
