"""Before a large run: how much memory and time will it take?

``estimate_run`` predicts peak memory (bytes) and wall time (seconds) of ``run`` + ``save``
from the request count, the mean prompt and output lengths, the number of policies and
constants measured per forward pass and per request. The number of forward passes is the
unknown: each one decodes one token for every sequence in the batch, so a policy runs about
n x mean_output / B passes, with B its mean batch. B is the batch the load sustains
(Little's law: rate per replica x mean output x pass time, solved by fixed-point iteration)
capped by ``max_batch_size`` and the KV cache; a static batch runs until its longest output.
The pass count is typically within 1.5x (it cannot know queueing, prefill passes or
preemptions); on the runs measured below it is 7-16% high, the memory 1-10% high and the
wall time up to 2.5x high (conservative: the constants predate faster decode merging).
``python -m sim run`` prints :func:`warn_if_large`'s line before it simulates.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.policies.table import POLICIES
from sim.resolve import ResolvedScenario, resolve

if TYPE_CHECKING:
    from sim.config import Scenario

# Memory re-measured for issue 25 with benchmarks/bench_cli_memory.py (peak RSS of the whole child process,
# as `/usr/bin/time -v` reports it), 2-core Intel Xeon x86-64 VM (Linux, Python 3.11, numpy 2.4): the
# quickstart's continuous policy (`--modes cli`: max batch 16, 3 req/s, ~24 passes a request) at 20k, 50k,
# 100k and 200k requests (0.49M-4.9M passes, 202-759 MiB) and the benchmark's own scenario (`--modes full`:
# max batch 64, 5 req/s, ~12 passes a request) at 50k-200k (0.6M-2.4M passes, 221-467 MiB); the two pass
# rates separate the per-pass from the per-request bytes. Least squares over the 7 runs, each within 1.5%.
BASE_BYTES = 145e6  # interpreter, numpy, pandas, SimPy, matplotlib, the cost model
BYTES_PER_PASS = 122.0  # iteration columns (50 B) and ITL events, their growth slack and the frames built from them
BYTES_PER_REQUEST = 267.0  # stream, request records, requests frame and CSV of the policy being run
BYTES_PER_REQUEST_KEPT = 150.0  # requests frame kept per further policy (full records; 2026-12-01, not re-measured)
# Wall time: measured on 2026-12-01 (200k-1M requests at 2, 5 and 9 req/s), fitted as base + per pass + per request.
BASE_S = 3.7  # start-up, imports, resolving the scenario
SECONDS_PER_PASS = 8.3e-6  # SimPy events, policy step, cost model, one record
SECONDS_PER_REQUEST = 41e-6  # per request per policy: clients, router, queues, summary
SECONDS_PER_REQUEST_KEPT = 12e-6  # per request per policy: requests.csv and plots (full records)

WARN_BYTES = 2e9
WARN_SECONDS = 60.0


def estimate_run(
    target: ResolvedScenario | Scenario,
    policies: Sequence[Any] | None = None,
    *,
    summary_only: bool = False,
) -> tuple[float, float]:
    """Predicted (peak memory in bytes, wall seconds) of running and saving a scenario.

    Args:
        target: a resolved scenario (``sim.resolve.resolve``) or a Scenario (resolved here:
            draws the request stream, cheap next to the run).
        policies: the policy configs to run (default: all of the scenario's).
        summary_only: predict ``run(..., summary_only=True)``: one policy's records at a time,
            no per-request files or plots.

    Returns:
        (memory_bytes, seconds).
    """
    resolved = _resolved(target)
    chosen = list(resolved.scenario.policies if policies is None else policies)
    n = len(resolved.stream)
    passes = [forward_passes(resolved, policy) for policy in chosen]
    memory_bytes = BASE_BYTES + max(passes, default=0.0) * BYTES_PER_PASS + n * BYTES_PER_REQUEST
    seconds = BASE_S + sum(passes) * SECONDS_PER_PASS + n * len(chosen) * SECONDS_PER_REQUEST
    if not summary_only:  # every policy's requests are kept, then written and plotted
        memory_bytes += n * max(0, len(chosen) - 1) * BYTES_PER_REQUEST_KEPT
        seconds += n * len(chosen) * SECONDS_PER_REQUEST_KEPT
    return memory_bytes, seconds


def warn_if_large(resolved: ResolvedScenario, policies: Sequence[Any], *, summary_only: bool) -> str | None:
    """``warnings.warn`` (and return) a message when a run with full records looks large.

    Large: over ``WARN_BYTES`` of memory or ``WARN_SECONDS`` of wall time by
    :func:`estimate_run`; nothing is said for a summary-only run.
    """
    if summary_only:
        return None
    memory_bytes, seconds = estimate_run(resolved, policies)
    if memory_bytes <= WARN_BYTES and seconds <= WARN_SECONDS:
        return None
    message = (
        f"this run is estimated at ~{memory_bytes / 1e9:.1f} GB peak memory and ~{seconds:.0f} s "
        f"({len(resolved.stream):,} requests x {len(policies)} policies); --summary-only "
        "(run(..., summary_only=True)) keeps only the summary and one policy's records at a time"
    )
    warnings.warn(message, UserWarning, stacklevel=3)  # shown by default, unlike ResourceWarning
    return message


def forward_passes(resolved: ResolvedScenario, policy: Any) -> float:
    """Expected iteration rows of one policy over the whole stream (all replicas): its forward passes,
    times the stages under pipeline parallelism (each virtual engine batches like a replica of 1/P of
    the KV cache, and each of its passes is a row per stage)."""
    stream = resolved.stream
    if not len(stream):
        return 0.0
    stages = resolved.scenario.pipeline_parallel
    batch = min(full_batch(resolved, policy) / stages, _load_batch(resolved, stages))
    outputs = stream.output_tokens
    if not POLICIES[policy.kind].holds_slots:
        return stages * float(outputs.sum()) / max(1.0, batch)
    size = max(1, round(batch))  # a static batch decodes until its longest output ends
    return stages * float(np.maximum.reduceat(outputs, np.arange(0, len(outputs), size)).sum())


def full_batch(resolved: ResolvedScenario, policy: Any) -> float:
    """Most sequences one replica can batch: max_batch_size, or what its KV cache holds (mean request)."""
    stream = resolved.stream
    reserve = POLICIES[policy.kind].memory == "reserve"  # prompt + max output reserved at admission
    per_request = stream.prompt_tokens.mean() + (stream.max_output_tokens if reserve else stream.output_tokens.mean())
    return max(1.0, min(float(policy.max_batch_size), resolved.kv.capacity_tokens / per_request))


def _load_batch(resolved: ResolvedScenario, stages: int = 1) -> float:
    """Mean batch the offered load sustains per scheduler (inf for a burst or a saturated replica): per
    replica, or per virtual engine of its ``stages`` pipeline stages."""
    stream, replicas = resolved.stream, resolved.scenario.replicas * stages
    if stream.closed_loop is not None:
        return max(1.0, stream.closed_loop.clients / replicas)
    span_s = float(stream.arrival_s[-1] - stream.arrival_s[0])
    if len(stream) < 2 or span_s <= 0:
        return math.inf
    rate = len(stream) / span_s / replicas
    mean_output = float(stream.output_tokens.mean())
    context = float(stream.prompt_tokens.mean()) + mean_output / 2
    batch = 1.0
    for _ in range(30):  # B = rate x output x T(B): increasing in B, from below to the least fixed point
        pass_s = resolved.cost_model.time_from_totals_s(0, 0, 0.0, round(batch), round(batch * context))
        new = max(1.0, rate * mean_output * pass_s)
        if new > 1e6:
            return math.inf
        if abs(new - batch) < 1e-3:
            break
        batch = new
    return batch


def _resolved(target: ResolvedScenario | Scenario) -> ResolvedScenario:
    return target if isinstance(target, ResolvedScenario) else resolve(target)
