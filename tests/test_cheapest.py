"""``capacity --cheapest``: the answer meets the SLO when simulated on its own, it is minimal, the
frontier is the Pareto set of what was run, and bad options are one ``error:`` line.

The direct check rebuilds the winning fleet from its configuration (GPU, TP, replicas) and runs
it with :func:`sim.run`, outside the search and its task machinery.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from sim.cli import main
from sim.config import Scenario
from sim.sweeps.cheapest import cheapest_fleet

SLO = {"ttft_p99_s": 0.5, "tpot_p99_s": 0.04}

TINY = {
    "name": "cheap",
    "seed": 9,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 300,
        "arrival": {"kind": "poisson", "rate": 16.0},
        "prompt_tokens": {"kind": "uniform", "low": 64, "high": 768},
        "output_tokens": {"kind": "uniform", "low": 8, "high": 192},
    },
    "policies": [{"name": "continuous", "kind": "continuous", "max_batch_size": 32}],
}


@pytest.fixture(scope="module")
def report():  # noqa: ANN201 - a CheapestReport
    return cheapest_fleet(Scenario(**TINY), SLO, gpus=["a100-80gb", "a40"], tensor_parallel=[1, 2], max_gpus=16)


def _direct(gpu: str, tp: int, replicas: int) -> pd.Series:
    scenario = Scenario(**TINY).replace(gpu=gpu, tensor_parallel=tp, replicas=replicas)
    return sim.run(scenario, load_frac=False).summary.iloc[0]


def _meets(row: pd.Series) -> bool:
    within = all(row[column] <= bound for column, bound in SLO.items())
    return bool(within and row["completed"] == row["requests"])


def test_the_cheapest_fleet_meets_the_slo_when_simulated_directly(report) -> None:  # noqa: ANN001
    best = report.best
    assert best is not None
    row = _direct(best["gpu"], int(best["tensor_parallel"]), int(best["replicas"]))
    assert _meets(row)
    assert row["fleet_usd_per_hour"] == pytest.approx(best["fleet_usd_per_hour"])
    assert best["replicas"] > 1  # the SLO binds: the workload needs more than one replica
    # minimal: one replica fewer of the same configuration misses the SLO
    assert not _meets(_direct(best["gpu"], int(best["tensor_parallel"]), int(best["replicas"]) - 1))


def test_no_meeting_fleet_that_was_run_is_cheaper_than_the_answer(report) -> None:  # noqa: ANN001
    met = report.runs[report.runs["meets"]]
    assert report.best["fleet_usd_per_hour"] == met["fleet_usd_per_hour"].min()
    smallest = report.configs.dropna(subset=["fleet_usd_per_hour"])
    assert report.best["fleet_usd_per_hour"] == smallest["fleet_usd_per_hour"].min()


def test_the_frontier_is_the_pareto_set_of_the_meeting_fleets(report) -> None:  # noqa: ANN001
    met = report.runs[report.runs["meets"]]
    for index, row in met.iterrows():
        others = met.drop(index)
        dominated = (
            (others["fleet_usd_per_hour"] <= row["fleet_usd_per_hour"])
            & (others["ttft_p99_s"] <= row["ttft_p99_s"])
            & ((others["fleet_usd_per_hour"] < row["fleet_usd_per_hour"]) | (others["ttft_p99_s"] < row["ttft_p99_s"]))
        ).any()
        assert bool(report.runs.loc[index, "frontier"]) == (not dominated), row["fleet"]
    assert not report.runs.loc[~report.runs["meets"], "frontier"].any()


def test_cli_writes_the_answer_the_tables_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY | {"gpu_hour_usd": 1.5}))
    out = tmp_path / "out"
    argv = ["capacity", str(path), "--cheapest", "--slo", "ttft_p99_s=0.5", "--slo", "tpot_p99_s=0.04"]
    assert main([*argv, "--gpus", "a100-80gb,h100-sxm", "--tp", "1", "--workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Cheapest within the SLO")
    assert {p.name for p in out.iterdir()} >= {"cheapest.csv", "configs.csv", "cheapest.md", "frontier.png"}
    runs = pd.read_csv(out / "cheapest.csv")
    # a single gpu_hour_usd prices the scenario's own GPU; the other keeps its catalog price
    per_gpu = (runs["fleet_usd_per_hour"] / runs["num_gpus"]).groupby(runs["gpu"]).first()
    assert per_gpu["a100-80gb"] == pytest.approx(1.5) and per_gpu["h100-sxm"] == pytest.approx(3.35)
    # the same command again replaces the folder it wrote
    assert main([*argv, "--gpus", "a100-80gb", "--tp", "1", "--workers", "1", "--out", str(out), "--quiet"]) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "a10"], "did you mean 'a40'"),
        (["--tp", "two"], "--tp"),
        (["--tp", "0"], "--tp"),
        (["--max-gpus", "0"], "max_gpus"),
        (["--policy", "contnuous"], "did you mean 'continuous'"),
        (["--split-gpus", "4"], "--split-gpus and --cheapest"),
    ],
)
def test_bad_cheapest_options_exit_2_with_one_line(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    argv = ["capacity", str(path), "--cheapest", "--slo", "ttft_p99_s=0.5", "--out", str(tmp_path / "o"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "o").exists()


def test_a_degree_the_model_cannot_use_is_reported_not_fatal() -> None:
    found = cheapest_fleet(Scenario(**TINY), SLO, gpus=["a100-80gb"], tensor_parallel=[1, 3], max_gpus=8)
    notes = found.configs.set_index("tensor_parallel")["note"]
    assert "tensor_parallel" in notes[3] and found.best is not None and found.best["tensor_parallel"] == 1


def test_the_cost_span_prunes_only_fleets_that_cannot_be_within_it() -> None:
    scenario = Scenario(**TINY)
    kwargs = {"gpus": ["a100-80gb", "a40"], "tensor_parallel": [1, 2], "max_gpus": 16}
    pruned = cheapest_fleet(scenario, SLO, cost_span=1.2, **kwargs)
    full = cheapest_fleet(scenario, SLO, cost_span=0, **kwargs)
    assert pruned.best["fleet"] == full.best["fleet"]
    assert len(pruned.runs) < len(full.runs)  # the span saved runs
    cheapest = full.best["fleet_usd_per_hour"]
    for (_, kept), (_, every) in zip(pruned.configs.iterrows(), full.configs.iterrows(), strict=True):
        if kept["note"].startswith("given up"):  # its smallest meeting fleet lies beyond the span
            assert not every["fleet_usd_per_hour"] <= 1.2 * cheapest
        else:
            assert kept["smallest_fleet"] == every["smallest_fleet"]


def test_a_degree_above_the_gpu_budget_is_reported_without_running() -> None:
    found = cheapest_fleet(Scenario(**TINY), SLO, gpus=["a100-80gb"], tensor_parallel=[1, 4], max_gpus=2)
    notes = found.configs.set_index("tensor_parallel")["note"]
    assert "budget" in notes[4] and (found.runs["tensor_parallel"] != 4).all()
