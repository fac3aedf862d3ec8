"""A fresh machine works: every third-party import is declared, every module imports,
and the commands that need no fit or plot load neither scipy nor matplotlib.

CI runs the suite in a fresh virtual environment holding only what ``pyproject.toml``
declares, so an undeclared import fails there too; the static check below names the
culprit even on a machine whose Python happens to have the package.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sim

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Import name -> distribution name, where they differ.
DISTRIBUTION_OF = {"yaml": "pyyaml", "pydantic_core": "pydantic"}
# Imports satisfied by a declared distribution's own dependencies, by design.
PROVIDED_BY = {"pydantic_core": "pydantic"}


def _declared(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() for req in requirements}


CORE = _declared(PYPROJECT["project"]["dependencies"])
EXTRAS = {name: _declared(reqs) for name, reqs in PYPROJECT["project"]["optional-dependencies"].items()}


def _third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level module name -> files importing it, for absolute imports outside the stdlib."""
    found: dict[str, set[str]] = {}
    # Sibling modules (bench_engine, ...) and the repository's own scripts (update_readme), which tests import.
    local = {"sim", "fakes"} | {p.stem for p in folder.glob("*.py")} | {p.stem for p in (REPO / "scripts").glob("*.py")}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def _distribution(module: str) -> str:
    return DISTRIBUTION_OF.get(module, module).lower()


def test_every_import_of_the_package_is_a_declared_dependency() -> None:
    # Ray is imported only inside the Ray backend, and is the optional [ray] extra; plotly only by
    # sim/report/html.py (report.html), the optional [html] extra; pyarrow only by sim/io/parquet.py
    # (metrics.format: parquet), the optional [parquet] extra; vllm and torch only by
    # sim/parity/vllm_driver.py, the optional [parity] extras.
    parity = EXTRAS["parity"] | EXTRAS["parity-vllm011"]
    allowed = CORE | EXTRAS["ray"] | EXTRAS["html"] | EXTRAS["parquet"] | parity
    missing = {m: files for m, files in _third_party_imports(REPO / "sim").items() if _distribution(m) not in allowed}
    assert not missing, f"sim/ imports packages pyproject.toml does not declare: {missing}"


def test_every_import_of_the_tests_is_declared_in_the_test_extra() -> None:
    allowed = CORE | EXTRAS["test"]
    imports = _third_party_imports(REPO / "tests") | _third_party_imports(REPO / "benchmarks")
    missing = {m: files for m, files in imports.items() if _distribution(m) not in allowed}
    assert not missing, f"tests/benchmarks import packages no install command declares: {missing}"


def test_scipy_is_declared_with_the_version_that_has_isotonic_regression() -> None:
    scipy_req = [r for r in PYPROJECT["project"]["dependencies"] if r.startswith("scipy")]
    assert scipy_req and ">=1.12" in scipy_req[0]


def test_every_module_of_the_package_imports() -> None:
    failures = {}
    for info in pkgutil.walk_packages(sim.__path__, prefix="sim."):
        if info.name == "sim.__main__":  # importing it runs the CLI; it only imports sim.cli
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - report every failing module at once
            failures[info.name] = repr(exc)
    assert not failures, failures


def _modules_loaded_by(code: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    return set(proc.stdout.split())


@pytest.mark.parametrize("heavy", ["scipy", "matplotlib"])
def test_help_loads_neither_scipy_nor_matplotlib(heavy: str) -> None:
    loaded = _modules_loaded_by("import sim.cli\nsim.cli.build_parser().format_help()")
    assert heavy not in loaded


@pytest.mark.parametrize("heavy", ["scipy", "matplotlib"])
def test_a_run_without_plots_loads_neither_scipy_nor_matplotlib(heavy: str, tmp_path: Path) -> None:
    out = tmp_path / "qs"
    loaded = _modules_loaded_by(
        "import sim.cli\n"
        f"assert sim.cli.main(['run', 'scenarios/quickstart.yaml', '--set', 'workload.requests=20', "
        f"'--no-plots', '--quiet', '--out', {str(out)!r}]) == 0"
    )
    assert (out / "summary.csv").is_file()
    assert heavy not in loaded


def test_ci_installs_into_a_fresh_virtual_environment_and_runs_both_readme_commands() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(python -m pip install[^\n]+)\n```", readme)
    assert len(commands) == 2, commands
    for command in commands:
        assert command in ci, f"CI does not run the README command verbatim: {command}"
    venv_at = ci.index("-m venv")
    assert all(ci.index(command) > venv_at for command in commands), "README commands must run inside the venv"
    assert '"$status" -eq 5' in ci, "CI must treat pytest's exit code 5 (no tests) as a failure"


def test_ci_runs_the_slow_tests_in_parallel() -> None:
    # `slow` lets a developer skip those tests (-m "not slow"); CI must still run every one of them,
    # on the two workers the test extra's pytest-xdist provides.
    addopts = PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"].split()
    ci = (REPO / ".ci" / "run").read_text()
    pytest_args = [line.split("python -m pytest", 1)[1].split() for line in ci.splitlines()
                   if "python -m pytest" in line and not line.startswith("#")]  # fmt: skip
    assert pytest_args and not any({"-m", "-k"} & set(args) or "--deselect" in args for args in pytest_args)
    assert "-m" not in addopts and "-k" not in addopts and not any(o.startswith("--deselect") for o in addopts)
    assert addopts[addopts.index("-n") + 1] == "2" and "pytest-xdist" in EXTRAS["test"]
