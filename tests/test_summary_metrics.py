"""Summary metrics against answers computed by hand on hand-built records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SLOConfig
from sim.metrics.summary import (
    EXTRA_COLUMNS,
    SUMMARY_COLUMNS,
    percentile,
    summarize,
    summarize_run,
)

# The summary.csv contract from the CLI issue, typed independently of the module.
CONTRACT = [
    "scenario", "policy", "requests", "completed", "duration_s", "throughput_rps",
    "output_tps", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "norm_latency_mean_s",
    "queue_p50_s", "gpu_busy_frac", "kv_peak_frac", "mean_batch_size", "preemptions",
]  # fmt: skip


def make_requests(n: int, **columns: object) -> pd.DataFrame:
    """n completed requests arriving at t=0..n-1 with 1 s latencies, overridable per column."""
    arrival = np.arange(n, dtype=float)
    base = {
        "request_id": np.arange(n),
        "replica": np.zeros(n, dtype=int),
        "arrival_s": arrival,
        "prompt_tokens": np.full(n, 100),
        "output_tokens": np.full(n, 10),
        "status": ["completed"] * n,
        "first_scheduled_s": arrival,
        "first_token_s": arrival + 0.1,
        "completion_s": arrival + 1.0,
        "queue_delay_s": np.zeros(n),
        "ttft_s": np.full(n, 0.1),
        "tpot_s": np.full(n, 0.1),
        "e2e_s": np.full(n, 1.0),
        "norm_latency_s": np.full(n, 0.1),
        "preemptions": np.zeros(n, dtype=int),
        "retries": np.zeros(n, dtype=int),
    }
    base.update(columns)
    return pd.DataFrame(base)


def make_iterations(rows: list[tuple[int, float, float, int, int, int]]) -> pd.DataFrame:
    """Rows of (replica, start_s, duration_s, batch_size, kv_blocks_used, kv_blocks_total)."""
    columns = [
        "replica",
        "start_s",
        "duration_s",
        "batch_size",
        "kv_blocks_used",
        "kv_blocks_total",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame["prefill_tokens"] = 0
    frame["decode_tokens"] = frame["batch_size"]
    return frame


NO_ITERATIONS = make_iterations([])


def run(requests: pd.DataFrame, iterations: pd.DataFrame = NO_ITERATIONS, **kwargs: object) -> dict:
    return summarize_run(requests, iterations, scenario="s", policy="p", **kwargs)


def test_percentiles_of_arithmetic_sequences():
    k = np.arange(101)
    order = np.random.default_rng(7).permutation(101)  # row order must not matter
    requests = make_requests(
        101,
        ttft_s=(0.01 * (k + 1))[order],
        e2e_s=(1.0 + 0.1 * k)[order],
        queue_delay_s=(0.001 * k)[order],
        norm_latency_s=(0.02 * k)[order],
    )
    row = run(requests)
    # The q-th linear percentile of x_k = a + b k, k = 0..100, is a + b q.
    assert row["ttft_p50_s"] == pytest.approx(0.51)
    assert row["ttft_p90_s"] == pytest.approx(0.91)
    assert row["ttft_p99_s"] == pytest.approx(1.00)
    assert row["e2e_p50_s"] == pytest.approx(6.0)
    assert row["e2e_p90_s"] == pytest.approx(10.0)
    assert row["e2e_p99_s"] == pytest.approx(10.9)
    assert row["e2e_mean_s"] == pytest.approx(6.0)
    assert row["e2e_max_s"] == pytest.approx(11.0)
    assert row["queue_p50_s"] == pytest.approx(0.05)
    assert row["norm_latency_mean_s"] == pytest.approx(1.0)
    assert row["tpot_p50_s"] == pytest.approx(0.1) and row["tpot_p99_s"] == pytest.approx(0.1)


def test_percentile_matches_numpy_and_ignores_nan():
    values = np.random.default_rng(3).exponential(size=500)
    with_nan = np.concatenate([values, [np.nan] * 50])
    for q in (50, 90, 99):
        assert percentile(with_nan, q) == pytest.approx(np.percentile(values, q))
    assert math.isnan(percentile(np.array([np.nan]), 50))
    assert math.isnan(percentile(np.array([]), 99))


def test_only_completed_requests_enter_latency_statistics():
    requests = make_requests(10, status=["completed"] * 8 + ["timed_out", "rejected"])
    requests.loc[8:, ["ttft_s", "e2e_s"]] = 1000.0  # must not leak into percentiles
    row = run(requests)
    assert (row["completed"], row["timed_out"], row["rejected"], row["requests"]) == (8, 1, 1, 10)
    assert row["ttft_p99_s"] == pytest.approx(0.1)
    assert row["e2e_max_s"] == pytest.approx(1.0)


def test_warmup_excludes_early_requests_from_latency_but_not_from_counts():
    e2e = np.where(np.arange(20) < 5, 50.0, 1.0)  # requests arriving at t < 5 are slow
    requests = make_requests(20, e2e_s=e2e)
    warm = run(requests, warmup_s=5.0)
    cold = run(requests)
    assert warm["e2e_max_s"] == pytest.approx(1.0)
    assert warm["e2e_mean_s"] == pytest.approx(1.0)
    assert cold["e2e_mean_s"] == pytest.approx((5 * 50.0 + 15 * 1.0) / 20)
    assert warm["completed"] == cold["completed"] == 20
    assert warm["throughput_rps"] == cold["throughput_rps"]


def test_zero_completed_gives_nan_not_an_exception():
    requests = make_requests(4, status=["rejected"] * 4)
    requests.loc[:, ["ttft_s", "tpot_s", "e2e_s", "norm_latency_s", "queue_delay_s"]] = np.nan
    row = run(requests, slo=SLOConfig(ttft_p99_s=1.0), gpu_hour_usd=2.0)
    assert row["completed"] == 0 and row["rejected"] == 4
    assert row["throughput_rps"] == 0.0 and row["output_tps"] == 0.0
    for column in ("ttft_p50_s", "e2e_mean_s", "tpot_p99_s", "queue_p50_s", "norm_latency_mean_s"):
        assert math.isnan(row[column]), column
    assert row["gpu_busy_frac"] == 0.0  # no iteration ran during a positive duration
    assert row["slo_attainment"] == 0.0


def test_empty_run_is_all_nan():
    row = run(make_requests(0))
    assert row["requests"] == row["completed"] == row["iterations"] == 0
    for column in ("duration_s", "throughput_rps", "ttft_p50_s", "kv_peak_frac", "mean_batch_size"):
        assert math.isnan(row[column]), column


def test_duration_spans_first_arrival_to_last_event():
    requests = make_requests(3, arrival_s=[2.0, 3.0, 4.0], completion_s=[5.0, 8.0, 12.0])
    iterations = make_iterations(
        [(0, 2.0, 10.5, 1, 1, 10)]
    )  # ends at 12.5, after the last completion
    row = run(requests, iterations)
    assert row["duration_s"] == pytest.approx(10.5)
    assert row["throughput_rps"] == pytest.approx(3 / 10.5)
    assert row["output_tps"] == pytest.approx(30 / 10.5)


def test_output_tps_counts_only_completed_tokens():
    requests = make_requests(
        4, output_tokens=[10, 20, 30, 1000], status=["completed"] * 3 + ["timed_out"]
    )
    row = run(requests, make_iterations([(0, 0.0, 4.0, 1, 1, 1)]))
    assert row["duration_s"] == pytest.approx(4.0)
    assert row["output_tps"] == pytest.approx(60 / 4.0)


def test_gpu_busy_fraction_over_replicas():
    requests = make_requests(1, arrival_s=[0.0], completion_s=[10.0])
    iterations = make_iterations(
        [
            (0, 0.0, 4.0, 2, 0, 10),
            (0, 5.0, 2.0, 2, 0, 10),
            (1, 1.0, 1.0, 1, 0, 10),
            (1, 9.0, 1.0, 3, 0, 10),
        ]
    )
    row = run(requests, iterations)
    assert row["replicas"] == 2
    assert row["gpu_busy_frac"] == pytest.approx((6.0 + 2.0) / (10.0 * 2))
    assert row["mean_batch_size"] == pytest.approx((2 + 2 + 1 + 3) / 4)
    # A replica that never ran an iteration still counts when passed explicitly.
    assert run(requests, iterations, replicas=4)["gpu_busy_frac"] == pytest.approx(8.0 / 40.0)


def test_kv_mean_is_time_weighted_and_idle_counts_as_zero():
    requests = make_requests(1, arrival_s=[0.0], completion_s=[10.0])
    iterations = make_iterations([(0, 0.0, 1.0, 4, 80, 100), (0, 1.0, 3.0, 1, 20, 100)])
    row = run(requests, iterations)
    assert row["kv_peak_frac"] == pytest.approx(0.8)
    # (0.8 x 1 s + 0.2 x 3 s) over 10 s; the unweighted mean would be 0.5.
    assert row["kv_mean_frac"] == pytest.approx(0.14)


def test_slo_attainment_and_goodput_count_requests_meeting_every_bound():
    ttft = [0.1] * 6 + [5.0, 5.0, 0.1, 0.1]
    tpot = [0.01] * 8 + [0.5, 0.01]
    status = ["completed"] * 9 + ["timed_out"]
    requests = make_requests(
        10, ttft_s=ttft, tpot_s=tpot, status=status, completion_s=np.linspace(1, 10, 10)
    )
    row = run(requests, slo=SLOConfig(ttft_p99_s=1.0, tpot_p99_s=0.05))
    assert row["slo_attainment"] == pytest.approx(6 / 10)
    assert row["goodput_rps"] == pytest.approx(6 / row["duration_s"])
    only_ttft = run(requests, slo=SLOConfig(ttft_p99_s=1.0))
    assert only_ttft["slo_attainment"] == pytest.approx(7 / 10)
    assert math.isnan(run(requests)["slo_attainment"]) and math.isnan(run(requests)["goodput_rps"])


def test_single_token_outputs_meet_any_tpot_bound():
    requests = make_requests(2, tpot_s=[np.nan, 0.5])
    assert run(requests, slo=SLOConfig(tpot_p99_s=0.1))["slo_attainment"] == pytest.approx(0.5)


def test_cost_columns():
    requests = make_requests(10, arrival_s=np.zeros(10), completion_s=np.full(10, 1800.0))
    row = run(requests, num_gpus=2, gpu_hour_usd=3.0)
    # 10 requests in half an hour on 2 GPUs at $3/GPU-hour = $3.
    assert row["requests_per_usd"] == pytest.approx(10 / 3.0)
    assert row["rps_per_gpu"] == pytest.approx(10 / 1800.0 / 2)
    assert math.isnan(run(requests)["requests_per_usd"])


def test_preemptions_and_retries_are_summed():
    row = run(make_requests(3, preemptions=[0, 2, 5], retries=[1, 0, 1]))
    assert (row["preemptions"], row["retries"]) == (7, 2)


def test_columns_start_with_the_contract_in_order():
    assert list(SUMMARY_COLUMNS) == CONTRACT
    assert not set(SUMMARY_COLUMNS) & set(EXTRA_COLUMNS)
    row = run(make_requests(3))
    assert list(row) == CONTRACT + list(EXTRA_COLUMNS)
    frame = summarize(
        {"b": (make_requests(3), NO_ITERATIONS), "a": (make_requests(2), NO_ITERATIONS)},
        scenario="x",
    )
    assert list(frame.columns[: len(CONTRACT)]) == CONTRACT
    assert list(frame["policy"]) == ["b", "a"] and list(frame["requests"]) == [3, 2]
    assert (frame["scenario"] == "x").all()


def test_policy_column_in_inputs_is_ignored():
    requests = make_requests(5)
    requests["policy"] = "other"
    assert run(requests)["policy"] == "p"


def test_missing_column_is_reported():
    with pytest.raises(ValueError, match="ttft_s"):
        run(make_requests(3).drop(columns=["ttft_s"]))


@settings(max_examples=examples(0.4))
@given(
    st.lists(
        st.tuples(st.floats(0.0, 5.0), st.floats(0.001, 3.0), st.integers(1, 64)),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.floats(0.0, 100.0), min_size=1, max_size=40),
)
def test_invariants_on_random_runs(iteration_specs, latencies):
    # Iterations of one replica never overlap: each starts after the previous ends plus a gap.
    rows, t = [], 0.0
    for gap_s, duration_s, batch in iteration_specs:
        rows.append((0, t + gap_s, duration_s, batch, batch, 64))
        t += gap_s + duration_s
    n = len(latencies)
    requests = make_requests(
        n, arrival_s=np.zeros(n), e2e_s=latencies, completion_s=np.array(latencies)
    )
    row = run(requests, make_iterations(rows))
    assert 0.0 <= row["gpu_busy_frac"] <= 1.0
    assert 0.0 <= row["kv_mean_frac"] <= row["kv_peak_frac"] <= 1.0
    assert row["e2e_p50_s"] <= row["e2e_p90_s"] <= row["e2e_p99_s"] <= row["e2e_max_s"]
    assert min(latencies) - 1e-9 <= row["e2e_mean_s"] <= max(latencies) + 1e-9
