"""Request streams whose prompts share content: Mooncake traces, shared system prompts, sessions.

Synthetic content is described in 16-token units (vLLM's default KV block): every unit
gets a fresh id unless it repeats an earlier prompt's unit (a shared prefix, or the
conversation so far). Savings are therefore exact for engine block sizes that are
multiples of 16. Random draws come from their own named streams (``shared_prefix``,
``sessions``), so the arrival and length draws of a workload stay those of the same
workload without the new blocks.
"""

from __future__ import annotations

import numpy as np

from sim.config import SharedPrefix, TraceArrival, Workload
from sim.errors import UserError
from sim.rng import RandomStreams
from sim.workload.content import PromptContent
from sim.workload.lengths import make_length_sampler
from sim.workload.mooncake import clip_prompts, load_mooncake
from sim.workload.stream import RequestStream, SessionChain
from sim.workload.traces import resolve_trace_path

SYNTHETIC_UNIT_TOKENS = 16


def mooncake_stream(workload: Workload, base_dir: str | None) -> RequestStream:
    """The stream of a ``format: mooncake`` trace arrival (lengths and content from the trace)."""
    arrival = workload.arrival
    assert isinstance(arrival, TraceArrival)
    try:
        path = resolve_trace_path(arrival.path, base_dir)
    except UserError as exc:
        raise type(exc)(str(exc), field="workload.arrival.path") from None
    limit = min(arrival.limit or 2**62, workload.requests or 2**62)
    trace = load_mooncake(path, limit)
    if arrival.max_prompt_tokens is not None:
        trace = clip_prompts(trace, arrival.max_prompt_tokens)
    max_output = workload.max_output_tokens or int(trace.output_tokens.max())
    return RequestStream(
        arrival_s=(trace.arrival_s - trace.arrival_s[0]) * arrival.time_scale,
        prompt_tokens=trace.prompt_tokens,
        output_tokens=np.minimum(trace.output_tokens, max_output),
        max_output_tokens=max_output,
        content=trace.content,
    )


class _Units:
    """Hands out fresh unit ids and collects each request's unit list."""

    def __init__(self) -> None:
        self.next_id = 0
        self.per_request: list[np.ndarray] = []

    def fresh(self, count: int) -> np.ndarray:
        ids = np.arange(self.next_id, self.next_id + count, dtype=np.int64)
        self.next_id += count
        return ids

    def content(self, content_tokens: np.ndarray) -> PromptContent:
        lengths = np.array([len(u) for u in self.per_request], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        ids = np.concatenate(self.per_request) if self.per_request else np.empty(0, np.int64)
        return PromptContent(SYNTHETIC_UNIT_TOKENS, ids, starts, content_tokens.astype(np.int64))


def _units_for(tokens: int) -> int:
    return -(-tokens // SYNTHETIC_UNIT_TOKENS)


def prefix_variants(config: SharedPrefix | None, n: int, streams: RandomStreams) -> np.ndarray:
    """Per request the shared prefix it starts with (-1: none), from the ``shared_prefix`` stream."""
    if config is None:
        return np.full(n, -1, dtype=np.int64)
    rng = streams.generator("shared_prefix")
    carries = rng.random(n) < config.fraction
    variant = rng.integers(0, config.variants, size=n)
    return np.where(carries, variant, -1).astype(np.int64)


def with_shared_prefix(stream: RequestStream, config: SharedPrefix, streams: RandomStreams) -> RequestStream:
    """``stream`` with a shared prefix of ``config.tokens`` before a fraction of its prompts.

    Prefixed request: prompt = prefix + its drawn prompt. The prefix's full units are the
    variant's; the unit holding both prefix and user tokens, and the rest, are fresh.
    """
    variants = prefix_variants(config, len(stream), streams)
    units = _Units()
    shared = [units.fresh(config.tokens // SYNTHETIC_UNIT_TOKENS) for _ in range(config.variants)]
    prompts = stream.prompt_tokens + np.where(variants >= 0, config.tokens, 0)
    for prompt, variant in zip(prompts.tolist(), variants.tolist(), strict=True):
        head = shared[variant] if variant >= 0 else units.fresh(0)
        units.per_request.append(np.concatenate((head, units.fresh(_units_for(prompt) - len(head)))))
    return _replace(stream, prompt_tokens=prompts, content=units.content(prompts))


def session_stream(workload: Workload, base: RequestStream, streams: RandomStreams) -> RequestStream:
    """Multi-turn sessions over ``base``'s draws: request i's drawn prompt is the i-th user message.

    Sessions start at ``base.arrival_s`` times (one per session, in order) and have turn
    counts from ``sessions.turns``; turns are numbered session by session. Turn k's
    prompt is turn k-1's prompt + its output + the new message, so its first units are
    the previous turn's full units (content = prompt + output, which the next turn repeats).
    """
    config = workload.sessions
    assert config is not None
    n = len(base)
    turns = _turn_counts(config, n, streams, base_dir=None)
    variants = prefix_variants(workload.shared_prefix, len(turns), streams)
    prefix_tokens = workload.shared_prefix.tokens if workload.shared_prefix else 0
    units, prompts = _Units(), np.zeros(n, dtype=np.int64)
    shared = [units.fresh(prefix_tokens // SYNTHETIC_UNIT_TOKENS) for _ in range(int(variants.max()) + 1)]
    next_turn = np.full(n, -1, dtype=np.int64)
    arrival_s = np.full(n, np.nan)
    rid = 0
    for session, count in enumerate(turns.tolist()):
        history = shared[variants[session]] if variants[session] >= 0 else units.fresh(0)
        history_tokens = prefix_tokens if variants[session] >= 0 else 0
        arrival_s[rid] = base.arrival_s[session]
        for turn in range(count):
            prompts[rid] = history_tokens + int(base.prompt_tokens[rid])
            content_tokens = prompts[rid] + int(base.output_tokens[rid])
            ids = np.concatenate((history, units.fresh(_units_for(content_tokens) - len(history))))
            units.per_request.append(ids)
            history_tokens = content_tokens
            history = ids[: content_tokens // SYNTHETIC_UNIT_TOKENS]
            if turn + 1 < count:
                next_turn[rid] = rid + 1
            rid += 1
    think = streams.generator("think_time").exponential(config.think_time_s, n) if config.think_time_s else np.zeros(n)
    return _replace(
        base,
        arrival_s=arrival_s,
        prompt_tokens=prompts,
        content=units.content(prompts + base.output_tokens),
        sessions=SessionChain(next_turn, think),
    )


def _turn_counts(config: object, n: int, streams: RandomStreams, base_dir: str | None) -> np.ndarray:
    """Turns per session until ``n`` requests are covered (the last session cut short)."""
    sampler = make_length_sampler(config.turns, base_dir, field="workload.sessions.turns")  # type: ignore[attr-defined]
    counts = sampler.sample(streams.generator("sessions"), n)  # n sessions always cover n turns
    ends = np.cumsum(counts)
    last = int(np.searchsorted(ends, n))
    counts = counts[: last + 1].copy()
    counts[-1] -= int(ends[last]) - n
    return counts


def _replace(stream: RequestStream, **changes: object) -> RequestStream:
    fields = {
        "arrival_s": stream.arrival_s, "prompt_tokens": stream.prompt_tokens, "output_tokens": stream.output_tokens,
        "max_output_tokens": stream.max_output_tokens, "closed_loop": stream.closed_loop,
        "content": stream.content, "sessions": stream.sessions,
    }  # fmt: skip
    fields.update(changes)
    return RequestStream(**fields)  # type: ignore[arg-type]
