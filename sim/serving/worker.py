"""The SimPy process of one GPU worker (replica): one event per forward pass.

Loop: ask the policy for a plan, apply it to the replica state, charge the cost model
for the pass, ``yield env.timeout(duration)``, credit the produced tokens, record the
iteration. With nothing to run the worker sleeps until a request arrives (or until the
time the policy asked to be woken, e.g. a static batch's max wait).

A plan with ``steps`` = K > 1 is a multi-step block (vLLM ``--num-scheduler-steps``): K
decode passes without asking the policy again. Nothing can join the batch before the
block ends and client cancellations only take effect then, so all K passes are known when
the block starts: the worker prices them all and waits once, for their summed duration
(one SimPy event instead of K), then records one row per pass at its own start time.
With an ``engine_cpu`` model each pass also pays the engine's CPU time
(:mod:`sim.serving.cpu_time`).

Decode-step merging (``merge_decode_steps``, on by default): the worker runs ahead of
the SimPy clock while no other event is due, ending a pass and beginning the next one at
its end without an event, and waits once (exactly) where something else may happen; when
a steady policy (``Policy.steady_decode``) plans a pure decode pass, the following passes
are known too until something can change them, and they are advanced in bulk
(:mod:`sim.serving.merge`); a pure decode plan is reused when ``Policy.decode_only`` says
the policy would build it again. Results are identical with merging on and off.

A virtual engine of a pipeline-parallel replica (``pipeline``) runs the plain loop: its passes
go through stages that the replica's other virtual engines share, so no pass's end is known
when it begins and nothing can be merged or run ahead. The pass runner takes the micro-batch
through the stages and records one row per stage (:mod:`sim.serving.pipeline`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import simpy

from sim.config import EngineCPUConfig
from sim.metrics.records import IterationRecords
from sim.policies.base import IterationPlan, Policy
from sim.serving.clock import delay_until
from sim.serving.cpu_time import EngineCPUTime
from sim.serving.merge import MAX_AHEAD_PASSES, decode_span, pass_delays
from sim.serving.pricing import CostModelLike
from sim.serving.state import CostTotals, ReplicaState


class Worker:
    """One replica's forward-pass loop.

    Args:
        env: the SimPy environment.
        state: the replica's queue, batch and KV.
        policy: decides each pass.
        cost_model: prices each pass.
        iterations: where each pass is recorded.
        on_completed: called with the request ids each pass completed.
        on_iteration: called with the number of passes that just ended (progress reporting):
            once per pass, or once for a merged run or a multi-step block.
        audit_every: check the replica's invariants every this many passes (0: never).
        engine_cpu: add this engine CPU-time model to every pass (None: the cost model's
            time only; give it a cost model without CPU overhead).
        merge_decode_steps: merge consecutive pure decode passes into one SimPy event where
            nothing can fall between them (the policy and state must allow it), and run
            passes ahead of the SimPy clock while no other event is due (see ``_run_ahead``).
        completions_inert: ``on_completed`` schedules and sends nothing (open-loop clients),
            so it may be called while the worker runs ahead of the clock.
        pipeline: runs each pass through a pipeline-parallel replica's stages and records it,
            ``pipeline(totals, pass_s, kv_blocks_used, context_tokens)`` (None: one timeout per
            pass); merging is then off.

    Attributes:
        pass_events: SimPy timeouts the worker waited on for its passes (one per pass, per
            multi-step block, or per run of merged decode passes).
        scheduler_calls: scheduling steps: calls of ``policy.schedule`` that started a pass
            (a block of K passes counts once; a plan with nothing to run does not count).
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
        on_iteration: Callable[[int], None],
        audit_every: int = 4096,
        engine_cpu: EngineCPUConfig | None = None,
        merge_decode_steps: bool = True,
        completions_inert: bool = False,
        pipeline: Callable[..., Generator[simpy.Event, Any, None]] | None = None,
    ) -> None:
        self.state = state
        self.scheduler_calls = 0
        self.pass_events = 0
        self._env = env
        self._policy = policy
        self._cost = cost_model.time_from_totals_s
        self._iterations = iterations
        self._on_completed = on_completed
        self._on_iteration = on_iteration
        self._audit_every = audit_every
        self._cpu = EngineCPUTime.from_config(engine_cpu) if engine_cpu is not None else None
        self._wake: simpy.Event | None = None
        self.env = env
        self.price: Callable[..., float] = self._cost if self._cpu is None else self._priced_first
        """GPU (+ engine CPU) time of a pass that is the first of its scheduling step."""
        self._pipeline = pipeline
        self._merge = merge_decode_steps and policy.steady_decode and state.merges_decode and pipeline is None
        self._completions_inert = completions_inert

    def start(self) -> None:
        """Start the worker's SimPy process."""
        self._env.process(self.run())

    def wake(self) -> None:
        """Work arrived: end the worker's idle wait, if it is waiting."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self) -> Generator[simpy.Event, Any, None]:
        """The SimPy process body: one timeout per pass, or running ahead (merging on)."""
        yield from (self._run_ahead() if self._merge else self._run_plain())

    def _run_plain(self) -> Generator[simpy.Event, Any, None]:
        """One SimPy timeout per pass (per multi-step block): the reference behaviour."""
        # Everything the loop touches is bound to a local: it runs once per forward pass.
        env, state, schedule = self._env, self.state, self._policy.schedule
        record, index = self._iterations.append, state.index
        audit_every, on_iteration = self._audit_every, self._on_iteration
        pipeline = self._pipeline
        passes, last_end_s = 0, 0.0
        while True:
            start_s = env.now
            if start_s < last_end_s:
                raise RuntimeError(
                    f"replica {index}: time went back from {last_end_s} to {start_s}"
                )
            plan = schedule(state.view(start_s))
            if not (plan.prefill or plan.decode) or (plan.preempt and state.runs_nothing(plan)):
                if state.flush_outputs(plan, start_s):  # victims go; async: the last outputs free KV; decide again
                    continue
                if state.running_count:
                    raise RuntimeError(
                        f"replica {index}: nothing planned, {state.running_count} running"
                    )
                yield from self._idle(plan.wake_at_s)
                continue
            totals, used_blocks, duration_s = self._begin_pass(plan, start_s)
            if plan.steps > 1:
                before = passes
                passes += yield from self._block(plan, start_s, totals, duration_s, used_blocks)
                last_end_s = env.now
                if audit_every and before // audit_every != passes // audit_every:
                    state.audit()
                continue
            self.pass_events += 1
            if pipeline is None:
                yield env.timeout(duration_s)
            else:  # through the stages, one row each
                yield from pipeline(totals, duration_s, used_blocks, state.prefill_context_tokens)
            last_end_s = env.now
            completed = state.end(plan, last_end_s)
            if pipeline is None:
                record(
                    index, start_s, duration_s, totals[1] + totals[3], totals[0], totals[3], used_blocks,
                    totals[2], totals[4], state.prefill_context_tokens,
                )  # fmt: skip
            if completed:
                self._on_completed(completed)
            passes += 1
            if audit_every and passes % audit_every == 0:
                state.audit()
            on_iteration(1)

    def _run_ahead(self) -> Generator[simpy.Event, Any, None]:
        """Passes without SimPy events wherever none is needed (merging on).

        The worker keeps its own clock (the end of its last pass), which may run ahead of
        ``env.now``. While no other event is due before a pass ends (``horizon_s``: the next
        event when the worker last resumed), nothing can observe or change the replica in
        between, so the worker ends the pass and plans and begins the next one at its end
        time without waiting: the same calls, with the same times, as one timeout per pass.
        It waits (timeouts landing exactly on the pass ends, ``pass_delays``) only to end a
        pass that ends at or after the horizon, to go idle, before a multi-step block, and
        before completions reach clients that may react to them (closed loops). Pure decode
        passes are repeated in bulk (``decode_span``), and a pure decode plan is reused without
        building a new one when ``Policy.decode_only`` says the policy would plan it again.
        """
        env, state, policy, iterations = self._env, self.state, self._policy, self._iterations
        schedule, decode_only = policy.schedule, policy.decode_only
        record, record_run, index = iterations.append, iterations.extend_decode_run, state.index
        price, inert, on_completed = self.price, self._completions_inert, self._on_completed
        audit_every, on_iteration = self._audit_every, self._on_iteration
        starts: list[float] = []  # passes begun since env.now and not waited for (starts[0] == env.now)
        durations: list[float] = []
        passes, clock, horizon_s = 0, env.now, env.peek()
        reuse: IterationPlan | None = None  # the last plan, if a pure decode plan
        while True:
            start_s = clock
            view = state.view(start_s)
            if reuse is not None and decode_only(view):
                plan = reuse  # the plan the policy would build: skip building it
            else:
                plan = schedule(view if reuse is None else state.view(start_s))  # decode_only may have asked the ledger
                if not (plan.prefill or plan.decode) or (plan.preempt and state.runs_nothing(plan)):
                    if state.flush_outputs(plan, start_s):  # victims go; async: the last outputs free KV; decide again
                        reuse = None
                        continue
                    if state.running_count:
                        raise RuntimeError(f"replica {index}: nothing planned, {state.running_count} running")
                    if starts:
                        yield from self._wait(starts, durations)
                    yield from self._idle(plan.wake_at_s)
                    clock, horizon_s, reuse = env.now, env.peek(), None
                    continue
            totals, used_blocks, duration_s = self._begin_pass(plan, start_s)
            if plan.steps > 1:
                if starts:
                    yield from self._wait(starts, durations)
                before = passes
                passes += yield from self._block(plan, start_s, totals, duration_s, used_blocks)
                if audit_every and before // audit_every != passes // audit_every:
                    state.audit()
                clock, horizon_s, reuse = env.now, env.peek(), None
                continue
            starts.append(start_s)
            durations.append(duration_s)
            pure = not plan.prefill and not plan.preempt
            merged = 0
            if pure:
                totals, used_blocks, merged = decode_span(
                    state, price, horizon_s, totals, used_blocks, starts, durations, record_run
                )
                if merged:
                    self.scheduler_calls += merged
                    start_s, duration_s = starts[-1], durations[-1]
            end_s = start_s + duration_s
            if end_s >= horizon_s or len(starts) >= MAX_AHEAD_PASSES:
                yield from self._wait(starts, durations)
                horizon_s = env.peek()
            completed = state.end(plan, end_s)
            record(
                index, start_s, duration_s, totals[1] + totals[3], totals[0], totals[3], used_blocks,
                totals[2], totals[4], state.prefill_context_tokens,
            )  # fmt: skip
            if completed:
                if inert:
                    on_completed(completed)
                else:  # the clients may send or schedule: be on time, and look again afterwards
                    if starts:
                        yield from self._wait(starts, durations)
                    on_completed(completed)
                    horizon_s = env.peek()
            before = passes
            passes += merged + 1
            if audit_every and before // audit_every != passes // audit_every:
                state.audit()
            on_iteration(merged + 1)
            clock = end_s
            reuse = plan if pure else None

    def _begin_pass(self, plan: IterationPlan, start_s: float) -> tuple[CostTotals, int, float]:
        """Apply a plan that runs (``state.begin``) and price its pass: the cost-model totals,
        the KV blocks in use during the pass, and its duration."""
        self.scheduler_calls += 1
        totals = self.state.begin(plan, start_s)
        duration_s = self.price(*totals)
        if not 0.0 <= duration_s < math.inf:
            raise ValueError(f"cost model returned {duration_s!r} s for totals {totals}")
        return totals, self.state.blocks.used_blocks, duration_s

    def _wait(self, starts: list[float], durations: list[float]) -> Generator[simpy.Event, Any, None]:
        """Wait until the last pass run ahead ends (exactly), then forget the passes."""
        env = self._env
        if starts[0] != env.now:
            raise RuntimeError(f"replica {self.state.index}: passes run ahead from {starts[0]}, clock at {env.now}")
        for delay_s in pass_delays(env.now, starts, durations):
            self.pass_events += 1
            yield env.timeout(delay_s)
        starts.clear()
        durations.clear()

    def _priced_first(self, *totals: Any) -> float:
        return self._priced(totals, first_of_step=True)

    def _priced(self, totals: CostTotals, *, first_of_step: bool) -> float:
        """GPU time from the cost model plus the engine CPU-time model."""
        assert self._cpu is not None
        return self._cpu.pass_time_s(self._cost(*totals), totals[1] + totals[3], first_of_step=first_of_step)

    def _block(
        self, plan: IterationPlan, start_s: float, totals: CostTotals, duration_s: float, used_blocks: int
    ) -> Generator[simpy.Event, Any, int]:
        """Run a multi-step block whose first pass ``state.begin`` already applied; return its passes.

        All passes are priced up front (nothing outside the block can change them), then
        one timeout covers them. Pass starts are summed one by one, as K consecutive
        timeouts would place them; the block ends exactly at the last pass's end
        (``delay_until``), where requests complete and receive their K tokens.
        """
        if plan.prefill or not plan.decode:
            raise RuntimeError(f"replica {self.state.index}: a multi-step plan must be a pure decode plan")
        state, cost, cpu = self.state, self._cost, self._cpu
        passes = [(start_s, duration_s, totals, used_blocks)]
        end_s = start_s + duration_s
        for _ in range(plan.steps - 1):
            totals = state.block_step()
            duration_s = cost(*totals) if cpu is None else self._priced(totals, first_of_step=False)
            if not 0.0 <= duration_s < math.inf:
                raise ValueError(f"cost model returned {duration_s!r} s for totals {totals}")
            passes.append((end_s, duration_s, totals, state.blocks.used_blocks))
            end_s += duration_s
        env = self._env
        self.pass_events += 1
        if self._pipeline is not None:  # pass after pass through the shared stages, which record them
            for _, pass_s, totals, used in passes:
                yield from self._pipeline(totals, pass_s, used, 0)
            completed = state.end_block(env.now)
        else:
            yield env.timeout(delay_until(env.now, end_s))
            completed = state.end_block(env.now)
            record, index = self._iterations.append, state.index
            for pass_start_s, pass_s, (prefill, _, work, decodes, kv_tokens), used in passes:
                record(index, pass_start_s, pass_s, decodes, prefill, decodes, used, work, kv_tokens, 0)
        if completed:
            self._on_completed(completed)
        self._on_iteration(len(passes))
        return len(passes)

    def _idle(self, wake_at_s: float | None) -> Generator[simpy.Event, Any, None]:
        env = self._env
        self._wake = env.event()
        if wake_at_s is None:
            yield self._wake
        else:
            yield self._wake | env.timeout(delay_until(env.now, wake_at_s))
        self._wake = None
