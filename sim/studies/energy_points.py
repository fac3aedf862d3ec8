"""Published energy measurements and batchsim's estimate of each, under the same conditions.

The points are the ML.ENERGY Leaderboard v3.0 runs of Llama-3.1-8B-Instruct on one H100 SXM
(vLLM 0.11.1, async scheduling, ``max-num-batched-tokens`` 8192, bf16, task ``lm-arena-chat``:
1,024 LMArena prompts sent at once, up to 4,096 output tokens; the server runs
``max_num_seqs`` = B of them at a time and energy is GPU energy over the steady-state window
divided by the output tokens of that window). Source: ml-energy/leaderboard
``public/data/models/meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json`` at commit
0cd52dab897c5d91a45f4d413038f3b8b4251b0f (2026-02-27); the v3.0 blog post dates the runs to
December 2025.

batchsim replays the same conditions: Llama-3.1-8B on ``h100-sxm``, the ``vllm-0.15`` preset
(V1 with async scheduling, as ``async-scheduling: true`` sets on 0.11.1) with
``max_batch_size`` B and an 8,192-token budget, closed-loop clients (2 x B, no think time) so
the running batch stays full as in the measured window, output lengths drawn from the
published histogram (mean ~395 tokens) and prompts lognormal with mean ~620 tokens (the
v3.0 post gives a mean of 634 prompt tokens for its Text Conversation task; the per-model
prompt histogram is not published). Energy per output token is counted over the window in
which every client is still sending (the queue never runs dry), as the benchmark counts its
steady state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.io.scenario import scenario_from_dict
from sim.metrics.energy import Pool, pass_energy_j

SOURCE = (
    "ML.ENERGY Leaderboard v3.0, ml-energy/leaderboard public/data/models/"
    "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json @ 0cd52dab (H100, 1 GPU, vLLM 0.11.1)"
)


@dataclass(frozen=True)
class PublishedPoint:
    """One measured configuration.

    Attributes:
        max_num_seqs: B, the server's batch limit.
        power_w: average GPU power over the steady window, W.
        joules_per_token: GPU energy per output token, J.
        output_tps: output tokens per second.
        fitted: used to fit :data:`sim.hardware.power.K_MEMORY` / ``K_COMPUTE`` (else held out).
    """

    max_num_seqs: int
    power_w: float
    joules_per_token: float
    output_tps: float
    fitted: bool = False


POINTS: tuple[PublishedPoint, ...] = (
    PublishedPoint(8, 486.1, 0.4548, 1070.0, fitted=True),
    PublishedPoint(16, 513.3, 0.2627, 1953.6),
    PublishedPoint(32, 559.7, 0.1651, 3391.1),
    PublishedPoint(64, 610.3, 0.1186, 5147.2),
    PublishedPoint(128, 669.2, 0.0951, 7036.5),
    PublishedPoint(256, 690.5, 0.0766, 9009.6),
    PublishedPoint(512, 688.3, 0.0702, 9805.6, fitted=True),
)
"""The H100 configurations of the source (avg_power_watts, energy_per_token_joules, output throughput)."""

OUTPUT_HISTOGRAM = (
    216, 111, 91, 99, 105, 83, 81, 57, 46, 39, 19, 17, 12, 13, 5, 6, 6, 2, 1, 1, 1, 0, 1, 0, 1,
    4, 2, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1,
)  # fmt: skip
"""Output lengths of the B = 64 run: 50 equal bins from 2 to 4,096 tokens (the source's histogram)."""

PROMPT_LOGNORMAL = {"kind": "lognormal", "median": 300, "sigma": 1.2, "min": 4, "max": 16000}
"""Assumed prompt lengths: mean ~620 tokens (see the module docstring)."""


def output_lengths_csv(path: Path, draws: int = 20000, seed: int = 0) -> Path:
    """Write ``draws`` output lengths sampled from :data:`OUTPUT_HISTOGRAM` (uniform within a bin)."""
    edges = np.linspace(2.0, 4096.0, len(OUTPUT_HISTOGRAM) + 1)
    counts = np.asarray(OUTPUT_HISTOGRAM, float)
    rng = np.random.default_rng(seed)
    bins = rng.choice(len(counts), size=draws, p=counts / counts.sum())
    lengths = np.floor(rng.uniform(edges[bins], edges[bins + 1])).astype(int)
    path.write_text("output_tokens\n" + "\n".join(map(str, lengths)) + "\n")
    return path


def point_scenario(point: PublishedPoint, lengths_csv: Path, requests: int | None = None) -> dict[str, Any]:
    """The scenario (plain data) that replays ``point``."""
    batch = point.max_num_seqs
    return {
        "name": f"mlenergy_h100_b{batch}",
        "seed": 7,
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "max_model_len": 20480,
        "metrics": {"max_iteration_rows": 10_000_000},
        "workload": {
            "requests": requests or max(1024, 8 * batch),
            "arrival": {"kind": "closed_loop", "clients": 2 * batch},
            "prompt_tokens": PROMPT_LOGNORMAL,
            "output_tokens": {"kind": "empirical", "path": str(lengths_csv), "column": "output_tokens"},
            "max_output_tokens": 4096,
        },
        "policies": [{"name": "vllm", "preset": "vllm-0.15", "max_batch_size": batch, "chunk_size": 8192}],
    }


def simulate_point(point: PublishedPoint, lengths_csv: Path, requests: int | None = None) -> dict[str, float]:
    """batchsim's power, J per output token and output tokens/s of ``point`` over its steady window."""
    from sim.fleet import colocated_pools
    from sim.resolve import resolve
    from sim.runner import run

    scenario = scenario_from_dict(point_scenario(point, lengths_csv, requests), {})
    result = run(scenario, load_frac=False)
    (pool,) = colocated_pools(resolve(scenario))
    return steady_window_energy(result.requests, result.iterations, pool, 2 * point.max_num_seqs)


def steady_window_energy(requests: Any, iterations: Any, pool: Pool, clients: int) -> dict[str, float]:
    """Power, J/token and tokens/s over the passes that end before the last request is sent.

    Until the last send, ``clients`` requests are in the system, more than the batch holds, so the
    batch is as full as the server allows: the measured steady state. A pass yields one output
    token per decoding sequence; a request's first token comes with its prefill and is counted
    from ``first_token_s``.
    """
    last_send = float(requests["arrival_s"].max())
    first_send = float(requests["arrival_s"].min())
    ends = iterations["start_s"].to_numpy() + iterations["duration_s"].to_numpy()
    window = (iterations["start_s"].to_numpy() >= first_send) & (ends <= last_send)
    rows = iterations.loc[window]
    energy_j = float(pass_energy_j(rows, pool).sum())
    busy_s = float(rows["duration_s"].sum())
    start, end = float(rows["start_s"].min()), float(ends[window].max())
    first_tokens = requests["first_token_s"].between(start, end).sum()
    tokens = float(rows["decode_tokens"].sum()) + float(first_tokens)
    return {
        "power_w": energy_j / busy_s,
        "joules_per_token": energy_j / tokens,
        "output_tps": tokens / (end - start),
        "mfu": float(np.average(rows["mfu"], weights=rows["duration_s"])),
        "mbu": float(np.average(rows["mbu"], weights=rows["duration_s"])),
        "mean_batch": float(np.average(rows["batch_size"], weights=rows["duration_s"])),
    }
