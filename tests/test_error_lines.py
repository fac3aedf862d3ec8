"""Every mistake is ONE bounded line: values quoted and cut, no pydantic internals, argparse included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main
from sim.config import Scenario
from sim.errors import MAX_LINE_CHARS, UserError, one_line, shown
from sim.io.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


def _error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[:1000]
    assert len(lines[0]) <= MAX_LINE_CHARS
    return lines[0]


def _scenario_file(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data.update(changes)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ----------------------------------------------------------------------------- values in messages
@given(st.one_of(st.text(), st.binary(), st.integers(), st.floats(), st.lists(st.text()), st.none()))
def test_a_shown_value_is_short_and_one_line(value: object) -> None:
    text = shown(value)
    assert len(text) <= 80 and len(text.splitlines()) <= 1


@given(st.text())
def test_one_line_is_one_bounded_line(text: str) -> None:
    line = one_line(text)
    assert len(line.splitlines()) <= 1 and len(line) <= MAX_LINE_CHARS
    if text.splitlines() == [text] and len(text) <= MAX_LINE_CHARS:
        assert line == text  # a line that needs no change is left alone


def test_a_long_name_is_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, main(["validate", str(_scenario_file(tmp_path, name="n" * 500_000))]))
    assert "name = 'nnnn" in line and "…" in line
    with pytest.raises(UserError) as info:  # a scenario built in code has no file-size limit
        load_scenario(QUICKSTART).replace(name="n" * 5_000_000)
    assert len(str(info.value)) <= MAX_LINE_CHARS and "…" in str(info.value)


def test_a_newline_in_a_value_stays_on_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(capsys, main(["validate", str(_scenario_file(tmp_path, name="bad\nname\r\u2028x"))]))
    assert "name = 'bad\\nname\\r\\u2028x'" in line


def test_an_unknown_long_key_is_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _scenario_file(tmp_path)
    path.write_text(path.read_text() + "k" * 1000 + ": 1\n")  # YAML allows plain keys up to 1024 characters
    line = _error_line(capsys, main(["validate", str(path)]))
    assert "unknown key 'kkk" in line


# ----------------------------------------------------------------------------- keys and presets
@pytest.mark.parametrize(("key", "shown_as"), [("1", "key 1 "), ("null", "key null "), ("true", "key true ")])
@pytest.mark.parametrize("nested", [False, True])
def test_a_key_that_is_not_text_is_one_line(
    key: str, shown_as: str, nested: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.yaml"
    text = QUICKSTART.read_text()
    path.write_text(text.replace("workload:\n", f"workload:\n  {key}: x\n") if nested else text + f"{key}: x\n")
    line = _error_line(capsys, main(["validate", str(path)]))
    assert (
        shown_as in line
        and "not a field name" in line
        and line.startswith("error: workload:" if nested else "error: scenario:")
    )


@pytest.mark.parametrize("value", ["[vllm-v1]", "{a: 1}", "42"])
def test_a_preset_that_is_not_a_name_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", str(QUICKSTART), "--set", f"policies[static].preset={value}"])
    line = _error_line(capsys, code)
    assert "policies[static].preset = " in line and "unknown preset" in line and "vllm-v1" in line


# ----------------------------------------------------------------------------- pydantic internals
@pytest.mark.parametrize(
    ("rate", "expected"),
    [("x", "must be a number or a mapping"), ("[1]", "= a list: must be a number or a mapping"),
     ("{kind: beta}", "acceptance_rate.mean: required field is missing"),
     ("{kind: beta, mean: 0.5, concentration: 2, extra: 1}", "unknown key 'extra'")],
)  # fmt: skip
def test_a_union_field_says_what_it_takes(rate: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["validate", str(QUICKSTART), "--set", "policies[vllm-v0].speculative.method=eagle",
         "--set", f"policies[vllm-v0].speculative.acceptance_rate={rate}"]
    )  # fmt: skip
    line = _error_line(capsys, code)
    assert expected in line, line
    for internal in ("function-", "tagged-union", "[_", "dictionary or object", "Input should"):
        assert internal not in line, line
    if rate.startswith("{"):  # a mapping: the user meant the distribution, not the number
        assert "must be a number" not in line, line


def test_a_numpy_value_shows_as_a_number() -> None:
    scenario = load_scenario(QUICKSTART)
    with pytest.raises(UserError) as info:
        scenario.replace(**{"workload.arrival.rate": np.float64(-0.1)})
    assert "= -0.1:" in str(info.value) and "np." not in str(info.value)


def test_a_scenario_built_in_code_reports_the_same_way() -> None:
    with pytest.raises(UserError, match="name = 'a/b'"):
        Scenario(**dict(yaml.safe_load(QUICKSTART.read_text()), name="a/b"))


# ----------------------------------------------------------------------------- argparse
MISUSES = {
    (): "python -m sim",
    ("runn",): "python -m sim",
    ("run", "--bogus"): "python -m sim run",
    ("run", "--seed", "abc"): "python -m sim run",
    ("validate",): "python -m sim validate",
    ("list", "nothing"): "python -m sim list",
    ("traces",): "python -m sim traces",
    ("traces", "convert", "a"): "python -m sim traces convert",
    ("sweep", str(QUICKSTART)): "python -m sim sweep",
    ("capacity", "--bogus"): "python -m sim capacity",
    ("validate", "a\nb", "c\nd"): "python -m sim validate",
}


@pytest.mark.parametrize("argv", sorted(MISUSES), ids=" ".join)
def test_command_line_misuse_is_one_line(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert info.value.code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and "usage:" not in err
    assert lines[0].endswith(f"(see {MISUSES[argv]} --help)"), lines[0]


def test_help_still_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0 and "usage: python -m sim run" in capsys.readouterr().out


def test_a_real_process_prints_one_line_for_misuse() -> None:
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "--nope"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: unrecognized arguments: --nope (see python -m sim run --help)\n"


def test_many_unknown_keys_are_one_message_per_mapping_on_a_bounded_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    for mapping in (data, data["workload"], data["slo"]):
        mapping.update({f"unknown_{i}_{'x' * 30}": i for i in range(5)})
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    line = _error_line(capsys, main(["validate", str(path)]))
    assert line.startswith("error: invalid scenario: ") and "unknown keys 'unknown_0_" in line
    assert line.count("allowed keys here") <= 3  # once per mapping, not once per key
