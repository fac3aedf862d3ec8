"""A run as a Chrome trace-event file, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout: one process per policy, one thread (track) per replica holding a complete
slice ("X") per forward pass, with the batch's size, prefill and decode tokens and KV
blocks as arguments. Each request is an async slice from arrival to completion (or
give-up) with nested phases ``queued``, ``prefill`` (to the first token) and ``decode``;
rejected requests are instant events. Counters per policy: requests waiting in the
queue and, per replica, KV blocks in use.

Size cap (stated in ``otherData.sampling`` of the file): at most ``max_passes`` pass
slices and counter samples per policy (every k-th pass beyond that, k the smallest
integer that fits) and at most ``max_requests`` request slices per policy (every k-th
request id). Timestamps are microseconds, the format's unit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

MAX_PASSES = 200_000
MAX_REQUESTS = 20_000
_US = 1e6

Event = dict[str, Any]


def trace_events(
    requests: pd.DataFrame,
    iterations: pd.DataFrame,
    *,
    timeout_s: float | None = None,
    max_passes: int = MAX_PASSES,
    max_requests: int = MAX_REQUESTS,
) -> dict[str, Any]:
    """The trace-event document of one run (``json.dump`` it to ``trace.json``).

    Args:
        requests: ``RunResult.requests`` (one row per policy and request).
        iterations: ``RunResult.iterations`` (one row per kept forward pass).
        timeout_s: the clients' timeout, where a timed-out request's slice ends
            (None: timed-out requests end at their arrival, as instants).
        max_passes: pass slices kept per policy (every k-th beyond it).
        max_requests: request slices kept per policy (every k-th beyond it).

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    events: list[Event] = []
    sampling: dict[str, dict[str, int]] = {}
    policies = list(dict.fromkeys(iterations["policy"].astype(str)).keys())
    policies += [p for p in dict.fromkeys(requests["policy"].astype(str)) if p not in policies]
    for pid, policy in enumerate(policies, start=1):
        passes = iterations[iterations["policy"].astype(str) == policy]
        reqs = requests[requests["policy"].astype(str) == policy]
        pass_every, request_every = _every(len(passes), max_passes), _every(len(reqs), max_requests)
        sampling[policy] = {"passes_every": pass_every, "requests_every": request_every}
        events += _metadata(pid, policy, passes)
        events += _pass_slices(pid, passes.iloc[::pass_every])
        events += _kv_counters(pid, passes.iloc[::pass_every])
        events += _queue_counter(pid, reqs, timeout_s, max_passes)
        events += _request_slices(pid, reqs.iloc[::request_every], timeout_s)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "batchsim", "sampling": sampling},
    }


def _every(rows: int, cap: int) -> int:
    return max(1, math.ceil(rows / cap))


def _metadata(pid: int, policy: str, passes: pd.DataFrame) -> list[Event]:
    meta: list[Event] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": policy}}]
    for replica in sorted(set(passes["replica"].astype(int))):
        name = {"name": f"replica {replica}"}
        meta.append({"ph": "M", "pid": pid, "tid": replica, "name": "thread_name", "args": name})
    return meta


def _pass_name(prefill_tokens: int, decode_tokens: int) -> str:
    if prefill_tokens and decode_tokens:
        return "prefill+decode"
    return "prefill" if prefill_tokens else "decode"


def _pass_slices(pid: int, passes: pd.DataFrame) -> list[Event]:
    columns = ("replica", "start_s", "duration_s", "batch_size", "prefill_tokens", "decode_tokens", "kv_blocks_used")
    rows = zip(*(passes[c].to_numpy() for c in columns), strict=True)
    return [
        {
            "ph": "X", "pid": pid, "tid": int(replica), "cat": "pass", "name": _pass_name(int(pre), int(dec)),
            "ts": float(start) * _US, "dur": float(dur) * _US,
            "args": {"batch_size": int(batch), "prefill_tokens": int(pre), "decode_tokens": int(dec),
                     "kv_blocks_used": int(kv)},
        }
        for replica, start, dur, batch, pre, dec, kv in rows
    ]  # fmt: skip


def _kv_counters(pid: int, passes: pd.DataFrame) -> list[Event]:
    return [
        {"ph": "C", "pid": pid, "name": f"KV blocks used (replica {int(r)})", "ts": float(t) * _US,
         "args": {"blocks": int(kv)}}
        for r, t, kv in zip(passes["replica"], passes["start_s"], passes["kv_blocks_used"], strict=True)
    ]  # fmt: skip


def _queue_counter(pid: int, requests: pd.DataFrame, timeout_s: float | None, cap: int) -> list[Event]:
    """Requests sent and not yet in a first batch (a preempted request's second wait is not
    counted), sampled at every change up to ``cap`` samples."""
    arrive = requests["arrival_s"].to_numpy(float)
    leave = requests["first_scheduled_s"].to_numpy(float)
    leave = np.where(np.isnan(leave), _give_up_s(requests, timeout_s), leave)
    times = np.concatenate([arrive, leave[~np.isnan(leave)]])
    steps = np.concatenate([np.ones(len(arrive)), -np.ones(int((~np.isnan(leave)).sum()))])
    order = np.lexsort((-steps, times))  # at equal times arrive first: a request never leaves before it came
    times, depth = times[order], np.cumsum(steps[order])
    keep = slice(None, None, _every(len(times), cap))
    return [
        {"ph": "C", "pid": pid, "name": "queue length", "ts": float(t) * _US, "args": {"requests": int(d)}}
        for t, d in zip(times[keep], depth[keep], strict=True)
    ]


def _give_up_s(requests: pd.DataFrame, timeout_s: float | None) -> np.ndarray:
    """When a never-scheduled request left the queue: rejected at arrival, timed out at
    arrival + timeout; NaN for one still waiting at the end."""
    status = requests["status"].astype(str).to_numpy()
    arrival = requests["arrival_s"].to_numpy(float)
    left = np.where(status == "timed_out", arrival + (timeout_s or 0.0), np.nan)
    return np.where(status == "rejected", arrival, left)


def _request_slices(pid: int, requests: pd.DataFrame, timeout_s: float | None) -> list[Event]:
    events: list[Event] = []
    columns = ("request_id", "status", "arrival_s", "first_scheduled_s", "first_token_s", "completion_s")
    for rid, status, arrival, scheduled, first, done in zip(*(requests[c] for c in columns), strict=True):
        base = {"pid": pid, "cat": "request", "id": int(rid)}
        if status == "rejected":
            events.append({**base, "ph": "n", "name": "rejected", "ts": float(arrival) * _US})
            continue
        end = done if status == "completed" else arrival + (timeout_s or 0.0)
        phases = _phases(float(arrival), float(scheduled), float(first), float(end))
        events.append({**base, "ph": "b", "name": f"request {int(rid)}", "ts": arrival * _US,
                       "args": {"status": str(status)}})  # fmt: skip
        for name, start, stop in phases:
            events.append({**base, "ph": "b", "name": name, "ts": start * _US})
            events.append({**base, "ph": "e", "name": name, "ts": stop * _US})
        events.append({**base, "ph": "e", "name": f"request {int(rid)}", "ts": end * _US})
    return events


def _phases(arrival: float, scheduled: float, first: float, end: float) -> list[tuple[str, float, float]]:
    """(name, start, stop) of queued / prefill / decode, each clipped to the request's end."""
    marks = [("queued", arrival), ("prefill", scheduled), ("decode", first)]
    known = [(name, t) for name, t in marks if not math.isnan(t) and t <= end]
    bounds = [t for _, t in known[1:]] + [end]
    return [(name, start, stop) for (name, start), stop in zip(known, bounds, strict=True) if stop > start]
