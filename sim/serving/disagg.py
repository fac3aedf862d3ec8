"""The disaggregated engine: a prefill pool and a decode pool joined by KV links.

A request is routed to a prefill replica, prefilled there (its first token comes out
at the end of the pass that computes its last prompt token), then handed to a decode
replica (chosen by the same router kind over the decode pool). The decode replica
takes requests in hand-off order: once the request's KV fits (the decode policy's
batch limit, and vLLM's 1% watermark unless the replica holds nothing), its blocks are
reserved there and the KV goes over the pair's :class:`~sim.serving.kv_link.Link`. The
prefill replica holds its blocks until the transfer ends; at the decode replica's next
pass boundary the request joins the decode group. So outside a transfer a request's KV
is in exactly one pool. Preempted decode requests recompute on the decode replica and,
while any waits there, no new transfer is admitted (they go first, as in vLLM).

Each pool's workers are the colocated engine's :class:`~sim.serving.worker.Worker` with
their own policy and cost model; replica indices are global (prefill 0..P-1, decode
P..P+D-1) so one iteration table and the clients' bookkeeping serve both pools.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.config import AdmissionConfig, ClientConfig, FrontendConfig
from sim.metrics.itl import ITLRecorder
from sim.metrics.records import RUNNING, IterationRecords, RequestRecords
from sim.policies.base import VLLM_WATERMARK_FRACTION
from sim.policies.table import make_policy
from sim.serving.clients import Clients
from sim.serving.engine import ProgressCallback, SimOutput, passed_progress_mark, run_to_end
from sim.serving.kv_link import Link, TransferModel
from sim.serving.pool_state import PoolRole
from sim.serving.pricing import CostModelLike
from sim.serving.router import make_router
from sim.serving.setup import ReplicaSetup, build_replicas
from sim.serving.state import ReplicaState
from sim.serving.worker import Worker
from sim.workload.stream import RequestStream

DISAGG_REQUEST_COLUMNS = ("kv_transfer_s", "kv_wait_s", "prefill_replica")
"""Request columns a disaggregated run adds at the end: link time (queue + transfer), prefill
end to joining the decode batch, and the prefill replica (``replica`` is the decode one)."""


@dataclass(frozen=True)
class PoolSpec:
    """What the engine needs of one pool.

    Attributes:
        policy: the pool's policy config.
        replica: every replica's set-up (pricing, KV blocks, features), as a colocated run's.
        replicas: replicas in the pool.
    """

    policy: Any
    replica: ReplicaSetup
    replicas: int

    @property
    def kv_blocks(self) -> int:
        """KV blocks per replica."""
        return self.replica.kv_blocks


class DisaggEngine:
    """One disaggregated run's wiring; ``run()`` may be called once.

    Args:
        stream: the requests.
        prefill, decode: the two pools.
        transfer: duration of a KV transfer.
        block_size: tokens per KV block (both pools; must equal each pool's own).
        router: router kind, used in each pool.
        client, admission, seed, progress, refuse, frontend: as :func:`sim.serving.engine.simulate`.
        audit_every: check replica invariants every this many passes per replica.
    """

    def __init__(
        self,
        stream: RequestStream,
        prefill: PoolSpec,
        decode: PoolSpec,
        transfer: TransferModel,
        *,
        block_size: int,
        router: str = "round_robin",
        client: ClientConfig | None = None,
        admission: AdmissionConfig | None = None,
        seed: int = 0,
        progress: ProgressCallback | None = None,
        refuse: np.ndarray | None = None,
        frontend: FrontendConfig | None = None,
        audit_every: int = 4096,
    ) -> None:
        self.stream, self.transfer, self.env = stream, transfer, simpy.Environment()
        self.records, self.iterations, self.itl = RequestRecords(len(stream)), IterationRecords(), ITLRecorder()
        self.prefill_spec, self.decode_spec = prefill, decode
        self.kv_transfer_s = np.full(len(stream), np.nan)
        self.kv_wait_s = np.full(len(stream), np.nan)
        self.prefill_replica = np.full(len(stream), -1, dtype=np.int16)
        self._pass_s = np.zeros(len(stream))  # duration of the pass that finished its prefill
        p, d = prefill.replicas, decode.replicas
        self.links = [[Link() for _ in range(d)] for _ in range(p)]
        self._pending: list[deque[int]] = [deque() for _ in range(d)]
        self._arrived: list[list[int]] = [[] for _ in range(d)]
        self._incoming_tokens = [0] * d
        self.roles = [PoolRole(handoff=self._handoff) for _ in range(p)]
        self.roles += [PoolRole(on_boundary=self._boundary_of(j)) for j in range(d)]
        prefill_built = self._pool(prefill, range(p), seed)
        decode_built = self._pool(decode, range(p, p + d), seed)
        self.prefill_states = [state for state, _ in prefill_built]
        self.decode_states = [state for state, _ in decode_built]
        self._decode_room = _max_running(decode.policy)
        self._boundary_only = getattr(decode.policy, "num_scheduler_steps", 1) > 1
        self._route_decode = _decode_router(router, self.decode_states, self._incoming_tokens, seed)
        states = self.prefill_states + self.decode_states
        self.clients = Clients(
            self.env, stream, self.records, states, self._wake, make_router(router, self.prefill_states, seed),
            client, admission, refuse=refuse, frontend=frontend,
        )  # fmt: skip
        self.workers = [self._worker(s, cost, prefill, audit_every) for s, cost in prefill_built]
        self.workers += [self._worker(s, cost, decode, audit_every) for s, cost in decode_built]
        self._progress, self._passes = progress, 0

    # ------------------------------------------------------------------ wiring
    def _pool(self, pool: PoolSpec, indices: range, seed: int) -> list[tuple[ReplicaState, CostModelLike]]:
        # Pools take a (re)prefill's blocks at admission (whole_prompt): KV held for transfers is not
        # preemptable, so a chunked prefill part-way through must never find its next chunk blocked by it.
        return build_replicas(
            self.stream, make_policy(pool.policy), pool.policy, pool.replica, self.records, self.itl, indices,
            seed=seed, pool_role=self.roles.__getitem__, whole_prompt=True,
        )  # fmt: skip

    def _worker(self, state: ReplicaState, cost: CostModelLike, pool: PoolSpec, audit_every: int) -> Worker:
        return Worker(
            self.env, state, make_policy(pool.policy), cost, self.iterations,
            on_completed=self.clients.completed, on_iteration=self._tick, audit_every=audit_every,
            engine_cpu=pool.replica.engine_cpu,
        )  # fmt: skip

    def _wake(self, replica: int) -> None:
        self.workers[replica].wake()

    def _tick(self, passes: int) -> None:
        before = self._passes
        self._passes += passes
        if self._progress is not None and passed_progress_mark(before, self._passes):
            self._progress(self.env.now, self.clients.finished)

    # ------------------------------------------------------------------ hand-off and transfer
    def _handoff(self, rid: int, prefill_index: int, pass_start_s: float, now_s: float) -> None:
        """A prefill ended: queue the request at a decode replica and try to start its transfer."""
        self.prefill_replica[rid] = prefill_index
        self._pass_s[rid] = now_s - pass_start_s
        j = self._route_decode()
        self._pending[j].append(rid)
        self._incoming_tokens[j] += int(self.stream.output_tokens[rid]) - 1
        if not self._boundary_only:  # between a single pass's allocations, reserving is safe
            self._admit_transfers(j, now_s)
        self.workers[len(self.prefill_states) + j].wake()

    def _boundary_of(self, j: int) -> Callable[[float], None]:
        def boundary(now_s: float) -> None:
            if self._arrived[j]:
                self._join_arrived(j, now_s)
            if self._pending[j]:
                self._admit_transfers(j, now_s)

        return boundary

    def _admit_transfers(self, j: int, now_s: float) -> None:
        """Reserve decode blocks and start transfers, hand-off order, while they fit."""
        state, pending, status = self.decode_states[j], self._pending[j], self.records.status
        role = self.roles[len(self.prefill_states) + j]
        while pending and not state.waiting_count:  # preempted requests recompute first
            rid = pending[0]
            if status[rid] != RUNNING:  # abandoned while it waited: its prefill KV is freed now
                pending.popleft()
                self._forget(rid, j)
                self._release_prefill(rid)
                continue
            need = role.transfer_blocks(rid)
            if not self._fits(state, role, need):
                return
            pending.popleft()
            cached = role.reserve_incoming(rid)
            self._start_transfer(rid, j, now_s, cached)

    def _fits(self, state: ReplicaState, role: PoolRole, need: int) -> bool:
        holders = state.running_count + len(role.receiving)
        if holders >= self._decode_room:
            return False
        keep = int(VLLM_WATERMARK_FRACTION * state.blocks.total_blocks) if holders else 0
        return need + keep <= state.blocks.free_blocks

    def _start_transfer(self, rid: int, j: int, now_s: float, cached_tokens: int) -> None:
        """Send the prompt's KV but for the ``cached_tokens`` the decode replica already holds."""
        link = self.links[self.prefill_replica[rid]][j]
        prefill_end_s = float(self.records.first_token_s[rid])
        at_once = link.free_at_s <= now_s and now_s == prefill_end_s  # layerwise overlap possible
        tokens = int(self.stream.prompt_tokens[rid]) - cached_tokens
        duration_s = self.transfer.duration_s(tokens, self._pass_s[rid] if at_once else 0)
        wait_s = link.book(now_s, duration_s)
        self.kv_transfer_s[rid] = wait_s + duration_s
        self.env.timeout(wait_s + duration_s).callbacks.append(lambda _event: self._arrive(rid, j))

    def _arrive(self, rid: int, j: int) -> None:
        self._release_prefill(rid)
        self._arrived[j].append(rid)
        self.workers[len(self.prefill_states) + j].wake()

    def _release_prefill(self, rid: int) -> None:
        i = int(self.prefill_replica[rid])
        self.roles[i].release_sent(rid)
        self.workers[i].wake()  # an idle prefill replica may now admit the queue's head

    def _join_arrived(self, j: int, now_s: float) -> None:
        role, status, first = self.roles[len(self.prefill_states) + j], self.records.status, self.records.first_token_s
        for rid in self._arrived[j]:
            self._forget(rid, j)
            if status[rid] != RUNNING:  # abandoned during the transfer
                role.drop_incoming(rid)
                continue
            role.join_decoding(rid, float(first[rid]))
            self.kv_wait_s[rid] = now_s - first[rid]
        self._arrived[j].clear()

    def _forget(self, rid: int, j: int) -> None:
        self._incoming_tokens[j] -= int(self.stream.output_tokens[rid]) - 1

    # ------------------------------------------------------------------ run
    def run(self) -> SimOutput:
        """Run until every request has ended; return the records (pool columns added)."""
        run_to_end(self.env, self.workers, self.clients, self._check_finished, self._progress)
        requests = self.records.to_frame(self.stream.prompt_tokens, self.stream.output_tokens)
        requests["kv_transfer_s"] = self.kv_transfer_s
        requests["kv_wait_s"] = self.kv_wait_s
        requests["prefill_replica"] = self.prefill_replica
        return SimOutput(requests, self._iteration_frame(), self.itl.to_frame())

    def _iteration_frame(self) -> pd.DataFrame:
        frame = self.iterations.to_frame(self.prefill_spec.kv_blocks)
        decode_rows = frame["replica"].to_numpy() >= len(self.prefill_states)
        frame.loc[decode_rows, "kv_blocks_total"] = self.decode_spec.kv_blocks
        return frame

    def _check_finished(self) -> None:
        unfinished = self.records.unfinished()
        if len(unfinished) or self.clients.finished != len(self.stream):
            raise RuntimeError(f"{len(unfinished)} requests never ended (first: {unfinished[:5].tolist()})")
        if any(self._pending) or any(self._arrived):
            raise RuntimeError("requests left waiting for a KV transfer after the run")
        for state, role in zip(self.prefill_states + self.decode_states, self.roles, strict=True):
            state.audit()
            if state.running_count or state.blocks.used_blocks or role.sending or role.receiving:
                raise RuntimeError(f"replica {state.index} still holds requests or KV after the run")


def _max_running(policy: Any) -> int:
    """Most requests a decode replica's policy lets hold a slot."""
    room = int(policy.max_batch_size)
    chunk = getattr(policy, "chunk_size", None)
    return min(room, int(chunk)) if chunk is not None else room


class _DecodeLoad:
    """A decode replica as the router sees it: its own outstanding tokens plus those on their way."""

    def __init__(self, state: ReplicaState, incoming: list[int], j: int) -> None:
        self._state, self._incoming, self._j = state, incoming, j

    @property
    def outstanding_tokens(self) -> int:
        """Tokens still to generate there, counting requests whose KV has not joined yet."""
        return self._state.outstanding_tokens + self._incoming[self._j]


def _decode_router(kind: str, states: list[ReplicaState], incoming: list[int], seed: int) -> Callable[[], int]:
    # seed + 1: a random router must not pair decode choices with the prefill router's draws.
    loads: list[Any] = [_DecodeLoad(state, incoming, j) for j, state in enumerate(states)]
    return make_router(kind, loads, seed + 1)
