"""What a validation folder holds: its shapes of real data, found from its files.

Three shapes (each folder's README describes its files; a folder may hold several):

- **burst**: ``summary.csv`` (one row per run, ``requests_file`` naming the run's per-request
  CSV) -- :mod:`sim.validation.data`;
- **stages**: a CSV with a ``stage`` column, one row per constant-rate load stage --
  :mod:`sim.validation.stages`;
- **trace**: a CSV with a ``server_arrival_s`` column, one row per served request --
  :mod:`sim.validation.spans`.

Every other CSV of the folder must be a request file that ``summary.csv`` names; anything
else, or a folder with none of the three, is one error. Other files (README, licence) are
not read.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import MissingDataError, UserError, shown
from sim.io.csv_reader import read_csv
from sim.validation.cases import Case
from sim.validation.data import SUMMARY_FILE, load_validation_set
from sim.validation.replay import burst_case
from sim.validation.spans import TRACE_MARKER, load_trace
from sim.validation.stages import STAGE_MARKER, load_stages

SHAPES_HELP = (
    f"{SUMMARY_FILE} with requests_file (bursts), a CSV with a '{STAGE_MARKER}' column (load stages) or "
    f"a CSV with a '{TRACE_MARKER}' column (per-request traces)"
)


def load_cases(folder: str | Path) -> list[Case]:
    """Every replayable case of a validation folder: bursts, then the other CSVs by name.

    Raises:
        MissingDataError: the folder does not exist.
        UserError: a CSV of no known shape, a folder with no known shape, or any reader's error.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingDataError(f"validation folder {folder}: not found (or not a folder)")
    cases: list[Case] = []
    claimed: set[str] = set()
    if (folder / SUMMARY_FILE).is_file():
        runs = load_validation_set(folder)
        cases += [burst_case(run) for run in runs]
        claimed |= {SUMMARY_FILE, *(str(run.summary["requests_file"]) for run in runs)}
    for path in sorted(p for p in folder.iterdir() if p.suffix.lower() == ".csv" and p.name not in claimed):
        cases += _cases_of(path)
    if not cases:
        raise UserError(f"validation folder {folder}: no data in a known shape; expected {SHAPES_HELP}")
    return cases


def _cases_of(path: Path) -> list[Case]:
    """The cases of one CSV that ``summary.csv`` does not name, by its columns."""
    columns = [str(c) for c in read_csv(path).columns]
    if STAGE_MARKER in columns:
        return list(load_stages(path))
    if TRACE_MARKER in columns:
        return list(load_trace(path))
    raise UserError(
        f"{path}: not a validation file of a known shape (columns {shown(', '.join(columns))}); expected {SHAPES_HELP}"
    )
