"""Replay one real run in batchsim: the same requests, the same server settings.

The scenario of a run (:func:`scenario_dict`) is built in code: the catalog model and GPU
named by the run's ``model_id`` and ``gpu``, its tensor-parallel degree and
``max_model_len``, 16-token KV blocks, the API front end with its fitted defaults
(``frontend: {}``) and one policy, the ``vllm-0.6`` preset with the server's flags
(:data:`SERVER_FLAGS`). The requests are the run's own, all sent at t = 0: their lengths
go into a temporary trace CSV (all arrivals 0) that batchsim's trace arrival reads, which
exists only while :func:`replay_scenario`'s block runs.

An empty answer (output_len 0: the first token sampled was EOS) still cost a prefill and
produced one token the client discarded, so it is simulated with 1 output token; the
metrics then count it as the client did (:mod:`sim.validation.metrics`).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.errors import UserError, did_you_mean, shown
from sim.validation.data import RealRun
from sim.validation.metrics import benchmark_metrics, client_frame
from sim.workload.traces import ARRIVAL_COLUMN, OUTPUT_COLUMN, PROMPT_COLUMN

MODELS: dict[str, str] = {
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama-3-8b",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
}
"""Hugging Face id of a measured model -> batchsim catalog model of the same shape."""
GPUS: dict[str, str] = {"A100-80GB-SXM": "a100-80gb", "H100-80GB-SXM": "h100-sxm"}
"""GPU name in summary.csv -> batchsim catalog GPU."""
POLICY_NAME = "vllm-0.6"
SERVER_FLAGS: dict[str, Any] = {
    "name": POLICY_NAME, "preset": "vllm-0.6", "num_scheduler_steps": 10, "max_batch_size": 1024,
    "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.95,
}  # fmt: skip
"""The measured server's flags (validation README): --num-scheduler-steps 10, --max-num-seqs 1024,
--gpu-memory-utilization 0.95, max_num_batched_tokens 2048 (the default without chunked prefill)."""
BLOCK_SIZE_TOKENS = 16


def catalog_names(run: RealRun) -> tuple[str, str]:
    """The batchsim (model, gpu) of a run; UserError for one batchsim has no mapping for."""
    model_id, gpu = run.summary["model_id"], run.summary["gpu"]
    if model_id not in MODELS:
        raise UserError(
            f"run {shown(run.name)}: model_id {shown(model_id)} has no batchsim model"
            f"{did_you_mean(model_id, MODELS)}; "
            f"known: {', '.join(MODELS)}"
        )
    if gpu not in GPUS:
        raise UserError(
            f"run {shown(run.name)}: gpu {shown(gpu)} has no batchsim GPU{did_you_mean(gpu, GPUS)}; "
            f"known: {', '.join(GPUS)}"
        )
    return MODELS[model_id], GPUS[gpu]


def engine_output_tokens(run: RealRun) -> np.ndarray:
    """Output tokens the engine generated per request: the client's count, an empty answer as 1."""
    return np.maximum(run.requests["output_len"].to_numpy(dtype=np.int64), 1)


def replay_name(run_name: str) -> str:
    """A valid scenario ``name`` for a run named after any file: each character a scenario name
    does not allow (a space, a slash, ...) becomes '_', no leading '.', at most 128 characters.

    The scenario name only labels the replay in memory; tables keep the run's own name.
    """
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", run_name).lstrip(".")[:128] or "run"


def scenario_dict(run: RealRun, trace_path: str) -> dict[str, Any]:
    """The replay scenario of ``run`` (as ``sim.Scenario(**d)`` takes it), reading ``trace_path``."""
    model, gpu = catalog_names(run)
    tp, gpus = run.summary["tensor_parallel"], run.summary["num_gpus"]
    if tp < 1 or gpus % tp:
        raise UserError(f"run {shown(run.name)}: num_gpus = {gpus} is not a multiple of tensor_parallel = {tp}")
    return {
        "name": replay_name(run.name), "seed": 0, "model": model, "gpu": gpu,
        "tensor_parallel": tp, "replicas": gpus // tp, "max_model_len": run.summary["max_model_len"],
        # The server's KV settings also at the scenario level, so the KV budget is the server's
        # whether or not the policy's own gpu_memory_utilization is applied.
        "memory": {"block_size": BLOCK_SIZE_TOKENS, "gpu_memory_utilization": SERVER_FLAGS["gpu_memory_utilization"]},
        "workload": {"arrival": {"kind": "trace", "path": trace_path}},
        "frontend": {},
        "policies": [dict(SERVER_FLAGS)],
    }  # fmt: skip


@contextmanager
def replay_scenario(run: RealRun) -> Iterator[Scenario]:
    """The validated replay Scenario of ``run``; its trace file exists until the block ends."""
    catalog_names(run)  # an unknown model or GPU fails before any file is written
    with tempfile.TemporaryDirectory(prefix="batchsim-replay-") as folder:
        path = Path(folder) / "requests.csv"  # not the run's name: any file name must work
        write_burst_trace(run, path)
        yield Scenario(**scenario_dict(run, str(path)))


def write_burst_trace(run: RealRun, path: Path) -> None:
    """The run's requests as a batchsim trace: every arrival at 0, its exact lengths."""
    pd.DataFrame({
        ARRIVAL_COLUMN: np.zeros(run.num_requests),
        PROMPT_COLUMN: run.requests["input_len"].to_numpy(dtype=np.int64),
        OUTPUT_COLUMN: engine_output_tokens(run),
    }).to_csv(path, index=False)  # fmt: skip


@dataclass(frozen=True)
class Replay:
    """A simulated run as its client saw it.

    Attributes:
        requests: :func:`~sim.validation.metrics.client_frame` of the replay.
        cost_model: how the GPU time was priced (calibrated, transferred, uncalibrated roofline).
    """

    requests: pd.DataFrame
    cost_model: str


def replay_run(run: RealRun) -> Replay:
    """Simulate ``run`` in batchsim with the real server's settings."""
    from sim.runner import run as simulate

    with replay_scenario(run) as scenario:
        result = simulate(scenario)
    requests = result.requests[result.requests["policy"] == POLICY_NAME]
    return Replay(client_frame(requests, run.requests["output_len"].to_numpy()), str(result.facts["cost_model"]))


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


def simulated_metrics(replay: Replay) -> dict[str, float]:
    """The same figures, computed from batchsim's replay of a run."""
    return benchmark_metrics(replay.requests)
