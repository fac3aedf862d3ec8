"""Replay of a burst run (the ``vllm-0.6.0-burst`` shape): the same requests, the same server.

A :class:`BurstCase` replays one run of a burst folder: the catalog model and GPU of its
``model_id`` and ``gpu``, its tensor-parallel degree and ``max_model_len``, 16-token KV
blocks, the API front end of the run's vLLM version (its preset's ``frontend``) and one policy, the
preset of the server's engine version with the server's flags
(:func:`sim.validation.server.policy_entry`). The requests are the run's own, all sent at
t = 0: their lengths go into a trace CSV (all arrivals 0) that batchsim's trace arrival reads.

An empty answer (output_len 0: the first token sampled was EOS) still cost a prefill and
produced one token the client discarded, so it is simulated with 1 output token; the
metrics then count it as the client did (:mod:`sim.validation.metrics`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.validation.cases import POLICY_NAME, Case, Residual
from sim.validation.data import RealRun
from sim.validation.metrics import METRICS, benchmark_metrics, client_frame
from sim.workload.traces import ARRIVAL_COLUMN, OUTPUT_COLUMN, PROMPT_COLUMN

UNITS: dict[str, str] = {
    "ttft_p50_ms": "ms", "tpot_p50_ms": "ms/token", "e2e_p50_ms": "ms", "output_tps": "tokens/s", "duration_s": "s",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BurstCase(Case):
    """One run of a burst folder (``summary.csv`` + its request file)."""

    run: RealRun

    def workload(self, folder: Path) -> dict[str, Any]:
        """Every request at t = 0 with its exact lengths, read back from a trace CSV in ``folder``."""
        path = folder / "requests.csv"  # not the run's name: any file name must work
        write_burst_trace(self.run, path)
        return {"arrival": {"kind": "trace", "path": str(path)}}

    def compare(self, requests: pd.DataFrame) -> list[Residual]:
        """benchmark_serving's figures of the replay against the run's summary row."""
        simulated = benchmark_metrics(client_frame(requests, self.run.requests["output_len"].to_numpy()))
        measured = measured_metrics(self.run)
        return [Residual(m, UNITS[m], measured[m], simulated[m]) for m in METRICS]


def burst_case(run: RealRun) -> BurstCase:
    """The case of one burst run."""
    s = run.summary
    source = f"{s.get('source_repo', '?')}, `{s.get('source_path', '?')}` at {str(s.get('source_commit', '?'))[:7]}"
    return BurstCase(shape="burst", name=run.name, flags=run.flags, n=run.num_requests, source=source, run=run)


def engine_output_tokens(run: RealRun) -> np.ndarray:
    """Output tokens the engine generated per request: the client's count, an empty answer as 1."""
    return np.maximum(run.requests["output_len"].to_numpy(dtype=np.int64), 1)


def write_burst_trace(run: RealRun, path: Path) -> None:
    """The run's requests as a batchsim trace: every arrival at 0, its exact lengths."""
    pd.DataFrame({
        ARRIVAL_COLUMN: np.zeros(run.num_requests),
        PROMPT_COLUMN: run.requests["input_len"].to_numpy(dtype=np.int64),
        OUTPUT_COLUMN: engine_output_tokens(run),
    }).to_csv(path, index=False)  # fmt: skip


@contextmanager
def replay_scenario(run: RealRun) -> Iterator[Scenario]:
    """The validated replay Scenario of a burst run; its trace file exists until the block ends."""
    case = burst_case(run)
    case.check()  # an unknown model or GPU fails before any file is written
    with tempfile.TemporaryDirectory(prefix="batchsim-replay-") as folder:
        yield Scenario(**case.scenario_dict(Path(folder)))


def replay_run(run: RealRun) -> pd.DataFrame:
    """The replay of a burst run as its client saw it (:func:`~sim.validation.metrics.client_frame`)."""
    from sim.runner import run as simulate

    with replay_scenario(run) as scenario:
        result = simulate(scenario)
    requests = result.requests[result.requests["policy"] == POLICY_NAME]
    return client_frame(requests, run.requests["output_len"].to_numpy())


def measured_metrics(run: RealRun) -> dict[str, float]:
    """The figures benchmark_serving reported for ``run`` (summary.csv), keyed as :data:`METRICS`."""
    s = run.summary
    return {
        "ttft_p50_ms": s["median_ttft_ms_nonzero"],
        "tpot_p50_ms": s["median_tpot_ms"],
        "e2e_p50_ms": s["median_latency_ms"],
        "output_tps": s["output_throughput"],
        "duration_s": s["duration"],
    }
