"""The fast path's workers: every replica's passes driven by one heap of next-event times.

SimPy still owns time, arrivals, clients, routers and the front end. What changes is how the
replicas' own events (a pass ends, an idle worker is woken) are kept: not as one SimPy process
and one timeout per pass, but in one heap of ``(time, priority, event id, replica)`` entries.
Each entry's event id is drawn from SimPy's own counter at the moment the general engine would
have created its timeout, so the heap and SimPy's queue together hold the events in exactly the
order SimPy would process them. The fleet puts one entry at a time into SimPy's queue (its
earliest, with that same id); when SimPy reaches it, the fleet processes its own events for as
long as they come before SimPy's next one, with the clock set as SimPy would set it, so that
clients, routers and deadlines see every replica exactly as in the general engine.

A replica also runs ahead on its own while its next pass ends before every other event, and
repeats pure decode passes in bulk (:mod:`sim.serving.fast.span`) up to the next external
event. With open-loop clients (completions change nothing outside the replica) a span may pass
other replicas' events: replicas share nothing between external events, so runs with many
replicas merge their decode passes as well as one replica does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy

from sim.metrics.pass_runs import PassRuns
from sim.serving.clock import delay_until
from sim.serving.fast.kernels import Kernel
from sim.serving.fast.replica import Totals
from sim.serving.fast.span import SpanPricer, decode_span

NORMAL, URGENT = 1, 0  # SimPy's event priorities
_NONE: list = []  # the plan parts of a pass that has none (never appended to)
START, BUSY, IDLE, IDLE_DEADLINE, WOKEN, WOKEN_DEADLINE, HOP = range(7)
"""What a replica is doing: starting, running a pass, idle (until woken, or woken or a deadline,
as ``yield wake | timeout``), woken, and about to resume once that condition fired (one more event)."""


class _Turn:
    """A SimPy queue entry of the fleet's: SimPy calls ``callbacks`` when it reaches it."""

    __slots__ = ("callbacks", "key")
    _ok = True
    _value = None

    def __init__(self, callback: Callable[[Any], None], key: tuple[float, int]) -> None:
        self.callbacks = [callback]
        self.key = key


class FastWorker:
    """One replica of the fleet: its state, its counters, and the pass in flight.

    Attributes:
        state: the replica's kernel (queue, batch, KV and the policy's decisions).
        scheduler_calls: passes planned (as ``Worker.scheduler_calls``: every pass is a scheduling step).
        pass_events: SimPy queue entries the fleet used for the ends of this replica's passes.
    """

    def __init__(self, fleet: Fleet, state: Kernel, pricer: SpanPricer) -> None:
        self.state = state
        self.index = state.index
        self.pricer = pricer
        self.price = pricer.price
        self.scheduler_calls = 0
        self.pass_events = 0
        self.passes = 0
        self.mode = START
        self.gen = 0
        self._fleet = fleet
        self.in_flight: tuple = ()  # the pass in flight: what ``Fleet._end`` takes

    def start(self) -> None:
        """Begin at time 0, as a SimPy process would (``run_to_end`` calls it for every worker)."""
        self._fleet.start(self)

    def wake(self) -> None:
        """Work arrived: end the worker's idle wait, if it is waiting."""
        self._fleet.wake(self)


class Fleet:
    """Every replica's events, kept in SimPy's order (see the module docstring).

    Args:
        env: the SimPy environment (its queue and event counter are read, as SimPy's own ``step`` does).
        iterations: where each pass is recorded.
        on_completed: called with the request ids each pass completed.
        on_iteration: called with the passes that just ended (progress; None: nobody asks).
        inert: completions make no client act (open loop), so spans may pass other replicas' events.
        audit_every: check each replica's invariants every this many of its passes (0: never).
    """

    def __init__(
        self, env: simpy.Environment, iterations: PassRuns, *, on_completed: Callable[[list[int]], None],
        on_iteration: Callable[[int], None] | None, inert: bool, audit_every: int,
    ) -> None:  # fmt: skip
        self.env = env
        self.workers: list[FastWorker] = []
        self._queue: list = env._queue  # noqa: SLF001 - the fleet's events share SimPy's order
        self._eid = env._eid  # noqa: SLF001
        self._heap: list[tuple[float, int, int, FastWorker, int]] = []
        self._registered: set[tuple[float, int]] = set()
        self._in_turn = False
        self._runs = iterations
        self._record = iterations.append
        self._on_completed = on_completed
        self._on_iteration = on_iteration
        self._inert = inert
        self._audit_every = audit_every
        self._watched = bool(audit_every) or on_iteration is not None  # else ``_passes_ended`` has nothing to do
        self._external = (math.inf, NORMAL, 0)  # SimPy's next own event, as (time, priority, id)
        self._external_len = -1

    def add(self, state: Kernel, pricer: SpanPricer) -> FastWorker:
        """A replica of the fleet, its passes priced by ``pricer``."""
        worker = FastWorker(self, state, pricer)
        self.workers.append(worker)
        return worker

    # ------------------------------------------------------------------ SimPy's side
    def start(self, worker: FastWorker) -> None:
        """The worker starts at time 0, as a process's initialisation (an urgent event) would."""
        self._push(worker, 0.0, URGENT)

    def wake(self, worker: FastWorker) -> None:
        """``Worker.wake``: the idle wait ends with an event at the current time."""
        if worker.mode == IDLE:
            worker.mode = WOKEN
        elif worker.mode == IDLE_DEADLINE:
            worker.mode = WOKEN_DEADLINE
        else:
            return
        self._push(worker, self.env.now)

    def _push(self, worker: FastWorker, at_s: float, priority: int = NORMAL) -> None:
        """An event of ``worker`` at ``at_s``, ordered as a SimPy event created now."""
        heappush(self._heap, (at_s, priority, next(self._eid), worker, worker.gen))
        if not self._in_turn:
            self._register()

    def _register(self) -> None:
        """Make sure SimPy's queue holds the fleet's earliest event, under that event's own key."""
        if not self._heap:
            return
        at_s, priority, eid, worker, _ = self._heap[0]
        if (at_s, eid) in self._registered:
            return
        self._registered.add((at_s, eid))
        if worker.mode == BUSY:  # a pass's end (not a start or a wake-up): what ``Worker.pass_events`` counts
            worker.pass_events += 1
        heappush(self._queue, (at_s, priority, eid, _Turn(self._turn, (at_s, eid))))

    def _external_head(self) -> tuple[float, int, int]:
        """SimPy's next event that is not one of the fleet's, as (time, priority, id)."""
        queue = self._queue
        if len(queue) == self._external_len:
            return self._external  # nothing was scheduled since (within a turn nothing pops SimPy's queue)
        best = (math.inf, NORMAL, 0)
        stack = [0]
        while stack:
            i = stack.pop()
            if i >= len(queue):
                continue
            entry = queue[i]
            key = entry[:3]
            if key >= best:
                continue  # a heap: nothing below it is earlier
            if entry[3].__class__ is _Turn:
                stack += (2 * i + 1, 2 * i + 2)
            else:
                best = key
        self._external, self._external_len = best, len(queue)
        return best

    def _turn(self, event: _Turn) -> None:
        """SimPy reached one of the fleet's entries: process the fleet's events due before SimPy's next."""
        self._registered.discard(event.key)
        self._in_turn = True
        self._external_len = -1  # SimPy popped events since the last turn
        try:
            heap, env, queue = self._heap, self.env, self._queue
            while heap:
                head = heap[0]
                external = self._external if len(queue) == self._external_len else self._external_head()
                if external < head:  # as ``external < head[:3]``: event ids are unique, so no tie reaches the rest
                    break
                heappop(heap)
                at_s, _, _, worker, gen = head
                if gen != worker.gen:
                    continue  # superseded (a deadline after a wake-up)
                env._now = at_s  # noqa: SLF001 - what SimPy's step sets before it processes an event
                self._due(worker, at_s)
        finally:
            self._in_turn = False
        self._register()

    # ------------------------------------------------------------------ a replica's events
    def _due(self, worker: FastWorker, now_s: float) -> None:
        mode = worker.mode
        if mode == BUSY:
            in_flight = worker.in_flight
            state = worker.state
            if in_flight[2] and not state.touched and state.can_repeat_decode():  # plan it again: end, begin
                _, _, _, start_s, duration_s, totals, used, passes = in_flight
                # ``_record_decode`` inline: with many replicas nearly every pass comes this way
                kv, step = totals[4], state.count
                run = self._runs.decode_run(worker.index, totals[3], kv, step, used, state.reserve_tokens is None)
                run.starts.append(start_s)
                run.durations.append(duration_s)
                if run.useds is not None:
                    run.useds.append(used)
                run.next_kv = kv + step
                state.end_decode(now_s)
                if self._watched:
                    self._passes_ended(worker, passes)
                self._run(worker, now_s, True, state.begin_decode())
                return
            self._run(worker, now_s, self._end(worker, now_s, *in_flight))
            return
        if mode in (IDLE_DEADLINE, WOKEN_DEADLINE):  # ``wake | timeout`` fired: the worker resumes one event later
            worker.gen += 1
            worker.mode = HOP
            self._push(worker, now_s)
            return
        self._run(worker, now_s, False)

    def _run(self, worker: FastWorker, clock: float, reuse: bool, begun: Totals | None = None) -> None:
        """Plan and begin passes from ``clock`` on, ending each at once while no other event comes first.

        ``reuse``: the pass that just ended was a pure decode pass that changed nothing but the decode step,
        and nothing reached the replica since it was planned: a steady policy plans it again (as the general
        path's ``Policy.decode_only`` reuse), if its blocks fit. ``begun``: that pass is begun already
        (``FastReplica.repeat_decode``), with these totals.
        """
        worker.gen += 1
        state = worker.state
        pricer = worker.pricer
        heap, queue = self._heap, self._queue
        while True:
            if begun is not None:
                totals, begun = begun, None
                pieces, preempt, decode, pure = _NONE, _NONE, True, True
            elif reuse and not state.touched and state.decode_fits():
                pieces, preempt, decode, pure = _NONE, _NONE, True, True
                totals = state.begin_decode()
            else:
                state.touched = False
                if not state.decide(clock):
                    if state.running:
                        raise RuntimeError(f"replica {worker.index}: nothing planned, {len(state.running)} running")
                    self._idle(worker, clock, state.wake_at_s)
                    return
                pieces, preempt, decode = state.pieces, state.preempt, state.decode
                totals = state.begin(pieces, preempt, decode, state.pad, clock)
                pure = decode and not pieces and not preempt
            duration_s = pricer.decode_s(totals[3], totals[4]) if pure else worker.price(*totals)
            if not 0.0 <= duration_s < math.inf:
                raise ValueError(f"cost model returned {duration_s!r} s for totals {totals}")
            used = state.used_blocks
            start_s = clock
            # the earliest time another event is due (another replica's or SimPy's), inline: once per pass
            external_s = (self._external if len(queue) == self._external_len else self._external_head())[0]
            horizon_s = heap[0][0] if heap and heap[0][0] < external_s else external_s
            passes = 1
            span_horizon_s = external_s if self._inert else horizon_s
            if pure and start_s + duration_s < span_horizon_s:  # repeat it while nothing else can happen
                span = decode_span(state, pricer, self._runs, span_horizon_s, start_s, duration_s, used, totals[3],
                                   totals[4])  # fmt: skip
                if span is not None:
                    done, start_s, duration_s, used = span
                    passes = done + 1
                    totals = (0, 0, 0.0, totals[3], totals[4] + done * state.count)
            worker.scheduler_calls += passes
            end_s = start_s + duration_s
            if end_s < horizon_s:  # nothing else before it ends: end it now
                self.env._now = end_s  # noqa: SLF001 - as SimPy would, for what clients schedule
                reuse = self._end(worker, end_s, pieces, decode, pure, start_s, duration_s, totals, used, passes)
                clock = end_s
                continue
            worker.mode = BUSY
            worker.in_flight = (pieces, decode, pure, start_s, duration_s, totals, used, passes)
            self._push(worker, end_s)
            return

    def _record_decode(
        self, worker: FastWorker, start_s: float, duration_s: float, seqs: int, kv: int, step: int, used: int
    ) -> None:
        """Record one pure decode pass (``step``: its members, by which the next one's KV grows)."""
        run = self._runs.decode_run(worker.index, seqs, kv, step, used, worker.state.reserve_tokens is None)
        run.starts.append(start_s)
        run.durations.append(duration_s)
        if run.useds is not None:
            run.useds.append(used)
        run.next_kv = kv + step

    def _end(
        self, worker: FastWorker, end_s: float, pieces: list[tuple[int, int]], decode: bool, pure: bool,
        start_s: float, duration_s: float, totals: Totals, used: int, passes: int,
    ) -> bool:  # fmt: skip
        """End a pass at ``end_s``: credit its tokens, record it, report its completions. Returns whether it was
        a pure decode pass that completed no one (a steady policy may plan it again)."""
        state = worker.state
        step = state.count  # the members of this pass: its decode KV's growth
        completed = state.end(pieces, decode, end_s)
        if pure:
            self._record_decode(worker, start_s, duration_s, totals[3], totals[4], step, used)
        else:
            self._record(
                worker.index, start_s, duration_s, totals[1] + totals[3], totals[0], totals[3], used, totals[2],
                totals[4], state.prefill_context_tokens,
            )  # fmt: skip
        if completed:
            self._on_completed(completed)
        if self._watched:
            self._passes_ended(worker, passes)
        return pure and not completed

    def _passes_ended(self, worker: FastWorker, passes: int) -> None:
        """Audits and progress after ``passes`` passes of ``worker`` ended."""
        if self._audit_every:
            before = worker.passes
            worker.passes += passes
            if before // self._audit_every != worker.passes // self._audit_every:
                worker.state.audit()
        if self._on_iteration is not None:
            self._on_iteration(passes)

    def _idle(self, worker: FastWorker, clock: float, wake_at_s: float | None) -> None:
        """Nothing to run: wait to be woken, or (``wake_at_s``) woken or that time, whichever first."""
        if wake_at_s is None:
            worker.mode = IDLE
            return
        worker.mode = IDLE_DEADLINE
        self._push(worker, clock + delay_until(clock, wake_at_s))
