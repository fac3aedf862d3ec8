"""The client-side advice experiments (sim.studies.client_advice) and the schema they added:
send order by prompt length, fixed vs exponential retry backoff, closed-loop concurrency,
max_tokens under KV reservation vs paged memory, the verdict table and its files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fakes import LinearCost, make_stream, setup

from sim.config import AdmissionConfig, ClientConfig, ContinuousPolicyConfig, Workload
from sim.serving.clients import retry_delay_s
from sim.serving.engine import simulate
from sim.studies import client_advice as ca
from sim.workload import build_request_stream
from sim.workload.order import send_permutation

ORDERS = ("arrival", "prompt_ascending", "prompt_descending")


def _run(scenario):
    from sim.runner import run

    return run(scenario)


# --------------------------------------------------------------------------- send order
@pytest.mark.parametrize(
    "arrival", [{"kind": "poisson", "rate": 5.0}, {"kind": "burst"}, {"kind": "closed_loop", "clients": 4}]
)
def test_order_permutes_the_same_requests_over_the_same_send_times(arrival: dict) -> None:
    base = {"requests": 300, "arrival": arrival, "prompt_tokens": ca.CHAT_PROMPT, "output_tokens": ca.CHAT_OUTPUT}
    drawn = build_request_stream(Workload.model_validate(base), 5)
    pairs = sorted(zip(drawn.prompt_tokens.tolist(), drawn.output_tokens.tolist(), strict=True))
    for order in ORDERS:
        stream = build_request_stream(Workload.model_validate(base | {"order": order}), 5)
        np.testing.assert_array_equal(stream.arrival_s, drawn.arrival_s)
        assert sorted(zip(stream.prompt_tokens.tolist(), stream.output_tokens.tolist(), strict=True)) == pairs
        steps = np.diff(stream.prompt_tokens)
        if order == "arrival":
            np.testing.assert_array_equal(stream.prompt_tokens, drawn.prompt_tokens)
        else:
            assert np.all(steps >= 0) if order == "prompt_ascending" else np.all(steps <= 0)
    assert np.any(np.diff(drawn.prompt_tokens) < 0)  # the drawn order is not already sorted


def test_sort_is_stable_for_equal_prompts() -> None:
    prompts = np.array([5, 3, 5, 3, 1])
    assert send_permutation("prompt_ascending", prompts).tolist() == [4, 1, 3, 0, 2]
    assert send_permutation("prompt_descending", prompts).tolist() == [0, 2, 1, 3, 4]


def _burst(order: str, requests: int, batch: int):
    scenario = ca.chat_scenario("sort", {"kind": "burst"}, requests, policies=["static", "continuous"],
                                workload={"order": order})  # fmt: skip
    return _run(scenario.replace(**{"policies[static].max_batch_size": batch,
                                    "policies[continuous].max_batch_size": batch}))  # fmt: skip


def test_sorting_changes_nothing_under_continuous_when_every_request_fits_one_batch() -> None:
    # All 48 requests are admitted in the first pass (batch cap 64, KV ample): the same set
    # runs together whatever the order, so each request's latency is a function of its lengths.
    results = {order: _burst(order, 48, 64) for order in ORDERS}
    signatures = []
    for result in results.values():
        req = result.requests[result.requests["policy"] == "continuous"]
        signatures.append(sorted(zip(req["prompt_tokens"], req["output_tokens"], req["e2e_s"].round(9), strict=True)))
    assert signatures[0] == signatures[1] == signatures[2]
    durations = [r.summary.set_index("policy").loc["continuous", "duration_s"] for r in results.values()]
    assert durations[0] == pytest.approx(durations[1]) == pytest.approx(durations[2])


def test_sorting_repacks_but_never_changes_continuous_work_when_batches_are_smaller() -> None:
    # With a cap below the job size the order decides who shares a pass (latencies move), but
    # continuous batching computes exactly the same prefill and decode tokens in any order.
    totals, e2e = [], []
    for order in ORDERS:
        result = _burst(order, 96, 8)
        its = result.iterations[result.iterations["policy"] == "continuous"]
        totals.append((int(its["prefill_tokens"].sum()), int(its["decode_tokens"].sum())))
        e2e.append(result.summary.set_index("policy").loc["continuous", "e2e_mean_s"])
    assert totals[0] == totals[1] == totals[2]
    assert len(set(np.round(e2e, 9))) > 1  # ... and the explanation is needed: the packing does change


def test_sorting_reduces_static_prompt_padding() -> None:
    table = ca.prompt_sorting(requests=96, max_batch_size=8).set_index(["policy", "order"])
    static = table.loc["static"]
    assert static.loc["prompt_ascending", "prompt_pad_tokens"] < static.loc["arrival", "prompt_pad_tokens"]
    assert static.loc["prompt_descending", "prompt_pad_tokens"] < static.loc["arrival", "prompt_pad_tokens"]
    assert table.loc["continuous", "prompt_pad_tokens"].isna().all()


def test_batch_padding_groups_requests_by_their_prefill_pass() -> None:
    frame = pd.DataFrame({"first_scheduled_s": [0.0, 0.0, 1.0, 1.0, 1.0], "prompt_tokens": [10, 4, 7, 7, 1],
                          "output_tokens": [3, 5, 2, 9, 9]})  # fmt: skip
    assert ca.batch_padding(frame) == {"prompt_pad_tokens": 6 + 6, "idle_slot_iterations": 2 + 7}


# --------------------------------------------------------------------------- retry backoff
@pytest.mark.parametrize("backoff", ["fixed", "exponential"])
def test_resends_of_a_rejected_request_follow_the_backoff_rule(backoff: str) -> None:
    # Request 0 runs for ~10 s (batch of one), request 1 fills the queue (max_queue 1), so
    # request 2 is rejected on every send; with k retries allowed it is finally rejected at
    # its k-th re-send, so consecutive final times give each gap between re-sends.
    stream = make_stream([0.0, 0.05, 0.1], 10, [1000, 5, 5])
    policy = ContinuousPolicyConfig(name="c", max_batch_size=1)
    ends = []
    for retries in range(5):
        client = ClientConfig(timeout_s=100.0, max_retries=retries, backoff_s=0.5, backoff=backoff)
        req = simulate(
            stream, policy,
            setup(
                LinearCost(0.01), kv_blocks=500, block_size=16, client=client,
                admission=AdmissionConfig(max_queue=1),
            ),
        ).requests
        assert req["status"][2] == "rejected" and req["retries"][2] == retries
        ends.append(req["completion_s"][2])
    assert ends[0] == pytest.approx(0.1)
    expected = [0.5] * 4 if backoff == "fixed" else [0.5, 1.0, 2.0, 4.0]
    assert np.diff(ends) == pytest.approx(expected)


def test_retry_delay_rule_and_default() -> None:
    assert [retry_delay_s("fixed", 8.0, k) for k in range(4)] == [8.0] * 4
    assert [retry_delay_s("exponential", 8.0, k) for k in range(4)] == [8.0, 16.0, 32.0, 64.0]
    assert ClientConfig(timeout_s=1.0).backoff == "exponential"


# --------------------------------------------------------------------------- concurrency
@pytest.fixture(scope="module")
def sweep() -> pd.DataFrame:
    return ca.concurrency_sweep(clients=(1, 2, 4, 8, 16, 32), requests_per_client=3)


def test_closed_loop_never_has_more_than_n_requests_in_flight(sweep: pd.DataFrame) -> None:
    assert (sweep["max_in_flight"] <= sweep["clients"]).all()
    assert (sweep["max_in_flight"] == sweep["clients"]).all()  # and the semaphore is actually filled


def test_throughput_does_not_fall_with_more_clients_up_to_the_knee(sweep: pd.DataFrame) -> None:
    knees = ca.knees(sweep)
    assert set(knees) == set(ca.POLICY_NAMES) and sweep["knee"].sum() == len(knees)
    for policy, group in sweep.groupby("policy"):
        before = group[group["clients"] <= knees[str(policy)]].sort_values("clients")
        assert len(before) >= 2
        assert np.all(np.diff(before["throughput_rps"]) >= 0), before


def test_max_in_flight_frees_a_slot_before_the_next_send() -> None:
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0, 0.0, 0.5], "completion_s": [1.0, 2.0, 0.5, 3.0]})
    assert ca.max_in_flight(frame) == 2


# --------------------------------------------------------------------------- max_tokens
def _closed_loop(limit: int, policies: list[str], **fields) -> pd.DataFrame:
    scenario = ca.chat_scenario("max-tokens", {"kind": "closed_loop", "clients": 64}, 192, policies=policies,
                                workload={"max_output_tokens": limit}, **fields)  # fmt: skip
    return _run(scenario)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_larger_max_tokens_never_runs_more_sequences_under_reservation(policy: str) -> None:
    kv_blocks, block = 2000, 16
    peaks, bounds = {}, {}
    for limit in (512, 4096):
        result = _closed_loop(limit, [policy], memory={"kv_blocks": kv_blocks, "block_size": block})
        peaks[limit] = int(result.iterations["batch_size"].max())
        prompts = result.requests["prompt_tokens"].to_numpy()
        # KV arithmetic: each running sequence holds ceil((prompt + max_tokens) / block) blocks.
        bounds[limit] = kv_blocks // int(np.min(-(-(prompts + limit) // block)))
        assert peaks[limit] <= bounds[limit]
    assert peaks[4096] <= peaks[512]
    assert bounds[4096] < peaks[512]  # the bound binds: max_tokens 4096 does cost concurrency here


def test_max_tokens_changes_nothing_under_paged_memory_when_kv_is_ample() -> None:
    small, large = (_closed_loop(limit, ["vllm-v0"]).summary for limit in (512, 4096))
    assert small["kv_peak_frac"].iloc[0] < 0.5 and small["preemptions"].iloc[0] == 0
    columns = [c for c in small.columns if c != "scenario"]
    pd.testing.assert_frame_equal(small[columns], large[columns])


# --------------------------------------------------------------------------- verdicts and files
def _sorting_table(sorted_pad: float) -> pd.DataFrame:
    rows = []
    for order, pad in (("arrival", 100.0), ("prompt_ascending", sorted_pad)):
        rows += [{"policy": "static", "order": order, "duration_s": 10.0, "throughput_rps": 1.0, "e2e_mean_s": 5.0,
                  "prompt_pad_tokens": pad, "idle_slot_iterations": 50.0},
                 {"policy": "continuous", "order": order, "duration_s": 8.0, "throughput_rps": 1.2, "e2e_mean_s": 4.0,
                  "prompt_pad_tokens": math.nan, "idle_slot_iterations": math.nan}]  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("sorted_pad", "supported", "change"), [(40.0, True, "-60%"), (130.0, False, "+30%")])
def test_verdict_follows_the_numbers(sorted_pad: float, supported: bool, change: str) -> None:
    row = ca.verdict_sorting(_sorting_table(sorted_pad))
    assert row["supported"] is supported and f"prompt padding {change}" in row["verdict"]
    assert row["advised_value"] == sorted_pad


def test_write_client_advice_writes_one_verdict_row_per_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sweep: pd.DataFrame
) -> None:
    cap = float(sweep["throughput_rps"].max())
    small = {
        "a": sweep, "b": ca.retry_backoff(cap, peak_s=10.0), "c": ca.timeouts(clients=16, requests=48),
        "d": ca.streaming_latency(cap, requests=100), "e": ca.prompt_sorting(requests=64, max_batch_size=8),
        "f": ca.max_tokens_reservation(clients=64, requests=128),
    }  # fmt: skip
    monkeypatch.setattr(ca, "run_all", lambda: small)
    advice = ca.write_client_advice(tmp_path)
    assert list(advice.columns) == list(ca.ADVICE_COLUMNS) and len(advice) == len(small)
    written = pd.read_csv(tmp_path / "client_advice.csv")
    assert written["verdict"].tolist() == advice["verdict"].tolist()
    text = (tmp_path / "client_advice.md").read_text()
    assert all(verdict in text for verdict in advice["verdict"]) and text.count("## ") == len(small)
