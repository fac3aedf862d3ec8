"""Records at scale: summaries from all records, sampled iterations kept, summary-only runs, estimates.

``run`` summarizes each policy from its full records, then keeps every k-th iteration
(k = ceil(passes / metrics.max_iteration_rows), per policy) or, with ``summary_only``, no
records at all. Neither may change a summary number: they are compared exactly against
a direct ``simulate`` + ``summarize_run`` on the unsampled records.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from array import array
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from fakes import setup

import sim
from sim.config import Scenario
from sim.fleet import colocated_pools, mean_gpu_price
from sim.hardware.utilization import UTILIZATION_COLUMNS
from sim.metrics import estimate
from sim.metrics import records as records_module
from sim.metrics.estimate import estimate_run, forward_passes, warn_if_large
from sim.metrics.records import ALL_REDUCE_COLUMN, ITERATION_COLUMNS, IterationRecords, sample_every_kth
from sim.metrics.summary import summarize_run
from sim.resolve import resolve
from sim.uncertainty.trust import TRUST_COLUMNS
from sim.serving.engine import SimOutput, simulate

MAX_ROWS = 50
SCENARIO = {
    "name": "records_memory",
    "seed": 5,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "replicas": 2,
    "router": "least_outstanding",
    "workload": {
        "requests": 80,
        "arrival": {"kind": "poisson", "rate": 8.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 128},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 80},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 8},
        {"name": "vllm", "kind": "paged", "max_batch_size": 64},
    ],
    "slo": {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05},
    "metrics": {"max_iteration_rows": MAX_ROWS},
}
POLICIES = [p["name"] for p in SCENARIO["policies"]]


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return Scenario.model_validate(SCENARIO)


@pytest.fixture(scope="module")
def full(scenario: Scenario) -> sim.RunResult:
    return sim.run(scenario)


@pytest.fixture(scope="module")
def summary_only(scenario: Scenario) -> sim.RunResult:
    return sim.run(scenario, summary_only=True)


@pytest.fixture(scope="module")
def direct(scenario: Scenario) -> dict[str, SimOutput]:
    """Each policy simulated directly, its records unsampled."""
    resolved = resolve(scenario)
    return {
        policy.name: simulate(
            resolved.stream, policy,
            setup(
                resolved.cost_model, kv_blocks=resolved.kv.num_blocks, block_size=resolved.kv.block_size,
                replicas=scenario.replicas, router=scenario.router, seed=scenario.seed,
            ),
        )
        for policy in scenario.policies
    }


def test_summary_only_gives_the_same_summary_and_no_records(
    full: sim.RunResult, summary_only: sim.RunResult
) -> None:
    pd.testing.assert_frame_equal(summary_only.summary, full.summary, check_exact=True)
    assert summary_only.summary_only and not full.summary_only
    assert summary_only.facts["summary_only"] is True and "iterations_every" not in summary_only.facts
    for kept, empty in ((full.requests, summary_only.requests), (full.iterations, summary_only.iterations)):
        assert len(empty) == 0 and len(kept) > 0
        assert list(empty.columns) == list(kept.columns)
        assert empty.dtypes.equals(kept.dtypes)


def test_summary_is_that_of_the_unsampled_records(
    scenario: Scenario, full: sim.RunResult, direct: dict[str, SimOutput]
) -> None:
    for row in full.summary.to_dict("records"):
        out = direct[row["policy"]]
        assert len(out.iterations) > MAX_ROWS  # so sampling happened
        pools = colocated_pools(resolve(scenario))  # energy and cost, from every pass too
        expected = summarize_run(
            out.requests,
            out.iterations,
            scenario=scenario.name,
            policy=row["policy"],
            num_gpus=scenario.replicas,
            slo=scenario.slo,
            gpu_hour_usd=mean_gpu_price(pools),
            replicas=scenario.replicas,
            itl=out.itl,
            work=resolve(scenario).pass_work,
            pools=pools,
        )
        assert list(row) == [*expected, *TRUST_COLUMNS]  # the trust columns are appended by the runner
        assert math.isnan(expected.pop("load_frac"))  # the runner's, from its capacity replay (sim/saturation.py)
        for column, value in expected.items():
            same = value == row[column] or (isinstance(value, float) and math.isnan(value) and math.isnan(row[column]))
            assert same, (row["policy"], column, value, row[column])


def test_iterations_keep_every_kth_pass_per_policy(full: sim.RunResult, direct: dict[str, SimOutput]) -> None:
    every = full.facts["iterations_every"]
    assert list(every) == POLICIES
    for policy in POLICIES:
        complete = direct[policy].iterations
        kept = full.iterations[full.iterations["policy"] == policy]
        assert every[policy] == math.ceil(len(complete) / MAX_ROWS) > 1
        assert 0 < len(kept) <= MAX_ROWS
        np.testing.assert_array_equal(kept["start_s"], complete["start_s"].to_numpy()[:: every[policy]])
        np.testing.assert_array_equal(kept["replica"], complete["replica"].to_numpy()[:: every[policy]])


def test_policy_column_is_categorical_in_scenario_order(full: sim.RunResult) -> None:
    for frame in (full.requests, full.iterations):
        assert list(frame.columns[:1]) == ["policy"]
        assert isinstance(frame["policy"].dtype, pd.CategoricalDtype)
        assert list(frame["policy"].cat.categories) == POLICIES
        assert list(frame["policy"].unique()) == POLICIES
    assert list(full.iterations.columns[1:]) == [*ITERATION_COLUMNS, *UTILIZATION_COLUMNS, ALL_REDUCE_COLUMN]


def test_sampled_rows_do_not_view_the_full_table() -> None:
    frame = pd.DataFrame({"start_s": np.arange(1000.0)})
    sampled, every = sample_every_kth(frame, 30)
    assert every == 34 and len(sampled) == 30 and list(sampled.index) == list(range(30))
    assert not np.shares_memory(sampled["start_s"].to_numpy(), frame["start_s"].to_numpy())
    same, one = sample_every_kth(frame, 1000)
    assert one == 1 and same is frame


def test_iteration_rows_of_several_replicas_sort_like_a_stable_sort() -> None:
    rng = np.random.default_rng(0)
    records = IterationRecords()
    starts = rng.integers(0, 40, 500).astype(float)  # many ties, so the tie-break shows
    for i, start_s in enumerate(starts):
        records.append(int(rng.integers(0, 3)), start_s, 0.5, i, 1, 2, 3)
    assert len(records) == 500
    records.flush()  # the staged rows into the typed columns read below
    columns = {name: np.array(getattr(records, name)) for name in ITERATION_COLUMNS if name != "kv_blocks_total"}
    expected = pd.DataFrame(columns).assign(kv_blocks_total=np.int32(9))[list(ITERATION_COLUMNS)]
    expected = expected.sort_values(["start_s", "replica"], kind="stable", ignore_index=True)
    frame = records.to_frame(9)
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert len(records) == 0 and isinstance(records.start_s, array)


def test_estimate_grows_with_requests_and_policies(scenario: Scenario) -> None:
    small = estimate_run(scenario)
    large = estimate_run(scenario.replace(**{"workload.requests": 800}))
    alone = estimate_run(scenario, scenario.policies[:1])
    lean = estimate_run(scenario.replace(**{"workload.requests": 800}), summary_only=True)
    assert all(v > 0 for v in small)
    assert large[0] > small[0] and large[1] > small[1]
    assert alone[0] < small[0] and alone[1] < small[1]
    assert lean[0] < large[0] and lean[1] < large[1]


def test_forward_passes_estimate_within_2x(scenario: Scenario, full: sim.RunResult) -> None:
    resolved = resolve(scenario)
    for policy, measured in zip(scenario.policies, full.summary["iterations"], strict=True):
        assert 0.5 < forward_passes(resolved, policy) / measured < 2.0, policy.name


def test_large_run_warns_unless_summary_only(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = resolve(scenario)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_large(resolved, scenario.policies, summary_only=False) is None
    monkeypatch.setattr(estimate, "WARN_BYTES", 1.0)
    with pytest.warns(UserWarning, match="--summary-only"):
        message = warn_if_large(resolved, scenario.policies, summary_only=False)
    assert message and "GB" in message
    assert warn_if_large(resolved, scenario.policies, summary_only=True) is None


def test_the_cli_prints_the_estimate_before_it_simulates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warning is of use only before the run it warns about: it must be on stderr when the
    first policy starts, not printed with the results."""
    import sim.runner
    from sim.cli import main

    monkeypatch.setattr(estimate, "WARN_SECONDS", 0.0)  # any run is "large"
    seen_when_simulating: list[str] = []
    simulate_policy = sim.runner._simulate_policy

    def noting_stderr(*args: object, **kwargs: object) -> object:
        seen_when_simulating.append(capsys.readouterr().err)
        return simulate_policy(*args, **kwargs)

    monkeypatch.setattr(sim.runner, "_simulate_policy", noting_stderr)
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(SCENARIO))
    assert main(["run", str(scenario_file), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"]) == 0
    first = seen_when_simulating[0].splitlines()
    assert len(first) == 1 and first[0].startswith("warning: this run is estimated at ~")
    assert "estimated" not in "".join(seen_when_simulating[1:]) + capsys.readouterr().err  # said once


ESTIMATE_CHILD = """
import sys
from sim.io.scenario import load_scenario
from sim.metrics.estimate import estimate_run
scenario = load_scenario(sys.argv[1], {"workload.requests": int(sys.argv[2])})
print(estimate_run(scenario, [p for p in scenario.policies if p.name == "continuous"])[0])
"""

PEAK_OF_GRANDCHILD = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""
"""Runs a command and prints its exit code and peak RSS (KiB). Linux keeps a process's peak RSS across
``exec``, including the peak of the memory ``exec`` replaced: a child forked (or vforked) straight from a
pytest worker that had grown to 1 GiB reads 1 GiB, whatever it then does. This small launcher's own
child starts from the launcher's few MiB, so its peak is its own."""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux only")
def test_memory_estimate_is_within_25_percent_of_a_measured_cli_run(tmp_path: Path) -> None:
    """The README's next step at 50k requests (1.2M passes, ~10 s): the peak RSS of the whole
    ``python -m sim run`` process against ``estimate_run``'s prediction for it. The model of
    2026-12-01 predicted 207 MiB for the 293 MiB measured (0.71x)."""
    repo = Path(__file__).resolve().parents[1]
    quickstart, requests = repo / "scenarios" / "quickstart.yaml", 50_000
    env = {**os.environ, "PYTHONPATH": str(repo)}
    argv = [sys.executable, "-m", "sim", "run", str(quickstart), "--policy", "continuous",
            "--set", f"workload.requests={requests}", "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    measured = subprocess.run([sys.executable, "-c", PEAK_OF_GRANDCHILD, *argv], cwd=repo, env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
    status, peak_kib = (int(word) for word in measured.stdout.split())
    assert status == 0
    predicted = subprocess.run([sys.executable, "-c", ESTIMATE_CHILD, str(quickstart), str(requests)], cwd=repo,
                               env=env, capture_output=True, text=True, check=True)  # fmt: skip
    estimate, peak = float(predicted.stdout), peak_kib * 1024
    assert 0.8 < estimate / peak < 1.25, f"estimate {estimate / 2**20:.0f} MiB, peak {peak >> 20} MiB"


def test_staged_rows_reach_the_columns_in_order_across_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows packed in several batches (and a merged run straddling a batch edge) come out in
    append order with their values and types, as if each had been appended to the columns."""
    monkeypatch.setattr(records_module, "STAGE_ROWS", 4)
    records = IterationRecords()
    expected = []
    for i in range(7):
        records.append(0, float(i), 0.25, i, 100 + i, 2, 30000 + i, 0.5 * i, 5 * i, 7)
        expected.append((0, float(i), 0.25, i, 100 + i, 2, 30000 + i, 0.5 * i, 5 * i, 7))
    starts, durations, kvs = [7.0, 8.0, 9.0], [0.125, 0.125, 0.25], [40, 43, 46]
    used = [11, 12, 12]
    records.extend_decode_run(1, starts, durations, 3, used, kvs)
    expected += [(1, s, d, 3, 0, 3, u, 0.0, k, 0) for s, d, u, k in zip(starts, durations, used, kvs, strict=True)]
    records.extend_decode_run(1, [10.0], [0.5], 3, 12, [49])
    expected.append((1, 10.0, 0.5, 3, 0, 3, 12, 0.0, 49, 0))
    assert len(records) == len(expected) == 11
    frame = records.to_frame(64)
    columns = [name for name in ITERATION_COLUMNS if name != "kv_blocks_total"]
    assert list(frame[columns].itertuples(index=False, name=None)) == expected
    assert frame["replica"].dtype == np.int16 and frame["start_s"].dtype == np.float64
    assert frame["kv_blocks_used"].dtype == np.int32 and (frame["kv_blocks_total"] == 64).all()
