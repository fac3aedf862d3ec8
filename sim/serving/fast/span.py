"""Merged decode spans of the fast path: a pure decode pass repeated while nothing else can happen.

The same rule as :func:`sim.serving.merge.decode_span` (read its docstring): a pure decode pass
of a steady policy is ended early and begun again while no other event is due before it ends,
no member gets its last token, no cancellation waits and (paged memory) the next step's blocks
are free. Every pass is priced as the first of its scheduling step, its start summed one by one,
and written as its own row straight into the replica's open decode run; the replica is advanced
once for all of them. Where the cost model gives its decode terms
(:meth:`sim.hardware.cost_model.CostModel.decode_terms`) a pass is priced by the same arithmetic
inline, without a call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.metrics.pass_runs import PassRuns
from sim.serving.cuda_graphs import CUDAGraphPadding
from sim.serving.fast.replica import FastReplica
from sim.serving.merge import MAX_AHEAD_PASSES

DecodeTerms = tuple[float, float, float, float, float]
_UNSEEN: Any = object()  # what the cache gives for a batch size not looked up yet


class SpanPricer:
    """Prices pure decode passes: ``price(0, 0, 0.0, seqs, kv)``, by its terms where the cost model gives them.

    Args:
        price: the pass price (``Worker.price``: cost model, plus the engine CPU model).
        cost_model: the cost model behind it (None when an engine CPU model adds to it: no terms then).
    """

    def __init__(self, price: Callable[..., float], cost_model: Any | None) -> None:
        self.price = price
        self._padding = cost_model if isinstance(cost_model, CUDAGraphPadding) else None
        inner = self._padding.inner if self._padding is not None else cost_model
        self._terms_of = getattr(inner, "decode_terms", None)
        self._cache: dict[int, DecodeTerms | None] = {}

    def terms(self, seqs: int) -> DecodeTerms | None:
        """(a, b, d2, c, e) of a pure decode pass of ``seqs`` sequences (see ``CostModel.decode_terms``), or None."""
        cache = self._cache
        if seqs in cache:
            return cache[seqs]
        terms = None
        if self._terms_of is not None:
            priced = self._padding.padded_decodes(seqs) if self._padding is not None else seqs
            terms = self._terms_of(priced)
            if terms is not None and not (terms[2] >= 0 and all(math.isfinite(t) for t in terms)):
                terms = None  # durations could fall with more KV: leave them to the checked calls
        cache[seqs] = terms
        return terms

    def decode_s(self, seqs: int, kv: int) -> float:
        """The duration of a pure decode pass of ``seqs`` sequences reading ``kv`` KV tokens."""
        terms = self._cache.get(seqs, _UNSEEN)  # the cache read inline: once per pure decode pass
        if terms is _UNSEEN:
            terms = self.terms(seqs)
        if terms is None:
            return self.price(0, 0, 0.0, seqs, kv)
        a, b, d2, c, e = terms
        return a + (b + d2 * kv) + c + e


def decode_span(
    state: FastReplica,
    pricer: SpanPricer,
    runs: PassRuns,
    horizon_s: float,
    start_s: float,
    duration_s: float,
    used_blocks: int,
    seqs: int,
    first_kv: int,
) -> tuple[int, float, float, int] | None:
    """Repeat the pure decode pass of ``seqs`` sequences and ``first_kv`` KV tokens just begun at ``start_s``
    while it merges, record the ended passes in the replica's open decode run of ``runs`` and advance the
    replica over them (None: no repeat).

    The passes are written straight into the run's lists as they are priced (no copies: a span is
    only a few passes long under load, so per-span overhead is what counts).

    Returns:
        How many passes ended, and the start, duration and blocks in use of the last pass, the one in flight.
    """
    end_s = start_s + duration_s
    if end_s >= horizon_s or state.cancelled or not state.count:
        return None
    limit = min(state.steps_before_finish(), MAX_AHEAD_PASSES)
    if limit <= 0:
        return None
    step_kv = state.count
    paged = state.reserve_tokens is None
    if paged:  # each repeat's new blocks must fit (else the policy preempts)
        free = state.total_blocks - used_blocks
        # a member needs one new block every ``block_size`` steps: when even that many for every member fit,
        # all ``limit`` repeats do, and the step by step count (as long as ``limit``) is not needed
        if -(-limit // state.block_size) * step_kv > free:
            limit = _fitting_steps(state.block_need_cycle(), free, limit)
            if limit <= 0:
                return None
    run = runs.decode_run(state.index, seqs, first_kv, step_kv, used_blocks, paged)
    starts, durations = run.starts, run.durations
    first = len(starts)
    starts.append(start_s)
    durations.append(duration_s)
    terms = pricer.terms(seqs)
    if terms is not None:
        _priced_inline(terms, starts, durations, end_s, horizon_s, first_kv, step_kv, limit)
        if not 0.0 <= durations[-1] < math.inf:  # the largest: the others are in range then
            raise ValueError(f"cost model returned {durations[-1]!r} s for a decode pass of {seqs} sequences")
    else:
        _priced_by_calls(pricer.price, seqs, starts, durations, end_s, horizon_s, first_kv, step_kv, limit)
    last_start_s, last_duration_s = starts.pop(), durations.pop()  # in flight: recorded when it ends
    done = len(starts) - first
    ends = starts[first + 1 :]
    ends.append(last_start_s)
    used = used_blocks
    if paged:
        used = _blocks_in_use(state.block_need_cycle(), used_blocks, done + 1, run.useds)  # type: ignore[arg-type]
    state.repeat_decodes(ends, used - used_blocks)
    run.next_kv = first_kv + done * step_kv
    return done, last_start_s, last_duration_s, used


def _fitting_steps(cycle: list[int], free: int, limit: int) -> int:
    """How many repeats (at most ``limit``) find their new blocks free, taken one after another."""
    size = len(cycle)
    for done in range(limit):
        need = cycle[done % size]
        if need > free:
            return done
        free -= need
    return limit


def _blocks_in_use(cycle: list[int], used: int, passes: int, useds: list[int]) -> int:
    """Append the blocks in use of each of the first ``passes - 1`` of ``passes`` passes, the first using
    ``used``, to ``useds``; return those of the last."""
    size = len(cycle)
    for done in range(passes - 1):
        useds.append(used)
        used += cycle[done % size]
    return used


def _priced_inline(
    terms: DecodeTerms,
    starts: list[float],
    durations: list[float],
    end_s: float,
    horizon_s: float,
    first_kv: int,
    step_kv: int,
    limit: int,
) -> None:
    """Append the repeats' starts and durations, ``((a + (b + d2 * kv)) + c) + e``, until one ends at or
    after the horizon. Each start is the previous one's end, summed one by one as the clock takes them.

    ``d2 >= 0`` (checked by the pricer) makes the durations grow with the KV: the caller checks the last.
    """
    a, b, d2, c, e = terms
    add, begin = durations.append, starts.append
    kvs = range(first_kv + step_kv, first_kv + step_kv * (limit + 1), step_kv)
    if c == 0.0 and e == 0.0:  # adding 0.0 changes no duration: leave it out
        for kv in kvs:
            if end_s >= horizon_s:
                return
            duration_s = a + (b + d2 * kv)
            begin(end_s)
            add(duration_s)
            end_s += duration_s
        return
    for kv in kvs:
        if end_s >= horizon_s:
            return
        duration_s = a + (b + d2 * kv) + c + e
        begin(end_s)
        add(duration_s)
        end_s += duration_s


def _priced_by_calls(
    price: Callable[..., float], seqs: int, starts: list[float], durations: list[float], end_s: float,
    horizon_s: float, first_kv: int, step_kv: int, limit: int,
) -> None:  # fmt: skip
    """As :func:`_priced_inline`, asking ``price`` for every pass (each checked)."""
    add, begin = durations.append, starts.append
    inf = math.inf
    for kv in range(first_kv + step_kv, first_kv + step_kv * (limit + 1), step_kv):
        if end_s >= horizon_s:
            return
        duration_s = price(0, 0, 0.0, seqs, kv)
        if not 0.0 <= duration_s < inf:
            raise ValueError(f"cost model returned {duration_s!r} s for {seqs} decodes, {kv} KV tokens")
        begin(end_s)
        add(duration_s)
        end_s += duration_s
