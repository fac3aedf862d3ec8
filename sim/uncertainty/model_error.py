"""Model error: how far batchsim's figures fell from real runs, by engine preset, GPU calibration class and load.

The source is the validation report (``results/validation/*.csv``, :mod:`sim.validation.report`): one row
per real run and metric with the preset that replayed it, the cost model's label and the run's load
(``load_frac``). :func:`build_table` turns it into the **model-error table**: per *cell* -- engine preset,
calibration class (:func:`cost_class`: calibrated, same-shape, transferred, roofline), load regime
(:data:`REGIMES`) and figure family (:data:`FAMILIES`) -- the runs it holds, the root mean square of their
log errors r = ln(simulated / measured) and the 90% prediction half-width of a new run's error,

    h = t(n) x rms x sqrt(1 + 1/n)      (n runs; zero-mean normal log errors, rms estimated on n values),

and the runs themselves (``source_runs``). Cells are also pooled over presets, then over classes, then over
regimes (``*``), and :func:`lookup` takes the most specific cell with at least :data:`MIN_RUNS` runs, so a
sparse cell borrows from its neighbours and says which. The committed copy, ``sim/uncertainty/model_error.csv``,
is what runs read; ``python -m sim report`` rebuilds it from the validation report, and
``python -m sim.uncertainty.model_error [--check]`` does it alone.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.uncertainty.sampling import t_quantile

PACKAGE_TABLE = Path(__file__).resolve().parent / "model_error.csv"
REPO_ROOT = Path(__file__).resolve().parents[2]
VALIDATION_DIR = REPO_ROOT / "results" / "validation"
ANY = "*"
MIN_RUNS = 3
"""Fewest runs a cell needs before its error is used; a sparser one borrows from the pooled cell above it."""
FAMILIES: dict[str, str] = {
    "ttft_p50_ms": "ttft_p50", "ttft_p90_ms": "ttft_p90", "ttft_p99_ms": "ttft_p99",
    "tpot_p50_ms": "tpot", "tpot_derived_ms": "tpot",
    "e2e_mean_ms": "e2e_mean", "e2e_p50_ms": "e2e_p50", "e2e_p90_ms": "e2e_p90", "e2e_p99_ms": "e2e_p99",
    "output_tps": "throughput", "req_per_s": "throughput",
}  # fmt: skip
"""Validation metric -> the family of figures its error speaks for (a burst's median TPOT and a stage's derived
TPOT are both the time per output token; tokens/s of a burst and requests/s of a stage both the throughput)."""
REGIMES: tuple[tuple[str, float], ...] = (("low", 0.5), ("mid", 0.9), ("saturated", math.inf))
"""Load regimes by ``load_frac``: below 0.5, 0.5 to 0.9, from 0.9 (each name and its exclusive upper bound)."""
COLUMNS = ("preset", "cost_class", "regime", "family", "runs", "rms_log_error", "half_width", "source_runs")
_TEXT_COLUMNS = ("preset", "cost_class", "regime", "family", "source_runs")


def cost_class(label: str) -> str:
    """The calibration class of a cost model label: ``calibrated``, ``same-shape``, ``transferred`` or ``roofline``."""
    for prefix, name in (("calibrated", "calibrated"), ("same-shape", "same-shape"), ("transferred", "transferred")):
        if label.startswith(prefix):
            return name
    return "roofline"


def regime(load_frac: float) -> str:
    """The load regime of ``load_frac`` (``*`` for NaN: a closed loop's load is not known)."""
    if load_frac is None or math.isnan(load_frac):
        return ANY
    return next(name for name, upper in REGIMES if load_frac < upper)


# --------------------------------------------------------------------------- building
def residuals(validation: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, family) of a validation report: its keys and log error ln(simulated / measured)."""
    rows = validation[validation["metric"].isin(FAMILIES) & validation["error_pct"].notna()]
    rows = rows[(rows["measured"] > 0) & (rows["simulated"] > 0)]
    return pd.DataFrame({
        "run": rows["run"].astype(str).to_numpy(),
        "preset": rows["preset"].astype(str).to_numpy(),
        "cost_class": [cost_class(str(label)) for label in rows["cost_model"]],
        "regime": [regime(float(x)) for x in rows["load_frac"]],
        "family": rows["metric"].map(FAMILIES).to_numpy(),
        "log_error": np.log(rows["simulated"].to_numpy(dtype=float) / rows["measured"].to_numpy(dtype=float)),
    })  # fmt: skip


def build_table(validation: pd.DataFrame) -> pd.DataFrame:
    """The model-error table of a validation report (all its folders concatenated): every cell and pool."""
    found = residuals(validation)
    rows = []
    for keys in ((True, True, True), (False, True, True), (False, False, True), (False, False, False)):
        rows += _cells(found, *keys)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    return table.sort_values(["family", "preset", "cost_class", "regime"], kind="stable").reset_index(drop=True)


def _cells(found: pd.DataFrame, by_preset: bool, by_class: bool, by_regime: bool) -> list[dict[str, object]]:
    keyed = found.assign(
        preset=found["preset"] if by_preset else ANY,
        cost_class=found["cost_class"] if by_class else ANY,
        regime=found["regime"] if by_regime else ANY,
    )
    cells = []
    for (preset, klass, load, family), group in keyed.groupby(["preset", "cost_class", "regime", "family"]):
        errors = group["log_error"].to_numpy()
        rms = float(np.sqrt(np.mean(errors**2)))
        cells.append({
            "preset": preset, "cost_class": klass, "regime": load, "family": family, "runs": len(errors),
            "rms_log_error": rms, "half_width": prediction_half_width(rms, len(errors)),
            "source_runs": "; ".join(sorted(group["run"])),
        })  # fmt: skip
    return cells


def prediction_half_width(rms: float, runs: int) -> float:
    """90% half-width of a new run's log error from ``runs`` observed ones of this root mean square."""
    return t_quantile(runs) * rms * math.sqrt(1.0 + 1.0 / runs)


def read_validation(folder: Path = VALIDATION_DIR, exclude: Iterable[str] = ()) -> pd.DataFrame:
    """Every ``*.csv`` validation report in ``folder`` (but ``model_error.csv``), concatenated, without the runs
    named in ``exclude``."""
    frames = [pd.read_csv(p) for p in sorted(folder.glob("*.csv")) if p.name != PACKAGE_TABLE.name]
    if not frames:
        return pd.DataFrame(columns=["run", "preset", "cost_model", "load_frac", "metric", "measured", "simulated",
                                     "error_pct"])  # fmt: skip
    table = pd.concat(frames, ignore_index=True)
    return table[~table["run"].isin(list(exclude))]


@functools.cache
def load_table(path: Path = PACKAGE_TABLE) -> pd.DataFrame:
    """The committed model-error table (read once per process)."""
    return _read_table(path)


def _read_table(source: Any) -> pd.DataFrame:
    """The table from a CSV path or buffer; text columns as Python strings (pandas' default string dtype
    would load pyarrow where it is installed, and a CSV run needs no pyarrow)."""
    return pd.read_csv(source, keep_default_na=False, na_values=[""], dtype=dict.fromkeys(_TEXT_COLUMNS, object))


def write_table(table: pd.DataFrame, path: Path) -> None:
    """``table`` as CSV (atomically; six significant digits)."""
    from sim.io.csv_writer import CSV_FLOAT_FORMAT
    from sim.io.safe_write import atomic_file

    with atomic_file(path) as tmp:
        table.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)


# --------------------------------------------------------------------------- looking up
@dataclass(frozen=True)
class ModelError:
    """The model error a figure carries.

    Attributes:
        half_width: 90% half-width of its log error (0: none known).
        cell: which cell of the table gave it (``preset / class / regime``, ``*`` where pooled), or why none.
        runs: the runs behind it.
    """

    half_width: float
    cell: str
    runs: int


def lookup(
    preset: str | None, klass: str, load_frac: float, family: str, table: pd.DataFrame | None = None
) -> ModelError:
    """The most specific cell of ``table`` (default: the committed one) with at least :data:`MIN_RUNS` runs for
    a figure of ``family`` from a run of ``preset`` on a ``klass`` cost model at ``load_frac``: the exact
    cell, then pooled over presets, over classes, over regimes. No row at all: half-width 0, cell ``none``."""
    cells = _committed_cells() if table is None else _cell_index(table)
    load = regime(load_frac)
    for key in ((preset or ANY, klass, load), (ANY, klass, load), (ANY, ANY, load), (ANY, ANY, ANY)):
        found = cells.get((family, *key))
        if found is not None and found[1] >= MIN_RUNS:
            return ModelError(found[0], " / ".join(key), found[1])
    return ModelError(0.0, "none", 0)


@functools.cache
def _committed_cells() -> dict[tuple[str, str, str, str], tuple[float, int]]:
    """The committed table's cells, indexed once per process: every run looks up about 14 of them, and
    filtering the frame each time cost a 1000-request run a quarter of its time."""
    return _cell_index(load_table())


def _cell_index(table: pd.DataFrame) -> dict[tuple[str, str, str, str], tuple[float, int]]:
    """(family, preset, cost class, regime) -> (half-width, runs) of the first row of each cell."""
    cells: dict[tuple[str, str, str, str], tuple[float, int]] = {}
    columns = ("family", "preset", "cost_class", "regime", "half_width", "runs")
    for family, preset, klass, load, half_width, runs in zip(*(table[c] for c in columns), strict=True):
        cells.setdefault((family, preset, klass, load), (float(half_width), int(runs)))
    return cells


def class_validated(klass: str, table: pd.DataFrame | None = None) -> bool:
    """Whether any real run of the table was priced by a cost model of class ``klass``."""
    table = load_table() if table is None else table
    return bool((table["cost_class"] == klass).any())


def refresh_package_table(validation_dir: Path, log: Callable[[str], None] = print) -> None:
    """``python -m sim report``: rebuild the committed table from ``validation_dir`` when that is the repository's
    own ``results/validation`` (a report written elsewhere must not change what every run reads)."""
    if Path(validation_dir).resolve() != VALIDATION_DIR.resolve():
        log(f"kept {PACKAGE_TABLE.name}: the report was written to {validation_dir}, not {VALIDATION_DIR}")
        return
    if not any(Path(validation_dir).glob("*.csv")):
        log(f"kept {PACKAGE_TABLE.name}: no validation report in {validation_dir}")
        return
    write_table(build_table(read_validation(Path(validation_dir))), PACKAGE_TABLE)
    load_table.cache_clear()
    _committed_cells.cache_clear()
    log(f"wrote {PACKAGE_TABLE}")


# --------------------------------------------------------------------------- command
def main(argv: list[str] | None = None) -> int:
    """``python -m sim.uncertainty.model_error [--check]``: rebuild the committed table from results/validation."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether the committed table is current")
    args = parser.parse_args(argv)
    fresh = build_table(read_validation())
    current = PACKAGE_TABLE.is_file() and load_table().equals(_round_trip(fresh))
    if args.check:
        print("model_error.csv is current" if current else "model_error.csv is stale: run without --check")
        return 0 if current else 1
    write_table(fresh, PACKAGE_TABLE)
    print(f"wrote {PACKAGE_TABLE}")
    return 0


def _round_trip(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` as written and read back (the file keeps six significant digits)."""
    import io

    from sim.io.csv_writer import CSV_FLOAT_FORMAT

    text = table.to_csv(index=False, float_format=CSV_FLOAT_FORMAT)
    return _read_table(io.StringIO(text))


if __name__ == "__main__":
    raise SystemExit(main())
