"""The SimPy process of one GPU worker (replica): one event per forward pass.

Loop: ask the policy for a plan, apply it to the replica state, charge the cost model
for the pass, ``yield env.timeout(duration)``, credit the produced tokens, record the
iteration. With nothing to run the worker sleeps until a request arrives (or until the
time the policy asked to be woken, e.g. a static batch's max wait).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any, Protocol

import simpy

from sim.metrics.records import IterationRecords
from sim.policies.base import Policy
from sim.serving.clock import delay_until
from sim.serving.state import ReplicaState


class CostModelLike(Protocol):
    """The one cost-model call the engine makes (see sim.hardware.cost_model)."""

    def time_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> float: ...


class Worker:
    """One replica's forward-pass loop.

    Args:
        env: the SimPy environment.
        state: the replica's queue, batch and KV.
        policy: decides each pass.
        cost_model: prices each pass.
        iterations: where each pass is recorded.
        on_completed: called with the request ids each pass completed.
        on_iteration: called after every pass (progress reporting).
        audit_every: check the replica's invariants every this many passes (0: never).
    """

    def __init__(
        self,
        env: simpy.Environment,
        state: ReplicaState,
        policy: Policy,
        cost_model: CostModelLike,
        iterations: IterationRecords,
        *,
        on_completed: Callable[[list[int]], None],
        on_iteration: Callable[[], None],
        audit_every: int = 4096,
    ) -> None:
        self.state = state
        self._env = env
        self._policy = policy
        self._cost = cost_model.time_from_totals_s
        self._iterations = iterations
        self._on_completed = on_completed
        self._on_iteration = on_iteration
        self._audit_every = audit_every
        self._wake: simpy.Event | None = None

    def wake(self) -> None:
        """Work arrived: end the worker's idle wait, if it is waiting."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self) -> Generator[simpy.Event, Any, None]:
        """The SimPy process body."""
        env, state, schedule, cost = self._env, self.state, self._policy.schedule, self._cost
        record, index, blocks = self._iterations.append, state.index, state.blocks
        passes, last_end_s = 0, 0.0
        while True:
            start_s = env.now
            if start_s < last_end_s:
                raise RuntimeError(
                    f"replica {index}: time went back from {last_end_s} to {start_s}"
                )
            plan = schedule(state.view(start_s))
            if not plan.has_work:
                if state.running_count:
                    raise RuntimeError(
                        f"replica {index}: nothing planned, {state.running_count} running"
                    )
                yield from self._idle(plan.wake_at_s)
                continue
            totals = state.begin(plan, start_s)
            used_blocks = blocks.used_blocks
            duration_s = cost(*totals)
            if not 0.0 <= duration_s < math.inf:
                raise ValueError(f"cost model returned {duration_s!r} s for totals {totals}")
            yield env.timeout(duration_s)
            last_end_s = env.now
            completed = state.end(plan, last_end_s)
            record(
                index, start_s, duration_s, totals[1] + totals[3], totals[0], totals[3], used_blocks
            )
            if completed:
                self._on_completed(completed)
            passes += 1
            if self._audit_every and passes % self._audit_every == 0:
                state.audit()
            self._on_iteration()

    def _idle(self, wake_at_s: float | None) -> Generator[simpy.Event, Any, None]:
        env = self._env
        self._wake = env.event()
        if wake_at_s is None:
            yield self._wake
        else:
            yield self._wake | env.timeout(delay_until(env.now, wake_at_s))
        self._wake = None
