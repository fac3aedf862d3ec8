"""The Python API: one code path with the CLI, scenarios built in code, overrides, results, sweeps.

The API and the CLI must never disagree, so most tests run the same tiny scenario both
ways and compare what comes out: the summary (as the CLI's CSV formats it), the output
folder, and a sweep against a loop of single runs.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import sim
from sim.cli import main as cli_main
from sim.io.outputs import CSV_FLOAT_FORMAT
from sim.metrics.summary import EXTRA_COLUMNS, SUMMARY_COLUMNS
from sim.sweeps import sweep

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "name": "tiny_api",
    "seed": 3,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 50,
        "arrival": {"kind": "poisson", "rate": 6.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 96},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 60},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 8},
        {"name": "vllm", "kind": "paged", "max_batch_size": 64},
    ],
}
POLICIES = [p["name"] for p in TINY["policies"]]


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture(scope="module")
def tiny_result(tiny_file: Path) -> sim.RunResult:
    return sim.run(sim.load_scenario(tiny_file))


def as_csv(summary: pd.DataFrame) -> str:
    """The summary exactly as ``summary.csv`` stores it."""
    buffer = io.StringIO()
    summary.to_csv(buffer, index=False, float_format=CSV_FLOAT_FORMAT)
    return buffer.getvalue()


def cli_run(scenario_file: Path, out: Path, *extra: str) -> Path:
    assert cli_main(["run", str(scenario_file), "--out", str(out), "--quiet", *extra]) == 0
    return out


def assert_same_numbers(left: pd.DataFrame, right: pd.DataFrame, rel: float = 1e-9) -> None:
    """Same columns, same text cells, numeric cells equal to ``rel`` (NaN equals NaN)."""
    assert list(left.columns) == list(right.columns)
    for column in left.columns:
        a, b = left[column].to_numpy(), right[column].to_numpy()
        if pd.api.types.is_numeric_dtype(left[column]) and pd.api.types.is_numeric_dtype(
            right[column]
        ):
            np.testing.assert_allclose(
                a.astype(float), b.astype(float), rtol=rel, equal_nan=True, err_msg=column
            )
        else:
            assert list(map(str, a)) == list(map(str, b)), column


# --------------------------------------------------------------------------- API == CLI
def test_api_summary_equals_cli_summary_csv(
    tiny_file: Path, tiny_result: sim.RunResult, tmp_path: Path
) -> None:
    out = cli_run(tiny_file, tmp_path / "cli", "--no-plots")
    assert as_csv(tiny_result.summary) == (out / "summary.csv").read_text()
    from_cli = pd.read_csv(out / "summary.csv")
    assert tuple(tiny_result.summary.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    assert_same_numbers(tiny_result.summary.reset_index(drop=True), from_cli, rel=1e-5)


@pytest.mark.slow
def test_save_writes_the_same_files_as_the_cli(
    tiny_file: Path, tiny_result: sim.RunResult, tmp_path: Path
) -> None:
    cli_dir = cli_run(tiny_file, tmp_path / "cli")
    api_dir = tiny_result.save(tmp_path / "api")
    names = sorted(p.name for p in cli_dir.iterdir())
    assert names == sorted(p.name for p in Path(api_dir).iterdir())
    assert {"summary.csv", "requests.csv", "iterations.csv", "scenario.resolved.yaml"} <= set(names)
    for name in names:
        if not name.endswith(".png"):  # figures are compared by name only
            assert (cli_dir / name).read_bytes() == (Path(api_dir) / name).read_bytes(), name


def test_run_accepts_a_path(tiny_file: Path, tiny_result: sim.RunResult) -> None:
    assert as_csv(sim.run(tiny_file).summary) == as_csv(tiny_result.summary)


def test_scenario_built_in_code_runs_like_its_yaml(tiny_result: sim.RunResult) -> None:
    in_code = sim.Scenario(**TINY)
    assert in_code.model_dump() == tiny_result.scenario.model_dump()
    assert in_code.base_dir is None  # nothing to resolve relative paths against: none are used here
    assert as_csv(sim.run(in_code).summary) == as_csv(tiny_result.summary)


# ----------------------------------------------------------------- validation and overrides
BAD = [
    ("workload.arrival.rate", -1.0, "workload.arrival.rate"),
    ("policies.1.kind", "orca", "policies[1].kind"),
    ("workload.prompt_tokenz", {"kind": "fixed", "value": 8}, "prompt_tokenz"),
    ("seed", -4, "seed"),
]


def with_value(data: dict, dotted: str, value: object) -> dict:
    """A deep copy of ``data`` with one nested key (list indices as digits) set."""
    copy = yaml.safe_load(yaml.safe_dump(data))
    *parents, last = dotted.split(".")
    node = copy
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return copy


@pytest.mark.parametrize(("dotted", "value", "named"), BAD, ids=[b[0] for b in BAD])
def test_scenario_in_code_raises_the_same_user_error_as_yaml(
    dotted: str, value: object, named: str, tmp_path: Path
) -> None:
    bad = with_value(TINY, dotted, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(sim.UserError) as from_yaml:
        sim.load_scenario(path)
    with pytest.raises(sim.UserError) as from_code:
        sim.Scenario(**bad)
    assert named in str(from_yaml.value)
    assert str(from_code.value) == str(from_yaml.value)


def test_replace_overrides_nested_fields_and_leaves_the_original(
    tiny_result: sim.RunResult,
) -> None:
    base = tiny_result.scenario
    new = base.replace(
        **{"workload.arrival.rate": 4.0, "policies[continuous].max_batch_size": 32, "seed": 9}
    )
    assert (new.workload.arrival.rate, new.policy("continuous").max_batch_size, new.seed) == (
        4.0,
        32,
        9,
    )
    assert (base.workload.arrival.rate, base.policy("continuous").max_batch_size, base.seed) == (
        6.0,
        8,
        3,
    )
    # Everything not overridden is untouched, including the folder relative paths resolve against.
    assert new.workload.prompt_tokens == base.workload.prompt_tokens
    assert new.policy("static") == base.policy("static")
    assert new.base_dir == base.base_dir


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"workload.arrival.rate": 0}, "workload.arrival.rate"),
        ({"policies[continous].max_batch_size": 4}, "did you mean 'continuous'"),
        ({"workload.arival.rate": 4}, "did you mean 'arrival'"),
    ],
)
def test_replace_validates_like_a_file(
    tiny_result: sim.RunResult, override: dict, named: str
) -> None:
    with pytest.raises(sim.UserError, match=re.escape(named)):
        tiny_result.scenario.replace(**override)


# --------------------------------------------------------------------------- the result object
def test_result_tables_agree_with_each_other(tiny_result: sim.RunResult) -> None:
    summary, requests = tiny_result.summary, tiny_result.requests
    assert list(summary["policy"]) == POLICIES
    assert set(requests["policy"]) == set(POLICIES) == set(tiny_result.iterations["policy"])
    for row in summary.itertuples():
        mine = requests[requests["policy"] == row.policy]
        assert len(mine) == row.requests == TINY["workload"]["requests"]
        assert (mine["status"] == "completed").sum() == row.completed
    # Every policy served the same request stream.
    arrivals = [
        requests[requests["policy"] == p]["arrival_s"].sort_values().to_numpy() for p in POLICIES
    ]
    for other in arrivals[1:]:
        np.testing.assert_array_equal(arrivals[0], other)


def test_a_policy_gives_the_same_row_whatever_else_runs(
    tiny_file: Path, tiny_result: sim.RunResult
) -> None:
    alone = sim.run(tiny_file, policies=["continuous"]).summary
    assert list(alone["policy"]) == ["continuous"]
    full_row = tiny_result.summary[tiny_result.summary["policy"] == "continuous"]
    assert as_csv(alone) == as_csv(full_row)


def test_unknown_policy_name_is_a_user_error(tiny_file: Path) -> None:
    with pytest.raises(sim.UserError, match="did you mean 'continuous'"):
        sim.run(tiny_file, policies=["continous"])


def test_repr_is_a_short_table_naming_every_policy(tiny_result: sim.RunResult) -> None:
    text = repr(tiny_result)
    lines = text.strip().splitlines()
    assert len(lines) <= len(POLICIES) + 3, text
    assert all(len(line) <= 200 for line in lines), text
    for name in POLICIES:
        assert name in text
    assert "tiny_api" in lines[0]


def test_html_repr_is_a_table(tiny_result: sim.RunResult) -> None:
    html = tiny_result._repr_html_()
    assert "<table" in html and html.count("<tr") == len(POLICIES) + 1
    for name in POLICIES:
        assert f">{name}<" in html
    assert len(html) < 10_000


def test_progress_factory_gets_one_callback_per_policy(tiny_file: Path) -> None:
    calls: list[tuple[str, int]] = []
    updates: list[tuple[float, int]] = []

    def factory(policy: str, total: int):  # noqa: ANN202 - the ProgressFactory shape
        calls.append((policy, total))
        return lambda sim_time_s, finished: updates.append((sim_time_s, finished))

    sim.run(tiny_file, progress=factory)
    assert calls == [(name, TINY["workload"]["requests"]) for name in POLICIES]
    assert all(0 <= finished <= TINY["workload"]["requests"] for _, finished in updates)


def test_import_sim_stays_light() -> None:
    heavy = "('simpy', 'sim.runner', 'matplotlib')"
    code = f"import sys, sim; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- sweeps
def test_sweep_equals_a_loop_of_runs(tiny_result: sim.RunResult) -> None:
    base = tiny_result.scenario.replace(**{"workload.requests": 30})
    rates, seeds = [2.0, 12.0], [0, 1]
    table = sweep(base, {"workload.arrival.rate": rates}, seeds=seeds, workers=1)
    assert len(table) == len(rates) * len(seeds) * len(POLICIES)
    assert {"workload.arrival.rate", "seed", "policy", *SUMMARY_COLUMNS} <= set(table.columns)
    columns = list(SUMMARY_COLUMNS + EXTRA_COLUMNS)  # a sweep's table: the summary's own columns, no trust columns
    for rate in rates:
        for seed in seeds:
            expected = sim.run(
                base.replace(**{"workload.arrival.rate": rate, "seed": seed})
            ).summary
            got = table[(table["workload.arrival.rate"] == rate) & (table["seed"] == seed)]
            got = got.set_index("policy").loc[POLICIES].reset_index()[columns]
            assert_same_numbers(got, expected[columns])
    assert base.workload.arrival.rate == 6.0 and base.seed == 3  # the sweep copies, never mutates


def test_sim_sweep_stays_the_function_once_the_sweep_package_is_loaded() -> None:
    # The function sim.sweep lives in the package sim.sweeps; importing that package (as the
    # CLI and sim.capacity do) must not shadow the function.
    code = "import sim, sim.cli; sim.capacity; sim.cli.build_parser(); print(callable(sim.sweep))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"
