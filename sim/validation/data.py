"""Reading a burst folder: ``summary.csv`` plus one per-request CSV per real run.

The format (``../shared/validation/vllm-0.6.0-burst/README.md``): ``summary.csv`` has one
row per run with the hardware (``gpu``, ``num_gpus``, ``tensor_parallel``), the model
(``model_id``, ``max_model_len``), ``num_prompts`` and the figures benchmark_serving
reported (``duration``, ``output_throughput``, ``median_ttft_ms_nonzero``,
``median_tpot_ms``, ``median_latency_ms``, ...), and ``requests_file``, the run's CSV of
``request_idx, input_len, output_len, ttft_s, e2e_s, status``. Everything is checked
before anything is simulated; every problem is one :class:`~sim.errors.UserError` naming
the file, line and column. The server of each run: its columns where ``summary.csv`` has
them (``engine_version``, ``max_num_seqs``, ... as :data:`sim.validation.server.COLUMN_NAMES`
lists), else :data:`BURST_DEFAULTS`, what the folder's README documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import MissingDataError, UserError, shown
from sim.io.csv_reader import number_column, read_csv, require_columns, where
from sim.validation.server import ServerFlags, read_server_flags
from sim.workload.traces import token_column

SUMMARY_FILE = "summary.csv"
SUMMARY_COLUMNS: tuple[str, ...] = (
    "config", "gpu", "num_gpus", "tensor_parallel", "model_id", "max_model_len", "num_prompts",
    "duration", "completed", "total_output_tokens", "output_throughput", "median_ttft_ms_nonzero",
    "median_tpot_ms", "median_latency_ms", "requests_file",
)  # fmt: skip
"""Columns of ``summary.csv`` the replay needs (others, e.g. the source, are kept if present)."""
REQUEST_COLUMNS: tuple[str, ...] = ("request_idx", "input_len", "output_len", "ttft_s", "status")
"""Columns of a run's request CSV the replay needs (``e2e_s`` may be present and empty)."""
BURST_DEFAULTS: dict[str, Any] = {
    "engine_version": "0.6.0", "max_num_seqs": 1024, "max_num_batched_tokens": 2048,
    "gpu_memory_utilization": 0.95, "prefix_caching": False, "chunked_prefill": False, "num_scheduler_steps": 10,
}  # fmt: skip
"""The server of ``vllm-0.6.0-burst`` (its README, "Server and client"): vLLM 0.6.0 with
--num-scheduler-steps 10, --max-num-seqs 1024, --gpu-memory-utilization 0.95, chunked prefill and
prefix caching off, max_num_batched_tokens 2048 (the default without chunked prefill)."""
_INT_FIELDS = ("num_gpus", "tensor_parallel", "max_model_len", "num_prompts", "completed", "total_output_tokens")
_FLOAT_FIELDS = ("duration", "output_throughput", "median_ttft_ms_nonzero", "median_tpot_ms", "median_latency_ms")


@dataclass(frozen=True)
class RealRun:
    """One measured run of a validation folder.

    Attributes:
        name: the request file's stem, unique in the folder (e.g. ``a100x1_..._len2000__N80``).
        summary: its ``summary.csv`` row (ints and floats parsed; other cells as text).
        requests: ``request_idx, input_len, output_len, ttft_s`` (ints; TTFT in seconds,
            0 for an empty output), one row per request in index order.
        flags: the measured server.
    """

    name: str
    summary: dict[str, Any]
    requests: pd.DataFrame
    flags: ServerFlags

    @property
    def num_requests(self) -> int:
        """Requests the client sent (``num_prompts``)."""
        return int(self.summary["num_prompts"])


def load_validation_set(folder: str | Path) -> list[RealRun]:
    """Every run of a burst folder, in ``summary.csv`` order, checked.

    Raises:
        MissingDataError: the folder or its ``summary.csv`` does not exist.
        UserError: a missing column, a cell that is not a number, a request file that is
            missing, has the wrong row count, or whose lengths disagree with the summary.
    """
    folder = Path(folder)
    summary_path = folder / SUMMARY_FILE
    if not folder.is_dir():
        raise MissingDataError(f"validation folder {folder}: not found (or not a folder)")
    if not summary_path.is_file():
        raise MissingDataError(f"validation folder {folder}: has no {SUMMARY_FILE}")
    frame = read_csv(summary_path)
    require_columns(frame, SUMMARY_COLUMNS, summary_path)
    numbers = _summary_numbers(frame, summary_path)
    runs = [_load_run(folder, summary_path, frame, numbers, row) for row in range(len(frame))]
    names = [r.name for r in runs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"{summary_path}: requests_file repeated: {shown(', '.join(repeated))}")
    return runs


def _summary_numbers(frame: pd.DataFrame, path: Path) -> dict[str, np.ndarray]:
    """The numeric columns of ``summary.csv``, each cell checked (whole numbers where counts)."""
    numbers = {c: number_column(frame, c, path, minimum=0, whole=True) for c in _INT_FIELDS}
    return numbers | {c: number_column(frame, c, path, minimum=0) for c in _FLOAT_FIELDS}


def _load_run(
    folder: Path, summary_path: Path, frame: pd.DataFrame, numbers: dict[str, np.ndarray], row: int
) -> RealRun:
    summary = _summary_row(frame, numbers, row)
    flags = read_server_flags(frame, row, summary_path, BURST_DEFAULTS)
    path = folder / str(summary["requests_file"])
    if not path.is_file():
        raise UserError(
            f"{where(summary_path, row, 'requests_file')}: {shown(str(summary['requests_file']))} not found in {folder}"
        )
    requests = _requests(path)
    _check_consistent(requests, summary, path)
    return RealRun(path.stem, summary, requests, flags)


def _summary_row(frame: pd.DataFrame, numbers: dict[str, np.ndarray], row: int) -> dict[str, Any]:
    summary: dict[str, Any] = {k: v for k, v in frame.iloc[row].items() if pd.notna(v)}
    summary |= {c: int(numbers[c][row]) for c in _INT_FIELDS} | {c: float(numbers[c][row]) for c in _FLOAT_FIELDS}
    for column in ("model_id", "gpu", "requests_file"):
        summary[column] = str(frame[column].iloc[row]).strip()
    return summary


def _requests(path: Path) -> pd.DataFrame:
    frame = read_csv(path)
    require_columns(frame, REQUEST_COLUMNS, path)
    requests = pd.DataFrame({
        "request_idx": token_column(frame, "request_idx", path, min_tokens=0),
        "input_len": token_column(frame, "input_len", path, min_tokens=1),
        "output_len": token_column(frame, "output_len", path, min_tokens=0),
        "ttft_s": number_column(frame, "ttft_s", path, minimum=0),
    })  # fmt: skip
    out_of_order = np.flatnonzero(requests["request_idx"].to_numpy() != np.arange(len(requests)))
    if out_of_order.size:
        row = int(out_of_order[0])
        raise UserError(
            f"{where(path, row, 'request_idx')}: {requests['request_idx'].iloc[row]} where {row} "
            "was expected; rows must be request 0, 1, 2, ... in order"
        )
    return requests


def _check_consistent(requests: pd.DataFrame, summary: dict[str, Any], path: Path) -> None:
    if len(requests) != summary["num_prompts"]:
        raise UserError(
            f"{path}: {len(requests)} requests, but summary.csv says num_prompts = {summary['num_prompts']}"
        )
    total = int(requests["output_len"].sum())
    if total != summary["total_output_tokens"]:
        raise UserError(
            f"{path}: output_len sums to {total}, but summary.csv says total_output_tokens = "
            f"{summary['total_output_tokens']}"
        )
