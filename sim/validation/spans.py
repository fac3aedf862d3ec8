"""Per-request server traces (vLLM's OpenTelemetry request spans): reading and replaying them.

The format (``../shared/validation/vllm-0.11-h100/README.md``, section 2): one row per served
request with ``run`` (which measurement), ``input_len``, ``output_len`` (= max_tokens with
ignore_eos), ``server_arrival_s`` (arrival at the engine, from the run's first request) and
the engine's spans ``server_ttft_s``, ``server_e2e_s``, ``server_queue_s`` (seconds). Where
``server_prompt_tokens`` / ``server_completion_tokens`` are present they must equal the
lengths. The server's flags come from the file's columns where it has them, else from
:data:`TRACE_SERVERS` (the README's transcription, keyed by ``run``).

A trace run is replayed with its arrivals at ``server_arrival_s`` and its exact lengths,
straight into the engine (no front end: the spans start at the engine), and compared per
request (the residuals' median and spread) and in distribution (mean and percentiles) on
TTFT, E2E and the time in the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import UserError, shown
from sim.io.csv_reader import number_column, read_csv, require_columns, where
from sim.metrics.running_pass import running_pass
from sim.validation.cases import Case, Residual, completed, stat_ms
from sim.validation.server import read_server_flags
from sim.workload.traces import ARRIVAL_COLUMN, OUTPUT_COLUMN, PROMPT_COLUMN, token_column

TRACE_MARKER = "server_arrival_s"
"""The column that makes a CSV a per-request trace."""
SPAN_COLUMNS: tuple[str, ...] = ("server_ttft_s", "server_e2e_s", "server_queue_s")
REQUIRED: tuple[str, ...] = ("run", "input_len", "output_len", TRACE_MARKER, *SPAN_COLUMNS)
COUNT_CHECKS: dict[str, str] = {"server_prompt_tokens": "input_len", "server_completion_tokens": "output_len"}
"""A column that restates a length -> the length it must equal."""
TRACE_SERVERS: dict[str, dict[str, Any]] = {
    "jan21-llama7b-train-1": {
        "engine_version": "0.11.0", "model_id": "meta-llama/Llama-2-7b-hf", "gpu": "H100-80GB-SXM",
        "tensor_parallel": 1, "num_gpus": 1, "max_model_len": 4096, "max_num_batched_tokens": 4096,
        "max_num_seqs": 256, "chunked_prefill": True, "prefix_caching": True, "gpu_memory_utilization": 0.9,
        "kv_cache_tokens": 119_008,
        "source": "inference-sim/inference-sim, `eval/ground_truth/jan21-llama7b-train-1/traces.json` at e7a4aa3",
    },
}  # fmt: skip
"""Servers of trace runs whose files do not record them: ``vllm-0.11-h100/README.md`` section 2 (vLLM
0.11.0 V1, Llama-2-7B fp16, one 80 GB GPU, H100-SXM inferred, max_model_len 4096,
max_num_batched_tokens 4096, max_num_seqs 256, chunked prefill and prefix caching on,
gpu_memory_utilization 0.9, KV cache 119,008 tokens from the log), each with its ``source``."""
STATS: tuple[str, ...] = ("mean", "p50", "p90", "p99")
SPANS: dict[str, str] = {"ttft": "server_ttft_s", "e2e": "server_e2e_s", "queue": "server_queue_s"}
SIMULATED: dict[str, str] = {"ttft": "ttft_s", "e2e": "e2e_s", "queue": "queue_delay_s"}
QUEUE_FLOOR_MS = 1.0
"""Queue statistics measured below this get no % error: an idle engine queues for microseconds."""


@dataclass(frozen=True, kw_only=True)
class TraceCase(Case):
    """One run of a per-request trace."""

    requests: pd.DataFrame  # input_len, output_len, arrival_s and the spans, in arrival order

    def workload(self, folder: Path) -> dict[str, Any]:
        """The run's arrivals and lengths, as a batchsim trace in ``folder``."""
        path = folder / "trace.csv"
        pd.DataFrame({
            ARRIVAL_COLUMN: self.requests["arrival_s"].to_numpy(),
            PROMPT_COLUMN: self.requests["input_len"].to_numpy(),
            OUTPUT_COLUMN: self.requests["output_len"].to_numpy(),
        }).to_csv(path, index=False)  # fmt: skip
        return {"arrival": {"kind": "trace", "path": str(path)}, "text": "random"}

    measured_at_engine = True  # the spans start when the request reaches the engine

    def compare(self, requests: pd.DataFrame) -> list[Residual]:
        """Distribution figures (ms) of TTFT, E2E and queue, then the per-request residuals."""
        done = completed(requests)
        if len(done) != len(self.requests):  # every traced request was served; the replay must serve them too
            raise UserError(f"run {shown(self.name)}: the replay completed {len(done)} of {len(self.requests)}")
        rows = []
        for span, column in SPANS.items():
            real, sim = self.requests[column].to_numpy(), done[SIMULATED[span]].to_numpy()
            if span == "queue" and "engine_intake_s" in done:  # the engine's clock, as vLLM measures it
                sim = (done["first_scheduled_s"] - done["engine_intake_s"]).to_numpy()
                assert (sim >= 0).all(), f"{self.name}: a request was scheduled before the engine took it in"
            floor = QUEUE_FLOOR_MS if span == "queue" else 0.0
            rows += [Residual(f"{span}_{s}_ms", "ms", stat_ms(real, s), stat_ms(sim, s), floor) for s in STATS]
            rows += per_request(span, real, sim)
        return rows


def engine_intake_s(arrival_s: pd.Series, passes: pd.DataFrame) -> np.ndarray:
    """When the engine takes each request in: at its arrival if no pass is running, else when that pass ends.

    vLLM's V1 engine core reads new requests only between steps (``EngineCore.run_busy_loop``: the input queue,
    then one engine step; ``vllm/v1/engine/core.py`` at v0.11.0), and its queue time starts there
    (``Scheduler.add_request`` records ``QUEUED``; ``queued_time = scheduled_ts - queued_ts`` in
    ``vllm/v1/metrics/stats.py``). batchsim's ``queue_delay_s`` starts at arrival, so a request that arrives
    mid-pass carries the rest of that pass too: comparing the two measured different spans.

    Args:
        arrival_s: the requests' arrival times at the engine.
        passes: the replay's iteration rows (``start_s``, ``duration_s``), every pass of its one replica.
    """
    arrivals = arrival_s.to_numpy(dtype=float)
    # A pass starting at the very arrival is the request's own (an idle engine starts it for the request).
    running = running_pass(passes, arrivals, starting_counts=False)
    ends = (passes["start_s"] + passes["duration_s"]).to_numpy(dtype=float)
    return np.where(running >= 0, ends[np.maximum(running, 0)], arrivals)


def per_request(span: str, real_s: np.ndarray, sim_s: np.ndarray) -> list[Residual]:
    """Residuals request by request: for TTFT and E2E the median signed and the median and p90 absolute
    % error; for the queue (microseconds when idle, where % means nothing) the median and p90 absolute
    difference in ms."""
    if span == "queue":
        diff_ms = np.abs(sim_s - real_s) * 1e3
        return [Residual(f"queue_req_abs_diff_{q}_ms", "ms", 0.0, float(np.percentile(diff_ms, int(q[1:]))))
                for q in ("p50", "p90")]  # fmt: skip
    error = 100.0 * (sim_s - real_s) / real_s
    return [
        Residual(f"{span}_req_err_p50", "%", 0.0, float(np.median(error))),
        Residual(f"{span}_req_abs_err_p50", "%", 0.0, float(np.median(np.abs(error)))),
        Residual(f"{span}_req_abs_err_p90", "%", 0.0, float(np.percentile(np.abs(error), 90))),
    ]


# --------------------------------------------------------------------------- reading
def load_trace(path: Path) -> list[TraceCase]:
    """One case per ``run`` of a per-request trace, checked.

    Raises:
        UserError: a missing column, a non-numeric or negative cell, a length that is not a whole
            number >= 1, spans out of order (queue <= TTFT <= E2E), arrivals out of order within a
            run, a restated count that differs from the length, or a run without known server flags.
    """
    frame = read_csv(path)
    require_columns(frame, REQUIRED, path)
    columns = {c: token_column(frame, c, path) for c in ("input_len", "output_len")}
    columns |= {c: number_column(frame, c, path, minimum=0) for c in (TRACE_MARKER, *SPAN_COLUMNS)}
    _check_counts(frame, path, columns)
    _check_span_order(path, columns)
    runs = frame["run"].astype(str).str.strip().to_numpy()
    return [_trace_case(frame, path, columns, runs == run, run) for run in dict.fromkeys(runs)]


def _check_counts(frame: pd.DataFrame, path: Path, columns: dict[str, np.ndarray]) -> None:
    for restated, length in COUNT_CHECKS.items():
        if restated not in frame.columns:
            continue
        values = token_column(frame, restated, path, min_tokens=0)
        differ = np.flatnonzero(values != columns[length])
        if differ.size:
            row = int(differ[0])
            raise UserError(
                f"{where(path, row, restated)}: {values[row]} disagrees with {length} = {columns[length][row]}"
            )


def _check_span_order(path: Path, columns: dict[str, np.ndarray]) -> None:
    queue, ttft, e2e = columns["server_queue_s"], columns["server_ttft_s"], columns["server_e2e_s"]
    for early, late, column in ((queue, ttft, "server_ttft_s"), (ttft, e2e, "server_e2e_s")):
        wrong = np.flatnonzero(late < early)
        if wrong.size:
            row = int(wrong[0])
            raise UserError(f"{where(path, row, column)}: {late[row]:g} is less than the span it contains")


def _trace_case(frame: pd.DataFrame, path: Path, columns: dict[str, np.ndarray], rows: np.ndarray,
                run: str) -> TraceCase:  # fmt: skip
    index = np.flatnonzero(rows)
    arrival_s = columns[TRACE_MARKER][index]
    backwards = np.flatnonzero(np.diff(arrival_s) < 0)
    if backwards.size:
        row = int(index[backwards[0] + 1])
        raise UserError(f"{where(path, row, TRACE_MARKER)}: earlier than the run's request before it; sort by arrival")
    defaults = dict(TRACE_SERVERS.get(run, {}))
    source = str(defaults.pop("source", "see the folder's README"))
    if not defaults and "engine_version" not in frame.columns:
        raise UserError(
            f"{path}: run {shown(run)} has no server flags: add columns engine_version, model_id, gpu, "
            f"max_model_len, ... or an entry to TRACE_SERVERS; known runs: {', '.join(TRACE_SERVERS)}"
        )
    flags = read_server_flags(frame, int(index[0]), path, defaults)
    requests = pd.DataFrame({
        "input_len": columns["input_len"][index], "output_len": columns["output_len"][index],
        "arrival_s": arrival_s, **{c: columns[c][index] for c in SPAN_COLUMNS},
    })  # fmt: skip
    return TraceCase(shape="trace", name=run, flags=flags, n=len(index), source=source, requests=requests)
