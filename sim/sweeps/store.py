"""The sweep's results file, written incrementally and recoverable after a crash.

``sweep.csv`` grows by one whole point (all its policy rows) at a time: the rows are
formatted into one string and appended with a single ``write`` on an ``O_APPEND``
descriptor, then fsync'ed, so a killed sweep leaves at worst a trailing partial line.
Floats are written in Python's shortest round-trip form and read back with
``float_precision="round_trip"``, so a resumed sweep returns the very same numbers.

``sweep.json`` next to it records what the rows mean (base scenario, grid, seeds) and the
``batchsim_version`` that marks the folder as batchsim's (:data:`sim.io.outputs.SWEEP_OUTPUT`);
``resume`` refuses a folder written by a different sweep instead of mixing results. A fresh
sweep replaces its folder as a whole (:func:`sim.io.outputs.atomic_folder`: only an empty one
or one batchsim wrote); every later write goes through :mod:`sim.io.safe_write`.
On resume, the trailing partial line, points with missing rows and failed points are
dropped (the file is rewritten atomically) and those points run again.

Rows arrive in completion order, which differs between runs. When a sweep finishes,
the file is rewritten (atomically, so a kill at that moment leaves the incremental
file, which still resumes) in grid order: point, seed, then the scenario's policy
order. Two runs of one sweep thus write byte-identical files.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import UserError
from sim.io.outputs import atomic_folder, check_output_dir
from sim.io.safe_write import write_error, write_text

CSV_NAME = "sweep.csv"
MANIFEST_NAME = "sweep.json"

Key = tuple[int, int]  # (point, seed)


def header_line(columns: Sequence[str]) -> str:
    """The CSV header, quoted exactly as pandas quotes data rows."""
    return pd.DataFrame(columns=list(columns)).to_csv(index=False, lineterminator="\n")


def rows_text(frame: pd.DataFrame) -> str:
    """CSV lines of ``frame`` (no header), floats in shortest round-trip form."""
    return frame.to_csv(index=False, header=False, lineterminator="\n")


# pandas 3 parses floats exactly by default (and deprecates the option); pandas 2's
# default "high" precision can be off by one unit in the last place.
_EXACT_FLOATS: dict[str, Any] = (
    {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
)


def parse_rows(columns: Sequence[str], texts: Sequence[str]) -> pd.DataFrame:
    """Parse CSV rows back into a DataFrame: floats exact, empty cells NaN (``error``: "")."""
    buffer = io.StringIO(header_line(columns) + "".join(texts))
    empty_is_nan = {c: [""] for c in columns if c != "error"}
    return pd.read_csv(
        buffer, keep_default_na=False, na_values=empty_is_nan, dtype={"error": str}, **_EXACT_FLOATS
    )


def check_folder(folder: Path) -> None:
    """Raise :class:`UserError` unless the sweep may write ``folder``.

    The rule of every output folder (:func:`sim.io.outputs.check_output_dir`): new, empty, or
    written by batchsim (a sweep, a run, a capacity search), and never the current, home or
    repository folder. A folder holding ``sweep.csv`` passes only as a sweep's (no other kind
    writes that name), so ``--resume`` never appends to someone else's file. Writes nothing,
    so a mistaken ``--out`` is reported before any simulation runs.
    """
    check_output_dir(folder)


def order_rows(columns: Sequence[str], texts: Sequence[str]) -> list[str]:
    """Row lines of ``texts`` in grid order: by point, then seed; a point's rows keep their order.

    ``texts`` may mix one-line rows (kept on resume) and whole points of several lines;
    a point's lines are always written together, in the scenario's policy order.
    """
    at_point, at_seed = columns.index("point"), columns.index("seed")
    lines = [line for text in texts for line in text.splitlines(keepends=True)]

    def key(line: str) -> tuple[int, int]:
        fields = next(csv.reader([line]))
        return int(fields[at_point]), int(fields[at_seed])

    return sorted(lines, key=key)  # stable: policy order within a point survives


class SweepFile:
    """Appends whole points to ``folder/sweep.csv``.

    Args:
        folder: output folder (created if missing).
        columns: the CSV columns, in order.
        manifest: JSON-able description of the sweep (``scenario``, ``params``, ``seeds``).
    """

    def __init__(self, folder: Path, columns: Sequence[str], manifest: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.columns = list(columns)
        # Through JSON once, so it compares equal to the copy read back on resume.
        self.manifest = json.loads(json.dumps(manifest, sort_keys=True, default=str))
        self.path = self.folder / CSV_NAME
        self._fd: int | None = None

    def start(self, resume: bool, expected_rows: Callable[[Key], int]) -> list[str]:
        """Open the file for appending; returns the row lines kept from a previous run.

        Args:
            resume: keep complete, successful points of an earlier run of this sweep.
            expected_rows: rows of a complete point (its policy count); 0 for keys not in it.

        Raises:
            UserError: resuming a folder written by a different sweep, or a folder that
                cannot be written (read-only file system, permissions).
        """
        kept: list[str] = []
        if resume and self.path.exists():
            self._check_manifest()
            kept = self._recover(expected_rows)
            self._write_manifest(self.manifest)
            write_text(self.path, header_line(self.columns) + "".join(kept), fsync=True)
        else:  # a fresh sweep: an older batchsim output there is replaced, as a whole, once this one is set up
            with atomic_folder(self.folder) as tmp:
                (tmp / MANIFEST_NAME).write_text(_manifest_text(self.manifest))
                (tmp / CSV_NAME).write_text(header_line(self.columns))
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise write_error(exc, self.path) from None
        return kept

    def append(self, text: str) -> None:
        """Append one point's rows with a single write, then flush them to disk."""
        if self._fd is None:
            raise RuntimeError("SweepFile.start() was not called")
        data = text.encode("utf-8")
        try:
            written = os.write(self._fd, data)
            if written != len(data):  # only on a full disk; the next resume drops the partial line
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
            os.fsync(self._fd)
        except OSError as exc:  # the finished points stay in the file: --resume completes the rest
            raise write_error(exc, self.path) from None

    def finish(
        self, rows: Sequence[str], execution: dict[str, Any] | None = None, workers: dict[str, Any] | None = None
    ) -> None:
        """Replace the incremental file with ``rows`` (all of them, in grid order) and close it.

        ``execution`` (how the runs were executed, e.g. Ray's start-up time) and ``workers``
        (:meth:`sim.sweeps.backends.WorkerCount.metadata`) are added to ``sweep.json`` under
        those keys; resume does not compare them, since they vary run to run.
        """
        self.close()
        write_text(self.path, header_line(self.columns) + "".join(rows), fsync=True)
        extra = {"execution": execution, "workers": workers}
        if any(value is not None for value in extra.values()):
            self._write_manifest(self.manifest | {k: v for k, v in extra.items() if v is not None})

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SweepFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        write_text(self.folder / MANIFEST_NAME, _manifest_text(manifest), fsync=True)

    def _check_manifest(self) -> None:
        path = self.folder / MANIFEST_NAME
        if not path.exists():
            raise UserError(
                f"cannot resume: {path} is missing, so the rows in {self.path} cannot be "
                f"matched to this sweep; use a new --out folder or drop --resume"
            )
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise UserError(f"cannot resume: {path} is not valid JSON") from None
        for part in ("scenario", "params", "seeds"):
            if _canonical(old.get(part)) != _canonical(self.manifest.get(part)):
                raise UserError(
                    f"cannot resume: {self.path} was written by a different sweep (its {part} "
                    f"differs); use a new --out folder or drop --resume"
                )

    def _recover(self, expected_rows: Callable[[Key], int]) -> list[str]:
        text = self.path.read_bytes().decode("utf-8", errors="replace")
        complete = text[: text.rfind("\n") + 1]  # a killed append leaves at most one partial line
        lines = complete.splitlines(keepends=True)
        if not lines:
            return []
        if lines[0] != header_line(self.columns):
            raise UserError(
                f"cannot resume: {self.path} has different columns than this sweep writes; "
                f"use a new --out folder or drop --resume"
            )
        return _complete_points(lines[1:], self.columns, expected_rows)


def _complete_points(
    lines: list[str], columns: list[str], expected_rows: Callable[[Key], int]
) -> list[str]:
    """The lines of points that have all their rows and no error, in file order."""
    at = {name: columns.index(name) for name in ("point", "seed", "error")}
    by_key: dict[Key, list[str]] = {}
    failed: set[Key] = set()
    for line in lines:
        fields = next(csv.reader([line]), [])
        if len(fields) != len(columns):
            continue  # a malformed line: its point will simply run again
        try:
            key = (int(fields[at["point"]]), int(fields[at["seed"]]))
        except ValueError:
            continue
        by_key.setdefault(key, []).append(line)
        if fields[at["error"]]:
            failed.add(key)
    done = {
        k for k, rows in by_key.items() if k not in failed and len(rows) == expected_rows(k) > 0
    }
    return [line for key, rows in by_key.items() if key in done for line in rows]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _manifest_text(manifest: dict[str, Any]) -> str:
    """``sweep.json``: the manifest, stamped with the version that marks the folder as batchsim's."""
    from sim.version import __version__

    stamped = {**manifest, "batchsim_version": __version__}  # not compared on resume: see _check_manifest
    return json.dumps(stamped, indent=1, sort_keys=True, default=str) + "\n"
