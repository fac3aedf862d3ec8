"""Distance to saturation: the offered load as a fraction of a policy's simulated capacity.

``load_frac`` (``summary.csv``; definition in docs/metrics.md) = offered rate / capacity:

- **capacity** of a policy on a stream: the completion rate it sustains on the stream's own
  request mix *with the queue never empty*, measured by a **capacity replay**: the stream's
  requests in order, repeated cyclically up to max(500, 3 x ``clients``) requests (unless the
  policy caches prefixes and the prompts carry identity: a cache would serve the repeats),
  sent by ``clients`` = 2 x the most sequences the deployment can batch, as a closed loop
  without think time, on the same deployment (front end, replicas, router, KV budget), with
  patient clients (no timeout, no queue limit). While requests remain unsent there are
  ``clients`` in the system, more than the batch holds; the rate is counted over that window,
  after its first quarter (the ramp-up of the first batch). A replay too short for such a
  window (fewer than ``clients`` + 16 requests) is one burst and its capacity is its
  completions over the burst's duration (ramp and drain included: a lower bound).
- **offered rate** of an open-loop stream: (N - 1) / (last send - first send), the mean rate
  of its arrivals (exact for constant arrivals). A stream sent at one instant (a burst) has no
  rate: its offered rate is taken as N / D, its requests over the run's duration D, so a burst
  that keeps the queue full reads about 1 and one the server absorbs at once reads far below.
  Closed loops and multi-turn sessions (sends that wait for answers) offer no fixed load: NaN.

The capacity is measured once per (policy, deployment, request mix) and memoized, so a sweep
over arrival rates pays for it once per process. Deterministic: the replay is a simulation of
fixed requests with the scenario's seed.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.config import DisaggregationConfig
from sim.policy_run import simulate_policy
from sim.workload.stream import ClosedLoop, RequestStream

if TYPE_CHECKING:
    from sim.resolve import ResolvedScenario

MIN_WINDOW_REQUESTS = 16
"""Fewest completions a steady window must count; below, the capacity replay is a burst."""
MIN_REPLAY_REQUESTS = 500
"""The capacity replay sends at least this many requests (or 3 x its clients), repeating a short stream."""
REPLAY_PER_CLIENT = 3
"""Requests per client of the capacity replay: a steady window of (3 - 1) x 3/4 = 1.5 x clients completions.
Within 0.5% of 8 per client on the validation replays; 2 per client was 6% low where the front end ramps up."""
_MEMO_SIZE = 64
_memo: OrderedDict[str, float] = OrderedDict()


def offered_rps(stream: RequestStream) -> float:
    """Mean arrival rate of an open-loop stream; inf when all are sent at one instant; NaN for closed loops.

    Args:
        stream: the requests.

    Returns:
        (N - 1) / (last send - first send) in requests/s, inf for a burst (N >= 1, zero span), NaN
        for a closed loop, multi-turn sessions or an empty stream.
    """
    if stream.closed_loop is not None or stream.sessions is not None or not len(stream):
        return math.nan
    span_s = float(stream.arrival_s[-1] - stream.arrival_s[0])
    return (len(stream) - 1) / span_s if span_s > 0 else math.inf


def steady_throughput_rps(requests: pd.DataFrame, clients: int) -> float:
    """Completion rate of a capacity replay while its queue could not run dry.

    With ``clients`` closed-loop clients over M requests, the last request is sent when the
    (M - clients)-th request ends; until then ``clients`` requests are in the system. The rate is
    counted between the end of the first quarter of that window and the window's end.

    Args:
        requests: the replay's request records (``status``, ``arrival_s``, ``completion_s``).
        clients: the replay's closed-loop clients.

    Returns:
        Completed requests per second in that window; with fewer than ``MIN_WINDOW_REQUESTS`` in
        it, completions over the whole replay (first send to last end). NaN if none completed.
    """
    ends = np.sort(requests["completion_s"].to_numpy(dtype=np.float64))
    completed = (requests["status"] == "completed").to_numpy()
    last = len(ends) - clients - 1  # index of the end that triggers the last send
    first = last // 4
    if last - first >= MIN_WINDOW_REQUESTS and ends[last] > ends[first]:
        done = requests["completion_s"].to_numpy(dtype=np.float64)[completed]
        counted = np.count_nonzero((done > ends[first]) & (done <= ends[last]))
        return counted / (ends[last] - ends[first])
    span_s = float(np.nanmax(ends) - np.nanmin(requests["arrival_s"].to_numpy(dtype=np.float64)))
    return int(completed.sum()) / span_s if completed.any() and span_s > 0 else math.nan


def saturation_clients(resolved: ResolvedScenario, policy: Any) -> int:
    """Closed-loop clients that keep every replica's batch full: 2 x the sequences it can batch."""
    from sim.metrics.estimate import full_batch

    if isinstance(policy, DisaggregationConfig):
        pools = (policy.prefill, policy.decode)
        return 2 * sum(pool.replicas * pool.policy.max_batch_size for pool in pools)
    return 2 * resolved.scenario.replicas * math.ceil(full_batch(resolved, policy))


def caches_prefixes(resolved: ResolvedScenario, policy: Any) -> bool:
    """Whether ``policy`` (any pool of a disaggregated deployment) runs with prefix caching."""
    from sim.resolve import prefix_caching_on

    if isinstance(policy, DisaggregationConfig):
        return any(prefix_caching_on(resolved.scenario, pool.policy) for pool in (policy.prefill, policy.decode))
    return prefix_caching_on(resolved.scenario, policy)


def replay_stream(stream: RequestStream, clients: int, *, cached: bool = False) -> RequestStream:
    """The capacity replay's requests: the stream's own, as ``clients`` closed-loop clients.

    Args:
        stream: the run's requests.
        clients: closed-loop clients of the replay.
        cached: the policy caches prefixes; then a stream with prompt identity is not repeated
            (its repeats would be served from cache), only cut.

    Returns:
        The first ``max(MIN_REPLAY_REQUESTS, REPLAY_PER_CLIENT x clients)`` requests of the stream
        repeated cyclically.
    """
    n = len(stream)
    wanted = max(MIN_REPLAY_REQUESTS, REPLAY_PER_CLIENT * clients)
    repeat = stream.content is None or not cached
    index = np.arange(wanted) % n if repeat else np.arange(min(n, wanted))
    content = stream.content.permuted(index) if stream.content is not None else None
    return RequestStream(
        arrival_s=np.full(len(index), np.nan),
        prompt_tokens=stream.prompt_tokens[index],
        output_tokens=stream.output_tokens[index],
        max_output_tokens=stream.max_output_tokens,
        closed_loop=ClosedLoop(clients=clients, think_time_s=np.zeros(len(index))),
        content=content,
    )


def capacity_rps(resolved: ResolvedScenario, policy: Any) -> float:
    """Simulated capacity (requests/s) of ``policy`` on ``resolved``'s request mix (memoized).

    Args:
        resolved: the resolved scenario (its stream gives the request mix).
        policy: a policy config of the scenario, or its disaggregation block.

    Returns:
        The steady completion rate of the capacity replay; NaN for an empty stream.
    """
    if not len(resolved.stream):
        return math.nan
    clients = saturation_clients(resolved, policy)
    stream = replay_stream(resolved.stream, clients, cached=caches_prefixes(resolved, policy))
    key = _memo_key(resolved, policy, stream)
    if key not in _memo:
        _memo[key] = _measure(resolved, policy, stream)
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    _memo.move_to_end(key)
    return _memo[key]


def load_fraction(resolved: ResolvedScenario, policy: Any, requests: pd.DataFrame) -> float:
    """``load_frac`` of one policy's run: offered rate / capacity (see the module docstring).

    Args:
        resolved: the resolved scenario.
        policy: the policy config (or disaggregation block) that ran.
        requests: that run's request records (``arrival_s``, ``completion_s``), for a burst's duration.

    Returns:
        The fraction; NaN for a closed loop, multi-turn sessions or an empty run.
    """
    offered = offered_rps(resolved.stream)
    if math.isnan(offered):
        return math.nan
    if math.isinf(offered):  # a burst: its requests over the time the policy took to serve them
        span_s = float(np.nanmax(requests["completion_s"]) - np.nanmin(requests["arrival_s"]))
        offered = len(requests) / span_s if span_s > 0 else math.nan
    return offered / capacity_rps(resolved, policy)


def _measure(resolved: ResolvedScenario, policy: Any, stream: RequestStream) -> float:
    refuse = resolved.over_length
    if refuse is not None:
        refuse = refuse[np.arange(len(stream)) % len(resolved.stream)]
    patient = resolved.scenario.model_copy(update={"client": None, "admission": None})
    replay = replace(resolved, scenario=patient, stream=stream, over_length=refuse)
    out = simulate_policy(replay, policy)
    assert stream.closed_loop is not None
    return steady_throughput_rps(out.requests, stream.closed_loop.clients)


def _memo_key(resolved: ResolvedScenario, policy: Any, stream: RequestStream) -> str:
    """What the capacity depends on: the deployment (the scenario less its workload and reporting
    settings), the policy, and the replayed requests."""
    scenario = resolved.scenario.model_dump_json(
        exclude={
            "name",
            "workload",
            "policies",
            "client",
            "admission",
            "metrics",
            "slo",
            "gpu_hour_usd",
            "input_price_ratio",
        }
    )
    digest = hashlib.sha256()
    for part in (scenario, policy.model_dump_json(), str(stream.closed_loop.clients if stream.closed_loop else 0)):
        digest.update(part.encode())
    for array in (stream.prompt_tokens, stream.output_tokens, resolved.over_length):
        digest.update(b"|" if array is None else np.ascontiguousarray(array).tobytes())
    if stream.content is not None:
        digest.update(np.ascontiguousarray(stream.content.ids).tobytes())
        digest.update(np.ascontiguousarray(stream.content.starts).tobytes())
    return digest.hexdigest()
