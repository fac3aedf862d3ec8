"""Constant-rate load stages (inference-perf stage summaries): reading and replaying them.

The format (``../shared/validation/vllm-0.11-h100/README.md``, section 1): one CSV row per
stage (``stage`` 0, 1, ...) plus an optional ``stage = all`` row summing them, each with the
server's flags (``engine_version``, ``model_id``, ``gpu``, ``tp``, ``max_model_len``,
``max_num_seqs``, ...), the client's workload (``num_system_prompts`` groups of
``users_per_system_prompt`` prompts: a ``system_prompt_len``-token shared system prompt plus
a question, ``prompt_len_mean`` tokens in all as the client counts them; ``output_len_cfg``
tokens with ``ignore_eos``), the load (``requested_rate``, ``achieved_rate``,
``stage_duration_s``, ``requests_sent``; ``saturated_client_bound`` when the client's
in-flight cap ``client_max_outstanding`` held the rate down) and the measured figures
(``ttft_*_ms``, ``e2e_*_ms``, ``tpot_derived_ms``, ``req_per_s``).

A stage is replayed at its achieved rate (evenly spaced sends) for its ``requests_sent``
requests; a client-bound stage as a closed loop of ``client_max_outstanding`` clients. The
server was warm (a saturation probe ran first), so the front end has no start-up delay. The
tool's TPOT and ITL columns are not used (2x too small, README caveat 1): TPOT is compared as
``tpot_derived_ms`` = (mean E2E - mean TTFT) / (output tokens - 1), computed the same way on
the replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import UserError, shown
from sim.io.csv_reader import number_column, read_csv, require_columns, where
from sim.validation.cases import Case, Residual, completed, stat_ms
from sim.validation.server import read_server_flags

STAGE_MARKER = "stage"
"""The column that makes a CSV a stage summary."""
LOAD_COLUMNS: tuple[str, ...] = (
    "requested_rate", "achieved_rate", "stage_duration_s", "requests_sent", "completed", "failed",
    "saturated_client_bound", "client_max_outstanding", "ignore_eos",
    "num_system_prompts", "system_prompt_len", "prompt_len_mean", "output_len_cfg",
)  # fmt: skip
"""Columns the replay needs, besides the measured figures and the server's flags."""
MEASURED: dict[str, tuple[str, str]] = {
    "ttft_mean_ms": ("ttft_mean_ms", "ms"), "ttft_p50_ms": ("ttft_median_ms", "ms"),
    "ttft_p90_ms": ("ttft_p90_ms", "ms"), "ttft_p99_ms": ("ttft_p99_ms", "ms"),
    "e2e_mean_ms": ("e2e_mean_ms", "ms"), "e2e_p50_ms": ("e2e_median_ms", "ms"),
    "e2e_p90_ms": ("e2e_p90_ms", "ms"), "e2e_p99_ms": ("e2e_p99_ms", "ms"),
    "tpot_derived_ms": ("tpot_derived_ms", "ms/token"), "req_per_s": ("req_per_s", "requests/s"),
}  # fmt: skip
"""Compared metric -> (its column in the stage CSV, unit)."""
_WHOLE = ("requests_sent", "completed", "failed", "client_max_outstanding", "num_system_prompts",
          "system_prompt_len", "output_len_cfg")  # fmt: skip
_SUMMED = ("requests_sent", "completed", "failed")


@dataclass(frozen=True, kw_only=True)
class StageCase(Case):
    """One constant-rate stage."""

    row: dict[str, Any]

    @property
    def output_tokens(self) -> int:
        """Tokens every request generates: ``output_len_cfg`` (ignore_eos), else the client's mean count."""
        if self.row["ignore_eos"]:
            return int(self.row["output_len_cfg"])
        return max(1, round(self.row["output_len_retok_mean"]))

    def workload(self, folder: Path) -> dict[str, Any]:
        """The stage's requests: a shared system prompt per group, a question, fixed outputs."""
        row = self.row
        system = int(row["system_prompt_len"])
        question = max(1, round(row["prompt_len_mean"]) - system)
        if row["saturated_client_bound"]:
            arrival: dict[str, Any] = {"kind": "closed_loop", "clients": int(row["client_max_outstanding"])}
        else:
            arrival = {"kind": "constant", "rate": float(row["achieved_rate"])}
        return {
            "requests": int(row["requests_sent"]), "arrival": arrival, "text": "random",
            "prompt_tokens": {"kind": "fixed", "value": question},
            "output_tokens": {"kind": "fixed", "value": self.output_tokens},
            "shared_prefix": {"tokens": system, "fraction": 1.0, "variants": int(row["num_system_prompts"])},
        }  # fmt: skip


    def compare(self, requests: pd.DataFrame) -> list[Residual]:
        """TTFT and E2E statistics, derived TPOT and request rate, measured vs the replay's."""
        simulated = stage_figures(requests, self.output_tokens)
        return [Residual(m, unit, float(self.row[column]), simulated[m]) for m, (column, unit) in MEASURED.items()]


def stage_figures(requests: pd.DataFrame, output_tokens: int) -> dict[str, float]:
    """inference-perf's figures of a replay: TTFT/E2E mean and percentiles over completed requests (ms),
    ``tpot_derived_ms`` = (mean E2E - mean TTFT) / (output tokens - 1), ``req_per_s`` = completed /
    (last end - first send)."""
    done = completed(requests)
    ttft_s, e2e_s = done["ttft_s"].to_numpy(), done["e2e_s"].to_numpy()
    figures = {f"ttft_{s}_ms": stat_ms(ttft_s, s) for s in ("mean", "p50", "p90", "p99")}
    figures |= {f"e2e_{s}_ms": stat_ms(e2e_s, s) for s in ("mean", "p50", "p90", "p99")}
    figures["tpot_derived_ms"] = (figures["e2e_mean_ms"] - figures["ttft_mean_ms"]) / max(1, output_tokens - 1)
    span_s = float(done["completion_s"].max() - requests["arrival_s"].min())
    figures["req_per_s"] = len(done) / span_s if span_s > 0 else float("nan")
    return figures


# --------------------------------------------------------------------------- reading
def load_stages(path: Path) -> list[StageCase]:
    """Every stage of a stage-summary CSV, checked, in file order (the ``all`` row only checks the sums).

    Raises:
        UserError: a missing column, a cell that is not a number (whole where a count), a stage
            whose completed + failed differ from requests_sent, or stage sums that differ from the
            ``all`` row; naming file, line and column.
    """
    frame = read_csv(path)
    require_columns(frame, (STAGE_MARKER, *LOAD_COLUMNS, *(c for c, _ in MEASURED.values())), path)
    labels = frame[STAGE_MARKER].astype(str).str.strip()
    total = labels.str.lower() == "all"
    stages = ~total.to_numpy()
    numbers = _numbers(frame, path, stages)
    cases = [_stage_case(frame, path, numbers, int(row)) for row in np.flatnonzero(stages)]
    if not cases:
        raise UserError(f"{path}: no stage rows (only 'all')")
    _check_sums(frame, path, numbers, stages, np.flatnonzero(total.to_numpy()))
    return cases


def _numbers(frame: pd.DataFrame, path: Path, rows: np.ndarray) -> dict[str, np.ndarray]:
    numeric = [c for c in LOAD_COLUMNS if c not in ("saturated_client_bound", "ignore_eos")]
    numeric += [c for c, _ in MEASURED.values()] + [STAGE_MARKER]
    if "output_len_retok_mean" in frame.columns:
        numeric.append("output_len_retok_mean")
    return {
        c: number_column(frame, c, path, minimum=0, whole=c in _WHOLE or c == STAGE_MARKER, rows=rows) for c in numeric
    }


def _stage_case(frame: pd.DataFrame, path: Path, numbers: dict[str, np.ndarray], row: int) -> StageCase:
    values: dict[str, Any] = {c: float(v[row]) for c, v in numbers.items()}
    for column in ("saturated_client_bound", "ignore_eos"):
        values[column] = _switch(frame[column].iloc[row], where(path, row, column))
    sent, done, failed = (int(values[c]) for c in _SUMMED)
    if done + failed != sent:
        raise UserError(
            f"{where(path, row, 'completed')}: completed {done} + failed {failed} = {done + failed}, "
            f"but requests_sent = {sent}"
        )
    if values["saturated_client_bound"] and values["client_max_outstanding"] < 1:
        raise UserError(f"{where(path, row, 'client_max_outstanding')}: a client-bound stage needs a cap >= 1")
    if not values["saturated_client_bound"] and values["achieved_rate"] <= 0:
        raise UserError(f"{where(path, row, 'achieved_rate')}: value 0 is not a rate > 0")
    flags = read_server_flags(frame, row, path, {})
    stage = int(values[STAGE_MARKER])
    source = _source(frame, row)
    requested = values["requested_rate"] if values["saturated_client_bound"] else None
    return StageCase(shape="stages", name=f"{path.stem}:stage {stage}", flags=flags, n=sent, source=source,
                     requested_rps=requested, row=values)  # fmt: skip


def _switch(cell: Any, location: str) -> bool:
    text = str(cell).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise UserError(f"{location}: value {shown(str(cell))} is not True or False")


def _check_sums(frame: pd.DataFrame, path: Path, numbers: dict[str, np.ndarray], stages: np.ndarray,
                totals: np.ndarray) -> None:  # fmt: skip
    if len(totals) > 1:
        raise UserError(f"{where(path, int(totals[1]), STAGE_MARKER)}: a second 'all' row")
    for row in totals:
        for column in _SUMMED:
            stated = number_column(frame, column, path, minimum=0, whole=True, rows=np.arange(len(frame)) == row)
            summed = int(numbers[column][stages].sum())
            if int(stated[row]) != summed:
                raise UserError(
                    f"{where(path, int(row), column)}: the 'all' row says {int(stated[row])}, but the stages "
                    f"sum to {summed}"
                )


def _source(frame: pd.DataFrame, row: int) -> str:
    def cell(column: str) -> str:
        return str(frame[column].iloc[row]) if column in frame.columns else "?"

    return f"{cell('source_repo')}, `{cell('source_path')}` at {cell('source_commit')[:7]}"
