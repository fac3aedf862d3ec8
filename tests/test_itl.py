"""Inter-token latency: weighted statistics equal those of the expanded gap list, and the
engine records one gap per stream event of every request, at the right times."""

from __future__ import annotations

import numpy as np
import pytest
from budget import examples
from fakes import LinearCost, make_stream, setup
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import ContinuousPolicyConfig, PagedPolicyConfig
from sim.metrics import itl as itl_module
from sim.metrics.itl import ITL_COLUMNS, ITLRecorder, empty_itl_frame, itl_stats
from sim.metrics.summary import percentile
from sim.serving.engine import SimOutput, simulate

gap_lists = st.lists(
    st.tuples(st.floats(0.0, 5.0, allow_nan=False), st.integers(0, 40)), min_size=1, max_size=60
)


@settings(max_examples=examples(3))
@given(gap_lists)
def test_weighted_stats_equal_the_stats_of_the_expanded_gaps(pairs):
    gaps = np.array([g for g, _ in pairs])
    counts = np.array([c for _, c in pairs])
    stats = itl_stats(gaps, counts)
    expanded = np.repeat(gaps, counts)
    if not expanded.size:
        assert all(np.isnan(v) for v in stats.values())
        return
    for q in (50, 90, 99):  # bit-identical to the summary's percentile convention
        assert stats[f"itl_p{q}_s"] == percentile(expanded, q) == np.percentile(expanded, q)
    assert stats["itl_mean_s"] == pytest.approx(float(np.mean(expanded)), rel=1e-12, abs=1e-15)


def test_weighted_percentiles_on_many_repeated_gaps():
    # Values that make numpy's two-sided lerp matter (gamma >= 0.5 and < 0.5).
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 8))
        gaps = rng.uniform(0.001, 0.2, k).round(int(rng.integers(2, 9)))
        counts = rng.integers(1, 2000, k)
        stats = itl_stats(gaps, counts)
        expanded = np.repeat(gaps, counts)
        assert [stats[f"itl_p{q}_s"] for q in (50, 90, 99)] == [np.percentile(expanded, q) for q in (50, 90, 99)]


def test_recorder_round_trip_and_empty_outputs():
    recorder = ITLRecorder()
    recorder.add(0.5, 3)
    recorder.add(0.25, 1)
    frame = recorder.to_frame()
    assert tuple(frame.columns) == ITL_COLUMNS and frame["count"].dtype == np.int64
    assert frame["gap_s"].tolist() == [0.5, 0.25] and frame["count"].tolist() == [3, 1]
    assert len(recorder) == 0 and len(recorder.to_frame()) == 0  # emptied
    assert tuple(empty_itl_frame().columns) == ITL_COLUMNS
    out = SimOutput(empty_itl_frame(), empty_itl_frame())
    assert len(out.itl) == 0


def test_a_request_alone_has_one_gap_per_decode_pass_and_tpot_is_their_mean():
    # Context-dependent pass times: every gap is its own decode pass's duration.
    cost = LinearCost(base_s=0.01, per_token_s=1e-4, per_kv_token_s=1e-5)
    stream = make_stream([0.0], 50, 12)
    out = simulate(stream, PagedPolicyConfig(name="p"), setup(cost, kv_blocks=20, block_size=16))
    decode_passes = out.iterations[out.iterations["decode_tokens"] > 0]
    assert (out.itl["count"] == 1).all() and len(out.itl) == 11
    assert np.allclose(np.sort(out.itl["gap_s"]), np.sort(decode_passes["duration_s"]), rtol=0, atol=1e-12)
    mean_itl = itl_stats(out.itl["gap_s"], out.itl["count"])["itl_mean_s"]
    assert out.requests["tpot_s"][0] == pytest.approx(mean_itl, rel=1e-12)
    assert len(set(np.round(out.itl["gap_s"], 12))) > 1  # the gaps do differ


def test_a_joiner_gets_its_own_gap_and_a_prefill_pass_lengthens_the_others():
    # Paged (prefill-first): A decodes, B's prefill pass interrupts it, then both decode.
    cost = LinearCost(base_s=0.01, per_token_s=1e-3)
    stream = make_stream([0.0, 0.025], 8, [4, 3])  # B arrives during A's first decode
    out = simulate(stream, PagedPolicyConfig(name="p"), setup(cost, kv_blocks=20, block_size=16))
    it = out.iterations
    d = it["duration_s"].to_numpy()
    assert it["prefill_tokens"].tolist() == [8, 0, 8, 0, 0]
    # A: prefill, decode (gap d1), B's prefill, decode (gap d2 + d3), decode (gap d4).
    # B: prefill (its first token), decode (gap d3), decode (gap d4).
    want = sorted([(d[1], 1), (d[2] + d[3], 1), (d[3], 1), (d[4], 2)])
    got = sorted(zip(out.itl["gap_s"], out.itl["count"], strict=True))
    assert [c for _, c in got] == [c for _, c in want]
    assert np.allclose([g for g, _ in got], [g for g, _ in want], rtol=0, atol=1e-12)


def test_members_that_had_the_same_previous_event_share_one_weighted_gap():
    cost = LinearCost(base_s=0.01)
    stream = make_stream(np.zeros(20), 16, 30)
    out = simulate(
        stream, ContinuousPolicyConfig(name="c", max_batch_size=20), setup(cost, kv_blocks=200, block_size=16),
    )
    assert len(out.itl) == 29 and (out.itl["count"] == 20).all()  # one entry per decode pass
    assert np.allclose(out.itl["gap_s"], 0.01)


def test_a_preempted_request_resumes_its_stream_with_the_token_of_its_re_prefill():
    # Block size 4, 6 blocks: three requests outgrow the cache and the newest is preempted.
    cost = LinearCost(base_s=0.01)
    stream = make_stream(np.zeros(3), 4, 20)
    out = simulate(stream, PagedPolicyConfig(name="p"), setup(cost, kv_blocks=6, block_size=4))
    req = out.requests
    assert req["preemptions"].sum() >= 1 and (req["status"] == "completed").all()
    # One gap per token after the first, the re-prefill's token included.
    assert int(out.itl["count"].sum()) == int((req["output_tokens"] - 1).sum())
    # The preempted request's longest gap spans its time out of the batch.
    assert out.itl["gap_s"].max() > 5 * 0.01


@pytest.mark.parametrize("events_per_slice", [1, 2, 3, 1 << 20])
def test_to_frame_gives_the_event_memory_back_and_keeps_the_rows(events_per_slice, monkeypatch):
    """The recorder's event times are emptied once copied (the table needs no second copy of
    them), and the rows, whatever the slice size, are one per stream event with veterans, then
    the joiners' gaps with a positive count."""
    monkeypatch.setattr(itl_module, "_EVENTS_PER_SLICE", events_per_slice)
    recorder = ITLRecorder()
    stream = recorder.new_stream()
    stream.times.extend([1.0, 1.5, 2.5, 4.0])
    stream.run_starts.extend([1, 3])  # no veterans at the first event, 2 from the second, 0 from the fourth
    stream.run_counts.extend([2, 0])
    stream.gaps.extend([0.25, 0.75])
    stream.counts.extend([1, 0])
    recorder.add(9.0, 4)
    frame = recorder.to_frame()
    assert frame["gap_s"].tolist() == [9.0, 0.5, 1.0, 0.25]
    assert frame["count"].tolist() == [4, 2, 2, 1]
    assert frame["count"].dtype == np.int64
    assert len(stream.times) == len(stream.run_starts) == len(stream.gaps) == 0


@settings(max_examples=examples(2))
@given(
    st.integers(0, 30).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(0.0, 2.0, allow_nan=False), min_size=n, max_size=n),
            st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, 4)), max_size=8),
        )
    ),
    st.integers(1, 6),
)
def test_stream_rows_equal_a_per_event_expansion(events, events_per_slice):
    """Rows of one stream, sliced any way: per event its veterans' gap (count from the run that
    covers it, zero counts dropped), exactly as expanding the runs event by event gives."""
    steps, runs = events
    times = np.cumsum(steps).tolist()
    runs = sorted(dict(runs).items())  # distinct run starts, ascending
    expected = []
    for i, t in enumerate(times):
        count = next((c for start, c in reversed(runs) if start <= i), 0)
        if count:
            expected.append((t - (times[i - 1] if i else 0.0), count))
    original = itl_module._EVENTS_PER_SLICE
    itl_module._EVENTS_PER_SLICE = events_per_slice
    try:
        recorder = ITLRecorder()
        stream = recorder.new_stream()
        stream.times.extend(times)
        stream.run_starts.extend([start for start, _ in runs])
        stream.run_counts.extend([count for _, count in runs])
        frame = recorder.to_frame()
    finally:
        itl_module._EVENTS_PER_SLICE = original
    assert list(zip(frame["gap_s"].tolist(), frame["count"].tolist(), strict=True)) == expected
