"""``metrics.format: parquet``: the per-request and per-iteration records as Parquet files.

``requests.parquet`` and ``iterations.parquet`` hold exactly the rows and columns of
``requests.csv`` and ``iterations.csv``, with the in-memory dtypes (``policy`` and ``status``
stay categorical, integers keep their widths) and full float precision, where the CSVs round
to six significant digits. ``summary.csv`` stays CSV whatever the format.

pyarrow is an optional extra (``pip install 'batchsim[parquet]'``): it is imported only when
Parquet is chosen, and :func:`require_pyarrow` turns its absence into one
:class:`~sim.errors.UserError` before a run simulates or writes anything. The files are written
inside the result folder's temporary sibling (:func:`sim.io.outputs.atomic_folder`), so they are
as atomic as the CSVs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from sim.config import Scenario
    from sim.result import RunData

FIELD = "metrics.format"
REQUESTS_FILE = "requests.parquet"
ITERATIONS_FILE = "iterations.parquet"
PARQUET_FILES = frozenset({REQUESTS_FILE, ITERATIONS_FILE})
# Rows converted to Arrow and written per row group: bounds the extra memory of a write to one
# chunk's copy (tens of MiB) instead of a second copy of a million-row table.
ROWS_PER_GROUP = 262_144
INSTALL_HINT = ("'parquet' needs pyarrow, which is not installed: pip install 'batchsim[parquet]' "
                "(or pip install pyarrow), or keep the default metrics.format: csv")


def wants_parquet(scenario: Scenario, *, summary_only: bool = False) -> bool:
    """Whether a run of ``scenario`` writes Parquet records (``--summary-only`` writes no records at all)."""
    return scenario.metrics.format == "parquet" and not summary_only


def require_pyarrow() -> None:
    """Raise UserError naming ``metrics.format`` and the install command when pyarrow is missing.

    Call it before simulating: a missing optional package must not cost a long run.
    """
    _pyarrow()


def _pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, imported lazily: CSV runs never load pyarrow."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UserError(INSTALL_HINT, field=FIELD) from None
    return pyarrow, pyarrow.parquet


def write_records_parquet(result: RunData, folder: Path) -> None:
    """``requests.parquet`` and ``iterations.parquet`` of ``result`` into ``folder``."""
    write_frame(result.requests, folder / REQUESTS_FILE)
    # Already every k-th pass per policy, sampled in memory (k: facts["iterations_every"]), as the CSV.
    write_frame(result.iterations, folder / ITERATIONS_FILE)


def write_frame(frame: pd.DataFrame, path: Path, rows_per_group: int = ROWS_PER_GROUP) -> None:
    """Write ``frame`` (without its index, as the CSVs) to ``path``, one row group per ``rows_per_group`` rows.

    One schema for every chunk, taken from the whole frame: a categorical column keeps all its
    categories (even unused ones) and every row group has the same types.
    """
    pa, pq = _pyarrow()
    schema = pa.Schema.from_pandas(frame.iloc[:0], preserve_index=False)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, max(len(frame), 1), rows_per_group):  # one (empty) group for an empty frame
            chunk = frame.iloc[start:start + rows_per_group]
            writer.write_table(pa.Table.from_pandas(chunk, schema=schema, preserve_index=False))
