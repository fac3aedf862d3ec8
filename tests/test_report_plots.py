"""Plot helpers: one Figure per call, expected lines/axes, binning that conserves totals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from sim.errors import UserError
from sim.metrics.summary import summarize_run
from sim.report import plots

POLICIES = ["static", "continuous", "paged"]


def make_requests(policies: list[str], n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    frames = []
    for index, policy in enumerate(policies):
        arrival = np.sort(rng.uniform(0, 50, n))
        e2e = rng.exponential(1.0 + index, n)
        ttft = e2e * 0.1
        frames.append(
            pd.DataFrame(
                {
                    "policy": policy,
                    "request_id": np.arange(n),
                    "replica": 0,
                    "arrival_s": arrival,
                    "prompt_tokens": 100,
                    "output_tokens": rng.integers(1, 500, n),
                    "status": np.where(np.arange(n) % 10 == 0, "timed_out", "completed"),
                    "first_scheduled_s": arrival,
                    "first_token_s": arrival + ttft,
                    "completion_s": arrival + e2e,
                    "queue_delay_s": 0.0,
                    "ttft_s": ttft,
                    "tpot_s": 0.01,
                    "e2e_s": e2e,
                    "norm_latency_s": 0.01,
                    "preemptions": 0,
                    "retries": 0,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def make_iterations(policies: list[str], n: int = 2000, replicas: int = 2) -> pd.DataFrame:
    rng = np.random.default_rng(9)
    frames = []
    for policy in policies:
        for replica in range(replicas):
            duration = rng.uniform(0.005, 0.05, n)
            gaps = rng.exponential(0.01, n)
            start = np.cumsum(gaps + duration) - duration  # back-to-back with gaps, no overlap
            used = rng.integers(0, 1000, n)
            frames.append(
                pd.DataFrame(
                    {
                        "policy": policy,
                        "replica": replica,
                        "start_s": start,
                        "duration_s": duration,
                        "batch_size": rng.integers(1, 64, n),
                        "prefill_tokens": 0,
                        "decode_tokens": 1,
                        "kv_blocks_used": used,
                        "kv_blocks_total": 1000,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def lines_with_labels(ax, labels):
    return [line for line in ax.get_lines() if line.get_label() in labels]


def cdf_lines(ax):
    return [line for line in ax.get_lines() if str(line.get_gid()).startswith("cdf ")]


def test_latency_cdf_one_monotone_line_per_policy():
    fig = plots.latency_cdf(make_requests(POLICIES), metric="e2e_s")
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    lines = cdf_lines(fig.axes[0])
    assert [line.get_gid() for line in lines] == [f"cdf {p}" for p in POLICIES]
    for line in lines:
        x, y = line.get_xdata(), line.get_ydata()
        assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) >= 0)
        assert y[0] == 0.0 and y[-1] == 1.0
    single = plots.latency_cdf(make_requests(["a"]).drop(columns=["policy"]))
    assert len(cdf_lines(single.axes[0])) == 1


def test_latency_cdf_log_ms_axis_and_distinct_styles():
    ax = plots.latency_cdf(make_requests(POLICIES), metric="ttft_s").axes[0]
    assert ax.get_xscale() == "log"
    assert "(ms" in ax.get_xlabel()
    lines = cdf_lines(ax)
    assert len({str(line.get_linestyle()) for line in lines}) == len(POLICIES)
    # x values are in ms: the largest equals the data's maximum TTFT x 1000.
    requests = make_requests(POLICIES)
    largest_s = requests.loc[requests["policy"] == "static", "ttft_s"].max()
    assert lines[0].get_xdata().max() == pytest.approx(largest_s * 1000)


def test_latency_cdf_p50_p99_markers_at_the_percentiles():
    requests = make_requests(POLICIES)
    ax = plots.latency_cdf(requests, metric="e2e_s").axes[0]
    for name, q in (("p50", 50), ("p99", 99)):
        markers = [line for line in ax.get_lines() if line.get_gid() == name]
        assert len(markers) == len(POLICIES)
        for policy, marker in zip(POLICIES, markers, strict=True):
            values = requests.loc[requests["policy"] == policy, "e2e_s"]
            assert marker.get_xdata()[0] == pytest.approx(np.percentile(values, q) * 1000, rel=1e-9)
            assert marker.get_ydata()[0] == q / 100
    labels = [line.get_label() for line in cdf_lines(ax)]
    assert all(" p50 " in label and " p99 " in label and " ms" in label for label in labels)


def test_latency_cdf_timed_out_mass_at_the_timeout_and_labelled():
    requests = make_requests(["a", "b"])
    late = requests["status"] == "timed_out"
    requests.loc[late, ["e2e_s", "ttft_s"]] = np.nan  # gave up before a first token
    requests.loc[requests.index[1], "status"] = "rejected"
    ax = plots.latency_cdf(requests, metric="e2e_s", timeout_s=30.0).axes[0]
    line = cdf_lines(ax)[0]
    x, y = line.get_xdata(), line.get_ydata()
    share = late[requests["policy"] == "a"].mean()
    jump = y[x == 30_000.0]
    assert jump.max() - y[x < 30_000.0].max() == pytest.approx(share, abs=1e-9)
    assert y[-1] == pytest.approx(1 - 1 / 200)  # the rejected request is not on the curve
    assert [line.get_gid() for line in ax.get_lines()].count("timeout") == 1
    label = next(t for t in ax.texts if t.get_gid() == "timeout-label").get_text()
    assert f"a {share:.1%}" in label and "30 s" in label
    legend = line.get_label()
    assert f"timed out {share:.1%}" in legend and "rejected 0.5%" in legend
    # No timeout given: the timed-out requests are missing from the curve, still stated in the legend.
    plain = cdf_lines(plots.latency_cdf(requests, metric="e2e_s").axes[0])[0]
    assert plain.get_ydata()[-1] == pytest.approx(1 - share - 1 / 200) and "timed out" in plain.get_label()


def test_timeline_panels_and_kv_mean_matches_summary():
    iterations = make_iterations(POLICIES[:2])
    fig = plots.timeline(iterations, requests=make_requests(POLICIES[:2]))
    assert len(fig.axes) == 3 + 2  # batch, KV, queue, then one utilization panel per policy
    for ax in fig.axes[:3]:
        assert [line.get_label() for line in ax.get_lines()] == POLICIES[:2]
        assert len({str(line.get_linestyle()) for line in ax.get_lines()}) == 2
    # Without mfu/mbu columns each utilization panel has the busy line only.
    for ax, policy in zip(fig.axes[3:], POLICIES[:2], strict=True):
        assert ax.get_gid() == f"utilization {policy}"
        assert [line.get_label() for line in ax.get_lines()] == [f"{policy} busy"]
    assert len(plots.timeline(iterations).axes) == 2 + 2  # no requests: no queue panel
    # Over bins spanning exactly the run, the binned KV line averages to kv_mean_frac.
    one = iterations[iterations["policy"] == "static"]
    span_s = (one["start_s"] + one["duration_s"]).max() - one["start_s"].min()
    kv_line = plots.timeline(one, bin_s=span_s / 37).axes[1].get_lines()[0]
    x, y = kv_line.get_xdata(), kv_line.get_ydata()
    no_requests = pd.DataFrame({c: pd.Series(dtype=float) for c in _request_columns()})
    row = summarize_run(no_requests, one, scenario="s", policy="static")
    assert np.sum(y[:-1] * np.diff(x)) / span_s == pytest.approx(row["kv_mean_frac"], rel=1e-9)


def test_queue_length_integrates_to_total_wait():
    requests = make_requests(["a"]).assign(first_scheduled_s=lambda f: f["arrival_s"] + 0.5)
    edges = np.linspace(0, 60, 121)
    from sim.report.series import queue_length

    assert np.sum(queue_length(requests, edges) * np.diff(edges)) == pytest.approx(0.5 * len(requests))


def _request_columns():
    return [
        "arrival_s",
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
    ]


def test_binned_time_mean_matches_brute_force():
    rng = np.random.default_rng(1)
    start = rng.uniform(0, 10, 300)
    duration = rng.uniform(0, 2, 300)
    values = rng.uniform(0, 5, 300)
    edges = np.linspace(-1, 13, 29)
    overlap = np.clip(
        np.minimum(edges[1:, None], start + duration) - np.maximum(edges[:-1, None], start), 0, None
    )
    expected = (overlap * values).sum(axis=1) / np.diff(edges)
    assert plots.binned_time_mean(start, duration, values, edges) == pytest.approx(
        expected, abs=1e-9
    )


def test_throughput_default_window_is_round_and_stated():
    title = plots.throughput_over_time(make_requests(["a"])).axes[0].get_title()
    assert "mean per 1 s window" in title  # span ~55 s / 60 windows -> 1 s


def test_throughput_over_time_conserves_completed_tokens():
    requests = make_requests(POLICIES)
    fig = plots.throughput_over_time(requests, bin_s=0.5)
    assert "output tokens/s" in fig.axes[0].get_title().lower() and "0.5 s window" in fig.axes[0].get_title()
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == POLICIES
    for policy, line in zip(POLICIES, lines, strict=True):
        done = requests[(requests["policy"] == policy) & (requests["status"] == "completed")]
        tokens = np.sum(line.get_ydata()[:-1] * np.diff(line.get_xdata()))
        assert tokens == pytest.approx(done["output_tokens"].sum())


def make_sweep() -> pd.DataFrame:
    rows = []
    for rate in (1.0, 2.0, 4.0, 8.0):
        for seed in range(3):
            # "fast" keeps up with every load; "slow" saturates at 3 req/s.
            rows.append(
                {
                    "policy": "fast",
                    "seed": seed,
                    "workload.arrival.rate": rate,
                    "throughput_rps": rate * 0.99,
                    "ttft_p99_s": 0.1 * rate + 0.01 * seed,
                }
            )
            rows.append(
                {
                    "policy": "slow",
                    "seed": seed,
                    "workload.arrival.rate": rate,
                    "throughput_rps": min(rate, 3.0),
                    "ttft_p99_s": 0.2 * rate**2 + 0.01 * seed,
                }
            )
    return pd.DataFrame(rows)


def test_latency_vs_load_bands_and_saturation_marker():
    fig = plots.latency_vs_load(make_sweep())
    ax = fig.axes[0]
    curves = lines_with_labels(ax, {"fast", "slow"})
    assert len(curves) == 2
    assert list(curves[1].get_ydata()) == pytest.approx(  # in ms, as the tables show TTFT
        [1000 * (0.2 + 0.01), 1000 * (0.8 + 0.01), 1000 * (3.2 + 0.01), 1000 * (12.8 + 0.01)]
    )
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "TTFT p99 (ms)"
    assert ax.get_xlabel() == "arrival rate (req/s)"
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2
    markers = [line for line in ax.get_lines() if line.get_gid() == "saturation"]
    assert len(markers) == 1 and markers[0].get_xdata()[0] == 4.0


def test_latency_vs_load_unknown_column():
    with pytest.raises(UserError, match="ttft_p99_s"):
        plots.latency_vs_load(make_sweep(), y="ttft_p99")


def test_speedup_bars_two_bars_per_scenario():
    table = pd.DataFrame(
        {
            "scenario": ["a", "b", "c"],
            "speedup": [2.0, 3.0, 0.9],
            "throughput_gain": [1.1, 2.0, 1.0],
        }
    )
    ax = plots.speedup_bars(table).axes[0]
    assert len(ax.containers) == 2
    assert [bar.get_height() for bar in ax.containers[0]] == [2.0, 3.0, 0.9]
    assert len([line for line in ax.get_lines() if line.get_gid() == "parity"]) == 1


def test_bad_bin_width_is_a_user_error():
    with pytest.raises(UserError, match="bin_s"):
        plots.throughput_over_time(make_requests(["a"]), bin_s=0)


def test_save_figure_is_deterministic_and_leaves_pyplot_alone(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = plots.latency_cdf(make_requests(POLICIES))
    first, second = tmp_path / "a" / "cdf.png", tmp_path / "b.png"
    plots.save_figure(fig, first)
    plots.save_figure(fig, second)
    assert first.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.read_bytes() == second.read_bytes()
    svg_a, svg_b = tmp_path / "a.svg", tmp_path / "b.svg"
    plots.save_figure(fig, svg_a)
    plots.save_figure(fig, svg_b)
    assert svg_a.read_bytes() == svg_b.read_bytes()
    assert plt.get_fignums() == before


def test_timeline_utilization_lines_average_to_busy_mfu_and_mbu():
    one = make_iterations(["static"])
    rng = np.random.default_rng(3)
    one = one.assign(mfu=rng.uniform(0, 0.1, len(one)), mbu=rng.uniform(0.2, 0.8, len(one)))
    span_s = (one["start_s"] + one["duration_s"]).max() - one["start_s"].min()
    lines = plots.timeline(one, bin_s=span_s / 23).axes[2].get_lines()  # the one utilization panel
    assert [line.get_label() for line in lines] == ["static busy", "static MBU", "static MFU"]
    capacity_s = span_s * one["replica"].nunique()
    expected = [one["duration_s"].sum(), (one["mbu"] * one["duration_s"]).sum(), (one["mfu"] * one["duration_s"]).sum()]
    for line, busy_s in zip(lines, expected, strict=True):
        x, y = line.get_xdata(), line.get_ydata()
        assert np.sum(y[:-1] * np.diff(x)) / span_s == pytest.approx(busy_s / capacity_s, rel=1e-9)


COMMITTED_SPEEDUPS = pd.DataFrame(  # results/batching_speedup.csv, whose 1.90x label crossed the frame
    {
        "scenario": ["seed_long", "seed_medium", "seed_mixed", "seed_short"],
        "speedup": [1.34286, 1.58763, 1.90211, 1.57324],
        "throughput_gain": [1.34376, 1.58412, 1.8778, 1.5806],
    }
)


@pytest.mark.parametrize(
    "table",
    [
        COMMITTED_SPEEDUPS,
        COMMITTED_SPEEDUPS.assign(speedup=[12.5, 1.0, 0.4, 3.0]),  # one tall bar
        COMMITTED_SPEEDUPS.assign(throughput_gain=[1.0, 1.0, 1.0, 1.0]),  # the tallest label on the first bar
    ],
    ids=["committed", "tall", "first"],
)
def test_speedup_bar_labels_lie_inside_the_axes_and_clear_of_the_legend(table):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.speedup_bars(table)
    FigureCanvasAgg(fig).draw()  # lays the figure out as saving it does
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    frame = ax.get_window_extent(renderer)
    (legend,) = [legend.get_window_extent(renderer) for legend in [*fig.legends, ax.get_legend()] if legend]
    labels = [t for t in ax.texts if t.get_text()]
    assert len(labels) == 2 * len(table)
    for box in [legend] + [text.get_window_extent(renderer) for text in labels]:
        assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), box
    for text in labels:
        box = text.get_window_extent(renderer)
        assert frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1), text.get_text()
        assert not box.overlaps(legend), text.get_text()
