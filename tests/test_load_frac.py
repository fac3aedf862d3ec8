"""``load_frac``: the offered load as a fraction of the policy's simulated capacity (sim/saturation.py).

The capacity a run is compared with is checked against an independent measurement: the
throughput of a long closed-loop run of the same requests with many more clients than the
batch holds (the queue never empty), read from its own ``summary.csv`` row.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import Scenario
from sim.resolve import resolve
from sim.runner import run
from sim.saturation import MIN_WINDOW_REQUESTS, capacity_rps, offered_rps, steady_throughput_rps

POLICY = {"name": "paged", "kind": "paged", "max_batch_size": 32}


def _scenario(arrival: dict, requests: int = 400, policy: dict | None = None) -> Scenario:
    workload = {
        "requests": requests, "arrival": arrival,
        "prompt_tokens": {"kind": "uniform", "low": 64, "high": 256},
        "output_tokens": {"kind": "uniform", "low": 8, "high": 64},
    }  # fmt: skip
    return Scenario(name="load", seed=3, model="llama-2-7b", gpu="a100-80gb", workload=workload,
                    policies=[policy or POLICY])  # fmt: skip


def _load_frac(arrival: dict, requests: int = 400) -> float:
    return float(run(_scenario(arrival, requests), summary_only=True).summary["load_frac"].iloc[0])


@pytest.fixture(scope="module")
def saturated_rps() -> float:
    """Throughput of 3000 requests sent by 200 closed-loop clients (the batch holds 32): the queue never empties."""
    summary = run(_scenario({"kind": "closed_loop", "clients": 200}, requests=3000), summary_only=True).summary
    return float(summary["throughput_rps"].iloc[0])


def test_capacity_is_the_throughput_with_the_queue_never_empty(saturated_rps: float) -> None:
    resolved = resolve(_scenario({"kind": "poisson", "rate": 1.0}))
    assert capacity_rps(resolved, resolved.scenario.policies[0]) == pytest.approx(saturated_rps, rel=0.05)


def test_a_burst_far_beyond_the_batch_is_saturated() -> None:
    assert _load_frac({"kind": "burst"}, requests=1500) == pytest.approx(1.0, abs=0.1)


def test_a_small_burst_is_far_from_saturation() -> None:
    # 4 requests on a batch of 32: all run at once, the run's rate is far below capacity.
    assert _load_frac({"kind": "burst"}, requests=4) < 0.3


@pytest.mark.parametrize("share", [0.1, 0.5, 2.0])
def test_constant_rate_is_rate_over_capacity(saturated_rps: float, share: float) -> None:
    rate = share * saturated_rps
    assert _load_frac({"kind": "constant", "rate": rate}) == pytest.approx(share, rel=0.05)


@settings(max_examples=8)
@given(st.floats(0.2, 40.0), st.floats(1.05, 4.0))
def test_load_frac_grows_with_the_arrival_rate(rate: float, factor: float) -> None:
    low = _load_frac({"kind": "poisson", "rate": rate}, requests=150)
    high = _load_frac({"kind": "poisson", "rate": rate * factor}, requests=150)
    assert high == pytest.approx(low * factor, rel=1e-9)  # the same draws, every gap shrunk by the factor


def test_closed_loop_offers_no_fixed_load() -> None:
    assert math.isnan(_load_frac({"kind": "closed_loop", "clients": 8}, requests=50))


def test_every_policy_row_has_its_own_capacity() -> None:
    small = {"name": "small", "kind": "paged", "max_batch_size": 2}
    scenario = _scenario({"kind": "constant", "rate": 2.0}, requests=100)
    scenario = Scenario(**{**scenario.model_dump(), "policies": [POLICY, small]})
    load = run(scenario, summary_only=True).summary.set_index("policy")["load_frac"]
    assert load["small"] > 3 * load["paged"]  # a 2-sequence batch saturates far sooner


# --------------------------------------------------------------------------- the pure parts
def _records(ends: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"status": "completed", "arrival_s": 0.0, "completion_s": ends})


@given(st.floats(0.5, 500.0), st.integers(1, 50), st.integers(0, 400))
def test_steady_rate_of_evenly_spaced_ends_is_their_rate(rate: float, clients: int, extra: int) -> None:
    n = clients + 4 * MIN_WINDOW_REQUESTS + extra
    ends = 5.0 + np.arange(n) / rate  # a ramp of 5 s, then one end every 1/rate
    assert steady_throughput_rps(_records(ends), clients) == pytest.approx(rate, rel=1e-6)


def test_a_replay_too_short_for_a_window_counts_the_whole_burst() -> None:
    ends = np.array([1.0, 2.0, 4.0])
    assert steady_throughput_rps(_records(ends), clients=10) == pytest.approx(3 / 4.0)


def test_offered_rate_of_constant_arrivals_is_exact() -> None:
    stream = resolve(_scenario({"kind": "constant", "rate": 7.0}, requests=50)).stream
    assert offered_rps(stream) == pytest.approx(7.0, rel=1e-12)
    assert math.isinf(offered_rps(resolve(_scenario({"kind": "burst"}, requests=5)).stream))
