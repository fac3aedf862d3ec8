"""Refresh the generated blocks of README.md from the code and the committed results.

Blocks sit between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` markers:
``schema`` (the scenario field reference), ``quickstart`` (results/quickstart/summary.md)
``speedup`` (the table of results/batching_speedup.md) and ``validation``
(results/validation/vllm-0.6.0-burst.md). ``--check`` exits 1 when the
README is stale; tests/test_readme.py runs that check.

    python scripts/update_readme.py [--check]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sim.schema_doc import schema_markdown  # noqa: E402


def _table_only(markdown: str) -> str:
    return "\n".join(line for line in markdown.splitlines() if line.startswith("|"))


def blocks() -> dict[str, str]:
    """The current text of every generated block."""
    results = REPO / "results"
    return {
        "schema": schema_markdown().strip(),
        "quickstart": _table_only((results / "quickstart" / "summary.md").read_text()),
        "speedup": _table_only((results / "batching_speedup.md").read_text()),
        "validation": _table_only((results / "validation" / "vllm-0.6.0-burst.md").read_text()),
    }


def render(readme: str) -> str:
    """README text with every generated block replaced by its current content."""
    for name, body in blocks().items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)", re.S)
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no '{name}' block")
        readme = pattern.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(2), readme)
    return readme


def main(argv: list[str]) -> int:
    path = REPO / "README.md"
    current = path.read_text()
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print("README.md is stale: run python scripts/update_readme.py")
            return 1
        return 0
    path.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
