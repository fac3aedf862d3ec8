"""Refresh the generated blocks of README.md from the code and the committed results.

Blocks sit between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` markers:
``schema`` (the scenario field reference), ``quickstart`` (results/quickstart/summary.md)
``speedup`` (the table of results/batching_speedup.md), ``validation``
(results/validation/vllm-0.6.0-burst.md), ``incident`` (results/incident/summary.md),
``client_advice`` (the verdicts of results/client_advice.csv), ``speedup_map`` and
``article_table`` (the grid and the quoted table's form in results/speedup_map.md).
Pages under docs/ may hold any of the same blocks and are refreshed too. ``--check`` exits 1 when a file is stale;
tests/test_readme.py runs that check.

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


def _table_after(markdown: str, heading: str) -> str:
    """The first Markdown table after the line starting with ``heading``."""
    lines = markdown.splitlines()
    after = next(i for i, line in enumerate(lines) if line.startswith(heading))
    start = next(i for i in range(after, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def _verdicts(csv: Path) -> str:
    """Experiment, advice and verdict of each row of results/client_advice.csv, as a Markdown table."""
    import pandas as pd

    table = pd.read_csv(csv)[["experiment", "advice", "supported", "verdict"]]
    rows = ["| experiment | advice | supported | verdict |", "|---|---|---|---|"]
    for r in table.itertuples():
        rows.append(f"| {r.experiment} | {r.advice} | {'yes' if r.supported else 'no'} | {r.verdict} |")
    return "\n".join(rows)


def blocks() -> dict[str, str]:
    """The current text of every generated block."""
    results = REPO / "results"
    return {
        "schema": schema_markdown().strip(),
        "quickstart": _table_only((results / "quickstart" / "summary.md").read_text()),
        "speedup": _table_only((results / "batching_speedup.md").read_text()),
        "validation": _table_only((results / "validation" / "vllm-0.6.0-burst.md").read_text()),
        "incident": _table_only((results / "incident" / "summary.md").read_text()),
        "client_advice": _verdicts(results / "client_advice.csv"),
        "speedup_map": _table_after((results / "speedup_map.md").read_text(), "## Speedup per length class"),
        "article_table": _table_after((results / "speedup_map.md").read_text(), "## The quoted table"),
    }


def render(text: str, required: bool = True) -> str:
    """``text`` with every generated block replaced by its current content.

    Args:
        text: a Markdown file's content.
        required: the README must hold every block; docs pages only some.
    """
    for name, body in blocks().items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            if required:
                raise SystemExit(f"README.md has no '{name}' block")
            continue
        text = pattern.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    pages = [(REPO / "README.md", True)] + [(p, False) for p in sorted((REPO / "docs").glob("*.md"))]
    stale = []
    for path, required in pages:
        current = path.read_text()
        fresh = render(current, required)
        if fresh == current:
            continue
        stale.append(path.relative_to(REPO))
        if "--check" not in argv:
            path.write_text(fresh)
    if "--check" in argv and stale:
        print(f"stale: {', '.join(map(str, stale))}: run python scripts/update_readme.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
