"""The package layout keeps its promises: imports run one way, a run never loads the offline
pipeline, and commands import only what they use (issue 17 item 3, issue 18 item 6)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "sim"
HEAVY = ("pandas", "numpy", "pydantic", "scipy", "matplotlib", "simpy", "ray", "plotly", "pyarrow")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(name: str, modules: set[str]) -> str | None:
    """The sim module an imported dotted name refers to (a submodule if one exists)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> sim modules it imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    files = {_module_name(p): p for p in SIM.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                target = _target(name, modules) if name.startswith("sim") else None
                if target and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_package() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the walk saw the package
    assert cycles(graph) == []


def test_a_run_never_imports_the_offline_calibration_pipeline() -> None:
    graph = import_graph()
    run_layers = (["hardware"], ["serving"], ["policies"], ["metrics"], ["workload"])
    run_side = [m for m in graph if m.split(".")[1:2] in run_layers]
    offenders = {m: sorted(t for t in graph[m] if t.startswith("sim.calibration")) for m in run_side}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_reports_are_pure_and_studies_do_the_simulating() -> None:
    """sim.report renders results (tables, plots, HTML, traces) and never simulates: it imports
    neither the engine, the runner, sweeps nor the studies; the studies are where results/ is made."""
    graph = import_graph()
    report = [m for m in graph if m.startswith("sim.report")]
    simulating = ("sim.studies", "sim.runner", "sim.serving", "sim.sweeps", "sim.disaggregation")
    offenders = {m: sorted(t for t in graph[m] if t.startswith(simulating)) for m in report}
    assert len(report) >= 6 and {m: t for m, t in offenders.items() if t} == {}
    studies = [m for m in graph if m.startswith("sim.studies.")]
    assert any("sim.runner" in graph[m] for m in studies)  # the studies run scenarios


def _loaded_after(code: str) -> list[str]:
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return [m for m in json.loads(out.stdout.splitlines()[-1]) if m in HEAVY]


def test_help_imports_no_heavy_library() -> None:
    loaded = _loaded_after(
        "import contextlib, io\nfrom sim.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main(['--help'])"
    )
    assert loaded == []


@pytest.mark.parametrize("args", [["run", "--help"], ["sweep", "--help"], ["list", "models"]])
def test_cheap_commands_import_no_scientific_stack(args: list[str]) -> None:
    loaded = _loaded_after(
        "import contextlib, io\nfrom sim.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main({args!r})"
    )
    assert not set(loaded) & {"pandas", "scipy", "matplotlib", "ray"}


@pytest.mark.slow
def test_a_run_without_plots_imports_neither_scipy_nor_matplotlib(tmp_path: Path) -> None:
    loaded = _loaded_after(
        "import sim\n"
        "s = sim.load_scenario('scenarios/quickstart.yaml').replace(**{'workload.requests': 50})\n"
        f"sim.run(s).save({str(tmp_path / 'out')!r}, plots=False)"
    )
    assert "pandas" in loaded and "simpy" in loaded  # the probe saw a real run
    assert "scipy" not in loaded and "matplotlib" not in loaded
