"""The modules of :mod:`sim.sweeps` import each other one way only (no import circles),
and every name moved to break a circle is still importable from where it used to live."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SWEEPS = Path(__file__).resolve().parents[1] / "sim" / "sweeps"


def _imports(path: Path) -> set[str]:
    """``sim.sweeps`` modules that ``path`` imports anywhere, deferred imports in functions included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "sim.sweeps":  # from sim.sweeps import cli
                found |= {f"sim.sweeps.{alias.name}" for alias in node.names}
            elif node.module.startswith("sim.sweeps."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("sim.sweeps.")}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {f"sim.sweeps.{p.stem}": p for p in SWEEPS.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & modules.keys() for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first = last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_sweep_modules_have_no_import_circle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    # Guards the test above against passing because it cannot see anything.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "sim.sweeps.backends" in _graph()["sim.sweeps.runner"]


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("sim.sweeps.backends", "WorkerDied"),
        ("sim.sweeps.errors", "WorkerDied"),
        ("sim.sweeps.cli", "parse_slo_options"),
        ("sim.sweeps.cli", "sigterm_as_interrupt"),
        ("sim.sweeps.cli", "Terminated"),
        ("sim.sweeps.cli", "StopSignal"),
        ("sim.sweeps.cli", "EXIT_TERMINATED"),
        ("sim.sweeps.cli_common", "sigterm_as_interrupt"),
        ("sim.sweeps.split_cli", "run_split_search"),
    ],
)
def test_moved_names_are_importable_where_they_were(module: str, name: str) -> None:
    import importlib

    assert hasattr(importlib.import_module(module), name)


def test_one_worker_died_class() -> None:
    from sim.sweeps import backends, errors, ray_backend

    assert backends.WorkerDied is errors.WorkerDied is ray_backend.WorkerDied
