"""The API front end: requests reach the engine after parse and tokenize turns on a few
event loops; checked on event times, not snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import LinearCost, make_stream, setup
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import ClientConfig, ContinuousPolicyConfig, FrontendConfig
from sim.serving.engine import simulate

CONTINUOUS = ContinuousPolicyConfig(name="c", max_batch_size=64)
KV = dict(kv_blocks=10_000, block_size=16)


def _handoff_s(requests) -> np.ndarray:
    """When the front end handed each request to the engine."""
    return (requests["arrival_s"] + requests["frontend_s"]).to_numpy()


def test_fifo_front_end_with_one_worker_admits_requests_exactly_one_cost_apart() -> None:
    prompts = np.array([10, 200, 30, 4000, 1, 57])
    stream = make_stream(np.zeros(len(prompts)), prompts, 5)
    fe = FrontendConfig(per_request_ms=3.0, per_prompt_token_us=0.5, workers=1, startup_ms=40, discipline="fifo")
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    cost_s = 3.0e-3 + 0.5e-6 * prompts
    assert np.allclose(_handoff_s(req), 0.040 + np.cumsum(cost_s), rtol=0, atol=1e-12)


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_w_workers_admit_w_times_faster(workers: int) -> None:
    n = 30
    stream = make_stream(np.zeros(n), 100, 5)
    fe = FrontendConfig(per_request_ms=2.0, per_prompt_token_us=10.0, workers=workers, startup_ms=0,
                        discipline="fifo")
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    cost_s = 2.0e-3 + 10e-6 * 100
    expected = (np.arange(n) // workers + 1) * cost_s
    assert np.allclose(np.sort(_handoff_s(req)), expected, rtol=0, atol=1e-12)
    # The last hand-off of the burst comes W times sooner than with one worker.
    assert np.isclose(_handoff_s(req).max(), np.ceil(n / workers) * cost_s)


def test_event_loop_parses_the_whole_burst_before_tokenizing_any() -> None:
    prompts = np.array([10, 20, 30, 40])
    stream = make_stream(np.zeros(4), prompts, 5)
    fe = FrontendConfig(per_request_ms=2.0, per_prompt_token_us=100.0, workers=1, startup_ms=0)
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    parse_all_s = 4 * 2.0e-3
    assert np.allclose(_handoff_s(req), parse_all_s + np.cumsum(100e-6 * prompts), rtol=0, atol=1e-12)


def test_spaced_arrivals_see_no_queueing_and_pay_both_turns() -> None:
    stream = make_stream(np.arange(5) * 1.0, 50, 5)
    fe = FrontendConfig(per_request_ms=2.0, per_prompt_token_us=20.0, workers=1, startup_ms=100)
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    own_s = 2.0e-3 + 20e-6 * 50
    assert np.isclose(req["frontend_s"][0], 0.100 + own_s)  # the cold start is paid once
    assert np.allclose(req["frontend_s"][1:], own_s)


def test_latencies_count_from_the_clients_send() -> None:
    stream = make_stream(np.zeros(8), 64, 6)
    fe = FrontendConfig(per_request_ms=5.0, startup_ms=0)
    with_fe = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    without = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), **KV)).requests
    assert np.all(with_fe["arrival_s"] == 0.0)
    assert np.all(with_fe["ttft_s"] >= with_fe["frontend_s"])
    assert with_fe["ttft_s"].mean() > without["ttft_s"].mean() + 0.005
    assert without["frontend_s"].isna().all()


def test_a_request_can_time_out_inside_the_front_end() -> None:
    stream = make_stream(np.zeros(10), 64, 6)
    fe = FrontendConfig(per_request_ms=100.0, startup_ms=0, discipline="fifo")
    req = simulate(
        stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, client=ClientConfig(timeout_s=0.45), **KV),
    ).requests
    # Four requests leave the front end before 0.45 s; the rest time out inside it, never scheduled.
    late = req["request_id"] >= 4
    assert (req.loc[late, "status"] == "timed_out").all()
    assert req.loc[late, "first_scheduled_s"].isna().all() and req.loc[late, "frontend_s"].isna().all()
    assert (req.loc[~late, "frontend_s"] <= 0.45).all()


# --------------------------------------------------------------------------- latency apart from capacity (issue 26)
def test_latency_delays_every_hand_off_without_taking_capacity() -> None:
    """Five requests at once through one loop: they leave it one turn apart, and each reaches the
    engine latency_ms later; the latency of one does not delay the next (it is not a turn)."""
    stream = make_stream(np.zeros(5), 100, 5)
    fe = FrontendConfig(per_request_ms=2.0, latency_ms=10.0, discipline="fifo")
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    assert np.allclose(_handoff_s(req), (np.arange(5) + 1) * 2.0e-3 + 10e-3, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("per_request_ms", "token_us", "latency_ms"), [(2.5, 0.0, 7.0), (1.0, 3.0, 0.5)])
def test_a_lone_request_costs_exactly_the_fixed_latency_plus_its_prefill(
    per_request_ms: float, token_us: float, latency_ms: float
) -> None:
    """At zero load TTFT = the front end's two turns + its latency + one prefill pass, nothing more."""
    cost = LinearCost(base_s=0.004, per_token_s=1e-5)
    stream = make_stream([0.0], 300, 4)
    fe = FrontendConfig(per_request_ms=per_request_ms, per_prompt_token_us=token_us, latency_ms=latency_ms)
    req = simulate(stream, CONTINUOUS, setup(cost, frontend=fe, **KV)).requests
    front_s = per_request_ms / 1e3 + token_us * 300 / 1e6 + latency_ms / 1e3
    prefill_s = cost.time_from_totals_s(300, 1, 300 * 150.0, 0, 0)
    assert req["ttft_s"][0] == pytest.approx(front_s + prefill_s, rel=0, abs=1e-12)


def test_a_warm_front_end_is_the_default() -> None:
    """No start-up delay unless asked for: a cold start is an explicit option, not part of every run."""
    assert FrontendConfig().startup_ms == 0.0
    stream = make_stream([0.0], 10, 2)
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=FrontendConfig(latency_ms=0), **KV)).requests
    assert req["frontend_s"][0] == pytest.approx(FrontendConfig().per_request_ms / 1e3, abs=1e-12)


@given(st.integers(1, 400))
@settings(max_examples=examples(0.25))
def test_a_burst_reaches_the_engine_after_the_loop_has_parsed_all_of_it(n: int) -> None:
    """The event loop parses the whole burst before any request is tokenized and submitted, so the
    first request reaches the engine n x per_request_ms + its tokenization + latency after the burst:
    first-token times grow linearly with the burst (the mechanism behind the N = 10 .. 640 data)."""
    fe = FrontendConfig(per_request_ms=3.0, per_prompt_token_us=1.0, latency_ms=5.0)
    stream = make_stream(np.zeros(n), 200, 3)
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), frontend=fe, **KV)).requests
    first_in_s = n * 3.0e-3 + 200 * 1.0e-6 + 5.0e-3
    assert _handoff_s(req).min() == pytest.approx(first_in_s, rel=0, abs=1e-9)
    assert req["ttft_s"].min() > first_in_s
