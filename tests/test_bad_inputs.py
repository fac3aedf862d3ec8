"""Every user mistake: one ``error:`` line naming the field and value, exit code 2, no
traceback, nothing written. One case per class of mistake (issue 9 lists them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "bad",
    "model": "llama-2-7b",
    "workload": {
        "requests": 20,
        "arrival": {"kind": "poisson", "rate": 2.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 64},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 16},
    },
    "policies": [
        {"name": "s", "kind": "static", "max_batch_size": 4},
        {"name": "c", "kind": "continuous", "max_batch_size": 4},
        {"name": "p", "kind": "paged"},
    ],
}


def _write(tmp_path: Path, text: str | bytes, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _base_file(tmp_path: Path) -> Path:
    return _write(tmp_path, yaml.safe_dump(BASE))


def _assert_one_clear_error(capsys: pytest.CaptureFixture[str], code: int, *fragments: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from: {err}"
    return err


# (overrides, fragments the single error line must contain)
OVERRIDE_CASES = {
    "typo with hint first": ({"workload.arrival.rat": 2}, ["unknown key 'rat'", "did you mean 'rate'"]),
    "negative rate": ({"workload.arrival.rate": -1}, ["workload.arrival.rate", "-1"]),
    "unknown kind": ({"workload.arrival.kind": "poison"}, ["did you mean 'poisson'"]),
    "string for an integer": ({"workload.requests": "many"}, ["workload.requests", "'many'"]),
    "boolean for an integer": ({"workload.requests": True}, ["workload.requests", "not the boolean true"]),
    "boolean for a float": ({"workload.arrival.rate": False}, ["workload.arrival.rate", "boolean false"]),
    "infinite rate": ({"workload.arrival.rate": float("inf")}, ["workload.arrival.rate", "inf"]),
    "nan rate": ({"workload.arrival.rate": float("nan")}, ["workload.arrival.rate", "nan"]),
    "infinite think time": (
        {"workload.arrival": {"kind": "closed_loop", "clients": 2, "think_time_s": float("inf")}},
        ["workload.arrival.think_time_s", "inf"],
    ),
    "infinite time scale": (
        {"workload.arrival": {"kind": "trace", "path": "x.csv", "time_scale": float("inf")}},
        ["workload.arrival.time_scale", "inf"],
    ),
    "infinite activation reserve": ({"memory.activation_reserve_gb": float("inf")}, ["activation_reserve_gb"]),
    "absurdly small rate": ({"workload.arrival.rate": 1e-300}, ["workload.arrival.rate", "1e-300"]),
    "10^12 requests": ({"workload.requests": 10**12}, ["workload.requests", "GB of records"]),
    "10^30 requests": ({"workload.requests": 10**30}, ["workload.requests", "at most 100,000,000"]),
    "10^12 kv blocks": ({"memory.kv_blocks": 10**12}, ["memory.kv_blocks", "1000000000"]),
    "10^30 kv blocks": ({"memory.kv_blocks": 10**30}, ["memory.kv_blocks"]),
    "name '.'": ({"name": "."}, ["name = '.'", "plain folder name"]),
    "name '..'": ({"name": ".."}, ["name = '..'"]),
    "name with a separator": ({"name": "a/b"}, ["name = 'a/b'"]),
    "queue limit of 0": ({"admission": {"max_queue": 0}}, ["admission.max_queue", "0"]),
    "utilization above 1": ({"memory.gpu_memory_utilization": 1.5}, ["memory.gpu_memory_utilization", "1.5"]),
    "uniform bounds reversed": ({"workload.output_tokens.low": 50}, ["high (16) must be >= low (50)"]),
    "duplicate policy names": ({"policies[c].name": "s"}, ["unique", "s"]),
    "unknown model": ({"model": "llama-2-7"}, ["llama-2-7", "did you mean"]),
    "model does not fit": ({"model": "llama-2-70b"}, ["does not fit", "GB", "GiB"]),
    "tensor parallel not dividing heads": ({"tensor_parallel": 3}, ["tensor_parallel", "3"]),
    "block larger than the KV budget": ({"memory.block_size": 10**6}, ["memory.block_size = 1000000"]),
    "request larger than the KV cache": ({"memory.kv_blocks": 1}, ["kv_blocks is 1", "policy 's'"]),
    "prompt longer than the context window": (
        {"workload.prompt_tokens": {"kind": "fixed", "value": 10_000}},
        ["maximum context length is 4096 tokens", "10000"],
    ),
    "max_model_len beyond the model": ({"max_model_len": 100_000}, ["max_model_len = 100000", "4096"]),
    "unknown router": ({"router": "fastest"}, ["router", "fastest"]),
    "unknown send order": ({"workload.order": "shortest_first"}, ["workload.order", "shortest_first"]),
    "unknown retry backoff": (
        {"client": {"timeout_s": 30, "max_retries": 2, "backoff": "linear"}},
        ["client.backoff", "linear"],
    ),
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", sorted(OVERRIDE_CASES))
def test_bad_value_is_one_error_line_and_writes_nothing(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides, fragments = OVERRIDE_CASES[case]
    data = yaml.safe_load(yaml.safe_dump(BASE))
    from sim.config.overrides import set_path

    for dotted, value in overrides.items():
        set_path(data, dotted, value)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    argv = [command, str(path)] + (["--out", str(out), "--no-plots", "--quiet"] if command == "run" else [])
    _assert_one_clear_error(capsys, main(argv), *fragments)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.yaml"]


FILE_CASES = {
    "not UTF-8": (b"name: caf\xe9\n", ["not UTF-8", "line 1"]),
    "UTF-16": ("name: x\n".encode("utf-16"), ["UTF-16"]),
    "duplicate key": (b"name: a\nname: b\n", ["duplicate key 'name'", "line 2"]),
    "broken YAML": (b"name: a\nworkload: {arrival: [\n", ["not valid YAML", "line"]),
    "not a mapping": (b"- a\n- b\n", ["must be a YAML mapping"]),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_file_is_one_error_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, fragments = FILE_CASES[case]
    path = _write(tmp_path, content)
    out = tmp_path / "out"
    _assert_one_clear_error(capsys, main(["run", str(path), "--out", str(out), "--quiet"]), *fragments, str(path))
    assert not out.exists()


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_clear_error(capsys, main(["validate", str(tmp_path / "nope.yaml")]), "not found")


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--set", "policies[zz].max_batch_size=2"], ["no item named 'zz'"]),
        (["--set", "policies[9].max_batch_size=2"], ["index 9 out of range"]),
        (["--set", "nonsense"], ["path=value"]),
        (["--seed", "-1"], ["--seed = -1"]),
        (["--policy", "contnuous"], ["--policy 'contnuous'"]),
    ],
)
def test_bad_command_line_options(
    extra: list[str], fragments: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _base_file(tmp_path)
    out = tmp_path / "out"
    code = main(["run", str(path), "--out", str(out), "--quiet", "--no-plots", *extra])
    _assert_one_clear_error(capsys, code, *fragments)
    assert not out.exists()


def test_over_length_reject_counts_them_as_rejected(tmp_path: Path) -> None:
    import sim

    scenario = sim.Scenario(**BASE).replace(
        **{"max_model_len": 70, "over_length": "reject", "workload.requests": 200}
    )
    result = sim.run(scenario)
    requests = result.requests
    too_long = requests["prompt_tokens"] + requests["output_tokens"] > 70
    assert too_long.any() and not too_long.all()
    assert (requests.loc[too_long, "status"] == "rejected").all()
    assert (requests.loc[~too_long, "status"] == "completed").all()
    assert requests.loc[too_long, "first_scheduled_s"].isna().all()
    # Refused on sight: they end at the instant they are sent and are never retried.
    assert (requests.loc[too_long, "completion_s"] == requests.loc[too_long, "arrival_s"]).all()
    per_policy = too_long.groupby(requests["policy"], observed=True).sum()
    summary = result.summary.set_index("policy")
    assert (summary["rejected"] == per_policy.reindex(summary.index)).all()


def test_calibrate_out_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", "--profiles", str(tmp_path), "--model", "llama-2-7b", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err


def test_report_over_a_non_utf8_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    _write(folder, b"name: caf\xe9\n", "broken.yaml")
    out = tmp_path / "results"
    code = main(["report", "--scenarios", str(folder), "--out", str(out), "--quiet", "--no-plots"])
    _assert_one_clear_error(capsys, code, "broken.yaml", "not UTF-8")


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, b"name: a\nname: b\n")
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path)], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "results").exists()
