"""Build the request stream of a scenario: the single entry point of the workload layer.

``build_request_stream(workload, seed)`` turns the ``workload`` block of a scenario
into a :class:`~sim.workload.stream.RequestStream`. Each random quantity has its own
named stream (see :data:`STREAMS`), so changing one part of the workload leaves the
others' draws untouched: a sweep over arrival rates keeps every request's prompt and
output length identical (common random numbers), and every policy in a scenario gets
the same stream because it is built once from the scenario seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from sim.config import ClosedLoopArrival, Length, TraceArrival, Workload
from sim.errors import UserError
from sim.rng import RandomStreams
from sim.workload.arrivals import closed_loop_clients, sample_arrivals
from sim.workload.lengths import make_length_sampler
from sim.workload.order import send_permutation
from sim.workload.shared_content import mooncake_stream, session_stream, with_shared_prefix
from sim.workload.stream import ClosedLoop, RequestStream
from sim.workload.traces import ARRIVAL_COLUMN, OUTPUT_COLUMN, PROMPT_COLUMN, load_trace

DEFAULT_REQUESTS = 1000
# Stream names (stable: renaming one changes every scenario's requests).
STREAMS = ("arrivals", "prompt_tokens", "output_tokens", "think_time")
_TRACE_COLUMNS = {"prompt_tokens": PROMPT_COLUMN, "output_tokens": OUTPUT_COLUMN}


@dataclass(frozen=True)
class _Replay:
    """The trace rows a run uses, plus each token column's max over the whole trace."""

    rows: pd.DataFrame
    max_tokens: dict[str, int]


def build_request_stream(workload: Workload, seed: int, base_dir: str | None = None) -> RequestStream:
    """The request stream of a scenario's workload.

    Args:
        workload: the validated ``workload`` block.
        seed: the scenario seed.
        base_dir: folder of the scenario file, against which relative trace and
            empirical-length paths are resolved (then the working directory).

    Returns:
        The requests in send order. Count: ``workload.requests`` (default 1000) for
        synthetic arrivals; for a trace, all its rows capped by ``arrival.limit`` and then
        by ``requests``. ``max_output_tokens`` is ``workload.max_output_tokens`` if given,
        else the output distribution's upper bound (the trace's column maximum when
        outputs come from a trace); outputs are clipped to it. ``workload.order``
        permutes the drawn requests over the unchanged send times (see
        :func:`~sim.workload.order.send_permutation`).

    Raises:
        UserError: a trace or length file is missing or corrupt, or a trace used for
            arrivals has no arrival times.
    """
    streams = RandomStreams(seed)
    if isinstance(workload.arrival, TraceArrival) and workload.arrival.format == "mooncake":
        return _trace_clients(mooncake_stream(workload, base_dir), workload.arrival, streams)
    replay = _load_replay(workload.arrival, workload.requests, base_dir)
    n = len(replay.rows) if replay else (workload.requests or DEFAULT_REQUESTS)
    prompt_tokens, _ = _lengths(workload.prompt_tokens, "prompt_tokens", replay, n, streams, base_dir)
    output_tokens, output_bound = _lengths(workload.output_tokens, "output_tokens", replay, n, streams, base_dir)
    max_output_tokens = workload.max_output_tokens or output_bound
    arrival_s, closed_loop = _send_times(workload, n, replay, streams)
    order = send_permutation(workload.order, prompt_tokens)
    stream = RequestStream(
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens[order],
        output_tokens=np.minimum(output_tokens[order], max_output_tokens),
        max_output_tokens=int(max_output_tokens),
        closed_loop=closed_loop,
    )
    if workload.sessions is not None:
        return session_stream(workload, stream, streams)
    if workload.shared_prefix is not None:
        return with_shared_prefix(stream, workload.shared_prefix, streams)
    return stream


def _load_replay(arrival: object, requests: int | None, base_dir: str | None) -> _Replay | None:
    if not isinstance(arrival, TraceArrival):
        return None
    try:
        frame = load_trace(arrival.path, base_dir)
    except UserError as exc:
        raise type(exc)(str(exc), field="workload.arrival.path") from None
    if ARRIVAL_COLUMN not in frame.columns and arrival.concurrency is None:
        raise UserError(
            f"trace '{arrival.path}' has no '{ARRIVAL_COLUMN}' column (a lengths-only trace); "
            f"use it as an empirical length distribution with another arrival kind, or replay it in order "
            f"with arrival.concurrency",
            field="workload.arrival.path",
        )
    n = min(len(frame), arrival.limit or len(frame), requests or len(frame))
    # The max over the whole trace, not the replayed rows: max_tokens is a property of the
    # service that produced the trace, and must not change with arrival.limit.
    max_tokens = {c: int(frame[c].max()) for c in (PROMPT_COLUMN, OUTPUT_COLUMN)}
    return _Replay(rows=frame.iloc[:n], max_tokens=max_tokens)


def _lengths(
    config: Length | None,
    name: str,
    replay: _Replay | None,
    n: int,
    streams: RandomStreams,
    base_dir: str | None,
) -> tuple[np.ndarray, int]:
    """Token counts for field ``name`` and the largest value it could take."""
    if config is None:
        # Workload validation guarantees a trace whenever a distribution is omitted.
        assert replay is not None
        column = _TRACE_COLUMNS[name]
        return replay.rows[column].to_numpy(dtype=np.int64), replay.max_tokens[column]
    sampler = make_length_sampler(config, base_dir, field=f"workload.{name}")
    return sampler.sample(streams.generator(name), n), sampler.upper_bound_tokens


def _send_times(
    workload: Workload, n: int, replay: _Replay | None, streams: RandomStreams
) -> tuple[np.ndarray, ClosedLoop | None]:
    arrival = workload.arrival
    if replay is not None:
        assert isinstance(arrival, TraceArrival)
        if arrival.concurrency is not None:
            return np.full(n, np.nan), closed_loop_clients(arrival, n, streams.generator("think_time"))
        trace_s = replay.rows[ARRIVAL_COLUMN].to_numpy(dtype=np.float64)
        return (trace_s - trace_s[0]) * arrival.time_scale, None
    if isinstance(arrival, ClosedLoopArrival):
        return np.full(n, np.nan), closed_loop_clients(arrival, n, streams.generator("think_time"))
    return sample_arrivals(arrival, n, streams.generator("arrivals")), None


def _trace_clients(stream: RequestStream, arrival: TraceArrival, streams: RandomStreams) -> RequestStream:
    """``stream`` replayed by ``arrival.concurrency`` closed-loop clients in its order (unchanged without)."""
    if arrival.concurrency is None:
        return stream
    loop = closed_loop_clients(arrival, len(stream), streams.generator("think_time"))
    return replace(stream, arrival_s=np.full(len(stream), np.nan), closed_loop=loop)
