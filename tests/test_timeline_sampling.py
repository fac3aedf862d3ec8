"""The timeline's means are the summary's, whether a run kept every pass (k = 1) or every k-th.

A run keeps every k-th forward pass per policy beyond ``metrics.max_iteration_rows``
(:func:`sim.metrics.records.sample_every_kth`), while its summary is computed from all
passes. Each plotted line (the PNG's and the HTML page's) is a time-weighted mean per bin;
integrated over the bins and divided by the summary's window it must give the summary's
``gpu_busy_frac``, ``kv_mean_frac``, ``mbu_mean`` and ``mfu_mean``: exactly at k = 1, and at
k > 1 within the sampling error of the kept rows, far inside the factor k that weighting
each row as one pass loses. The summary has no time-weighted batch size, so that line is
held to sum(b_i d_i) over the complete records of the same deterministic run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sim
from sim.config import Scenario
from sim.io.outputs import PLOTS
from sim.report import plots
from sim.report.html import timeline_figure

SAMPLED_ROWS = 300
SCENARIO = {
    "name": "timeline_sampling",
    "seed": 11,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "replicas": 2,
    "router": "least_outstanding",
    "workload": {
        "requests": 240,
        "arrival": {"kind": "poisson", "rate": 12.0},
        "prompt_tokens": {"kind": "uniform", "low": 64, "high": 512},
        "output_tokens": {"kind": "uniform", "low": 8, "high": 160},
    },
    "policies": [
        {"name": "continuous", "kind": "continuous", "max_batch_size": 16},
        {"name": "vllm", "kind": "paged", "max_batch_size": 64},
    ],
}
POLICIES = [p["name"] for p in SCENARIO["policies"]]
SUMMARY_OF = {"busy": "gpu_busy_frac", "kv": "kv_mean_frac", "mbu": "mbu_mean", "mfu": "mfu_mean"}
PNG_LABELS = {"busy": "busy", "mbu": "MBU", "mfu": "MFU"}  # utilization panel: "<policy> <name>"
# Sampling error of every k-th pass at k = 11, measured on this run: busy, KV, MBU and batch
# within 1.6 %, MFU 14 % (its FLOPs sit in the few prefill passes, so fewer are kept). A row
# weighted as one pass would be off by 1 - 1/k = 91 %.
SAMPLING_REL = {"busy": 0.05, "kv": 0.05, "mbu": 0.05, "batch": 0.05, "mfu": 0.3}


def _run(max_rows: int | None) -> sim.RunResult:
    data = dict(SCENARIO)
    if max_rows is not None:
        data["metrics"] = {"max_iteration_rows": max_rows}
    return sim.run(Scenario.model_validate(data))


@pytest.fixture(scope="module")
def complete() -> sim.RunResult:
    result = _run(None)
    assert set(result.facts["iterations_every"].values()) == {1}
    return result


@pytest.fixture(scope="module")
def sampled() -> sim.RunResult:
    result = _run(SAMPLED_ROWS)
    assert min(result.facts["iterations_every"].values()) >= 8  # many passes per row, per policy
    return result


def expected_means(complete: sim.RunResult, policy: str) -> dict[str, float]:
    """Per quantity, the mean over the summary's window and workers: the summary's own figure,
    and for batch size sum(b_i d_i) / (window x workers) over all passes."""
    row = complete.summary.set_index("policy").loc[policy]
    means = {key: float(row[column]) for key, column in SUMMARY_OF.items()}
    every = complete.iterations[complete.iterations["policy"] == policy]
    capacity_s = float(row["duration_s"]) * int(row["replicas"])
    means["batch"] = float((every["batch_size"] * every["duration_s"]).sum()) / capacity_s
    return means


def png_means(result: sim.RunResult, policy: str) -> dict[str, float]:
    """Each of ``policy``'s lines on the saved ``timeline.png``, integrated over its bins
    and divided by the summary's window."""
    fig = PLOTS["timeline.png"](result, plots)
    window_s = float(result.summary.set_index("policy").loc[policy, "duration_s"])
    lines = {("batch", line.get_label()): line for line in fig.axes[0].get_lines()}
    lines |= {("kv", line.get_label()): line for line in fig.axes[1].get_lines()}
    panel = next(ax for ax in fig.axes if ax.get_gid() == f"utilization {policy}")
    lines |= {(key, line.get_label()): line for line in panel.get_lines() for key in PNG_LABELS}
    means = {}
    for key in SUMMARY_OF.keys() | {"batch"}:
        label = f"{policy} {PNG_LABELS[key]}" if key in PNG_LABELS else policy
        x, y = lines[key, label].get_xdata(), lines[key, label].get_ydata()
        means[key] = float(np.sum(y[:-1] * np.diff(x))) / window_s  # step lines repeat the last value
    return means


def html_means(result: sim.RunResult, policy: str) -> dict[str, float]:
    """Each of ``policy``'s traces in the HTML timeline (bin centres, equal widths), likewise."""
    figure = timeline_figure(result)
    titles = {axis["title"]["text"]: name for name, axis in figure["layout"].items() if name.startswith("yaxis")}
    keys = {"batch size": "batch", "KV used (fraction)": "kv", "GPU busy (fraction)": "busy",
            "MBU (fraction)": "mbu", "MFU (fraction)": "mfu"}  # fmt: skip
    window_s = float(result.summary.set_index("policy").loc[policy, "duration_s"])
    means = {}
    for title, key in keys.items():
        axis = "y" + titles[title].removeprefix("yaxis")
        (trace,) = [t for t in figure["data"] if t["name"] == policy and t["yaxis"] == axis]
        width = (trace["x"][-1] - trace["x"][0]) / (len(trace["x"]) - 1)  # centres are rounded to 4 decimals
        means[key] = float(np.sum(trace["y"])) * width / window_s
    return means


@pytest.mark.parametrize("policy", POLICIES)
def test_unsampled_timeline_means_are_the_summarys(complete: sim.RunResult, policy: str) -> None:
    expected = expected_means(complete, policy)
    assert expected["busy"] > 0.3 and expected["mfu"] > 0  # a busy run: a lost factor would show
    assert png_means(complete, policy) == pytest.approx(expected, rel=1e-9)
    assert html_means(complete, policy) == pytest.approx(expected, rel=1e-3)  # the page rounds to 5 decimals


@pytest.mark.parametrize("policy", POLICIES)
def test_sampled_lines_count_each_row_as_k_passes(sampled: sim.RunResult, policy: str) -> None:
    """The mechanism, exactly: each kept row's value x duration enters k times."""
    row = sampled.summary.set_index("policy").loc[policy]
    rows = sampled.iterations[sampled.iterations["policy"] == policy]
    weight = sampled.facts["iterations_every"][policy] * rows["duration_s"] / (row["duration_s"] * row["replicas"])
    kv = rows["kv_blocks_used"] / rows["kv_blocks_total"]
    values = {"busy": 1.0, "kv": kv, "mbu": rows["mbu"], "mfu": rows["mfu"], "batch": rows["batch_size"]}
    expected = {key: float((weight * value).sum()) for key, value in values.items()}
    assert png_means(sampled, policy) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("policy", POLICIES)
def test_sampled_timeline_means_are_the_summarys(complete: sim.RunResult, sampled: sim.RunResult, policy: str) -> None:
    pd.testing.assert_frame_equal(sampled.summary, complete.summary)  # same run: the summary uses all passes
    expected = expected_means(complete, policy)
    for drawn in (png_means(sampled, policy), html_means(sampled, policy)):
        for key, value in expected.items():
            assert drawn[key] == pytest.approx(value, rel=SAMPLING_REL[key]), key


def test_a_worker_without_kept_passes_still_counts(complete: sim.RunResult) -> None:
    """Averaging over the workers the summary counts, not the replica ids the rows happen to hold."""
    rows = complete.iterations[(complete.iterations["policy"] == "continuous") & (complete.iterations["replica"] == 0)]
    from sim.report.series import timeline

    counted = timeline(rows, replicas={"continuous": 2}).series["continuous"]["busy"]
    guessed = timeline(rows).series["continuous"]["busy"]
    np.testing.assert_allclose(counted * 2, guessed)


def test_sampling_factor_must_name_each_group(complete: sim.RunResult) -> None:
    from sim.errors import UserError

    with pytest.raises(UserError, match="every has no entry for 'vllm'"):
        plots.timeline(complete.iterations, every={"continuous": 2})
    with pytest.raises(UserError, match="every must be an integer >= 1, got 0"):
        plots.timeline(complete.iterations, every=0)
