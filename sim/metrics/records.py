"""Columnar record buffers: per-request results and per-iteration rows.

The engine writes scalars into preallocated numpy columns (one slot per request) and
appends to typed ``array.array`` columns (one entry per forward pass), so a run of
10^6 requests and 10^7 iterations costs a few hundred MB instead of one Python object
per row. Each buffer becomes a DataFrame once, at the end of the run; the column
meanings are written down in ``docs/engine.md`` and ``docs/metrics.md``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

# Request status codes (int8 column). The first five are in flight; the last three are final.
UNSENT, WAITING, RUNNING, BACKOFF, FRONTEND, COMPLETED, TIMED_OUT, REJECTED = range(8)
FINAL_STATUSES: tuple[str, ...] = ("completed", "timed_out", "rejected")

REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "status",
    "first_scheduled_s", "first_token_s", "completion_s", "queue_delay_s", "ttft_s", "tpot_s",
    "e2e_s", "norm_latency_s", "preemptions", "retries", "frontend_s",
    "spec_steps", "spec_proposed_tokens", "spec_accepted_tokens", "spec_tokens_per_step",
    "cached_prompt_tokens",
)  # fmt: skip
"""Columns of ``SimOutput.requests``, in order."""

ITERATION_COLUMNS: tuple[str, ...] = (
    "replica", "start_s", "duration_s", "batch_size", "prefill_tokens", "decode_tokens",
    "kv_blocks_used", "kv_blocks_total", "prefill_attn_work", "decode_kv_tokens", "prefill_context_tokens",
)  # fmt: skip
"""Columns of ``SimOutput.iterations``, in order."""

PIPELINE_COLUMNS: tuple[str, ...] = ("stage", "virtual_engine")
"""Appended to the iteration rows of a pipeline-parallel run: each row is one stage's pass of one virtual
engine's micro-batch (``sim.serving.pipeline``)."""

ALL_REDUCE_COLUMN = "all_reduce_s"
"""Appended to the iteration rows a result keeps (after ``mfu`` and ``mbu``): the seconds of each pass that the
cost model gives its tensor-parallel all-reduces (0 at TP 1); divided by ``duration_s``, their share."""


class RequestRecords:
    """Per-request results of one run, one numpy slot per request index.

    Times are NaN until the event happens. ``generated_tokens`` counts output tokens
    produced so far; it survives preemption (recompute keeps generated tokens).

    Args:
        num_requests: requests in the stream.
    """

    def __init__(self, num_requests: int) -> None:
        n = num_requests
        self.replica = np.full(n, -1, dtype=np.int16)
        self.arrival_s = np.full(n, np.nan)
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.completion_s = np.full(n, np.nan)
        self.enqueued_s = np.full(n, np.nan)  # last time it joined a queue (send or preemption)
        self.frontend_done_s = np.full(n, np.nan)  # when the API front end first handed it to the engine
        self.status = np.zeros(n, dtype=np.int8)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.retries = np.zeros(n, dtype=np.int32)
        self.generated_tokens = np.zeros(n, dtype=np.int32)
        # Speculative decoding (zero without it): verification steps, draft tokens proposed, accepted.
        self.spec_steps = np.zeros(n, dtype=np.int32)
        self.spec_proposed_tokens = np.zeros(n, dtype=np.int32)
        self.spec_accepted_tokens = np.zeros(n, dtype=np.int32)
        self.cached_prompt_tokens = np.zeros(n, dtype=np.int64)  # served from the prefix cache at first admission

    def __len__(self) -> int:
        return len(self.status)

    def unfinished(self) -> np.ndarray:
        """Indices of requests that have not ended (empty after a complete run)."""
        return np.flatnonzero(self.status < COMPLETED)

    def to_frame(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> pd.DataFrame:
        """The requests table (``REQUEST_COLUMNS``), with latencies derived vectorially.

        Queue delay and TTFT are given wherever the event happened (also for a request
        that later timed out); TPOT, E2E and normalized latency only for completed ones.
        The frame views these records' columns (no copy: they are final after a run) and
        copies the token counts, which belong to the shared request stream.
        """
        done = self.status == COMPLETED
        n_out = np.asarray(output_tokens)
        e2e_s = np.where(done, self.completion_s - self.arrival_s, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot_s = np.where(
                done & (n_out > 1), (self.completion_s - self.first_token_s) / (n_out - 1), np.nan
            )
            # Tokens per verification step: each step yields its accepted drafts plus one target token.
            spec_tokens_per_step = np.where(
                self.spec_steps > 0, (self.spec_steps + self.spec_accepted_tokens) / self.spec_steps, np.nan
            )
        status = pd.Categorical.from_codes(
            np.clip(self.status.astype(np.int64) - COMPLETED, -1, None),
            categories=list(FINAL_STATUSES),
        )
        return pd.DataFrame(
            {
                "request_id": np.arange(len(self), dtype=np.int64),
                "replica": self.replica,
                "arrival_s": self.arrival_s,
                "prompt_tokens": np.array(prompt_tokens, dtype=np.int64),
                "output_tokens": n_out.astype(np.int64),
                "status": status,
                "first_scheduled_s": self.first_scheduled_s,
                "first_token_s": self.first_token_s,
                "completion_s": self.completion_s,
                "queue_delay_s": self.first_scheduled_s - self.arrival_s,
                "ttft_s": self.first_token_s - self.arrival_s,
                "tpot_s": tpot_s,
                "e2e_s": e2e_s,
                "norm_latency_s": e2e_s / n_out,
                "preemptions": self.preemptions,
                "retries": self.retries,
                "frontend_s": self.frontend_done_s - self.arrival_s,
                "spec_steps": self.spec_steps,
                "spec_proposed_tokens": self.spec_proposed_tokens,
                "spec_accepted_tokens": self.spec_accepted_tokens,
                "spec_tokens_per_step": spec_tokens_per_step,
                "cached_prompt_tokens": self.cached_prompt_tokens,
            },
            copy=False,
        )


_ITERATION_TYPES: tuple[tuple[str, str], ...] = (
    ("replica", "h"), ("start_s", "d"), ("duration_s", "d"), ("batch_size", "i"), ("prefill_tokens", "i"),
    ("decode_tokens", "i"), ("kv_blocks_used", "i"), ("prefill_attn_work", "d"), ("decode_kv_tokens", "i"),
    ("prefill_context_tokens", "i"),
)  # fmt: skip
"""The record columns (``ITERATION_COLUMNS`` less ``kv_blocks_total``) and their ``array`` type codes."""
_PIPELINE_TYPES: tuple[tuple[str, str], ...] = (("stage", "h"), ("virtual_engine", "h"))

STAGE_ROWS = 1 << 15
"""Rows kept as Python lists before they are packed into the typed columns (:meth:`IterationRecords.flush`)."""


class IterationRecords:
    """Growable typed columns, one entry per forward pass (all of them, never sampled).

    ``append`` is bound once per worker and called once per iteration; ``kv_blocks_total``
    is constant per replica and filled in by ``to_frame``. Rows are staged in Python lists
    and packed into the ``array`` columns ``STAGE_ROWS`` at a time (``struct.pack``): appending
    to a list is a fraction of the cost of an ``array.append``, which parses its argument
    (about a tenth of a merged run's time); the staged rows use a few MiB.

    Args:
        pipeline: rows are stage passes of a pipeline-parallel run (:meth:`append_stage`), with the
            ``PIPELINE_COLUMNS`` after the others.
    """

    def __init__(self, *, pipeline: bool = False) -> None:
        self._types = _ITERATION_TYPES + (_PIPELINE_TYPES if pipeline else ())
        self._new_buffers()

    def _new_buffers(self) -> None:
        self.replica = array("h")
        self.start_s = array("d")
        self.duration_s = array("d")
        self.batch_size = array("i")
        self.prefill_tokens = array("i")
        self.decode_tokens = array("i")
        self.kv_blocks_used = array("i")
        self.prefill_attn_work = array("d")
        self.decode_kv_tokens = array("i")
        self.prefill_context_tokens = array("i")
        self._staged: tuple[list, ...] = tuple([] for _ in self._types)
        (
            self._replica, self._start_s, self._duration_s, self._batch_size, self._prefill_tokens,
            self._decode_tokens, self._kv_blocks_used, self._prefill_attn_work, self._decode_kv_tokens,
            self._prefill_context_tokens,
        ) = self._staged[: len(_ITERATION_TYPES)]  # fmt: skip
        for name, code in self._types[len(_ITERATION_TYPES) :]:
            setattr(self, name, array(code))

    def __len__(self) -> int:
        return len(self.start_s) + len(self._start_s)

    def flush(self) -> None:
        """Pack the staged rows into the typed columns (the ``array`` attributes hold every row after it)."""
        if not self._start_s:
            return
        for (name, code), staged in zip(self._types, self._staged, strict=True):
            getattr(self, name).frombytes(struct.pack(f"{len(staged)}{code}", *staged))  # the fastest packer
            staged.clear()

    def append(
        self,
        replica: int,
        start_s: float,
        duration_s: float,
        batch_size: int,
        prefill_tokens: int,
        decode_tokens: int,
        kv_blocks_used: int,
        prefill_attn_work: float = 0.0,
        decode_kv_tokens: int = 0,
        prefill_context_tokens: int = 0,
    ) -> None:
        """Record one forward pass (the last three: the cost-model totals MFU and MBU need)."""
        self._replica.append(replica)
        self._start_s.append(start_s)
        self._duration_s.append(duration_s)
        self._batch_size.append(batch_size)
        self._prefill_tokens.append(prefill_tokens)
        self._decode_tokens.append(decode_tokens)
        self._kv_blocks_used.append(kv_blocks_used)
        self._prefill_attn_work.append(prefill_attn_work)
        self._decode_kv_tokens.append(decode_kv_tokens)
        self._prefill_context_tokens.append(prefill_context_tokens)
        if len(self._start_s) >= STAGE_ROWS:
            self.flush()

    def append_stage(self, stage: int, virtual_engine: int, *row: float) -> None:
        """Record one stage's pass of a pipeline-parallel micro-batch: ``row`` as :meth:`append` takes it."""
        for staged, value in zip(self._staged, (*row, stage, virtual_engine), strict=True):
            staged.append(value)
        if len(self._start_s) >= STAGE_ROWS:
            self.flush()

    def extend_decode_run(
        self, replica: int, start_s: list[float], duration_s: list[float], decodes: int,
        kv_blocks_used: list[int] | int, decode_kv_tokens: list[int],
    ) -> None:  # fmt: skip
        """Record a run of pure decode passes of one batch (``decodes`` sequences each; blocks
        used: one count per pass, or one for all): as ``append`` would, row by row."""
        n = len(start_s)
        self._replica.extend([replica] * n)
        self._start_s.extend(start_s)
        self._duration_s.extend(duration_s)
        same = [decodes] * n
        self._batch_size.extend(same)
        zeros = [0] * n
        self._prefill_tokens.extend(zeros)
        self._decode_tokens.extend(same)
        self._kv_blocks_used.extend([kv_blocks_used] * n if isinstance(kv_blocks_used, int) else kv_blocks_used)
        self._prefill_attn_work.extend([0.0] * n)
        self._decode_kv_tokens.extend(decode_kv_tokens)
        self._prefill_context_tokens.extend(zeros)
        if len(self._start_s) >= STAGE_ROWS:
            self.flush()

    def to_frame(self, kv_blocks_total: int) -> pd.DataFrame:
        """The iterations table (``ITERATION_COLUMNS``), ordered by start time then replica.

        The buffers are emptied and the frame's columns view them without a copy, so the
        frame holds the only reference: dropping it frees the memory. Rows from several
        replicas are reordered one column at a time (peak: the table plus one column).
        """
        self.flush()
        columns: dict[str, array] = {name: getattr(self, name) for name, _ in self._types}
        self._new_buffers()  # the views below keep the old buffers alive, nothing else does
        views = {name: np.frombuffer(buffer, dtype=buffer.typecode) for name, buffer in columns.items()}
        del columns
        views["kv_blocks_total"] = np.full(len(views["start_s"]), kv_blocks_total, dtype=np.int32)
        pipeline = len(self._types) > len(_ITERATION_TYPES)
        names = ITERATION_COLUMNS + (PIPELINE_COLUMNS if pipeline else ())
        data = {name: views.pop(name) for name in names}  # in the published order
        del views
        # Rows are appended when an iteration ends (merged passes earlier): sort by start, then
        # replica (and stage), unless the starts strictly increase (then no order of appends can differ).
        starts = data["start_s"]
        if len(starts) > 1 and not (starts[1:] > starts[:-1]).all():
            keys = (data["stage"],) if pipeline else ()
            order = np.lexsort((*keys, data["replica"], data["start_s"]))  # stable, like sort_values
            for name in data:
                data[name] = data[name][order]  # frees that column's buffer
        return pd.DataFrame(data, copy=False)


def with_all_reduce_column(
    iterations: pd.DataFrame,
    all_reduce_s: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    stage_shares: Sequence[float] | None = None,
) -> pd.DataFrame:
    """``iterations`` with ``all_reduce_s`` appended (a shallow copy), priced from all rows' totals at once.

    Args:
        iterations: iteration rows (``ITERATION_COLUMNS``).
        all_reduce_s: seconds of all-reduce of passes of (tokens, prefill pieces, replica), vectorised
            (:meth:`sim.hardware.cost_model.CostModel.all_reduce_s` of the replica's cost model).
        stage_shares: per pipeline stage, its share of the layers: a stage row (``stage`` column) gets
            that share of its pass's all-reduces (None: rows are whole passes).
    """
    out = iterations.copy(deep=False)
    decodes = iterations["decode_tokens"].to_numpy(dtype=np.int64)
    tokens = iterations["prefill_tokens"].to_numpy(dtype=np.int64) + decodes
    pieces = iterations["batch_size"].to_numpy(dtype=np.int64) - decodes  # rows = prefill pieces + decodes
    replicas = iterations["replica"].to_numpy()
    seconds = all_reduce_s(tokens, pieces, replicas) if len(iterations) else np.zeros(0)
    if stage_shares is not None and "stage" in iterations.columns:
        seconds = seconds * np.asarray(stage_shares)[iterations["stage"].to_numpy(dtype=np.int64)]
    out[ALL_REDUCE_COLUMN] = seconds
    return out


def sample_every_kth(frame: pd.DataFrame, max_rows: int) -> tuple[pd.DataFrame, int]:
    """Every k-th row, k = ceil(rows / max_rows) (at least 1), and k: the rule of ``iterations.csv``.

    The sampled rows are copied (a strided view would keep the whole table alive), so the
    caller can drop the full frame; with k = 1 the frame itself is returned.
    """
    every = max(1, -(-len(frame) // max_rows))
    if every == 1:
        return frame, 1
    return frame.iloc[::every].copy().reset_index(drop=True), every
