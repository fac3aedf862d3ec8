"""Every notebook in notebooks/ executes top to bottom without error, and is committed output-free.

Notebooks run with nbclient on the ``python3`` kernel, from the notebooks/ folder (as
Jupyter would), with the repository on ``PYTHONPATH`` so an uninstalled checkout works.
A cell that raises, or runs past ``CELL_TIMEOUT_S``, fails the test with the cell's
traceback. The calibration notebook is also run as if ``../shared`` were absent, so the
fallback to the committed fit report cannot rot on machines that have the profiles.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

nbclient = pytest.importorskip(
    "nbclient", reason="nbclient is a test dependency: pip install -e '.[test]'"
)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
EXPECTED = {"compare_policies", "calibration", "seed_table", "client_advice"}
CELL_TIMEOUT_S = 120
PARAMETERS_TAG = "parameters"


def execute(nb: nbformat.NotebookNode, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    """Run ``nb`` in a fresh kernel started in notebooks/; raises CellExecutionError on an error."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the kernel subprocess inherits the environment
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    client.execute()
    return nb


def outputs_of(nb: nbformat.NotebookNode, output_type: str | None = None) -> list[dict]:
    """Every output of every code cell (optionally only one output type)."""
    found = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    return [o for o in found if output_type is None or o["output_type"] == output_type]


def images(nb: nbformat.NotebookNode) -> int:
    """How many PNG images the executed notebook shows."""
    return sum("image/png" in o.get("data", {}) for o in outputs_of(nb))


def read(stem: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS_DIR / f"{stem}.ipynb", as_version=4)


def test_the_documented_notebooks_exist() -> None:
    assert EXPECTED <= {p.stem for p in NOTEBOOKS}


def test_the_readme_and_docs_api_name_every_notebook() -> None:
    """A notebook added to notebooks/ but missing from the README's list (as client_advice once was) fails."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Python API and notebooks") :]
    section = section[: section.index("\n## ", 1)]
    api = (REPO / "docs" / "api.md").read_text()
    for path in NOTEBOOKS:
        assert f"`{path.stem}`" in section, path.stem
        assert f"`notebooks/{path.name}`" in api, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid_and_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code"
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count)
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} hold outputs; run python scripts/strip_notebooks.py"
    )
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_shows_figures(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = execute(nbformat.read(path, as_version=4), monkeypatch)  # raises on the first failing cell
    # Each notebook is about pictures; none showing means the figure display broke silently.
    assert images(nb) >= 1, f"{path.name} displayed no figure"


@pytest.mark.slow
def test_calibration_notebook_falls_back_without_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = read("calibration")
    tagged = [i for i, c in enumerate(nb.cells) if PARAMETERS_TAG in c.metadata.get("tags", [])]
    assert len(tagged) == 1, (
        "calibration.ipynb needs exactly one cell tagged 'parameters' setting SHARED"
    )
    assert "SHARED" in nb.cells[tagged[0]].source
    missing = nbformat.v4.new_code_cell('SHARED = Path("/nonexistent/shared")')
    nb.cells.insert(tagged[0] + 1, missing)
    nb = execute(nb, monkeypatch)
    text = "".join(o.get("text", "") for o in outputs_of(nb, "stream"))
    assert "not found" in text, "the notebook should say that ../shared is missing"
    assert images(nb) >= 1, "the fallback should still show the committed fit plots"
