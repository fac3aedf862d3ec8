"""``python -m sim report``: regenerate results/ from the shipped scenarios.

Each scenario's outputs go to ``results/<name>/``; the scenarios under
``scenarios/seed_table/`` also feed ``results/batching_speedup.{md,csv}`` and, when all four
length classes are there, the speedup map ``results/speedup_map.{csv,md}`` and
``speedup_map_<class>.png`` (:mod:`sim.studies.speedup_map`); the real vLLM runs
in ``../shared/validation`` are replayed into ``results/validation/`` (skipped, saying so, where
absent). A scenario
whose trace is not on this machine is skipped with a message, not an error. Every
scenario is loaded and its folder checked (:func:`sim.io.outputs.check_output_dir`) before
the first simulation, so a folder that must not be replaced fails the report at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from sim.errors import MissingDataError, UserError, did_you_mean
from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_file, check_output_dir
from sim.io.safe_paths import check_target, require_input_folder
from sim.io.scenario import load_scenario

if TYPE_CHECKING:
    from sim.studies.speedup_map import MapConfig, SpeedupMap

SPEEDUP_FOLDER = "seed_table"


def _validation(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.validation.report import report_validation

    report_validation(out_dir, log=log)


def _model_error(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.uncertainty.model_error import refresh_package_table

    refresh_package_table(out_dir / "validation", log=log)


def _serving_calibration(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.calibration.serving_cli import write_shared_calibration

    write_shared_calibration(out_dir / "calibration", log=log)


def _client_advice(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.studies.client_advice import write_client_advice

    write_client_advice(out_dir)
    log(f"wrote {out_dir / 'client_advice.md'}")


def _moe(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.studies.moe import write_moe_report

    write_moe_report(out_dir, plots=plots)
    log(f"wrote {out_dir / 'moe.md'}")


def _speculative(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.studies.speculative import write_speculative_report

    write_speculative_report(out_dir, plots)
    log(f"wrote {out_dir / 'speculative.md'}")


def _disaggregation(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.studies.disaggregation import write_disaggregation_report

    write_disaggregation_report(out_dir, plots=plots)
    log(f"wrote {out_dir / 'disaggregation.md'}")


def _money(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.studies.money import write_money_report

    log(f"wrote {write_money_report(out_dir, plots=plots)}")


def _prefix_caching(out_dir: Path, *, plots: bool, log: Callable[[str], None]) -> None:
    from sim.studies.prefix_caching import write_prefix_report

    write_prefix_report(out_dir, plots=plots)  # logs one line and skips when the Mooncake trace is absent


ExtraReport = Callable[..., None]
EXTRA_REPORTS: dict[str, ExtraReport] = {
    "validation": _validation,  # validation/: real vLLM runs vs their replay
    "model_error": _model_error,  # sim/uncertainty/model_error.csv: the validation residuals by preset, class, load
    "serving_calibration": _serving_calibration,  # calibration/vllm-0.11-h100_serving.yaml (calibrate-serving)
    "client_advice": _client_advice,  # client_advice.{csv,md}
    "moe": _moe,  # moe.md, moe/, moe_cost.png (scenarios/moe/)
    "speculative": _speculative,  # speculative.md, speculative.png
    "disaggregation": _disaggregation,  # disaggregation.{md,csv,png} (scenarios/disaggregation/)
    "prefix_caching": _prefix_caching,  # prefix_caching.{md,png} (scenarios/prefix/, the Mooncake trace)
    "money": _money,  # money.{md,csv}: the incident and the speedup map in $/Mtok and J/token (after the map)
}
"""Reports written after the shipped scenarios, in order, by name: each is
``write(out_dir, plots=, log=)``, runs its own scenarios or experiments (imported only when the
report runs) and logs what it wrote or why it skipped."""


def report_scenarios(scenarios_dir: Path, out_dir: Path) -> list[Path]:
    """The scenario files of ``scenarios_dir`` after checking both arguments of ``report``.

    An existing folder without scenarios is allowed: the report then writes only its extra reports.

    Raises:
        UserError: a missing folder (a typo), a file given as one, or an ``out_dir`` that cannot
            be a folder (see :func:`sim.io.safe_paths.check_target`).
    """
    require_input_folder(scenarios_dir, "scenarios folder", field="scenarios")
    check_target(out_dir, field="out", folder=True)
    return shipped_scenarios(scenarios_dir)


def shipped_scenarios(folder: Path) -> list[Path]:
    """Top-level scenario files, then the seed-table cases, each group sorted by name."""
    return sorted(folder.glob("*.yaml")) + sorted((folder / SPEEDUP_FOLDER).glob("*.yaml"))


def regenerate_results(
    scenarios_dir: Path, out_dir: Path, *, plots: bool = True, progress: bool = False,
    log: Callable[[str], None] = print, html: bool = False, studies: Collection[str] | None = None,
) -> dict[str, pd.DataFrame]:
    """Run every shipped scenario, write its folder (with ``report.html`` when ``html``), then the
    speedup table and the extra reports; returns summaries by scenario.

    Args:
        studies: names from :data:`EXTRA_REPORTS` to write after the scenarios (default: all of
            them; empty: none). A test that checks one report runs only that one.

    Raises:
        UserError: ``scenarios_dir`` is not a folder holding scenario files, ``out_dir`` cannot be a
            folder, a scenario or its output folder is refused, or a study name is unknown; all checked
            before anything runs.
    """
    from sim.runner import run

    extras = _extra_reports(studies)
    summaries: dict[str, pd.DataFrame] = {}
    seed_table: dict[str, pd.DataFrame] = {}
    scenarios = [(path, load_scenario(path)) for path in report_scenarios(scenarios_dir, out_dir)]
    for _, scenario in scenarios:
        check_output_dir(out_dir / scenario.name)
    for path, scenario in scenarios:
        try:
            result = run(scenario, progress=progress)
        except MissingDataError as exc:
            log(f"skipped {path.name}: {exc}")
            continue
        result.save(out_dir / result.scenario.name, plots=plots, html=html)
        summaries[result.scenario.name] = result.summary
        if path.parent.name == SPEEDUP_FOLDER:
            seed_table[result.scenario.name] = result.summary
        log(f"{result.scenario.name}: {len(result.summary)} policies in {result.runtime_s:.1f}s")
    speedup_map = write_speedup_map(scenarios_dir, out_dir, plots=plots, log=log)
    if seed_table:
        from sim.studies.speedup_map_text import conclusion

        closing = conclusion(speedup_map) if speedup_map is not None else None
        write_speedup(seed_table, out_dir, plots=plots, conclusion=closing)
        log(f"wrote {out_dir / 'batching_speedup.md'}")
    for write in extras:
        write(out_dir, plots=plots, log=log)
    return summaries


def _extra_reports(studies: Collection[str] | None) -> list[ExtraReport]:
    """The named extra reports in :data:`EXTRA_REPORTS`' order (all for None); UserError for an unknown name."""
    if studies is None:
        return list(EXTRA_REPORTS.values())
    unknown = [name for name in studies if name not in EXTRA_REPORTS]
    if unknown:
        name = unknown[0]
        raise UserError(
            f"{name!r:.80} is not a study{did_you_mean(str(name), EXTRA_REPORTS)}; studies: {', '.join(EXTRA_REPORTS)}",
            field="studies",
        )
    return [write for name, write in EXTRA_REPORTS.items() if name in studies]


def write_speedup(
    summaries: dict[str, pd.DataFrame], out_dir: Path, *, plots: bool = True, conclusion: str | None = None
) -> pd.DataFrame:
    """batching_speedup.csv/.md (and .png) from per-scenario summaries; ``conclusion`` closes the text."""
    from sim.report import plots as figures
    from sim.report.speedup import speedup_markdown, speedup_table

    table = speedup_table(summaries)
    with atomic_file(out_dir / "batching_speedup.csv") as tmp:
        table.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)
    with atomic_file(out_dir / "batching_speedup.md") as tmp:
        tmp.write_text(speedup_markdown(table, conclusion=conclusion))
    if plots:
        with atomic_file(out_dir / "batching_speedup.png") as tmp:
            figures.save_figure(figures.speedup_bars(table), tmp)
    return table


def write_speedup_map(
    scenarios_dir: Path, out_dir: Path, *, plots: bool = True, log: Callable[[str], None] = print,
    config: MapConfig | None = None,
) -> SpeedupMap | None:
    """Measure the speedup map and write speedup_map.csv/.md (and one PNG per class).

    Returns:
        The map, or None (saying so) when a length class's seed-table scenario is absent.
    """
    from sim.studies.speedup_map import CLASS_FILES, MapConfig, measure_map

    config = config or MapConfig()
    missing = [c for c in config.classes if not (scenarios_dir / SPEEDUP_FOLDER / f"{CLASS_FILES[c]}.yaml").exists()]
    if missing:
        log(f"skipped the speedup map: no {SPEEDUP_FOLDER}/ scenario for {', '.join(missing)}")
        return None
    started = time.perf_counter()
    speedup_map = measure_map(scenarios_dir, config, log=log)
    save_speedup_map(speedup_map, out_dir, plots=plots)
    log(f"wrote {out_dir / 'speedup_map.md'} in {time.perf_counter() - started:.0f}s")
    return speedup_map


def save_speedup_map(speedup_map: SpeedupMap, out_dir: Path, *, plots: bool = True) -> None:
    """speedup_map.csv/.md and, with ``plots``, speedup_map_<class>.png into ``out_dir``."""
    from sim.studies.speedup_map_text import map_markdown

    with atomic_file(out_dir / "speedup_map.csv") as tmp:
        speedup_map.table.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)
    with atomic_file(out_dir / "speedup_map.md") as tmp:
        tmp.write_text(map_markdown(speedup_map))
    if not plots:
        return
    from sim.report import plots as figures
    from sim.studies.speedup_map_plot import speedup_heatmap

    for name in speedup_map.config.classes:
        with atomic_file(out_dir / f"speedup_map_{name}.png") as tmp:
            figures.save_figure(speedup_heatmap(speedup_map.table, name), tmp)
