"""The engine's output tables (the pinned contract) and its user-facing errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fakes import LinearCost, make_stream, setup

from sim.config import ContinuousPolicyConfig, PagedPolicyConfig, StaticPolicyConfig
from sim.errors import UserError
from sim.metrics.records import ITERATION_COLUMNS, REQUEST_COLUMNS
from sim.serving.engine import SimOutput, simulate

CONTINUOUS = ContinuousPolicyConfig(name="c", max_batch_size=4)


def _run(stream, policy=CONTINUOUS, **kw) -> SimOutput:
    kw = {"kv_blocks": 100, "block_size": 16, **kw}
    progress = kw.pop("progress", None)
    return simulate(stream, policy, setup(LinearCost(0.01, 1e-4), **kw), progress=progress)


def test_tables_have_exactly_the_pinned_columns():
    out = _run(make_stream([0.0, 0.2], 10, [1, 5]))
    assert (
        tuple(out.requests.columns)
        == REQUEST_COLUMNS
        == (
            "request_id",
            "replica",
            "arrival_s",
            "prompt_tokens",
            "output_tokens",
            "status",
            "first_scheduled_s",
            "first_token_s",
            "completion_s",
            "queue_delay_s",
            "ttft_s",
            "tpot_s",
            "e2e_s",
            "norm_latency_s",
            "preemptions",
            "retries",
            "frontend_s",  # added after v0.1 (issue 10): columns are only ever appended
            "spec_steps",  # speculative decoding (issue 16)
            "spec_proposed_tokens",
            "spec_accepted_tokens",
            "spec_tokens_per_step",
            "cached_prompt_tokens",  # issue 13: prefix caching
        )
    )
    assert (
        tuple(out.iterations.columns)
        == ITERATION_COLUMNS
        == (
            "replica",
            "start_s",
            "duration_s",
            "batch_size",
            "prefill_tokens",
            "decode_tokens",
            "kv_blocks_used",
            "kv_blocks_total",
            # added in issue 12 (the cost-model totals MFU and MBU need), appended:
            "prefill_attn_work",
            "decode_kv_tokens",
            "prefill_context_tokens",
        )
    )
    assert (
        out.iterations["start_s"].dtype == np.float64
        and out.iterations["batch_size"].dtype.itemsize <= 4
    )


def test_latency_columns_follow_their_definitions():
    req = _run(make_stream([0.0, 0.0, 0.5], [10, 20, 30], [1, 6, 3])).requests
    a, s, f, c = (
        req[k] for k in ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s")
    )
    n = req["output_tokens"]
    assert np.allclose(req["queue_delay_s"], s - a) and np.allclose(req["ttft_s"], f - a)
    assert np.allclose(req["e2e_s"], c - a) and np.allclose(req["norm_latency_s"], (c - a) / n)
    assert np.isnan(req["tpot_s"][0]) and np.allclose(req["tpot_s"][1:], ((c - f) / (n - 1))[1:])


def test_first_token_comes_from_the_pass_that_finishes_the_prompt():
    # A lone request: first token = end of the prefill pass; then one pass per token.
    req = _run(make_stream([1.0], 100, 4)).requests
    prefill_s, decode_s = 0.01 + 100e-4, 0.01 + 1e-4
    assert req["first_token_s"][0] == pytest.approx(1.0 + prefill_s)
    assert req["completion_s"][0] == pytest.approx(1.0 + prefill_s + 3 * decode_s)


def test_iterations_are_ordered_by_start_across_replicas():
    out = _run(make_stream(np.arange(40) * 0.003, 30, 20), replicas=3)
    assert out.iterations["start_s"].is_monotonic_increasing
    assert set(out.iterations["replica"]) == {0, 1, 2}


def test_empty_stream_gives_empty_tables():
    stream = make_stream(
        np.array([]), np.array([], dtype=int), np.array([], dtype=int), max_output_tokens=1
    )
    out = _run(stream)
    assert len(out.requests) == 0 and len(out.iterations) == 0
    assert list(out.requests.columns) == list(REQUEST_COLUMNS)


def test_progress_is_reported_with_time_and_finished_count():
    calls: list[tuple[float, int]] = []
    n = 300
    _run(
        make_stream(np.arange(n) * 0.01, 20, 100), progress=lambda t, done: calls.append((t, done))
    )
    times, done = zip(*calls, strict=True)
    assert len(calls) >= 2 and done[-1] == n
    assert list(times) == sorted(times) and list(done) == sorted(done)


def test_a_request_that_can_never_fit_is_a_user_error():
    stream = make_stream([0.0], 100, 50, max_output_tokens=200)
    # Reserve memory needs ceil((100 + 200) / 16) = 19 blocks; paged needs ceil(149 / 16) = 10.
    with pytest.raises(UserError, match="kv_blocks"):
        _run(stream, kv_blocks=18)
    with pytest.raises(UserError, match="kv_blocks"):
        _run(stream, policy=StaticPolicyConfig(name="s", max_batch_size=1), kv_blocks=18)
    assert (
        _run(stream, policy=PagedPolicyConfig(name="p"), kv_blocks=10).requests["status"]
        == "completed"
    ).all()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"kv_blocks": 0}, "kv_blocks"),
        ({"block_size": 0}, "block_size"),
        ({"replicas": 0}, "replicas"),
        ({"router": "round-robin"}, "round_robin"),
    ],
)
def test_bad_engine_arguments_are_user_errors(kw, field):
    with pytest.raises(UserError, match=field):
        _run(make_stream([0.0], 10, 2), **kw)


def test_status_is_a_categorical_of_the_three_endings():
    req = _run(make_stream([0.0], 10, 2)).requests
    assert isinstance(req["status"].dtype, pd.CategoricalDtype)
    assert list(req["status"].cat.categories) == ["completed", "timed_out", "rejected"]
