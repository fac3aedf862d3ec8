"""The sweep loop with a fake point function: incremental sweep.csv, crashes, resume, failures.

The fake is a deterministic function of (arrival rate, batch size, seed) with full-precision
noise, so "equal to the last digit" is a real check of the CSV round trip, and it is fast
enough to kill and resume sweeps many times over. The real engine is exercised in
test_sweep_backends.py and test_sweep_cli.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from sim.config import Scenario
from sim.errors import UserError
from sim.io.scenario import scenario_from_dict
from sim.metrics.summary import EXTRA_COLUMNS, SUMMARY_COLUMNS
from sim.rng import RandomStreams
from sim.sweeps.backends import WorkerDied
from sim.sweeps.runner import run_sweep
from sim.sweeps.store import CSV_NAME, check_folder, order_rows
from sim.uncertainty.trust import TRUST_COLUMNS

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "fake",
    "workload": {
        "requests": 100,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "fixed", "value": 64},
        "output_tokens": {"kind": "fixed", "value": 16},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 8},
    ],
}
PARAMS = {
    "workload.arrival.rate": [1.0, 2.0, 4.0, 8.0],
    "policies[continuous].max_batch_size": [8, 32],
}
SEEDS = [0, 1]
ROWS = 4 * 2 * len(SEEDS) * 2


def fake_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
    """Queue-like latencies that grow with load, plus seed-dependent noise in every digit."""
    rate = scenario.workload.arrival.rate
    noise = RandomStreams(scenario.seed).generator(f"fake-{rate}").random(len(scenario.policies))
    rows = []
    for jitter, policy in zip(noise, scenario.policies, strict=True):
        if policies and policy.name not in policies:
            continue
        service_rps = policy.max_batch_size / 2.0
        load = min(rate / service_rps, 0.999)
        ttft_s = (0.05 + jitter / 1000) / (1 - load)
        rows.append(
            {
                "scenario": scenario.name,
                "policy": policy.name,
                "requests": 100,
                "completed": 100,
                "throughput_rps": min(rate, service_rps) * (1 - jitter / 100),
                "ttft_p99_s": ttft_s,
                "tpot_p99_s": 0.02 * (1 + load),
                "e2e_mean_s": 3 * ttft_s,
                "slo_attainment": 1 - load / 2,
            }
        )
    return pd.DataFrame(rows)


def dying_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
    """Kills its process (as the OOM killer would) at rate 4."""
    if scenario.workload.arrival.rate == 4.0:
        os._exit(3)
    return fake_point(scenario, policies)


def interrupted_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
    """Ctrl-C arrives while rate 4 runs."""
    if scenario.workload.arrival.rate == 4.0:
        raise KeyboardInterrupt
    return fake_point(scenario, policies)


def slow_first_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
    """Point 0 seed 0 finishes after the others, so completion order differs from grid order."""
    if scenario.workload.arrival.rate == 1.0 and scenario.policies[1].max_batch_size == 8 and scenario.seed == 0:
        time.sleep(0.5)
    return fake_point(scenario, policies)


def failing_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
    """Rate 8 fails the way a too-large model would."""
    if scenario.workload.arrival.rate == 8.0:
        raise UserError("model does not fit:\nneeds 90 GB")
    return fake_point(scenario, policies)


@pytest.fixture(scope="module")
def base() -> Scenario:
    return scenario_from_dict(BASE)


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.fixture(scope="module")
def reference(base: Scenario, reference_dir: Path) -> pd.DataFrame:
    """An uninterrupted sweep, written to disk."""
    return run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=reference_dir)


def assert_identical(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, expected, check_exact=True)


def assert_csv_whole(path: Path) -> pd.DataFrame:
    """sweep.csv parses, ends with a whole line, and every (point, seed) has all its rows."""
    text = path.read_text()
    assert text.endswith("\n")
    frame = pd.read_csv(path)
    assert frame.groupby(["point", "seed"]).size().eq(2).all()
    return frame


def test_table_shape_order_and_columns(reference: pd.DataFrame) -> None:
    assert len(reference) == ROWS
    assert list(reference.columns[:4]) == [*PARAMS, "seed", "point"]
    assert list(reference.columns[4:-1]) == [*SUMMARY_COLUMNS, *EXTRA_COLUMNS, *TRUST_COLUMNS]
    assert reference.columns[-1] == "error" and (reference["error"] == "").all()
    keys = list(zip(reference["point"], reference["seed"], reference["policy"], strict=True))
    assert keys == sorted(keys, key=lambda k: (k[0], k[1], ["static", "continuous"].index(k[2])))
    # the swept batch size really reached each point's scenario
    continuous = reference[reference["policy"] == "continuous"]
    slow = continuous[continuous["policies[continuous].max_batch_size"] == 8]
    fast = continuous[continuous["policies[continuous].max_batch_size"] == 32]
    assert (slow["ttft_p99_s"].to_numpy() > fast["ttft_p99_s"].to_numpy()).all()


def test_in_memory_sweep_equals_the_file_and_a_loop_of_calls(base: Scenario, reference: pd.DataFrame) -> None:
    in_memory = run_sweep(base, PARAMS, SEEDS, point_fn=fake_point)
    assert_identical(in_memory, reference)
    row = reference[(reference["point"] == 5) & (reference["seed"] == 1)]
    direct = fake_point(
        base.replace(**{"workload.arrival.rate": 4.0, "policies[continuous].max_batch_size": 32, "seed": 1})
    )
    assert row["ttft_p99_s"].tolist() == direct["ttft_p99_s"].tolist()  # exact floats


def test_pool_of_two_gives_identical_results_and_file(
    base: Scenario, reference: pd.DataFrame, reference_dir: Path, tmp_path: Path
) -> None:
    pooled = run_sweep(base, PARAMS, SEEDS, point_fn=slow_first_point, workers=2, out=tmp_path)
    assert_identical(pooled, reference)
    # rows came back in completion order (point 0 last); the finished file is in grid order
    assert (tmp_path / CSV_NAME).read_bytes() == (reference_dir / CSV_NAME).read_bytes()


def test_a_resumed_file_is_in_grid_order_too(
    base: Scenario, reference: pd.DataFrame, reference_dir: Path, tmp_path: Path
) -> None:
    """(``reference`` writes ``reference_dir``'s sweep.csv: asked for, so the test never finds it unwritten on
    a pytest-xdist worker that has not run it yet.)"""
    with pytest.raises(KeyboardInterrupt):
        run_sweep(base, PARAMS, SEEDS, point_fn=interrupted_point, out=tmp_path)
    text = (tmp_path / CSV_NAME).read_text()
    header, *lines = text.splitlines(keepends=True)
    points = ["".join(lines[i : i + 2]) for i in range(0, len(lines), 2)]  # two policies a point
    (tmp_path / CSV_NAME).write_text(header + "".join(reversed(points)))  # whole points, out of order
    run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=tmp_path, resume=True)
    assert (tmp_path / CSV_NAME).read_bytes() == (reference_dir / CSV_NAME).read_bytes()


def test_order_rows_sorts_by_point_then_seed_and_keeps_policy_order() -> None:
    columns = ["x", "seed", "point", "policy", "error"]
    texts = ["1,7,1,static,\n1,7,1,cont,\n", "0,9,0,static,\n", "0,9,0,cont,\n", "0,2,0,static,\n0,2,0,cont,\n"]
    assert order_rows(columns, texts) == [
        "0,2,0,static,\n", "0,2,0,cont,\n", "0,9,0,static,\n", "0,9,0,cont,\n",
        "1,7,1,static,\n", "1,7,1,cont,\n",
    ]  # fmt: skip


def test_check_folder_accepts_folders_and_refuses_files(tmp_path: Path) -> None:
    check_folder(tmp_path)  # exists
    check_folder(tmp_path / "new" / "nested")  # can be created
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    for bad, says in [("file", "not a folder"), ("file/sub/deeper", "is a file"), ("dangling", "not a folder")]:
        with pytest.raises(UserError, match=says):
            check_folder(tmp_path / bad)


def test_killed_process_leaves_whole_rows_and_resume_completes(
    base: Scenario, reference: pd.DataFrame, tmp_path: Path
) -> None:
    script = textwrap.dedent(f"""
        from sim.io.scenario import scenario_from_dict
        from sim.sweeps.runner import run_sweep
        from test_sweep_resume import BASE, PARAMS, SEEDS, dying_point
        base = scenario_from_dict(BASE)
        run_sweep(base, PARAMS, SEEDS, point_fn=dying_point, out={str(tmp_path)!r})
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    partial = assert_csv_whole(tmp_path / CSV_NAME)
    assert set(partial["workload.arrival.rate"]) == {1.0, 2.0}  # rate-4 points died before writing
    calls: list[float] = []

    def counting_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
        calls.append(scenario.workload.arrival.rate)
        return fake_point(scenario, policies)

    resumed = run_sweep(base, PARAMS, SEEDS, point_fn=counting_point, out=tmp_path, resume=True)
    assert_identical(resumed, reference)
    assert sorted(set(calls)) == [4.0, 8.0] and len(calls) == 8  # only the missing points ran
    assert len(assert_csv_whole(tmp_path / CSV_NAME)) == ROWS


def test_killed_pool_worker_is_reported_and_resume_completes(
    base: Scenario, reference: pd.DataFrame, tmp_path: Path
) -> None:
    with pytest.raises(WorkerDied, match="--resume"):
        run_sweep(base, PARAMS, SEEDS, point_fn=dying_point, workers=2, out=tmp_path)
    partial = assert_csv_whole(tmp_path / CSV_NAME)
    assert 4.0 not in set(partial["workload.arrival.rate"])
    resumed = run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, workers=2, out=tmp_path, resume=True)
    assert_identical(resumed, reference)


def test_ctrl_c_keeps_finished_points(base: Scenario, reference: pd.DataFrame, tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_sweep(base, PARAMS, SEEDS, point_fn=interrupted_point, out=tmp_path)
    assert len(assert_csv_whole(tmp_path / CSV_NAME)) == 4 * 2 * 2  # points at rates 1 and 2
    assert_identical(run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=tmp_path, resume=True), reference)


@pytest.mark.parametrize("cut", ["mid_line", "whole_line", "header"])
def test_truncated_csv_resumes_to_the_same_table(
    base: Scenario, reference: pd.DataFrame, tmp_path: Path, cut: str
) -> None:
    run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=tmp_path)
    path = tmp_path / CSV_NAME
    text = path.read_text()
    last_line_start = text.rstrip("\n").rfind("\n") + 1
    keep = {
        "mid_line": len(text) - 25,
        "whole_line": last_line_start,
        "header": text.find("\n") - 3,
    }[cut]
    path.write_text(text[:keep])  # whole_line leaves the last point with one of its two rows
    calls: list[tuple[float, int]] = []

    def counting_point(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
        calls.append((scenario.workload.arrival.rate, scenario.seed))
        return fake_point(scenario, policies)

    assert_identical(
        run_sweep(base, PARAMS, SEEDS, point_fn=counting_point, out=tmp_path, resume=True),
        reference,
    )
    # only the last point's rows were damaged; with no whole header line, nothing was kept
    assert calls == (
        [(8.0, 1)]
        if cut != "header"
        else [(r, s) for r in PARAMS["workload.arrival.rate"] for _ in (8, 32) for s in SEEDS]
    )
    assert_csv_whole(path)


def test_failed_points_are_reported_not_dropped_and_retried_on_resume(
    base: Scenario, reference: pd.DataFrame, tmp_path: Path
) -> None:
    table = run_sweep(base, PARAMS, SEEDS, point_fn=failing_point, out=tmp_path)
    assert len(table) == ROWS
    failed = table[table["error"] != ""]
    assert set(failed["workload.arrival.rate"]) == {8.0} and len(failed) == 2 * 2 * 2
    assert failed["error"].str.startswith("UserError: model does not fit").all()
    assert "\n" not in "".join(failed["error"])
    assert failed["ttft_p99_s"].isna().all() and set(failed["policy"]) == {"static", "continuous"}
    assert_csv_whole(tmp_path / CSV_NAME)
    assert_identical(run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=tmp_path, resume=True), reference)


def test_resume_refuses_a_different_sweep(base: Scenario, tmp_path: Path) -> None:
    run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=tmp_path)
    other = {**PARAMS, "workload.arrival.rate": [1.0, 3.0]}
    for params, seeds, scenario in [
        (other, SEEDS, base),
        (PARAMS, [0], base),
        (PARAMS, SEEDS, base.replace(**{"workload.requests": 50})),
    ]:
        with pytest.raises(UserError, match="different sweep"):
            run_sweep(scenario, params, seeds, point_fn=fake_point, out=tmp_path, resume=True)
    with pytest.raises(UserError, match="resume"):
        run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, resume=True)


def test_resume_of_a_finished_sweep_runs_nothing(base: Scenario, reference: pd.DataFrame, tmp_path: Path) -> None:
    run_sweep(base, PARAMS, SEEDS, point_fn=fake_point, out=tmp_path)

    def must_not_run(scenario: Scenario, policies: list[str] | None = None) -> pd.DataFrame:
        raise AssertionError("a finished point ran again")

    assert_identical(run_sweep(base, PARAMS, SEEDS, point_fn=must_not_run, out=tmp_path, resume=True), reference)
