"""The command line end to end: outputs, overrides, and clean exit-2 errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.metrics.summary import SUMMARY_COLUMNS

TINY = {
    "name": "tiny",
    "seed": 5,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 60,
        "arrival": {"kind": "poisson", "rate": 8.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 64},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 40},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 8},
    ],
}


def write_scenario(folder: Path, data: dict, name: str = "s.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(*args: str) -> int:
    return main(list(args))


def test_run_writes_consistent_outputs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run_cli("run", str(write_scenario(tmp_path, TINY)), "--out", str(out), "--quiet") == 0
    expected = {"summary.csv", "summary.md", "requests.csv", "iterations.csv", "scenario.resolved.yaml",
                "ttft_cdf.png", "e2e_cdf.png", "timeline.png", "throughput.png"}
    assert expected <= {p.name for p in out.iterdir()}
    summary = pd.read_csv(out / "summary.csv")
    assert tuple(summary.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    requests = pd.read_csv(out / "requests.csv")
    for row in summary.itertuples():
        mine = requests[requests.policy == row.policy]
        done = mine[mine.status == "completed"]
        assert row.requests == len(mine) == 60
        assert row.completed == len(done)
        assert row.throughput_rps == pytest.approx(row.completed / row.duration_s, rel=1e-4)
        assert row.output_tps == pytest.approx(done.output_tokens.sum() / row.duration_s, rel=1e-4)
        assert row.ttft_p50_s == pytest.approx(np.median(done.ttft_s), rel=1e-4)
        assert row.e2e_mean_s == pytest.approx(done.e2e_s.mean(), rel=1e-4)
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["seed"] == 5 and resolved["scenario"]["memory"]["block_size"] == 16
    assert resolved["derived"]["cost_model"] == "calibrated"


def test_same_seed_same_bytes_and_seed_flag_changes_stream(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, TINY)
    for name, extra in (("a", []), ("b", []), ("c", ["--seed", "6"])):
        assert run_cli("run", str(path), "--out", str(tmp_path / name), "--quiet", "--no-plots", *extra) == 0
    read = lambda n: (tmp_path / n / "summary.csv").read_bytes()  # noqa: E731
    assert read("a") == read("b")
    assert read("a") != read("c")


def test_set_and_policy_filters(tmp_path: Path) -> None:
    out = tmp_path / "o"
    code = run_cli("run", str(write_scenario(tmp_path, TINY)), "--out", str(out), "--quiet", "--no-plots",
                   "--set", "workload.requests=25", "--set", "policies[continuous].max_batch_size=2",
                   "--policy", "continuous")
    assert code == 0
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.policy) == ["continuous"] and summary.requests.iloc[0] == 25
    iterations = pd.read_csv(out / "iterations.csv")
    assert iterations.batch_size.max() <= 2
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["scenario"]["workload"]["requests"] == 25


def _corrupt_trace(folder: Path) -> Path:
    path = folder / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,abc,5\n")
    return path


BAD_INPUTS = {
    "unknown key": ({"workload.arival": {"kind": "burst"}}, "workload.arival"),
    "bad type": ({"policies[static].max_batch_size": "eight"}, "policies[0].max_batch_size"),
    "negative rate": ({"workload.arrival.rate": -2}, "workload.arrival.rate"),
    "missing trace": ({"workload.arrival": {"kind": "trace", "path": "nope.csv"}}, "nope.csv"),
    "corrupt trace": ({"workload.arrival": {"kind": "trace", "path": "trace.csv"}}, "num_prefill_tokens"),
    "does not fit": ({"model": "llama-2-70b"}, "GB"),
    "unknown model": ({"model": "llama-2-7"}, "llama-2-7"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exit_2_names_field_writes_nothing(case: str, tmp_path: Path, capsys) -> None:
    overrides, fragment = BAD_INPUTS[case]
    _corrupt_trace(tmp_path)
    path = write_scenario(tmp_path, TINY)
    out = tmp_path / "never"
    args = ["run", str(path), "--out", str(out), "--quiet"]
    for key, value in overrides.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and "Traceback" not in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]


def test_subprocess_exit_code_and_no_traceback(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, dict(TINY, workload=dict(TINY["workload"], requests=-1)))
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "workload.requests = -1" in proc.stderr and "Traceback" not in proc.stderr


def test_validate_schema_and_list(tmp_path: Path, capsys) -> None:
    assert run_cli("validate", str(write_scenario(tmp_path, TINY))) == 0
    assert "ok" in capsys.readouterr().out
    assert run_cli("schema") == 0
    schema = json.loads(capsys.readouterr().out)
    assert "workload" in schema["properties"]
    for what, must_have in (("models", "llama-2-7b"), ("gpus", "h100-sxm"), ("policies", "chunked_prefill"),
                            ("arrivals", "closed_loop")):
        assert run_cli("list", what) == 0
        assert must_have in capsys.readouterr().out


def test_version_and_every_list_topic_in_the_top_level_help(capsys) -> None:
    from sim import __version__
    from sim.cli import CATALOGS, build_parser
    from sim.listing import catalog_lines

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"batchsim {__version__}"
    help_text = " ".join(build_parser().format_help().split())
    for topic in CATALOGS:
        assert topic in help_text
        assert catalog_lines(topic)  # every topic the help names has something to show


def test_list_traces_says_where_each_trace_is(capsys) -> None:
    from sim.listing import catalog_lines
    from sim.workload.traces import TRACE_NAMES, local_trace_path

    for name, line in zip(TRACE_NAMES, catalog_lines("traces"), strict=True):
        path = local_trace_path(name)
        assert (f"[here: {path}]" in line) if path else ("[not here:" in line)
