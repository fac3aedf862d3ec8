"""Decode-step merging: consecutive pure decode passes of one replica in one SimPy event.

A worker that begins a pure decode pass (no prefill, no preemption, one step) of a
steady policy (``Policy.steady_decode``) knows the next pass too, as long as nothing
can happen in between: no other event is due before the pass ends (``env.peek()``: an
arrival, retry, deadline, another replica's pass end, a wake-up), no member finishes in
it, no cancellation waits for its end, and the next step's KV blocks fit (so the policy
would preempt no one). Then the policy would plan the same decode pass again, so the
worker ends this pass and begins the next one at once, records the row, and looks again.
When a pass can no longer be followed this way the worker waits once, until the end of
that last pass, and ends it as usual.

Exactness: the passes are ended and begun with the same calls, in the same order and at
the same times as one event per pass would make (every pass is priced as the first of its
scheduling step, as the policy would have been asked); the pass starts are summed one by
one as SimPy sums its timeouts, and the single timeout lands exactly on the last end. No
other event falls strictly between the block's start and its last pass's start, and any
event due at or after that is already queued, so it keeps its order relative to the
worker's. ``merge_decode_steps: false`` (the ``engine`` section) turns it off.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

if TYPE_CHECKING:
    from sim.policies.base import IterationPlan
    from sim.serving.state import CostTotals
    from sim.serving.worker import Worker


def merged_decode_passes(
    worker: Worker, plan: IterationPlan, start_s: float, totals: CostTotals, duration_s: float, used_blocks: int
) -> Generator[simpy.Event, Any, int]:
    """Run the pure decode pass ``plan`` (begun at ``start_s``) and every pass that merges with it.

    Returns:
        The number of passes run (at least one).
    """
    env, state, price, record = worker.env, worker.state, worker.price, worker.record
    index, blocks, on_iteration = state.index, state.blocks, worker.on_iteration
    horizon_s = env.peek()  # the next event of anyone else: nothing happens before it but us
    starts, durations = [start_s], [duration_s]
    decodes, used, kv_tokens = [totals[3]], [used_blocks], [totals[4]]  # rows of the passes ended early
    end_s = start_s + duration_s
    while end_s < horizon_s and state.can_repeat_decode():
        totals = state.repeat_decode(plan, end_s)  # end this pass (nothing completes), begin the next
        duration_s = price(*totals)
        if not 0.0 <= duration_s < math.inf:
            raise ValueError(f"cost model returned {duration_s!r} s for totals {totals}")
        starts.append(end_s)
        durations.append(duration_s)
        decodes.append(totals[3])
        used.append(blocks.used_blocks)
        kv_tokens.append(totals[4])
        end_s += duration_s
    merged = len(starts) - 1
    if merged:  # before the wait: other replicas' rows may follow during the last pass
        worker.record_decodes(index, starts[:-1], durations[:-1], decodes[:-1], used[:-1], kv_tokens[:-1])
        worker.scheduler_calls += merged
        for _ in range(merged):
            on_iteration()
    start_s, duration_s, used_blocks = starts[-1], durations[-1], used[-1]
    for delay_s in _delays(env.now, starts, durations):
        worker.pass_events += 1
        yield env.timeout(delay_s)
    completed = state.end(plan, end_s)
    record(
        index, start_s, duration_s, totals[1] + totals[3], totals[0], totals[3], used_blocks,
        totals[2], totals[4], state.prefill_context_tokens,
    )  # fmt: skip
    if completed:
        worker.on_completed(completed)
    on_iteration()
    return len(starts)


def _delays(now_s: float, starts: list[float], durations: list[float]) -> list[float]:
    """Timeouts from ``now_s`` that end exactly where the passes end: one, ``exact_delay`` to
    the last end, when the float sum can land there; else one to the latest pass start it can
    land on and then the remaining passes' own durations (exact by construction)."""
    end_s = starts[-1] + durations[-1]
    delay_s = exact_delay(now_s, end_s)
    if delay_s is not None:
        return [delay_s]
    for j in range(len(starts) - 1, 0, -1):
        delay_s = exact_delay(now_s, starts[j])
        if delay_s is not None:
            return [delay_s, *durations[j:]]
    return durations  # starts[0] == now_s


def exact_delay(now_s: float, at_s: float) -> float | None:
    """The delay ``d`` with ``now_s + d == at_s`` exactly (``at_s >= now_s >= 0``), or None.

    ``at_s - now_s`` can round either way when ``now_s < at_s / 2``; step it by ulps towards
    ``at_s``. The rounded sum can also jump over ``at_s`` (None then).
    """
    delay = at_s - now_s
    while now_s + delay < at_s:
        delay = math.nextafter(delay, math.inf)
    while now_s + delay > at_s:
        delay = math.nextafter(delay, -math.inf)
    return delay if now_s + delay == at_s else None
