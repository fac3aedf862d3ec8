"""Iteration records written as runs: one entry per forward pass, or per run of consecutive decode passes.

The engine's fast path (:mod:`sim.serving.fast`) records a pass as a *run* of one, and consecutive
pure decode passes of one batch (the same sequences, the decode KV growing by a fixed step a pass)
as one run of n passes, with only each pass's start and duration (and, under paged memory, its
KV blocks in use) stored one by one. A replica's decode run stays open while its passes continue it
and is closed by any other pass of that replica. :meth:`PassRuns.to_frame` expands the runs into the
same table as :meth:`sim.metrics.records.IterationRecords.to_frame`, row for row: a run costs 46 bytes
however many passes it holds, a pass 16 (20 when its blocks in use are kept one by one).
"""

from __future__ import annotations

import struct
from array import array

import numpy as np
import pandas as pd

from sim.metrics.records import ITERATION_COLUMNS

RUN_FIELDS: tuple[tuple[str, str], ...] = (
    ("replica", "h"), ("passes", "q"), ("batch_size", "i"), ("prefill_tokens", "i"), ("decode_tokens", "i"),
    ("kv_blocks_used", "i"), ("prefill_attn_work", "d"), ("decode_kv_tokens", "i"), ("kv_step", "i"),
    ("prefill_context_tokens", "i"),
)  # fmt: skip
"""Per run: its columns' values for its first pass (``kv_blocks_used`` -1: one value per pass, kept apart),
how many passes, and the decode KV's growth per pass."""

_WIDTH = len(RUN_FIELDS)
STAGE_RUNS = 1 << 13
"""Runs kept as one flat Python list before they are packed into the typed columns."""
_STAGE_VALUES = STAGE_RUNS * _WIDTH
MAX_RUN_PASSES = 1 << 15
"""An open decode run is closed after this many passes (bounds the Python lists it keeps)."""


class DecodeRun:
    """The open decode run of one replica: passes of ``decodes`` sequences, KV from ``first_kv`` up by ``step``."""

    __slots__ = ("starts", "durations", "decodes", "first_kv", "step", "next_kv", "used", "useds")

    def __init__(self, decodes: int, first_kv: int, step: int, used: int, per_pass: bool) -> None:
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.decodes = decodes
        self.first_kv = first_kv
        self.step = step
        self.next_kv = first_kv
        self.used = -1 if per_pass else used
        self.useds: list[int] | None = [] if per_pass else None


class PassRuns:
    """Growable typed columns of runs of passes (see the module docstring).

    Args:
        replicas: replica indices run from 0 to this (exclusive).
    """

    def __init__(self, replicas: int = 1) -> None:
        self._runs: list = []  # closed runs being staged, ``_WIDTH`` values each
        self._columns = {name: array(code) for name, code in RUN_FIELDS}
        self.start_s = array("d")
        self.duration_s = array("d")
        self._used = array("i")  # blocks in use of each pass of the runs that keep them one by one
        self.open: list[DecodeRun | None] = [None] * replicas
        self.passes = 0

    def __len__(self) -> int:
        return self.passes

    def append(
        self, replica: int, start_s: float, duration_s: float, batch_size: int, prefill_tokens: int,
        decode_tokens: int, kv_blocks_used: int, prefill_attn_work: float = 0.0, decode_kv_tokens: int = 0,
        prefill_context_tokens: int = 0,
    ) -> None:  # fmt: skip
        """Record one forward pass (as ``IterationRecords.append``)."""
        if self.open[replica] is not None:
            self.close(replica)
        self._runs.extend((replica, 1, batch_size, prefill_tokens, decode_tokens, kv_blocks_used, prefill_attn_work,
                           decode_kv_tokens, 0, prefill_context_tokens))  # fmt: skip
        self.start_s.append(start_s)
        self.duration_s.append(duration_s)
        self.passes += 1
        if len(self._runs) >= _STAGE_VALUES:
            self.flush()

    def decode_run(self, replica: int, decodes: int, kv_tokens: int, step: int, used: int, per_pass: bool) -> DecodeRun:
        """The replica's open decode run, if the pure decode pass of ``decodes`` sequences reading ``kv_tokens``
        continues it (same sequences, the KV ``step`` further, the same blocks unless kept ``per_pass``);
        otherwise a new one (the old one closed). The caller appends the passes' starts and durations."""
        run = self.open[replica]
        if run is not None:
            if (
                run.next_kv == kv_tokens and run.decodes == decodes and run.step == step
                and (per_pass or run.used == used) and len(run.starts) < MAX_RUN_PASSES
            ):  # fmt: skip
                return run
            self.close(replica)
        run = self.open[replica] = DecodeRun(decodes, kv_tokens, step, used, per_pass)
        return run

    def close(self, replica: int) -> None:
        """Close the replica's open decode run (its passes become a run of the records)."""
        run = self.open[replica]
        self.open[replica] = None
        if run is None or not run.starts:
            return
        n = len(run.starts)
        self._runs.extend((replica, n, run.decodes, 0, run.decodes, run.used, 0.0, run.first_kv, run.step, 0))
        self.start_s.extend(run.starts)
        self.duration_s.extend(run.durations)
        if run.useds is not None:
            self._used.extend(run.useds)
        self.passes += n
        if len(self._runs) >= _STAGE_VALUES:
            self.flush()

    def flush(self) -> None:
        """Pack the staged runs into the typed columns."""
        runs = self._runs
        if not runs:
            return
        count = len(runs) // _WIDTH
        for k, (name, code) in enumerate(RUN_FIELDS):
            self._columns[name].frombytes(struct.pack(f"{count}{code}", *runs[k::_WIDTH]))
        runs.clear()

    def to_frame(self, kv_blocks_total: int) -> pd.DataFrame:
        """The iterations table (``ITERATION_COLUMNS``), ordered by start time then replica, equal to the one
        :class:`~sim.metrics.records.IterationRecords` makes of the same passes.

        Open runs are closed. The records are emptied; each run column is given back once the table's
        columns made of it exist.
        """
        for replica in range(len(self.open)):
            self.close(replica)
        self.flush()
        runs = {name: np.frombuffer(buffer, dtype=buffer.typecode) for name, buffer in self._columns.items()}
        counts = runs.pop("passes")
        data: dict[str, np.ndarray] = {
            "start_s": np.frombuffer(self.start_s, dtype=np.float64),
            "duration_s": np.frombuffer(self.duration_s, dtype=np.float64),
        }
        for name in ("replica", "batch_size", "prefill_tokens", "decode_tokens", "prefill_attn_work",
                     "prefill_context_tokens"):  # fmt: skip
            data[name] = np.repeat(runs.pop(name), counts)
        data["kv_blocks_used"] = self._blocks_used(runs.pop("kv_blocks_used"), counts)
        data["decode_kv_tokens"] = _stepped(runs.pop("decode_kv_tokens"), runs.pop("kv_step"), counts)
        del counts
        self._columns = {name: array(code) for name, code in RUN_FIELDS}
        self.start_s, self.duration_s, self._used, self.passes = array("d"), array("d"), array("i"), 0
        data["kv_blocks_total"] = np.full(len(data["start_s"]), kv_blocks_total, dtype=np.int32)
        frame = {name: data.pop(name) for name in ITERATION_COLUMNS}
        starts = frame["start_s"]
        if len(starts) > 1 and not (starts[1:] > starts[:-1]).all():
            order = np.lexsort((frame["replica"], starts))  # stable, as IterationRecords sorts
            for name in frame:
                frame[name] = frame[name][order]
        return pd.DataFrame(frame, copy=False)

    def _blocks_used(self, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
        used = np.repeat(first, counts)
        per_pass = used < 0
        if per_pass.any():
            used[per_pass] = np.frombuffer(self._used, dtype=np.int32)
        return used


def _stepped(first: np.ndarray, step: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per pass ``first + step * k`` for the k-th pass of its run (k from 0), as int32."""
    values = np.repeat(first.astype(np.int64), counts)
    if step.any():
        ends = np.cumsum(counts)
        offsets = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - counts, counts)
        values += np.repeat(step.astype(np.int64), counts) * offsets
    return values.astype(np.int32)
