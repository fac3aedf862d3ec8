"""Clients: when requests are sent, admission control, retries with backoff, deadlines.

Open loop: request i is sent at ``stream.arrival_s[i]``. Closed loop: the first
``clients`` requests are sent at t=0 and every request that ends (completed, timed
out, finally rejected) makes its client send the next unsent request index after that
request's think time. With ``client.timeout_s`` each request is abandoned at first send
+ timeout if it has not completed; with ``admission.max_queue`` a send to a replica
whose queue is full is rejected and, while retries remain, re-sent after
:func:`retry_delay_s`: ``backoff_s * 2**k`` (k = retries so far) with
``client.backoff: exponential``, ``backoff_s`` every time with ``fixed``. Retries go
through the router again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy

from sim.config import AdmissionConfig, ClientConfig, FrontendConfig
from sim.metrics.records import BACKOFF, COMPLETED, FRONTEND, REJECTED, TIMED_OUT, RequestRecords
from sim.serving.clock import delay_until
from sim.serving.frontend import FrontEnd
from sim.serving.router import Router
from sim.serving.state import ReplicaState
from sim.workload.stream import RequestStream


def retry_delay_s(backoff: str, backoff_s: float, retries: int) -> float:
    """Delay before the next re-send of a rejected request.

    Args:
        backoff: ``exponential`` (doubling) or ``fixed``.
        backoff_s: the first delay (``client.backoff_s``).
        retries: re-sends made so far (0 before the first).

    Returns:
        ``backoff_s * 2**retries`` for exponential, ``backoff_s`` for fixed.
    """
    return backoff_s if backoff == "fixed" else backoff_s * 2**retries


class Clients:
    """All clients of one run.

    Args:
        env: the SimPy environment.
        stream: the requests.
        records: per-request results.
        replicas: replica states, by index.
        wake: ``wake(replica)`` tells an idle worker that work arrived.
        route: the router.
        client: timeouts and retries (None: patient clients, no retries).
        admission: queue limit (None: unbounded).
        refuse: per request, True when the server refuses it on sight (longer than
            max_model_len: HTTP 400, never retried).
        frontend: the API server every send passes before the router (None: none).
    """

    def __init__(
        self,
        env: simpy.Environment,
        stream: RequestStream,
        records: RequestRecords,
        replicas: Sequence[ReplicaState],
        wake: Callable[[int], None],
        route: Router,
        client: ClientConfig | None,
        admission: AdmissionConfig | None,
        *,
        refuse: np.ndarray | None = None,
        frontend: FrontendConfig | None = None,
    ) -> None:
        self.finished = 0
        self._env = env
        self._stream = stream
        self._records = records
        self._replicas = replicas
        self._wake = wake
        self._route = route
        self._route_by_request = getattr(route, "by_request", False)  # cache-aware routers need the request
        self._timeout_s = client.timeout_s if client else None
        self._max_retries = client.max_retries if client else 0
        self._backoff_s = client.backoff_s if client else 0.0
        self._backoff = client.backoff if client else "exponential"
        self._max_queue = admission.max_queue if admission else None
        self._refuse = refuse if refuse is not None and refuse.any() else None
        self._frontend = FrontEnd(env, frontend, stream.prompt_tokens, self._handed_over) if frontend else None
        self._next_unsent = 0
        self._to_send: deque[int] = deque()
        self._sending = False

    def start(self) -> None:
        """Schedule the first sends."""
        loop = self._stream.closed_loop
        if loop is None:
            self._env.process(self._open_loop())
            return
        first = min(loop.clients, len(self._stream))
        self._next_unsent = first
        for rid in range(first):
            self._send(rid)

    @property
    def completions_inert(self) -> bool:
        """Whether an ending request makes no client act (open loop): then completions may be
        reported while a worker runs ahead of the clock (see ``Worker``)."""
        return self._stream.closed_loop is None and self._stream.sessions is None

    def completed(self, rids: list[int]) -> None:
        """Requests a worker just completed."""
        for rid in rids:
            self._ended(rid)

    def _later(self, delay_s: float, action: Callable[[int], None], rid: int) -> None:
        # A bare timeout with a callback: one heap entry, no process.
        self._env.timeout(delay_s).callbacks.append(lambda _event: action(rid))

    # ------------------------------------------------------------------ sending
    def _open_loop(self) -> Generator[Any, Any, None]:
        env = self._env
        for rid, at_s in enumerate(self._stream.arrival_s.tolist()):
            if at_s != at_s:  # NaN: a later session turn, sent when the turn before it ends
                continue
            if at_s > env.now:
                yield env.timeout(delay_until(env.now, at_s))
            self._send(rid)

    def _send(self, rid: int) -> None:
        # Sends triggered while sending (a rejection ends a closed-loop request, whose
        # client sends again) are queued, not recursed into.
        self._to_send.append(rid)
        if self._sending:
            return
        self._sending = True
        while self._to_send:
            self._first_send(self._to_send.popleft())
        self._sending = False

    def _first_send(self, rid: int) -> None:
        self._records.arrival_s[rid] = self._env.now
        if self._refuse is not None and self._refuse[rid]:
            self._records.status[rid] = REJECTED
            self._records.completion_s[rid] = self._env.now
            self._ended(rid)
            return
        if self._timeout_s is not None:
            self._later(self._timeout_s, self._deadline, rid)
        self._through_frontend(rid)

    def _through_frontend(self, rid: int) -> None:
        if self._frontend is None:
            self._deliver(rid)
            return
        self._records.status[rid] = FRONTEND
        self._frontend.submit(rid)

    def _handed_over(self, rid: int) -> None:
        records = self._records
        if records.status[rid] != FRONTEND:  # the client gave up while the server parsed it
            return
        if records.frontend_done_s[rid] != records.frontend_done_s[rid]:  # NaN: the first hand-off
            records.frontend_done_s[rid] = self._env.now
        self._deliver(rid)

    def _deliver(self, rid: int) -> None:
        index = self._route(rid) if self._route_by_request else self._route()  # type: ignore[call-arg]
        replica = self._replicas[index]
        if self._max_queue is not None and replica.waiting_count >= self._max_queue:
            self._reject(rid, index)
            return
        replica.enqueue(rid, self._env.now)
        self._wake(index)

    def _reject(self, rid: int, index: int) -> None:
        records = self._records
        records.replica[rid] = index
        retries = int(records.retries[rid])
        if retries < self._max_retries:
            records.retries[rid] = retries + 1
            records.status[rid] = BACKOFF
            delay_s = retry_delay_s(self._backoff, self._backoff_s, retries)
            self._later(delay_s, self._retry, rid)
            return
        records.status[rid] = REJECTED
        records.completion_s[rid] = self._env.now
        self._ended(rid)

    def _retry(self, rid: int) -> None:
        if self._records.status[rid] == BACKOFF:  # else it timed out while backing off
            self._through_frontend(rid)  # a retry is a new HTTP request

    # ------------------------------------------------------------------ endings
    def _deadline(self, rid: int) -> None:
        records = self._records
        status = records.status[rid]
        if status >= COMPLETED:
            return
        if status in (BACKOFF, FRONTEND):  # not at a replica: nothing to cancel there
            records.status[rid] = TIMED_OUT
            records.completion_s[rid] = self._env.now
        else:
            self._replicas[records.replica[rid]].abandon(rid, self._env.now)
        self._ended(rid)

    def _ended(self, rid: int) -> None:
        self.finished += 1
        if self._stream.sessions is not None:
            self._next_turn(rid)
            return
        loop = self._stream.closed_loop
        if loop is None or self._next_unsent >= len(self._stream):
            return
        nxt = self._next_unsent
        self._next_unsent += 1
        think_s = float(loop.think_time_s[nxt])
        if think_s > 0:
            self._later(think_s, self._send, nxt)
        else:
            self._send(nxt)

    def _next_turn(self, rid: int) -> None:
        """A session's turn ended (however): its client sends the next turn after thinking."""
        sessions = self._stream.sessions
        assert sessions is not None
        nxt = int(sessions.next_turn[rid])
        if nxt < 0:
            return
        think_s = float(sessions.think_time_s[nxt])
        if think_s > 0:
            self._later(think_s, self._send, nxt)
        else:
            self._send(nxt)
