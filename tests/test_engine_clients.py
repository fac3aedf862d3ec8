"""Clients under overload (timeouts, admission control, retries), closed loops, routers."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import LinearCost, make_stream, setup

from sim.config import AdmissionConfig, ClientConfig, ContinuousPolicyConfig, StaticPolicyConfig
from sim.serving.engine import simulate
from sim.workload.stream import ClosedLoop

CONTINUOUS = ContinuousPolicyConfig(name="c", max_batch_size=8)
KV = dict(kv_blocks=200, block_size=16)


def test_timeout_cancels_a_running_request_and_frees_its_kv():
    # Each request reserves ceil((10 + 1000) / 16) = 64 blocks of 100: one at a time.
    stream = make_stream([0.0, 0.5], 10, [1000, 5])
    out = simulate(
        stream, CONTINUOUS,
        setup(LinearCost(0.01), kv_blocks=100, block_size=16, client=ClientConfig(timeout_s=2.0)),
    )
    req = out.requests
    assert req["status"].tolist() == ["timed_out", "completed"]
    assert req["completion_s"][0] == pytest.approx(2.0)  # abandoned at send + timeout
    assert req["first_token_s"][0] < 2.0 and np.isnan(req["e2e_s"][0])
    # Request 1 waited for request 0's KV and ran right after the cancellation (next pass boundary).
    assert 2.0 <= req["first_scheduled_s"][1] <= 2.0 + 0.01 + 1e-9
    assert out.iterations["start_s"].max() < 2.2  # no passes for the abandoned request


def test_timeout_drops_a_queued_request():
    # One at a time: request 0 ends at 0.80 s, request 1 runs into its deadline,
    # request 2 never starts.
    stream = make_stream(np.zeros(3), 10, [80, 95, 5])
    static = StaticPolicyConfig(name="s", max_batch_size=1)
    req = simulate(stream, static, setup(LinearCost(0.01), client=ClientConfig(timeout_s=1.0), **KV)).requests
    assert req["status"].tolist() == ["completed", "timed_out", "timed_out"]
    assert req["first_scheduled_s"][1] == pytest.approx(0.8)
    assert np.isnan(req["first_scheduled_s"][2]) and req["completion_s"][2] == pytest.approx(1.0)


def test_full_queue_rejects_and_retries_back_off_exponentially():
    stream = make_stream(np.zeros(5), 10, 1)
    policy = ContinuousPolicyConfig(name="c", max_batch_size=1)
    req = simulate(
        stream, policy,
        setup(
            LinearCost(0.01), admission=AdmissionConfig(max_queue=1),
            client=ClientConfig(timeout_s=100.0, max_retries=2, backoff_s=0.5), **KV,
        ),
    ).requests
    # t=0: request 0 queued, 1-4 rejected; t=0.5: 1 queued, 2-4 rejected;
    # t=0.5+1.0: 2 queued, 3-4 rejected for good.
    assert req["status"].tolist() == ["completed"] * 3 + ["rejected"] * 2
    assert req["retries"].tolist() == [0, 1, 2, 2, 2]
    assert np.allclose(req["first_scheduled_s"][:3], [0.0, 0.5, 1.5])
    assert np.allclose(req["completion_s"][3:], 1.5) and np.all(req["arrival_s"] == 0.0)


def test_rejection_without_retries_is_final_at_once():
    stream = make_stream(np.zeros(3), 10, 4)
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), admission=AdmissionConfig(max_queue=1), **KV)).requests
    # All sent at t=0 before the worker's first pass: the first one fills the queue.
    assert req["status"].tolist() == ["completed", "rejected", "rejected"]
    assert np.all(req["completion_s"][1:] == 0.0) and np.all(req["retries"] == 0)


def test_closed_loop_sends_the_next_request_a_think_time_after_each_end():
    n, clients = 12, 3
    think_s = np.linspace(0.0, 0.3, n)
    stream = make_stream(np.full(n, np.nan), 20, 7, closed_loop=ClosedLoop(clients, think_s))
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.02), **KV)).requests
    assert np.all(req["arrival_s"][:clients] == 0.0)
    ends = np.sort(req["completion_s"].to_numpy())
    assert np.allclose(req["arrival_s"][clients:], ends[: n - clients] + think_s[clients:])


def test_round_robin_deals_requests_in_turn():
    stream = make_stream(np.arange(30) * 0.01, 10, 3)
    req = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), replicas=3, **KV)).requests
    assert req["replica"].tolist() == [i % 3 for i in range(30)]


def test_random_router_is_reproducible_per_seed_and_uses_every_replica():
    stream = make_stream(np.arange(200) * 0.01, 10, 3)
    routes = {
        seed: simulate(stream, CONTINUOUS, setup(LinearCost(0.01), replicas=4, router="random", seed=seed, **KV))
        .requests["replica"]
        .to_numpy()
        for seed in (1, 1, 2)
    }
    again = simulate(stream, CONTINUOUS, setup(LinearCost(0.01), replicas=4, router="random", seed=1, **KV))
    assert np.array_equal(routes[1], again.requests["replica"].to_numpy())
    assert not np.array_equal(routes[1], routes[2])
    assert set(routes[1].tolist()) == {0, 1, 2, 3}


def test_least_outstanding_steers_around_a_loaded_replica():
    # Request 0 is huge; the small ones that follow avoid its replica.
    stream = make_stream(
        np.zeros(5), [1000, 10, 10, 10, 10], [500, 10, 10, 10, 10], max_output_tokens=500
    )
    kw = dict(kv_blocks=1000, block_size=16, replicas=2)
    cost = LinearCost(0.01, per_token_s=1e-4)  # the huge prompt makes its replica's passes slow
    least = simulate(stream, CONTINUOUS, setup(cost, router="least_outstanding", **kw)).requests
    assert least["replica"].tolist() == [0, 1, 1, 1, 1]
    rr = simulate(stream, CONTINUOUS, setup(cost, **kw)).requests
    assert least["e2e_s"][1:].mean() < rr["e2e_s"][1:].mean()
