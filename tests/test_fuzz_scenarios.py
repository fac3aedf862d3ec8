"""Fuzz: mutated shipped scenarios through ``python -m sim validate`` never get past the one-line rule.

Each example takes a file under scenarios/, breaks it one way (a key deleted or repeated, a
value of the wrong type, a huge, negative or NaN number, unicode, deep nesting, aliases
sharing one list many times over, random bytes, a BOM, a cut-off end) and checks what every
user mistake must give: exit 0, or exit 2 with exactly one ``error:`` line of at most 500
characters; never a traceback; nothing written; and a bounded memory peak.

The example count is fixed (:data:`FUZZ_EXAMPLES`, ~20 s on two busy cores); a Hypothesis
profile with a larger ``max_examples`` raises it, e.g. ``HYPOTHESIS_PROFILE=deep``
(tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(REPO.glob("scenarios/**/*.yaml"))
FUZZ_EXAMPLES = 40
"""Examples per run under the default profile; a profile asking for more than Hypothesis's default 100 wins."""
MEMORY_BOUND = 100 * 2**20
"""Most bytes a validate may allocate (tracemalloc peak): the shipped scenarios peak at ~20 MiB."""
MAX_LINE = 500

_PROFILE_EXAMPLES = settings().max_examples
FUZZ_SETTINGS = settings(
    max_examples=_PROFILE_EXAMPLES if _PROFILE_EXAMPLES > 100 else FUZZ_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# ----------------------------------------------------------------------------- values
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)  # no lone surrogates: not UTF-8
_AWKWARD_TEXT = st.sampled_from(
    ["", " ", "\n", "a\nb", "\r\n", "\u2028", "\x85", "\t", "x" * 5000, "🙂" * 10, "1e12", "-0.1", ".nan", "null",
     "~", "yes", "no", "0x1F", "0o17", "1_000", "2023-02-30", "1:2:3", "*a", "&a", "!!str", "<<", "%YAML", "{", "["]
)  # fmt: skip
_NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, -(2**31), 2**31, 2**63, 2**64, 10**30, -(10**30), 10**300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, -0.0, 5e-324, 1.7976931348623157e308, -1e12]),
)
_LEAVES = st.one_of(st.none(), st.booleans(), _NUMBERS, _TEXT, _AWKWARD_TEXT)
_KEYS = st.one_of(_TEXT, st.sampled_from(["name", "kind", "rate", "preset", "<<"]), st.integers(), st.none())
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=12,
)


def _shared_tower(fanout: int, levels: int, leaf: Any) -> list[Any]:
    """One list held ``fanout`` times, ``levels`` deep: dumped as anchors and aliases, fanout^levels values."""
    tower: list[Any] = [leaf] * fanout
    for _ in range(levels - 1):
        tower = [tower] * fanout
    return tower


_ALIASED = st.builds(_shared_tower, st.integers(1, 12), st.integers(1, 12), _LEAVES)


# ----------------------------------------------------------------------------- mutations of the data
def _places(data: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in the data, parents before children."""
    found: list[tuple[Any, Any]] = []
    stack = [data]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            found.append((node, key))
            stack.append(value)
    return found


def _mutate_data(draw: Callable[..., Any], text: str) -> bytes:
    data = yaml.safe_load(text)
    places = _places(data)
    container, key = draw(st.sampled_from(places))
    action = draw(st.sampled_from(["delete", "replace", "alias", "add key"]))
    if action == "delete":
        del container[key]
    elif action == "replace":
        container[key] = draw(_VALUES)
    elif action == "alias":
        container[key] = draw(_ALIASED)
    else:
        target = container if isinstance(container, dict) else data
        target[draw(_KEYS)] = draw(_VALUES)
    return yaml.safe_dump(data, allow_unicode=draw(st.booleans()), sort_keys=False).encode()


# ----------------------------------------------------------------------------- mutations of the text
def _alias_bomb(fanout: int, levels: int) -> str:
    lines = [f"  a0: &a0 [{', '.join(['x'] * fanout)}]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "bomb:\n" + "\n".join(lines) + "\n"


_RAW_VALUES = st.one_of(
    st.integers(1, 2000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 200).map(lambda depth: "{a: " * depth + "1" + "}" * depth),
    st.sampled_from(
        [
            "*undefined",
            "&r [*r]",
            "!!python/object/apply:os.system [x]",
            "!custom x",
            "2023-02-30",
            "0b_",
            ":".join(["1"] * 300),
            "{<<: 1}",
            "'unterminated",
            '"a\\x00b"',
            "? [1]\n: 2",
            "|\n  block\n",
            "1e12",
            "1.5e3",
            "-.inf",
            "0x" + "f" * 200,
            "9" * 5000,
            "!!binary '@@'",
            "!!set {a, b}",
            "!!timestamp 1",
            "!!bool maybe",
            "!!float x",
            "!!set [1]",
            "!!map [1]",
            "!!omap [1]",
        ]
    ),
)


def _mutate_text(draw: Callable[..., Any], text: str) -> bytes:
    lines = text.splitlines(keepends=True)
    data = text.encode()
    action = draw(st.sampled_from(["repeat line", "drop line", "raw value", "bomb", "bytes", "cut", "bom"]))
    at = draw(st.integers(0, max(len(lines) - 1, 0)))
    if action == "repeat line":
        return "".join(lines[: at + 1] + lines[at:]).encode()
    if action == "drop line":
        return "".join(lines[:at] + lines[at + 1 :]).encode()
    if action == "raw value":
        keyed = [i for i, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("#")]
        i = draw(st.sampled_from(keyed))
        head = lines[i].split(": ", 1)[0]
        lines[i] = f"{head}: {draw(_RAW_VALUES)}\n"
        return "".join(lines).encode()
    if action == "bomb":
        return (text + _alias_bomb(draw(st.integers(1, 12)), draw(st.integers(1, 12)))).encode()
    if action == "bytes":
        where = draw(st.integers(0, len(data)))
        return data[:where] + draw(st.binary(min_size=1, max_size=64)) + data[where:]
    if action == "cut":
        return data[: draw(st.integers(0, len(data)))]
    return b"\xef\xbb\xbf" + data


@st.composite
def broken_scenarios(draw: Callable[..., Any]) -> bytes:
    """A shipped scenario broken in one way, as the bytes of a file."""
    text = draw(st.sampled_from(SHIPPED)).read_text()
    mutate = draw(st.sampled_from([_mutate_data, _mutate_text]))
    return mutate(draw, text)


# ----------------------------------------------------------------------------- the property
@functools.cache
def _warm_up() -> None:
    # Imports and caches of a first validate are not the scenario's memory.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["validate", str(REPO / "scenarios" / "quickstart.yaml")]) == 0


def _validate(content: bytes) -> tuple[int, str, str, int, list[str]]:
    """Exit code, stdout, stderr, tracemalloc peak and the folder's files after validating ``content``."""
    _warm_up()
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        (Path(folder) / "scenario.yaml").write_bytes(content)
        out, err = io.StringIO(), io.StringIO()
        tracemalloc.start()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["validate", "scenario.yaml"])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return code, out.getvalue(), err.getvalue(), peak, sorted(os.listdir(folder))


@FUZZ_SETTINGS
@given(broken_scenarios())
def test_a_broken_scenario_is_ok_or_one_bounded_error_line(content: bytes) -> None:
    code, out, err, peak, files = _validate(content)
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err[:2000]
        assert len(lines[0]) <= MAX_LINE, lines[0][:2000]
        assert out == ""
    assert files == ["scenario.yaml"]
    assert peak < MEMORY_BOUND, f"tracemalloc peak {peak / 2**20:.0f} MiB"
