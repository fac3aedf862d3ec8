"""Decode-step merging: consecutive pure decode passes of one replica, advanced in bulk.

A worker that begins a pure decode pass (no prefill, no preemption, one step) of a
steady policy (``Policy.steady_decode``) knows the next pass too, as long as nothing
can happen in between: no other event is due before the pass ends (``env.peek()``: an
arrival, retry, deadline, another replica's pass end, a wake-up), no member finishes in
it, no cancellation waits for its end, and the next step's KV blocks fit (so the policy
would preempt no one). Then the policy would plan the same decode pass again, so the
pass can be ended and the next one begun at once. ``decode_span`` does that for as many
passes as allowed, in one tight loop: it prices each pass (the cost model is the only
per-pass call), then advances the replica once for all of them and records their rows
at once. The worker (``Worker._run_ahead``) then ends the last one as usual, waiting for
the clock only where something else may happen first.

Exactness: every pass is priced with the same totals, as the first of its scheduling
step (as the policy would have been asked), and its start is summed one by one as SimPy
sums its timeouts; the worker's waits land exactly on the pass ends (``pass_delays``). No
other event falls strictly between a span's start and its last pass's start, and any event
due at or after that is already queued, so it keeps its order relative to the worker's.
``merge_decode_steps: false`` (the ``engine`` section) turns it off.

This module knows the replica state's API only, not the worker: the worker imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: neither module imports the other at run time
    from sim.serving.state import CostTotals, ReplicaState


MAX_AHEAD_PASSES = 4096
"""A worker waits for the clock after this many passes run ahead (bounds the lists kept for it)."""


class RunRecorder(Protocol):
    """Where a span's rows go (``IterationRecords.extend_decode_run``)."""

    def __call__(
        self, replica: int, start_s: list[float], duration_s: list[float], decodes: int,
        kv_blocks_used: list[int] | int, decode_kv_tokens: list[int],
    ) -> None: ...  # fmt: skip


def decode_span(
    state: ReplicaState,
    price: Callable[..., float],
    horizon_s: float,
    totals: CostTotals,
    used_blocks: int,
    starts: list[float],
    durations: list[float],
    record_run: RunRecorder,
) -> tuple[CostTotals, int, int]:
    """Repeat the pure decode pass just begun (the last of ``starts``/``durations``) while it merges.

    Each repeat ends the pass early and begins the same one at its end; the passes that follow
    are appended to ``starts`` and ``durations`` and every pass but the last is recorded. The
    state is advanced once for all of them (``ReplicaState.repeat_decodes``): a repeat changes
    nothing but the decode group's step, its context sum and (paged memory) the blocks of the
    members at a block edge, all known in advance.

    Returns:
        The last pass's totals, its KV blocks in use, and how many passes were merged into it.
    """
    end_s = starts[-1] + durations[-1]
    limit = min(state.repeatable_decodes(), MAX_AHEAD_PASSES) if end_s < horizon_s else 0
    if not limit:
        return totals, used_blocks, 0
    first = len(starts) - 1
    seqs, kv, step_kv = totals[3], totals[4], state.decoding_count
    kvs = [kv]
    add_start, add_duration, add_kv = starts.append, durations.append, kvs.append
    inf = math.inf
    done = 0
    used = used_blocks
    useds: list[int] | int = used_blocks
    # Two loops, not one with a memory test per pass: this is the per-pass hot path.
    if state.grows_per_step:  # paged: each repeat's new blocks must fit (else the policy preempts)
        cycle = state.decoders.block_need_cycle()
        size, free = len(cycle), state.span_free_blocks()
        useds = [used]
        add_used = useds.append
        while done < limit and end_s < horizon_s:
            need = cycle[done % size]
            if need > free:
                break
            free -= need
            used += need
            kv += step_kv
            duration_s = price(0, 0, 0.0, seqs, kv)
            if not 0.0 <= duration_s < inf:
                raise ValueError(f"cost model returned {duration_s!r} s for {seqs} decodes, {kv} KV tokens")
            add_start(end_s)
            add_duration(duration_s)
            add_kv(kv)
            add_used(used)
            end_s += duration_s
            done += 1
    else:  # reserved KV: only finishing members and the horizon end the span
        while done < limit and end_s < horizon_s:
            kv += step_kv
            duration_s = price(0, 0, 0.0, seqs, kv)
            if not 0.0 <= duration_s < inf:
                raise ValueError(f"cost model returned {duration_s!r} s for {seqs} decodes, {kv} KV tokens")
            add_start(end_s)
            add_duration(duration_s)
            add_kv(kv)
            end_s += duration_s
            done += 1
    if not done:
        return totals, used_blocks, 0
    state.repeat_decodes(starts[first + 1 :], used - used_blocks)
    rows_used = useds[:-1] if isinstance(useds, list) else useds
    record_run(state.index, starts[first:-1], durations[first:-1], seqs, rows_used, kvs[:-1])
    return (0, 0, 0.0, seqs, kv), used, done


def pass_delays(now_s: float, starts: list[float], durations: list[float]) -> list[float]:
    """The timeouts that take the clock from ``now_s`` (= ``starts[0]``) exactly to the end of the
    last of these back-to-back passes, as one timeout per pass would (see ``_delays``)."""
    return _delays(now_s, starts, durations)


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
