"""build_request_stream: determinism, common random numbers, caps, trace replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import Workload
from sim.errors import UserError
from sim.workload import DEFAULT_REQUESTS, build_request_stream, load_trace

DATA = Path(__file__).resolve().parent / "data"
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
LENGTHS = {
    "prompt_tokens": {"kind": "uniform", "low": 16, "high": 2048},
    "output_tokens": {"kind": "lognormal", "median": 120, "sigma": 1.0, "min": 1, "max": 1500},
}


def _workload(arrival: dict[str, Any], **fields: Any) -> Workload:
    return Workload.model_validate({"arrival": arrival, **{**LENGTHS, **fields}})


def _trace(**arrival: Any) -> dict[str, Any]:
    return {"kind": "trace", "path": str(DATA / "tiny_trace.csv"), **arrival}


# --------------------------------------------------------------------------- determinism and CRN
def test_same_seed_same_stream_and_seed_matters() -> None:
    workload = _workload({"kind": "gamma", "rate": 3, "cv": 2}, requests=5000)
    a, b = build_request_stream(workload, 11), build_request_stream(workload, 11)
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    c = build_request_stream(workload, 12)
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_changing_the_rate_changes_only_the_clock() -> None:
    slow = build_request_stream(_workload({"kind": "poisson", "rate": 2.0}, requests=20_000), 5)
    fast = build_request_stream(_workload({"kind": "poisson", "rate": 8.0}, requests=20_000), 5)
    np.testing.assert_array_equal(slow.prompt_tokens, fast.prompt_tokens)
    np.testing.assert_array_equal(slow.output_tokens, fast.output_tokens)
    # Same underlying unit exponentials: every send time scales by exactly 1/4.
    np.testing.assert_allclose(fast.arrival_s, slow.arrival_s / 4, rtol=1e-9)


@pytest.mark.parametrize(
    "arrival",
    [
        {"kind": "burst"},
        {"kind": "constant", "rate": 1},
        {"kind": "closed_loop", "clients": 4, "think_time_s": 1.0},
        {
            "kind": "schedule",
            "phases": [{"duration_s": 5, "rate": 1}, {"duration_s": 5, "rate": 9}],
        },
    ],
)
def test_lengths_do_not_depend_on_the_arrival_process(arrival: dict[str, Any]) -> None:
    base = build_request_stream(_workload({"kind": "poisson", "rate": 1}), 9)
    other = build_request_stream(_workload(arrival), 9)
    np.testing.assert_array_equal(base.prompt_tokens, other.prompt_tokens)
    np.testing.assert_array_equal(base.output_tokens, other.output_tokens)


def test_output_distribution_does_not_move_prompts() -> None:
    a = build_request_stream(_workload({"kind": "burst"}), 3)
    b = build_request_stream(
        _workload({"kind": "burst"}, output_tokens={"kind": "fixed", "value": 10}), 3
    )
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    assert set(b.output_tokens.tolist()) == {10}


# ------------------------------------------------------------------ counts and max_output_tokens
def test_default_request_count() -> None:
    stream = build_request_stream(_workload({"kind": "poisson", "rate": 1}), 0)
    assert len(stream) == DEFAULT_REQUESTS == 1000


@pytest.mark.parametrize(
    ("output", "bound"),
    [
        ({"kind": "fixed", "value": 77}, 77),
        ({"kind": "uniform", "low": 10, "high": 900}, 900),
        ({"kind": "normal", "mean": 300, "std": 50, "min": 1, "max": 650}, 650),
        ({"kind": "zipf", "a": 1.3, "min": 1, "max": 3000}, 3000),
        (
            {
                "kind": "empirical",
                "path": str(DATA / "lengths_only.csv"),
                "column": "num_decode_tokens",
            },
            2958,
        ),
    ],
)
def test_default_max_output_is_the_distribution_upper_bound(
    output: dict[str, Any], bound: int
) -> None:
    stream = build_request_stream(_workload({"kind": "burst"}, output_tokens=output), 1)
    assert stream.max_output_tokens == bound
    assert stream.output_tokens.max() <= bound


def test_explicit_max_output_clips_outputs_and_keeps_the_rest() -> None:
    free = build_request_stream(_workload({"kind": "burst"}), 4)
    capped = build_request_stream(_workload({"kind": "burst"}, max_output_tokens=100), 4)
    assert capped.max_output_tokens == 100
    np.testing.assert_array_equal(capped.output_tokens, np.minimum(free.output_tokens, 100))
    assert (free.output_tokens > 100).any()  # the cap really bit
    roomy = build_request_stream(_workload({"kind": "burst"}, max_output_tokens=5000), 4)
    assert roomy.max_output_tokens == 5000
    np.testing.assert_array_equal(roomy.output_tokens, free.output_tokens)


def test_closed_loop_stream() -> None:
    arrival = {"kind": "closed_loop", "clients": 8, "think_time_s": 0.5}
    stream = build_request_stream(_workload(arrival, requests=4000), 2)
    assert np.isnan(stream.arrival_s).all()
    assert stream.closed_loop is not None and stream.closed_loop.clients == 8
    assert stream.closed_loop.think_time_s.shape == (4000,)
    assert stream.closed_loop.think_time_s.mean() == pytest.approx(0.5, rel=0.08)


# --------------------------------------------------------------------------- trace replay
@pytest.mark.parametrize("time_scale", [1.0, 0.5, 3.0])
def test_trace_replay_reproduces_gaps_and_lengths(time_scale: float) -> None:
    workload = Workload.model_validate({"arrival": _trace(time_scale=time_scale)})
    stream = build_request_stream(workload, 0)
    trace = load_trace(str(DATA / "tiny_trace.csv"))
    assert len(stream) == len(trace) == 5
    assert stream.arrival_s[0] == 0.0
    np.testing.assert_allclose(np.diff(stream.arrival_s), np.diff(trace["arrived_at"]) * time_scale)
    np.testing.assert_array_equal(stream.prompt_tokens, trace["num_prefill_tokens"])
    np.testing.assert_array_equal(stream.output_tokens, trace["num_decode_tokens"])
    assert stream.max_output_tokens == 300


@pytest.mark.parametrize(
    ("limit", "requests", "expected"),
    [(None, None, 5), (3, None, 3), (None, 2, 2), (4, 2, 2), (2, 4, 2), (None, 99, 5)],
)
def test_trace_caps(limit: int | None, requests: int | None, expected: int) -> None:
    workload = Workload.model_validate({"arrival": _trace(limit=limit), "requests": requests})
    stream = build_request_stream(workload, 0)
    assert len(stream) == expected
    np.testing.assert_array_equal(stream.prompt_tokens, [100, 200, 50, 1, 4000][:expected])
    # max_tokens is a property of the service (whole trace), not of how much we replay.
    assert stream.max_output_tokens == 300


def test_trace_with_given_prompt_distribution() -> None:
    workload = Workload.model_validate(
        {"arrival": _trace(), "prompt_tokens": {"kind": "fixed", "value": 64}}
    )
    stream = build_request_stream(workload, 0)
    assert set(stream.prompt_tokens.tolist()) == {64}
    np.testing.assert_array_equal(stream.output_tokens, [20, 5, 300, 1, 64])


def test_trace_relative_to_scenario_folder() -> None:
    workload = Workload.model_validate({"arrival": {"kind": "trace", "path": "tiny_trace.csv"}})
    assert len(build_request_stream(workload, 0, base_dir=str(DATA))) == 5


def test_lengths_only_trace_cannot_drive_arrivals() -> None:
    workload = Workload.model_validate(
        {"arrival": {"kind": "trace", "path": str(DATA / "lengths_only.csv")}}
    )
    with pytest.raises(UserError, match="arrived_at") as err:
        build_request_stream(workload, 0)
    assert err.value.field == "workload.arrival.path"


def test_missing_trace_names_the_field() -> None:
    workload = Workload.model_validate({"arrival": {"kind": "trace", "path": "missing.csv"}})
    with pytest.raises(UserError, match=r"workload.arrival.path: trace file not found"):
        build_request_stream(workload, 0)


def test_real_trace_by_registered_name(monkeypatch: pytest.MonkeyPatch) -> None:
    if not (SHARED_TRACES / "splitwise_conv.csv").is_file():
        pytest.skip(f"{SHARED_TRACES / 'splitwise_conv.csv'} absent (shared data not mounted)")
    monkeypatch.delenv("BATCHSIM_TRACE_DIR", raising=False)
    workload = Workload.model_validate({"arrival": {"kind": "trace", "path": "azure-conv-2023"}})
    stream = build_request_stream(workload, 0)
    assert len(stream) == 19_366
    assert np.all(np.diff(stream.arrival_s) >= 0)
    assert stream.max_output_tokens == stream.output_tokens.max() == 1000
    # One hour of traffic: ~5.5 req/s on average.
    assert len(stream) / stream.arrival_s[-1] == pytest.approx(5.53, rel=0.01)


# --------------------------------------------------------------------------- property
_arrivals = st.one_of(
    st.builds(lambda r: {"kind": "poisson", "rate": r}, st.floats(1e-3, 1e4)),
    st.builds(
        lambda r, cv: {"kind": "gamma", "rate": r, "cv": cv},
        st.floats(1e-3, 1e4),
        st.floats(0.05, 20),
    ),
    st.builds(lambda r: {"kind": "constant", "rate": r}, st.floats(1e-3, 1e4)),
    st.just({"kind": "burst"}),
    st.builds(
        lambda phases: {"kind": "schedule", "phases": phases + [{"duration_s": 1.0, "rate": 1.0}]},
        st.lists(
            st.builds(
                lambda d, r: {"duration_s": d, "rate": r},
                st.floats(1e-3, 1e3),
                st.sampled_from([0.0, 0.1, 50.0]),
            ),
            max_size=4,
        ),
    ),
)


@settings(max_examples=examples(0.6))
@given(arrival=_arrivals, requests=st.integers(1, 3000), seed=st.integers(0, 2**31))
def test_any_open_loop_workload_gives_a_valid_stream(
    arrival: dict[str, Any], requests: int, seed: int
) -> None:
    stream = build_request_stream(_workload(arrival, requests=requests), seed)  # validates itself
    assert len(stream) == requests
    assert np.all(np.isfinite(stream.arrival_s)) and stream.arrival_s.min() >= 0
    assert stream.prompt_tokens.dtype == stream.output_tokens.dtype == np.int64
