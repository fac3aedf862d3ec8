"""YAML that cannot exhaust memory or time (sim/io/yaml_reader.py), and the YAML it now accepts.

The budget is checked two ways: hostile files through ``validate`` stay within the targets
(<= 1 MB: <= 1 s of CPU and <= 100 MB; larger: refused in one line without being read), and
for random anchor/alias structures the loader refuses exactly those whose expanded size or
depth, counted here on the expanded data, is over the limit.
"""

from __future__ import annotations

import contextlib
import io
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main
from sim.errors import UserError
from sim.io.scenario import load_scenario, scenario_to_dict
from sim.io.yaml_reader import MAX_BYTES, MAX_NODES, parse_yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
CPU_SECONDS = 1.0
MEMORY_BYTES = 100 * 2**20


def _alias_bomb(fanout: int = 9, levels: int = 9) -> str:
    """The issue's bomb: 9 levels of 9 aliases, 9^9 = 387 million values expanded from ~700 bytes."""
    lines = [f"  a0: &a0 [{', '.join(['x'] * fanout)}]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "bomb:\n" + "\n".join(lines) + "\n"


def _quiet_validate(path: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        return main(["validate", str(path)]), err.getvalue()


def _validate(path: Path) -> tuple[int, str, float, int]:
    """Exit code, stderr, CPU seconds and tracemalloc peak of ``validate path``.

    Timed and traced in two runs: tracemalloc slows allocation about threefold.
    """
    _quiet_validate(QUICKSTART)  # imports and caches first: they are not the file's cost
    start = time.process_time()
    code, err = _quiet_validate(path)
    cpu = time.process_time() - start
    tracemalloc.start()
    try:
        assert _quiet_validate(path) == (code, err)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return code, err, cpu, peak


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 500, err[:1000]
    return lines[0]


def _hostile_files() -> dict[str, str]:
    quick = QUICKSTART.read_text()
    head = quick + "anchor: &s 1\nextra: ["
    return {
        "alias bomb": quick + _alias_bomb(),
        "1 MB of aliases": head + ", ".join(["*s"] * ((1_000_000 - len(head)) // 4)) + "]\n",
        "1 MB of values": head + ",".join(["1"] * ((1_000_000 - len(head)) // 2)) + "]\n",
        "1 MB of nesting": quick + "deep: " + "[" * 400_000 + "]" * 400_000 + "\n",
        "1 MB name": quick.replace("name: quickstart", "name: " + "a" * 1_000_000),
    }


@pytest.mark.parametrize("case", sorted(_hostile_files()))
def test_a_hostile_file_is_refused_within_the_budget(case: str, tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(_hostile_files()[case])
    assert path.stat().st_size <= MAX_BYTES
    code, err, cpu, peak = _validate(path)
    assert code == 2
    _one_line(err)
    assert cpu <= CPU_SECONDS, f"{cpu:.2f} s"
    assert peak <= MEMORY_BYTES, f"{peak / 2**20:.0f} MiB"


def test_the_bomb_names_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(QUICKSTART.read_text() + _alias_bomb())
    line = _one_line(_validate(path)[1])
    assert str(path) in line and f"more than {MAX_NODES:,}" in line and "aliases" in line and "line " in line


def test_the_largest_valid_scenario_loads_within_the_budget(tmp_path: Path) -> None:
    # Just under the node budget, every node a real policy field: the schema checks all of them.
    head = QUICKSTART.read_text().split("policies:")[0] + "policies:\n"
    policies = "".join(f"  - {{name: p{i}, kind: static, max_batch_size: 4}}\n" for i in range(MAX_NODES // 7 - 20))
    path = tmp_path / "many.yaml"
    path.write_text(head + policies)
    start = time.process_time()
    scenario = load_scenario(path)
    cpu = time.process_time() - start
    tracemalloc.start()
    try:
        load_scenario(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(scenario.policies) == MAX_NODES // 7 - 20
    assert cpu <= CPU_SECONDS, f"{cpu:.2f} s"
    assert peak <= MEMORY_BYTES, f"{peak / 2**20:.0f} MiB"


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as handle:
        handle.truncate(50_000_000)  # sparse: 50 MB without writing them
    code, err, cpu, peak = _validate(path)
    line = _one_line(err)
    assert code == 2 and "47.7 MiB" in line and "1 MiB" in line
    assert peak < 4 * MAX_BYTES  # at most the first MiB (and one byte) was read
    assert cpu <= CPU_SECONDS


# ----------------------------------------------------------------------------- the budget is exact
def _expanded(value: Any, depth: int = 1) -> tuple[int, int]:
    """(values, depth) of data once every shared list or dict is counted wherever it appears."""
    if isinstance(value, dict):
        children = [_expanded(part, depth + 1) for pair in value.items() for part in pair]
    elif isinstance(value, list):
        children = [_expanded(item, depth + 1) for item in value]
    else:
        return 1, depth
    return 1 + sum(n for n, _ in children), max([depth, *(d for _, d in children)])


@st.composite
def _shared_structures(draw: Any) -> Any:
    """Lists and dicts that reuse earlier ones (dumped as anchors and aliases), up to ~3000 values expanded."""
    pool: list[Any] = [draw(st.integers(0, 9))]
    for _ in range(draw(st.integers(1, 8))):
        parts = draw(st.lists(st.sampled_from(range(len(pool))), min_size=1, max_size=4))
        items = [pool[i] for i in parts]
        pool.append(items if draw(st.booleans()) else {f"k{i}": item for i, item in enumerate(items)})
    return pool[-1]


@given(_shared_structures(), st.integers(10, 400), st.integers(2, 12))
def test_the_loader_refuses_exactly_what_expands_beyond_the_budget(data: Any, max_nodes: int, max_depth: int) -> None:
    text = yaml.safe_dump(data)
    nodes, depth = _expanded(data)
    within = nodes <= max_nodes and depth <= max_depth
    try:
        loaded = parse_yaml(text, max_nodes=max_nodes, max_depth=max_depth)
    except UserError as exc:
        assert not within, str(exc)
        return
    assert within, f"{nodes} values, {depth} deep"
    assert loaded == data


# ----------------------------------------------------------------------------- what else is refused, one line each
REFUSED = {
    "recursive alias": ("a: &a [1, *a]\n", "recursive"),
    "500 nested lists": ("a: " + "[" * 500 + "]" * 500 + "\n", "nested too deeply"),
    "depth by aliases": ("a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n", "levels"),
    "huge base-60 integer": ("a: " + ":".join(["1"] * 300_000) + "\n", "more than 100 characters"),
    "impossible date": ("a: 2023-02-30\n", "day is out of range"),
    "list as a key": ("? [1]\n: 2\n", "a key must be a single value"),
    "tag that does not fit": ("a: !!timestamp 1\n", "'1' is not a valid timestamp"),
    "boolean that is not": ("a: !!bool maybe\n", "'maybe' is not a valid bool"),
    "set of a list": ("a: !!set [1]\n", "expected a mapping node"),
    "python tag": ("a: !!python/object/apply:os.system [ls]\n", "could not determine a constructor"),
    "duplicate key": ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (first at line 1)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_document_is_one_line(case: str) -> None:
    text, fragment = REFUSED[case]
    start = time.process_time()
    with pytest.raises(UserError) as info:
        parse_yaml(text, "f.yaml")
    message = str(info.value)
    assert message.startswith("f.yaml: ") and fragment in message and "\n" not in message, message
    assert len(message) <= 500 and time.process_time() - start <= CPU_SECONDS


def _block_bomb(fanout: int = 9, levels: int = 9) -> str:
    """The bomb as one block-style YAML value, without commas (``--param`` splits its values at commas)."""
    lines = ["- &l0", *["  - x"] * fanout, *["- *l0"] * (fanout - 1)]
    for level in range(1, levels):
        lines = [f"- &l{level}", *(f"  {line}" for line in lines), *[f"- *l{level}"] * (fanout - 1)]
    return "\n".join(lines)


def test_an_alias_bomb_in_set_and_param_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(QUICKSTART), "--set", f"workload.requests={_block_bomb()}"]) == 2
    assert "--set workload.requests: too many values" in _one_line(capsys.readouterr().err)
    from sim.sweeps.grid import parse_param_option

    with pytest.raises(UserError, match="--param workload.requests: too many values"):
        parse_param_option(f"workload.requests={_block_bomb()}")


def test_a_calibration_file_is_read_within_the_budget(tmp_path: Path) -> None:
    from sim.hardware.calibration_files import read_yaml

    path = tmp_path / "cal.yaml"
    path.write_text("format: 1\n" + _alias_bomb())
    with pytest.raises(UserError, match="too many values"):
        read_yaml(path)


# ----------------------------------------------------------------------------- YAML now accepted
def _policies(tmp_path: Path, policies_yaml: str) -> Path:
    head = QUICKSTART.read_text().split("policies:")[0]
    path = tmp_path / "merge.yaml"
    path.write_text(head + policies_yaml)
    return path


def test_merge_keys_fill_a_mapping_as_if_written_out(tmp_path: Path) -> None:
    merged = _policies(
        tmp_path,
        "policies:\n  - &first {name: c1, kind: continuous, max_batch_size: 8}\n  - {<<: *first, name: c2}\n",
    )
    written = tmp_path / "written.yaml"
    written.write_text(
        merged.read_text().split("policies:")[0] + "policies:\n"
        "  - {name: c1, kind: continuous, max_batch_size: 8}\n  - {name: c2, kind: continuous, max_batch_size: 8}\n"
    )
    assert load_scenario(merged).policies == load_scenario(written).policies


def test_a_key_written_twice_is_still_refused_next_to_a_merge(tmp_path: Path) -> None:
    path = _policies(tmp_path, "policies:\n  - &first {name: c1, kind: static, max_batch_size: 8}\n"
                               "  - {<<: *first, name: c2, name: c3}\n")  # fmt: skip
    with pytest.raises(UserError, match="duplicate key 'name'"):
        load_scenario(path)


def test_a_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + QUICKSTART.read_bytes())
    assert scenario_to_dict(load_scenario(path)) == scenario_to_dict(load_scenario(QUICKSTART))
    assert _quiet_validate(path)[0] == 0


@pytest.mark.parametrize(("text", "number"), [("1e12", 1e12), ("1.5e3", 1500.0), ("-2E-3", -0.002), ("1_0e1", 100.0)])
def test_exponent_notation_is_a_number(text: str, number: float) -> None:
    assert parse_yaml(f"a: {text}\n") == {"a": number}


def test_1e12_requests_is_refused_as_the_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(QUICKSTART), "--set", "workload.requests=1e12"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "workload.requests" in line and "'1e12'" not in line and "1000000000000" in line
