"""Refresh the generated blocks of README.md from the code and the committed results.

Blocks sit between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` markers:
``schema`` (the scenario field reference), ``quickstart`` (results/quickstart/summary.md)
``speedup`` (the table of results/batching_speedup.md), ``validation``
(results/validation/vllm-0.6.0-burst.md), ``incident`` (results/incident/summary.md),
``client_advice`` (the verdicts of results/client_advice.csv), ``speedup_map`` and
``article_table`` (the grid and the quoted table's form in results/speedup_map.md),
``calibration_errors`` (held-out MAPE / worst case of each A100 fit report, results/calibration/*_fit.md).
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


CALIBRATION_COLUMNS = {
    "linear": "linear ops (target ≤ 5%)", "attention_decode": "attention decode (≤ 10%)",
    "attention_prefill": "attention prefill (≤ 10%)", "all_reduce": "all-reduce", "cpu_overhead": "CPU overhead",
}  # fmt: skip
"""Components of a fit report (results/calibration/*_fit.md) shown in the README, with their headers."""


def fit_errors(report: str) -> dict[str, tuple[str, str]]:
    """Component -> (MAPE, worst) as written in a fit report's table, e.g. ``("1.7%", "16.7%")``."""
    table = _table_after(report, "# Fit report").splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in table]
    return {row[0]: (row[2], row[3]) for row in cells}


def _calibration_errors(folder: Path, gpu: str) -> str:
    """One row per committed fit report of ``gpu``: MAPE / worst case (rounded to 1%) per component."""
    header = [f"calibration ({gpu.upper()})", *CALIBRATION_COLUMNS.values()]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for path in sorted(folder.glob(f"*_{gpu}_tp*_fit.md")):
        model, tp = re.fullmatch(rf"(.+)_{gpu}_tp(\d+)_fit\.md", path.name).groups()
        errors = fit_errors(path.read_text())
        cells = [f"{errors[c][0]} / {float(errors[c][1].rstrip('%')):.0f}%" if c in errors else "—"
                 for c in CALIBRATION_COLUMNS]  # fmt: skip
        rows.append(f"| {model} TP{tp} | " + " | ".join(cells) + " |")
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
        "calibration_errors": _calibration_errors(results / "calibration", "a100-80gb"),
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
