"""A run as a Chrome trace-event file, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout: one process per policy, one thread (track) per replica holding a complete
slice ("X") per forward pass, with the batch's size, prefill and decode tokens and KV
blocks as arguments; a disaggregated deployment names each replica's pool ("prefill
pool, replica 0", "decode pool, replica 2": the ids of ``iterations.csv``). Each request
is an async slice from arrival to completion (or give-up) with nested phases ``queued``,
``prefill`` (to the first token) and ``decode``; rejected requests are instant events.
A disaggregated request has two more between prefill and decode: ``KV transfer`` (its
``kv_transfer_s``: link queue and transfer) and ``awaiting decode`` (the rest of its
``kv_wait_s``: waiting for room on the decode replica and for its next pass). Under pipeline
parallelism (a ``stage`` column) each stage of each replica is its own track ("replica 0, stage 1"),
a slice per micro-batch it ran (its virtual engine in the arguments), so the gaps between slices are
the pipeline's bubbles. The records
hold both durations but not when the transfer began, so it is drawn right after the first
token, which is when it begins whenever the decode replica has room. Counters per policy
(on thread 0; the format keeps counters per process): requests waiting in the queue and,
on each replica's thread, its KV blocks in use.

Size cap (stated in ``otherData.sampling`` of the file): at most ``max_passes`` pass
slices and counter samples per policy (every k-th pass beyond that, k the smallest
integer that fits) and at most ``max_requests`` request slices per policy (every k-th
request id). Timestamps are microseconds, the format's unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
    prefill_replicas: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The trace-event document of one run (``json.dump`` it to ``trace.json``).

    Args:
        requests: ``RunResult.requests`` (one row per policy and request).
        iterations: ``RunResult.iterations`` (one row per kept forward pass).
        timeout_s: the clients' timeout, where a timed-out request's slice ends
            (None: timed-out requests end at their arrival, as instants).
        max_passes: pass slices kept per policy (every k-th beyond it).
        max_requests: request slices kept per policy (every k-th beyond it).
        prefill_replicas: per disaggregated deployment (by its policy label), its prefill
            replicas P: replicas 0..P-1 form the prefill pool, the rest the decode pool.

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
        split = (prefill_replicas or {}).get(policy)
        stages = _stages(passes)
        events += _metadata(pid, policy, passes, split, stages)
        events += _pass_slices(pid, passes.iloc[::pass_every], stages)
        events += _kv_counters(pid, passes.iloc[::pass_every], split, stages)
        events += _queue_counter(pid, reqs, timeout_s, max_passes)
        events += _request_slices(pid, reqs.iloc[::request_every], timeout_s)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "batchsim", "sampling": sampling},
    }


def _every(rows: int, cap: int) -> int:
    return max(1, math.ceil(rows / cap))


def _stages(passes: pd.DataFrame) -> int:
    """Pipeline stages of a policy's replicas: 1 unless its rows are stage passes (``stage`` column)."""
    if "stage" not in passes.columns or not len(passes):
        return 1
    return int(passes["stage"].max()) + 1


def _tracks(passes: pd.DataFrame, stages: int) -> np.ndarray:
    """Each row's track: its replica, or under pipeline parallelism replica x stages + stage."""
    replicas = passes["replica"].to_numpy().astype(int)
    if stages == 1:
        return replicas
    return replicas * stages + passes["stage"].to_numpy().astype(int)


def _metadata(pid: int, policy: str, passes: pd.DataFrame, split: int | None, stages: int = 1) -> list[Event]:
    process = policy if split is None else f"{policy} (disaggregated: prefill and decode pools)"
    meta: list[Event] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process}}]
    for track in sorted(set(_tracks(passes, stages).tolist())):
        name = {"name": _track_name(track, split, stages)}
        meta.append({"ph": "M", "pid": pid, "tid": track, "name": "thread_name", "args": name})
    return meta


def _track_name(track: int, split: int | None, stages: int) -> str:
    """A track's name: its replica's, and its stage under pipeline parallelism ("replica 0, stage 1")."""
    if stages == 1:
        return _replica_name(track, split)
    return f"{_replica_name(track // stages, split)}, stage {track % stages}"


def _replica_name(replica: int, split: int | None) -> str:
    """A replica's track name: "replica 3", or with a disaggregated deployment's split "decode pool, replica 3"."""
    if split is None:
        return f"replica {replica}"
    return f"{'prefill' if replica < split else 'decode'} pool, replica {replica}"


def _pass_name(prefill_tokens: int, decode_tokens: int) -> str:
    if prefill_tokens and decode_tokens:
        return "prefill+decode"
    return "prefill" if prefill_tokens else "decode"


def _pass_slices(pid: int, passes: pd.DataFrame, stages: int = 1) -> list[Event]:
    columns = ("start_s", "duration_s", "batch_size", "prefill_tokens", "decode_tokens", "kv_blocks_used")
    engines = passes["virtual_engine"].to_numpy() if stages > 1 else np.zeros(len(passes), dtype=int)
    rows = zip(_tracks(passes, stages), *(passes[c].to_numpy() for c in columns), engines, strict=True)
    events = []
    for track, start, dur, batch, pre, dec, kv, engine in rows:
        args = {"batch_size": int(batch), "prefill_tokens": int(pre), "decode_tokens": int(dec),
                "kv_blocks_used": int(kv)}  # fmt: skip
        if stages > 1:
            args["virtual_engine"] = int(engine)
        events.append({
            "ph": "X", "pid": pid, "tid": int(track), "cat": "pass", "name": _pass_name(int(pre), int(dec)),
            "ts": float(start) * _US, "dur": float(dur) * _US, "args": args,
        })  # fmt: skip
    return events


def _kv_counters(pid: int, passes: pd.DataFrame, split: int | None, stages: int = 1) -> list[Event]:
    if stages > 1:  # each virtual engine's own blocks, sampled once per micro-batch: at its first stage
        passes = passes[passes["stage"].to_numpy() == 0]
        owners = [f"{_replica_name(int(r), split)}, virtual engine {int(v)}"
                  for r, v in zip(passes["replica"], passes["virtual_engine"], strict=True)]  # fmt: skip
    else:
        owners = [_replica_name(int(r), split) for r in passes["replica"]]
    tracks = _tracks(passes, stages)
    return [
        {"ph": "C", "pid": pid, "tid": int(r), "name": f"KV blocks used ({owner})", "ts": float(t) * _US,
         "args": {"blocks": int(kv)}}
        for r, owner, t, kv in zip(tracks, owners, passes["start_s"], passes["kv_blocks_used"], strict=True)
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
        {"ph": "C", "pid": pid, "tid": 0, "name": "queue length", "ts": float(t) * _US, "args": {"requests": int(d)}}
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
    rows = zip(*(requests[c] for c in columns), *_handoff_columns(requests), strict=True)
    for rid, status, arrival, scheduled, first, done, transfer, wait in rows:
        base = {"pid": pid, "cat": "request", "id": int(rid)}
        if status == "rejected":
            events.append({**base, "ph": "n", "name": "rejected", "ts": float(arrival) * _US})
            continue
        end = done if status == "completed" else arrival + (timeout_s or 0.0)
        marks = _marks(float(arrival), float(scheduled), float(first), float(transfer), float(wait))
        events.append({**base, "ph": "b", "name": f"request {int(rid)}", "ts": arrival * _US,
                       "args": {"status": str(status)}})  # fmt: skip
        for name, start, stop in _phases(marks, float(end)):
            events.append({**base, "ph": "b", "name": name, "ts": start * _US})
            events.append({**base, "ph": "e", "name": name, "ts": stop * _US})
        events.append({**base, "ph": "e", "name": f"request {int(rid)}", "ts": end * _US})
    return events


def _handoff_columns(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``kv_transfer_s`` and ``kv_wait_s`` of a disaggregated run; NaN (no hand-off) otherwise."""
    if "kv_transfer_s" not in requests.columns:
        missing = np.full(len(requests), np.nan)
        return missing, missing
    return requests["kv_transfer_s"].to_numpy(float), requests["kv_wait_s"].to_numpy(float)


def _marks(arrival: float, scheduled: float, first: float, transfer: float, wait: float) -> list[tuple[str, float]]:
    """Where each phase of a request begins (NaN: never).

    Decode begins at the first token, or once the KV has joined the decode batch
    (``first + kv_wait_s``) after a hand-off; a request abandoned during its transfer
    never decodes.
    """
    handed_off = not math.isnan(transfer)
    decode = first if not handed_off else first + wait  # NaN wait: it never joined
    return [
        ("queued", arrival), ("prefill", scheduled), ("KV transfer", first if handed_off else math.nan),
        ("awaiting decode", first + transfer), ("decode", decode),
    ]  # fmt: skip


def _phases(marks: list[tuple[str, float]], end: float) -> list[tuple[str, float, float]]:
    """(name, start, stop) of each phase that happened, each ending where the next begins
    and clipped to the request's end. A mark before the previous one (the last ulp of
    first + kv_wait_s against first + kv_transfer_s) is moved up to it, so phases never overlap."""
    known: list[tuple[str, float]] = []
    for name, t in marks:
        if not math.isnan(t) and t <= end:
            known.append((name, max(t, known[-1][1]) if known else t))
    bounds = [t for _, t in known[1:]] + [end]
    return [(name, start, stop) for (name, start), stop in zip(known, bounds, strict=True) if stop > start]
