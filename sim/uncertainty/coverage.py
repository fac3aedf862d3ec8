"""How often the stated intervals held the measured value of the real runs, each run left out of its own table.

For every real run of the validation report and every family of :data:`CHECKED` it has, the model-error table
is rebuilt without that run (:func:`sim.uncertainty.model_error.build_table`), the run's cell looked up as a
run of batchsim would (its preset, its cost model's class, its load) and the 90% interval
simulated x e^(+-h) compared with what was measured. The replays are of the runs' own requests, so the
simulation has no sampling error of its own: the interval is the model error alone. ``coverage`` is the share
of (run, figure) pairs inside; the target is >= 80% on runs never seen (issue 29). :func:`flag_check` asks
the other question: did the flags mark every run whose error exceeded 25%?

    python -m sim.uncertainty.coverage [--docs [--check]]   # print, or refresh docs/uncertainty.md's blocks
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from sim.uncertainty.flags import NEAR_CAPACITY
from sim.uncertainty.model_error import (
    ANY,
    MIN_RUNS,
    REPO_ROOT,
    build_table,
    cost_class,
    load_table,
    lookup,
    read_validation,
    residuals,
)

DOCS_FILE = REPO_ROOT / "docs" / "uncertainty.md"

CHECKED = ("ttft_p50", "tpot", "e2e_p50", "throughput")
"""Families whose coverage is reported: the medians the targets name, and the throughput."""
LARGE_ERROR = 0.25
"""An error above this (relative) is one the flags must mark."""


def leave_one_out_coverage(validation: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (run, family): measured vs simulated, the left-out interval's half-width and cell, covered."""
    validation = read_validation() if validation is None else validation
    found = residuals(validation)
    loads = validation.groupby("run")["load_frac"].first()
    rows = []
    for run in sorted(found["run"].unique()):
        table = build_table(validation[validation["run"] != run])
        for _, row in found[(found["run"] == run) & found["family"].isin(CHECKED)].iterrows():
            error = lookup(row["preset"], row["cost_class"], float(loads[run]), row["family"], table)
            rows.append({
                "run": run, "family": row["family"], "log_error": row["log_error"], "half_width": error.half_width,
                "cell": error.cell, "covered": abs(row["log_error"]) <= error.half_width,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=["run", "family", "log_error", "half_width", "cell", "covered"])


def coverage_by_family(table: pd.DataFrame) -> pd.DataFrame:
    """Per family and over all: pairs, covered, coverage (%), median half-width (%)."""
    groups = [*table.groupby("family", sort=False), ("all", table)]
    return pd.DataFrame([{
        "family": family, "pairs": len(g), "covered": int(g["covered"].sum()),
        "coverage_pct": 100.0 * g["covered"].mean(),
        "median_half_width_pct": 100.0 * math.expm1(g["half_width"].median()),
    } for family, g in groups])  # fmt: skip


def flag_check(validation: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per real run: its largest |error| over every compared figure (and which figure that is) and over the
    medians, and whether a run of batchsim in its place would be flagged (load above 0.9, a transferred or
    roofline cost model)."""
    validation = read_validation() if validation is None else validation
    rows = validation[validation["error_pct"].notna()]
    out = []
    for run, group in rows.groupby("run", sort=False):
        medians = group[group["metric"].isin(["ttft_p50_ms", "tpot_p50_ms", "tpot_derived_ms", "e2e_p50_ms"])]
        klass = cost_class(str(group["cost_model"].iloc[0]))
        load = float(group["load_frac"].iloc[0])
        worst = group["error_pct"].abs().idxmax()
        out.append({
            "run": run, "worst_metric": str(group.loc[worst, "metric"]),
            "worst_error_pct": float(abs(group.loc[worst, "error_pct"])),
            "worst_median_error_pct": float(medians["error_pct"].abs().max()) if len(medians) else math.nan,
            "flagged": load > NEAR_CAPACITY or klass in ("transferred", "roofline"),
        })  # fmt: skip
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- docs blocks
def coverage_markdown(validation: pd.DataFrame | None = None) -> str:
    """The ``coverage`` block: coverage per family, then the flag check."""
    by_family = coverage_by_family(leave_one_out_coverage(validation))
    lines = ["| figure | (run, figure) pairs | inside the 90% interval | coverage | median half-width |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {r.family} | {r.pairs} | {r.covered} | {r.coverage_pct:.0f}% | ±{r.median_half_width_pct:.0f}% |"
              for r in by_family.itertuples()]  # fmt: skip
    lines += ["", flag_line(flag_check(validation))]
    return "\n".join(lines)


def flag_line(flags: pd.DataFrame) -> str:
    """The flag check in one sentence: runs with a figure off by more than :data:`LARGE_ERROR`, how many the
    flags marked, the others with their worst figure, and how many had a median that far off."""
    large = flags[flags["worst_error_pct"] > 100 * LARGE_ERROR]
    medians = flags[flags["worst_median_error_pct"] > 100 * LARGE_ERROR]
    missed = ", ".join(f"{r.run} ({r.worst_metric} {r.worst_error_pct:.0f}%)" for r in large.itertuples()
                       if not r.flagged) or "none"  # fmt: skip
    return (f"Runs with a figure more than {LARGE_ERROR:.0%} off: {len(large)} of {len(flags)} "
            f"({int(large['flagged'].sum())} flagged; not flagged: {missed}); with a median (TTFT, TPOT, E2E) more "
            f"than {LARGE_ERROR:.0%} off: {len(medians)}.")  # fmt: skip


def model_error_markdown(table: pd.DataFrame | None = None) -> str:
    """The ``model_error`` block: the pooled cells' 90% half-widths per family, with their runs."""
    table = load_table() if table is None else table
    pooled = table[(table["preset"] == ANY)]
    families = ("ttft_p50", "tpot", "e2e_p50", "throughput")
    lines = ["| class | load | runs | used | " + " | ".join(f"{f} ±" for f in families) + " | source runs |",
             "|---|---|---:|---|" + "---:|" * len(families) + "---|"]  # fmt: skip
    for (klass, load), cell in pooled.groupby(["cost_class", "regime"], sort=True):
        by_family = cell.set_index("family")
        widths = [f"{100 * math.expm1(by_family.loc[f, 'half_width']):.0f}%" if f in by_family.index else "—"
                  for f in families]  # fmt: skip
        runs = int(cell["runs"].max())
        sources = str(cell.sort_values("runs").iloc[-1]["source_runs"])
        used = "yes" if runs >= MIN_RUNS else f"no: < {MIN_RUNS} runs, pooled"
        lines.append(f"| {klass} | {load} | {runs} | {used} | " + " | ".join(widths) + f" | {sources} |")
    return "\n".join(lines)


def refresh_docs(check: bool = False, docs: Path = DOCS_FILE) -> bool:
    """Write the ``coverage`` and ``model_error`` blocks of docs/uncertainty.md; True if they were current."""
    from sim.io.outputs import atomic_file
    from sim.validation.report import render_docs

    current = docs.read_text()
    fresh = render_docs(current, coverage_markdown(), "coverage")
    fresh = render_docs(fresh, model_error_markdown(), "model_error")
    if fresh != current and not check:
        with atomic_file(docs) as tmp:
            tmp.write_text(fresh)
    return fresh == current


def main(argv: list[str] | None = None) -> int:
    """Print the coverage and flag tables, or refresh (``--docs``) or check (``--docs --check``) the docs."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--docs", action="store_true", help="refresh the blocks of docs/uncertainty.md")
    parser.add_argument("--check", action="store_true", help="with --docs: only say whether they are current")
    args = parser.parse_args(argv)
    if args.docs:
        current = refresh_docs(check=args.check)
        print("docs/uncertainty.md is current" if current else "docs/uncertainty.md was stale")
        return 0 if current or not args.check else 1
    print(coverage_by_family(leave_one_out_coverage()).round(1).to_string(index=False))
    print(flag_check().round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
