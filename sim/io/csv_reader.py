"""Reading the CSV files a user supplies (traces, profiles, validation runs), one clear error each.

Every such reader goes through here, so all of them answer a bad file the same way: one
:class:`~sim.errors.UserError` naming the file, the line as a text editor counts it (the
header is line 1, blank lines count), the column and the cell, quoted and cut short, and
what is allowed. A UTF-8 byte-order mark is accepted (pandas drops it), as YAML does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import UserError, did_you_mean, shown

MAX_EXACT_INTEGER = 2**53
"""Largest whole number a float64 holds exactly: larger counts in a file are corrupt data."""


def read_csv(path: Path) -> pd.DataFrame:
    """The data rows of a CSV file; trailing blank lines dropped, blank lines inside kept as empty rows.

    Raises:
        UserError: unreadable file, not CSV, rows longer than the header, or a header without data rows.
    """
    try:
        with warnings.catch_warnings():
            # Mixed-type columns warn on stderr; the column checks below say what is wrong instead.
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)
            # Without index_col=False pandas would take a first line with one field too many as
            # having an unnamed index column and shift every value one column left of its name;
            # with it pandas warns (the first line) or fails (a later line) instead.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            # Blank lines are kept (as empty rows) so that row i is always line i + 2.
            frame = pd.read_csv(path, skip_blank_lines=False, index_col=False)
    except pd.errors.ParserWarning:
        raise UserError(
            f"{path}: the first data line has more fields than the header has column names; every line "
            "needs one value per header column"
        ) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        raise UserError(f"{path}: not a readable CSV file: {_first_line(exc)}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    filled = np.flatnonzero(~frame.isna().all(axis=1).to_numpy())
    frame = frame.iloc[: filled[-1] + 1] if filled.size else frame.iloc[:0]
    if frame.empty:
        raise UserError(f"{path}: the file has a header but no data rows")
    return frame


def require_columns(frame: pd.DataFrame, columns: Iterable[str], path: Path) -> None:
    """Raise UserError naming the first of ``columns`` missing from ``frame`` (with a did-you-mean hint)."""
    present = [str(c) for c in frame.columns]
    for column in columns:
        if column not in present:
            listed = ", ".join(present)
            listed = listed if len(listed) <= 200 else listed[:200] + "..."
            raise UserError(f"{path}: no column '{column}'{did_you_mean(column, present)}; columns are: {listed}")


def number_column(
    frame: pd.DataFrame,
    column: str,
    path: Path,
    *,
    minimum: float | None = None,
    above: float | None = None,
    whole: bool = False,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Column ``column`` of ``frame`` as float64, every cell (of ``rows``, a mask, if given) checked.

    Args:
        frame: rows read by :func:`read_csv`.
        column: the column; missing is an error.
        path: the file, for the message.
        minimum: smallest value allowed (``>=``).
        above: values must be greater than this (``>``).
        whole: values must be whole numbers (at most :data:`MAX_EXACT_INTEGER`).
        rows: check only these rows (the others may hold anything, e.g. NaN).

    Raises:
        UserError: a cell that is empty, not a number, not finite, or out of range.
    """
    require_columns(frame, [column], path)
    values = _floats(frame[column])
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values)
        if minimum is not None:
            bad |= values < minimum
        if above is not None:
            bad |= values <= above
        if whole:
            bad |= (values != np.floor(values)) | (np.abs(values) > MAX_EXACT_INTEGER)
    if rows is not None:
        bad &= rows
    if bad.any():
        row = int(np.argmax(bad))
        allowed = _allowed(minimum, above, whole)
        raise UserError(f"{where(path, row, column)}: {cell_text(frame, row, column, path)} is not {allowed}")
    return values


def _floats(cells: pd.Series) -> np.ndarray:
    """The cells as float64, NaN where a cell is not a number."""
    try:
        return pd.to_numeric(cells, errors="coerce").to_numpy(dtype=np.float64)
    except OverflowError:  # pandas does not coerce an integer beyond float range (400 digits): one by one
        return np.array([_float_or_nan(cell) for cell in cells], dtype=np.float64)


def _float_or_nan(cell: object) -> float:
    try:
        return float(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def where(path: Path, row: int, column: str) -> str:
    """``FILE, line N, column 'C'`` of data row ``row`` (0-based; the header is line 1)."""
    return f"{path}, line {row + 2}, column {shown(str(column))}"


def cell_text(frame: pd.DataFrame, row: int, column: str, path: Path) -> str:
    """The cell as the file has it, quoted and cut short, or ``empty cell``.

    pandas reads ``nan``, ``NA`` and the like as missing; only on this error path is the
    file read again as text, to show what the line really holds.
    """
    value = frame[column].iloc[row]
    if not pd.isna(value):
        return f"value {shown(str(value))}"
    try:
        text = pd.read_csv(path, skip_blank_lines=False, dtype=str, keep_default_na=False, usecols=[column])
        raw = str(text[column].iloc[row])
    except (ValueError, KeyError, IndexError, OSError, pd.errors.ParserError):
        raw = ""
    return f"value {shown(raw)}" if raw.strip() else "empty cell"


def _allowed(minimum: float | None, above: float | None, whole: bool) -> str:
    kind = "a whole number" if whole else "a finite number"
    bounds = [f">= {minimum:g}" if minimum is not None else "", f"> {above:g}" if above is not None else ""]
    bounds.append("and <= 2**53" if whole else "")
    return " ".join([kind, *(b for b in bounds if b)])


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "..."
