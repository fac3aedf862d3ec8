"""The Chrome/Perfetto trace of a run agrees with the run's own records."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from sim import run
from sim.io.scenario import load_scenario
from sim.report.trace_events import trace_events

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def overload():
    """A short overload run: queueing, timeouts and three policies."""
    scenario = load_scenario(REPO / "scenarios" / "overload.yaml", {"workload.requests": 120})
    return run(scenario)


def _by_policy(document: dict) -> dict[int, list[dict]]:
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e.get("name") == "process_name"}
    grouped: dict[str, list[dict]] = defaultdict(list)
    for event in document["traceEvents"]:
        grouped[names[event["pid"]]].append(event)
    return grouped


def test_pass_slices_are_the_iteration_rows(overload) -> None:
    grouped = _by_policy(trace_events(overload.requests, overload.iterations, timeout_s=60.0))
    for policy, rows in overload.iterations.groupby("policy", observed=True):
        slices = [e for e in grouped[str(policy)] if e["ph"] == "X"]
        assert len(slices) == len(rows) > 0
        np.testing.assert_allclose([e["dur"] for e in slices], rows["duration_s"].to_numpy() * 1e6, rtol=1e-12)
        assert [e["args"]["batch_size"] for e in slices] == rows["batch_size"].tolist()


def test_passes_on_one_replica_never_overlap(overload) -> None:
    document = trace_events(overload.requests, overload.iterations)
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for event in document["traceEvents"]:
        if event["ph"] == "X":
            tracks[(event["pid"], event["tid"])].append(event)
    for slices in tracks.values():
        ends = np.array([e["ts"] + e["dur"] for e in slices[:-1]])
        starts = np.array([e["ts"] for e in slices[1:]])
        assert np.all(starts >= ends - 1e-3)  # 1 ns of float slack


def test_request_slices_span_arrival_to_completion_or_give_up(overload) -> None:
    grouped = _by_policy(trace_events(overload.requests, overload.iterations, timeout_s=60.0))
    for policy, reqs in overload.requests.groupby("policy", observed=True):
        spans = {}
        for event in grouped[str(policy)]:
            if event.get("cat") == "request" and event["name"].startswith("request "):
                spans.setdefault(event["id"], {})[event["ph"]] = event["ts"]
        for row in reqs.itertuples():
            if row.status == "rejected":
                continue
            span = spans[row.request_id]
            length_s = (span["e"] - span["b"]) / 1e6
            expected = row.e2e_s if row.status == "completed" else 60.0
            assert math.isclose(length_s, expected, rel_tol=1e-9, abs_tol=1e-9)
    assert (overload.requests["status"] == "timed_out").any()  # the give-up branch was exercised


def test_async_phases_are_balanced_and_nested_in_time(overload) -> None:
    document = trace_events(overload.requests, overload.iterations, timeout_s=60.0)
    opened: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
    for event in (e for e in document["traceEvents"] if e["ph"] in "be"):
        key = (event["pid"], event["id"])
        if event["ph"] == "b":
            opened[key].append((event["name"], event["ts"]))
        else:
            name, start = opened[key].pop()
            assert name == event["name"] and event["ts"] >= start
    assert all(not stack for stack in opened.values())


def test_queue_counter_is_never_negative_and_drains(overload) -> None:
    grouped = _by_policy(trace_events(overload.requests, overload.iterations, timeout_s=60.0))
    peaks = {}
    for policy, events in grouped.items():
        depth = [e["args"]["requests"] for e in events if e.get("name") == "queue length"]
        assert min(depth) >= 0 and depth[-1] == 0
        peaks[policy] = max(depth)
    assert peaks["static"] > peaks["continuous-32"]  # the overloaded policy's queue builds up


def test_size_cap_keeps_every_kth_pass_and_says_so(overload) -> None:
    document = trace_events(overload.requests, overload.iterations, max_passes=10, max_requests=7)
    grouped = _by_policy(document)
    for policy, rows in overload.iterations.groupby("policy", observed=True):
        every = math.ceil(len(rows) / 10)
        slices = [e for e in grouped[str(policy)] if e["ph"] == "X"]
        assert len(slices) == len(rows.iloc[::every]) <= 10
        assert document["otherData"]["sampling"][str(policy)]["passes_every"] == every
        requests = {e["id"] for e in grouped[str(policy)] if e.get("cat") == "request"}
        assert len(requests) <= 7


def test_cli_writes_a_loadable_trace(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sim", "run", "scenarios/quickstart.yaml", "--set", "workload.requests=30",
           "--trace-events", "--no-plots", "--quiet", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True)
    document = json.loads((out / "trace.json").read_text())
    iterations = (out / "iterations.csv").read_text().count("\n") - 1
    assert sum(e["ph"] == "X" for e in document["traceEvents"]) == iterations


def test_trace_with_summary_only_is_one_clear_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "sim", "run", "--trace-events", "--summary-only", "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--summary-only" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def disaggregated(tmp_path_factory):
    """A short disaggregated run (2 prefill + 2 decode replicas) beside two colocated policies,
    saved with its trace as ``run --trace-events`` saves it."""
    overrides = {"workload.requests": 60, "metrics.warmup_s": 0}
    result = run(load_scenario(REPO / "scenarios" / "disaggregation" / "gpus4.yaml", overrides))
    out = tmp_path_factory.mktemp("disagg") / "run"
    result.save(out, plots=False, trace_events=True)
    return result, json.loads((out / "trace.json").read_text())


def _process_ids(document: dict) -> dict[str, int]:
    return {e["args"]["name"]: e["pid"] for e in document["traceEvents"] if e.get("name") == "process_name"}


def test_every_counter_sits_on_a_process_and_thread(overload, disaggregated) -> None:
    for document in (trace_events(overload.requests, overload.iterations, timeout_s=60.0), disaggregated[1]):
        counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
        assert counters and all(isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int) for e in counters)
    # A replica's KV counter sits on that replica's thread.
    for event in (e for e in disaggregated[1]["traceEvents"] if e["ph"] == "C" and e["name"].startswith("KV")):
        assert event["name"].endswith(f"replica {event['tid']})")


def test_disaggregated_tracks_name_their_pool(disaggregated) -> None:
    result, document = disaggregated
    block = result.scenario.disaggregation
    pid = next(p for name, p in _process_ids(document).items() if name.startswith(block.name))
    threads = {e["tid"]: e["args"]["name"] for e in document["traceEvents"]
               if e.get("name") == "thread_name" and e["pid"] == pid}  # fmt: skip
    total = block.prefill.replicas + block.decode.replicas
    assert sorted(threads) == list(range(total))
    assert [threads[t].split(" pool")[0] for t in range(total)] == (
        ["prefill"] * block.prefill.replicas + ["decode"] * block.decode.replicas
    )
    # The names agree with the work: prefill tracks never decode, decode tracks never prefill here.
    for event in (e for e in document["traceEvents"] if e["ph"] == "X" and e["pid"] == pid):
        pool = threads[event["tid"]].split(" pool")[0]
        assert event["args"]["decode_tokens" if pool == "prefill" else "prefill_tokens"] == 0, event
    colocated = [name for name in _process_ids(document) if not name.startswith(block.name)]
    assert colocated and all("pool" not in name for name in colocated)


def _spans(events: list[dict], pid: int, name: str) -> dict[int, tuple[float, float]]:
    begins = {e["id"]: e["ts"] for e in events if e["pid"] == pid and e["ph"] == "b" and e["name"] == name}
    ends = {e["id"]: e["ts"] for e in events if e["pid"] == pid and e["ph"] == "e" and e["name"] == name}
    assert begins.keys() == ends.keys()
    return {rid: (begins[rid] / 1e6, ends[rid] / 1e6) for rid in begins}


def test_kv_transfer_is_its_own_phase_of_the_recorded_length(disaggregated) -> None:
    result, document = disaggregated
    name = result.scenario.disaggregation.name
    events, pids = document["traceEvents"], _process_ids(document)
    pid = next(p for label, p in pids.items() if label.startswith(name))
    transfers, decodes = _spans(events, pid, "KV transfer"), _spans(events, pid, "decode")
    requests = result.requests[result.requests["policy"] == name]
    handed_off = requests[requests["kv_transfer_s"].notna() & (requests["status"] == "completed")]
    assert len(handed_off) > 0 and set(handed_off["request_id"]) <= set(transfers)
    for row in handed_off.itertuples():
        start, stop = transfers[row.request_id]
        assert math.isclose(stop - start, row.kv_transfer_s, rel_tol=1e-6, abs_tol=1e-9)
        assert math.isclose(start, row.first_token_s, rel_tol=1e-12)  # after the prefill, not inside it
        decode_start = decodes[row.request_id][0] if row.request_id in decodes else row.completion_s
        assert stop <= decode_start + 1e-9  # decoding begins once the KV has arrived
        if row.request_id in decodes:
            assert math.isclose(decode_start, row.first_token_s + row.kv_wait_s, rel_tol=1e-12)
    for label, other in pids.items():  # colocated policies hand nothing off
        if not label.startswith(name):
            assert not _spans(events, other, "KV transfer")
