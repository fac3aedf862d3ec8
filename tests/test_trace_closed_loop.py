"""Closed-loop replay of a recorded request list (``arrival: {kind: trace, concurrency: C}``).

GuideLLM's synchronous mode (C = 1) and its concurrent mode (C clients) send the requests of a
list in order, each client its next one as soon as its request ends. The properties: the rows
are sent in trace order with their own lengths, never more than C are in flight, the first
min(C, N) go at t = 0 and every later send happens exactly when an earlier request ends.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import Scenario
from sim.errors import UserError
from sim.resolve import resolve
from sim.runner import run


def _scenario(trace: Path, arrival: dict, policy: dict | None = None) -> Scenario:
    return Scenario(
        name="closed-trace", seed=1, model="llama-2-7b", gpu="a100-80gb",
        workload={"arrival": {"kind": "trace", "path": str(trace), **arrival}},
        policies=[policy or {"name": "p", "kind": "paged", "max_batch_size": 4}],
    )  # fmt: skip


def _write_trace(folder: Path, prompts: list[int], outputs: list[int], *, arrivals: bool) -> Path:
    frame = pd.DataFrame({"num_prefill_tokens": prompts, "num_decode_tokens": outputs})
    if arrivals:  # times the closed loop must ignore
        frame.insert(0, "arrived_at", np.arange(len(prompts)) * 100.0)
    path = folder / "trace.csv"
    frame.to_csv(path, index=False)
    return path


def in_flight_peak(sent_s: np.ndarray, ended_s: np.ndarray) -> int:
    """Most requests sent and not yet ended at any instant (an end before a send at the same instant)."""
    events = sorted([(t, 1) for t in sent_s] + [(t, -1) for t in ended_s])  # -1 sorts first at a tie
    return int(np.max(np.cumsum([step for _, step in events])))


requests = st.lists(st.tuples(st.integers(1, 600), st.integers(1, 60)), min_size=1, max_size=40)


@settings(max_examples=40)
@given(rows=requests, clients=st.integers(1, 12), arrivals=st.booleans())
def test_trace_rows_are_sent_in_order_by_at_most_c_clients(rows, clients: int, arrivals: bool) -> None:
    prompts, outputs = [p for p, _ in rows], [o for _, o in rows]
    with tempfile.TemporaryDirectory() as folder:
        trace = _write_trace(Path(folder), prompts, outputs, arrivals=arrivals)
        scenario = _scenario(trace, {"concurrency": clients})
        stream = resolve(scenario).stream
        result = run(scenario)
    assert np.array_equal(stream.prompt_tokens, prompts) and np.array_equal(stream.output_tokens, outputs)
    req = result.requests.sort_values("request_id")
    sent_s, ended_s = req["arrival_s"].to_numpy(), req["completion_s"].to_numpy()
    assert (req["status"] == "completed").all()
    assert np.all(np.diff(sent_s) >= 0)  # trace order: request i is never sent after request i + 1
    first = min(clients, len(rows))
    assert np.all(sent_s[:first] == 0.0)
    # Zero think time: request C + k goes out exactly when the (k+1)-th request ends.
    assert np.array_equal(sent_s[first:], np.sort(ended_s)[: len(rows) - first])
    assert in_flight_peak(sent_s, ended_s) == first


def test_synchronous_mode_sends_each_request_when_the_previous_one_ends(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path, [100, 200, 300], [5, 6, 7], arrivals=True)
    req = run(_scenario(trace, {"concurrency": 1})).requests.sort_values("request_id")
    assert req["arrival_s"].iloc[0] == 0.0
    assert np.array_equal(req["arrival_s"].to_numpy()[1:], req["completion_s"].to_numpy()[:-1])


def test_think_time_delays_each_next_send(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path, [100] * 30, [5] * 30, arrivals=False)
    req = run(_scenario(trace, {"concurrency": 1, "think_time_s": 2.0})).requests.sort_values("request_id")
    gaps = req["arrival_s"].to_numpy()[1:] - req["completion_s"].to_numpy()[:-1]
    assert np.all(gaps > 0) and 0.5 < gaps.mean() < 4.0  # exponential think times of mean 2 s


def test_lengths_only_trace_needs_concurrency(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path, [100, 200], [5, 6], arrivals=False)
    with pytest.raises(UserError, match="concurrency"):
        resolve(_scenario(trace, {}))


def test_think_time_without_concurrency_is_refused(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path, [100], [5], arrivals=True)
    with pytest.raises(UserError, match="think_time_s needs concurrency"):
        _scenario(trace, {"think_time_s": 1.0})
