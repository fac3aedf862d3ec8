"""A fast CSV writer for the run's tables, byte for byte what ``DataFrame.to_csv`` writes.

``to_csv(index=False, float_format="%.6g")`` formats every float through a Python call
chain per value (a missing-value check, a formatter, a lambda): most of a small run's
time, and 105 s of a million-request run's 12M-row iterations table. Here each column is
turned into Python values once per chunk (``tolist``) and each row is formatted by one
``template % row`` (floats with ``float_format``, ints with ``%d``), in C: 3-4x faster.
The ``csv`` writer pandas uses checks every field for quoting, which is most of its cost;
here only text goes through it, each distinct value once, so quoting is the same.
Missing values (NaN floats, missing text or categories) are empty fields, as pandas'
default ``na_rep`` writes them. ``tests/test_csv_writer.py`` compares the bytes with
pandas on generated frames.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pandas import CategoricalDtype

if TYPE_CHECKING:
    import pandas as pd

CSV_FLOAT_FORMAT = "%.6g"  # six significant digits: byte-stable files, far finer than the model's accuracy
CHUNK_ROWS = 32_768
"""Rows turned into Python objects at a time (bounds the writer's memory on million-row tables)."""


def write_csv(frame: pd.DataFrame, path: Path | str, float_format: str) -> None:
    """Write ``frame`` as ``frame.to_csv(path, index=False, float_format=float_format)`` would."""
    if frame.shape[1] < 2 or any(map(_pandas_only, frame.dtypes)):
        frame.to_csv(path, index=False, float_format=float_format)
        return
    newline = os.linesep
    columns = [_column_values(frame.iloc[:, i]) for i in range(frame.shape[1])]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        handle.write(",".join(_quoted_all([str(name) for name in frame.columns])) + newline)
        for start in range(0, len(frame), CHUNK_ROWS):
            template, fields = _chunk_fields(columns, start, float_format)
            handle.write(newline.join(map(template.__mod__, zip(*fields, strict=True))) + newline)


def _pandas_only(dtype: object) -> bool:
    """A column left to pandas: categories that are floats or bools (their text is pandas' own).
    A frame of one column is the other corner (the csv module quotes a lone empty field)."""
    return isinstance(dtype, CategoricalDtype) and dtype.categories.dtype.kind in "fcb"


class _Coded:
    """A categorical column of text or integer labels: its codes, and each label's field once
    (code -1, missing, indexes the last field: "")."""

    def __init__(self, series: pd.Series) -> None:
        self.codes = series.cat.codes.to_numpy()
        self.fields = [*_quoted_all(series.cat.categories.tolist()), ""]

    def chunk(self, start: int, stop: int) -> list[str]:
        fields = self.fields
        return [fields[code] for code in self.codes[start:stop].tolist()]


def _column_values(series: pd.Series) -> np.ndarray | _Coded:
    """The column as numbers (as they are), codes of a categorical, or objects with missing -> ""."""
    if isinstance(series.dtype, CategoricalDtype):
        return _Coded(series)  # not an object array of a million strings
    values = series.to_numpy()
    if values.dtype.kind in "fiub":
        return values
    values = series.to_numpy(dtype=object, copy=True)
    values[series.isna().to_numpy()] = ""
    return values


def _chunk_fields(columns: list[np.ndarray | _Coded], start: int, float_format: str) -> tuple[str, list[list]]:
    """A row template and each column's values for rows ``start`` to ``start + CHUNK_ROWS``.

    One ``template % row`` per row formats all its fields in C: floats with ``float_format``,
    ints with ``%d`` (as ``str``), anything else (bools, text, floats with missing values)
    pre-formatted and quoted as ``%s``.
    """
    stop = start + CHUNK_ROWS
    formats: list[str] = []
    fields: list[list] = []
    for values in columns:
        if isinstance(values, _Coded):
            formats.append("%s")
            fields.append(values.chunk(start, stop))
            continue
        part = values[start:stop]
        kind = part.dtype.kind
        if kind == "f" and np.isnan(part).any():
            formats.append("%s")
            fields.append(["" if x != x else float_format % x for x in part.tolist()])
        elif kind in "fiu":
            formats.append(float_format if kind == "f" else "%d")
            fields.append(part.tolist())
        elif kind == "b":
            formats.append("%s")  # True / False, as str() writes them
            fields.append(part.tolist())
        else:
            formats.append("%s")
            fields.append(_quoted_all(part.tolist()))
    return ",".join(formats), fields


def _quoted_all(values: list) -> list[str]:
    """Each value as the csv module writes it in a row of several fields (quoted where needed)."""
    cache: dict = {}
    return [cache[v] if v in cache else cache.setdefault(v, _quoted(v)) for v in values]


def _quoted(value: object) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n", quoting=csv.QUOTE_MINIMAL).writerow([value, ""])
    return buffer.getvalue()[:-2]  # drop the empty second field's separator and the line end
