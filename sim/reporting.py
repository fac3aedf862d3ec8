"""``python -m sim report``: regenerate results/ from the shipped scenarios.

Each scenario's outputs go to ``results/<name>/``; the scenarios under
``scenarios/seed_table/`` also feed ``results/batching_speedup.{md,csv}``. A scenario
whose trace is not on this machine is skipped with a message, not an error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from sim.errors import MissingDataError
from sim.outputs import CSV_FLOAT_FORMAT, atomic_folder
from sim.scenario_io import load_scenario

SPEEDUP_FOLDER = "seed_table"


def shipped_scenarios(folder: Path) -> list[Path]:
    """Top-level scenario files, then the seed-table cases, each group sorted by name."""
    return sorted(folder.glob("*.yaml")) + sorted((folder / SPEEDUP_FOLDER).glob("*.yaml"))


def regenerate_results(
    scenarios_dir: Path, out_dir: Path, *, plots: bool = True, progress: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, pd.DataFrame]:
    """Run every shipped scenario, write its folder, then the speedup table; returns summaries by scenario."""
    from sim.runner import run

    summaries: dict[str, pd.DataFrame] = {}
    seed_table: dict[str, pd.DataFrame] = {}
    for path in shipped_scenarios(scenarios_dir):
        try:
            result = run(load_scenario(path), progress=progress)
        except MissingDataError as exc:
            log(f"skipped {path.name}: {exc}")
            continue
        result.save(out_dir / result.scenario.name, plots=plots)
        summaries[result.scenario.name] = result.summary
        if path.parent.name == SPEEDUP_FOLDER:
            seed_table[result.scenario.name] = result.summary
        log(f"{result.scenario.name}: {len(result.summary)} policies in {result.runtime_s:.1f}s")
    if seed_table:
        write_speedup(seed_table, out_dir, plots=plots)
        log(f"wrote {out_dir / 'batching_speedup.md'}")
    return summaries


def write_speedup(summaries: dict[str, pd.DataFrame], out_dir: Path, *, plots: bool = True) -> pd.DataFrame:
    """batching_speedup.csv/.md (and .png) from per-scenario summaries."""
    from sim.report import plots as figures
    from sim.report.speedup import speedup_markdown, speedup_table

    table = speedup_table(summaries)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_folder(out_dir / ".speedup") as tmp:
        table.to_csv(tmp / "batching_speedup.csv", index=False, float_format=CSV_FLOAT_FORMAT)
        (tmp / "batching_speedup.md").write_text(speedup_markdown(table))
        if plots:
            figures.save_figure(figures.speedup_bars(table), tmp / "batching_speedup.png")
    staged = out_dir / ".speedup"
    for item in staged.iterdir():
        item.replace(out_dir / item.name)
    staged.rmdir()
    return table
