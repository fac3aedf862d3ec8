"""Pricing a recorded schedule with batchsim's cost model: step durations, then TTFT and TPOT.

A schedule (a list of :class:`~sim.parity.trace.Step`) says which requests ran with how many
tokens; walking it in order gives each request's computed tokens before every piece (reset by
a preemption, started at its prefix-cache hit), so each step's cost-model totals, and the steps
where each request emits a token. The same walk prices vLLM's and batchsim's schedules, so what
differs between their latencies is scheduling, not cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.parity.trace import Requests, Step

Totals = tuple[int, int, float, int, int]
"""(prefill tokens, prefill pieces, prefill attention work, decode sequences, decode KV tokens)."""


@dataclass
class Walked:
    """One step as walked: its cost-model totals and the requests that emitted a token (and finished)."""

    totals: Totals
    emitted: list[int]
    finished: list[int]


class StepWalker:
    """Follows a schedule step by step: per request, computed and generated tokens.

    A piece of one token on a request that has generated tokens and has all but the last of its
    tokens computed is a decode; every other piece is a prefill chunk (docs/engine.md, "Tokens").
    """

    def __init__(self, requests: Requests) -> None:
        self._prompt = requests.prompt_tokens
        self._output = requests.output_tokens
        self.computed = [0] * len(requests)
        self.generated = [0] * len(requests)
        self._running: set[int] = set()

    def walk(self, step: Step) -> Walked:
        """Apply one step and return its totals and token emissions."""
        for rid in step.preempt:
            self._running.discard(rid)
            self.computed[rid] = 0
        hits = dict(step.hit)
        prefill_tokens = pieces = decodes = kv_tokens = 0
        work = 0.0
        emitted: list[int] = []
        finished: list[int] = []
        for rid, tokens in step.run:
            if rid not in self._running:
                self._running.add(rid)
                self.computed[rid] = hits.get(rid, 0)
            before = self.computed[rid]
            target = self._prompt[rid] + self.generated[rid]
            if tokens == 1 and self.generated[rid] and before == target - 1:
                decodes += 1
                kv_tokens += target
            else:
                prefill_tokens += tokens
                pieces += 1
                work += tokens * (before + tokens / 2)
            self.computed[rid] = before + tokens
            if self.computed[rid] >= target:
                self.generated[rid] += 1
                emitted.append(rid)
                if self.generated[rid] >= self._output[rid]:
                    self._running.discard(rid)
                    finished.append(rid)
        return Walked((prefill_tokens, pieces, work, decodes, kv_tokens), emitted, finished)


@dataclass
class Latencies:
    """Per-request first-token and completion times of a priced schedule (NaN: never happened)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    makespan_s: float


def price(steps: list[Step], requests: Requests, cost_model: object) -> Latencies:
    """Price every step with ``cost_model.time_from_totals_s`` and time each request's tokens.

    A step starts when the previous one ends, or when the last request handed to it arrived if
    that is later (an idle server waits for the arrival).
    """
    walker = StepWalker(requests)
    arrival = np.asarray(requests.arrival_s, dtype=float)
    first = np.full(len(requests), np.nan)
    done = np.full(len(requests), np.nan)
    clock = 0.0
    for step in steps:
        if step.add:
            clock = max(clock, float(arrival[step.add].max()))
        walked = walker.walk(step)
        clock += cost_model.time_from_totals_s(*walked.totals)  # type: ignore[attr-defined]
        for rid in walked.emitted:
            if np.isnan(first[rid]):
                first[rid] = clock
        done[walked.finished] = clock
    outputs = np.asarray(requests.output_tokens, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (done - first) / (outputs - 1), np.nan)
    return Latencies(first - arrival, tpot, clock)
