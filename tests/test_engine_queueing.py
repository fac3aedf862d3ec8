"""The engine against queueing theory.

With ``max_batch_size: 1``, Poisson arrivals and fixed lengths on a cost model whose
iterations take a fixed time, one worker is an M/D/1 queue with service time
S = output_tokens x iteration time. Its mean wait is Pollaczek-Khinchine's
W_q = rho S / (2 (1 - rho)); path by path, waits follow Lindley's recursion
W_{i+1} = max(0, W_i + S - A_{i+1}); and Little's law L_q = lambda W_q links the
engine's own time-integral of the queue length to the per-request delays.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import LinearCost, make_stream, poisson_arrivals, setup

from sim.config import ContinuousPolicyConfig
from sim.serving.engine import Engine

ONE_AT_A_TIME = ContinuousPolicyConfig(name="fcfs", max_batch_size=1)


def _md1(rho: float, n: int, seed: int, service_s: float = 0.05, output_tokens: int = 1):
    cost = LinearCost(base_s=service_s / output_tokens)  # every pass takes the same time
    stream = make_stream(poisson_arrivals(rho / service_s, n, seed), 8, output_tokens)
    engine = Engine(stream, ONE_AT_A_TIME, setup(cost, kv_blocks=16, block_size=16))
    return engine, engine.run().requests


def test_waits_follow_lindleys_recursion_path_by_path():
    service_s, n = 0.06, 3000
    _, req = _md1(0.7, n, seed=11, service_s=service_s, output_tokens=3)
    gaps = np.diff(req["arrival_s"].to_numpy())
    expected = np.zeros(n)
    for i in range(1, n):
        expected[i] = max(0.0, expected[i - 1] + service_s - gaps[i - 1])
    assert np.allclose(req["queue_delay_s"], expected, atol=1e-9)
    assert np.allclose(req["e2e_s"] - req["queue_delay_s"], service_s)  # deterministic service


@pytest.mark.slow
@pytest.mark.parametrize(("rho", "n"), [(0.5, 100_000), (0.8, 300_000)])
def test_mean_wait_matches_pollaczek_khinchine(rho: float, n: int):
    # Sampling error of the mean wait (batch-means over Lindley paths of this length):
    # ~1.3% at rho 0.5 and ~1.5% at rho 0.8, well inside the 5% asked.
    service_s = 0.05
    engine, req = _md1(rho, n, seed=2024, service_s=service_s)
    pk_s = rho * service_s / (2 * (1 - rho))
    assert req["queue_delay_s"].mean() == pytest.approx(pk_s, rel=0.05)
    # Little's law on the queue the engine measured (its own time-integral of the length).
    horizon_s = req["completion_s"].max()
    mean_queue = engine.states[0].queue_area_s / horizon_s
    arrival_rate = n / horizon_s
    assert mean_queue == pytest.approx(arrival_rate * req["queue_delay_s"].mean(), rel=0.05)
    assert mean_queue == pytest.approx(arrival_rate * pk_s, rel=0.05)
    # Utilisation: the worker is busy a fraction rho of the time.
    assert n * service_s / horizon_s == pytest.approx(rho, rel=0.02)
