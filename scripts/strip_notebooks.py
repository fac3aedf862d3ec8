"""Strip outputs and execution counts from notebooks so they are committed output-free.

Notebooks are source here: CI executes them (``tests/test_notebooks.py``), so stored
outputs would only add binary noise to diffs and go stale. Usage::

    python scripts/strip_notebooks.py              # every notebooks/*.ipynb, in place
    python scripts/strip_notebooks.py --check      # exit 1 if any notebook has outputs
    python scripts/strip_notebooks.py a.ipynb b.ipynb
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
# Per-run metadata that Jupyter adds and that changes without the source changing.
_VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled")


def strip(nb: nbformat.NotebookNode) -> bool:
    """Remove outputs, execution counts and volatile metadata in place; True if anything changed."""
    changed = _strip_notebook_metadata(nb.metadata)
    for cell in nb.cells:
        for key in _VOLATILE_CELL_METADATA:
            changed |= cell.metadata.pop(key, None) is not None
        if cell.cell_type != "code":
            continue
        changed |= bool(cell.outputs) or cell.execution_count is not None
        cell.outputs = []
        cell.execution_count = None
    return changed


def _strip_notebook_metadata(metadata: nbformat.NotebookNode) -> bool:
    # The kernel records its Python version and lexer details; they differ between machines.
    language = metadata.get("language_info")
    slim = {"name": language.get("name", "python")} if language else None
    changed = metadata.pop("widgets", None) is not None
    if language is not None and language != slim:
        metadata["language_info"] = slim
        changed = True
    return changed


def is_stripped(nb: nbformat.NotebookNode) -> bool:
    """True when no code cell holds outputs or an execution count."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    return all(not c.outputs and c.execution_count is None for c in code)


def main(argv: list[str] | None = None) -> int:
    """Strip the given notebooks (default: notebooks/*.ipynb); with --check only report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)"
    )
    parser.add_argument(
        "--check", action="store_true", help="report notebooks with outputs, change nothing"
    )
    args = parser.parse_args(argv)
    paths = args.paths or sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
    dirty = []
    for path in paths:
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        if args.check:
            if not is_stripped(nb):
                dirty.append(path)
        elif strip(nb):
            nbformat.write(nb, path)
            print(f"stripped {path}")
    for path in dirty:
        print(f"{path}: has outputs; run python scripts/strip_notebooks.py", file=sys.stderr)
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
