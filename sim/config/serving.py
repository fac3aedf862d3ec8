"""Schema of the serving stack around the batching policy: KV memory, cost options, the API
front end, clients, admission, SLOs and metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sim.config.base import MAX_DURATION_S, MAX_KV_BLOCKS, MAX_TOKENS, Float, Int, StrictModel


# --------------------------------------------------------------------------- the rest
class MemoryConfig(StrictModel):
    """KV-cache budget: GPU memory x utilization - weights/TP - activation reserve."""

    gpu_memory_utilization: Float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory the engine may use.")
    block_size: Int = Field(16, ge=1, le=MAX_TOKENS, description="Tokens per KV block.")
    activation_reserve_gb: Float | None = Field(
        None,
        ge=0,
        le=10_000,
        description="GiB kept for activations (default: estimated from the model and token budget).",
    )
    kv_blocks: Int | None = Field(
        None,
        ge=1,
        le=MAX_KV_BLOCKS,
        description="Pin the KV capacity in blocks per GPU worker (as vLLM logs '# GPU blocks'); "
        "overrides the estimate.",
    )
    prefix_caching: bool = Field(
        False,
        description="Automatic prefix caching (vLLM APC): full prompt blocks already in the KV cache are reused, "
        "not recomputed; finished requests' blocks stay cached until evicted (LRU). Paged and chunked_prefill "
        "policies only (a policy's own prefix_caching wins).",
    )


class FrontendConfig(StrictModel):
    """The OpenAI-compatible API server in front of the engine: it parses and tokenizes requests.

    Each request costs ``per_request_ms`` (HTTP parse, validation) and then
    ``per_prompt_token_us`` per prompt token (tokenization) on one of ``workers`` event
    loops before it reaches the router; TTFT and E2E still count from the client's send.
    Defaults are fitted on the real vLLM 0.6.0 bursts in ../shared/validation (docs/validation.md).
    """

    per_request_ms: Float = Field(2.1, ge=0, le=10_000, description="Parse and validation time per request (ms).")
    per_prompt_token_us: Float = Field(0.0, ge=0, le=10_000, description="Tokenization time per prompt token (µs).")
    workers: Int = Field(1, ge=1, le=1024, description="API-server event loops working in parallel.")
    latency_ms: Float = Field(
        0.0,
        ge=0,
        le=MAX_DURATION_S * 1000,
        description="Delay outside the engine that takes no front-end capacity (HTTP transit, the hop to the "
        "engine process, detokenization and streaming of the answer): every request reaches the engine this much "
        "after its turns on the event loop, so TTFT and E2E grow by it, TPOT does not.",
    )
    startup_ms: Float = Field(
        0.0,
        ge=0,
        le=MAX_DURATION_S * 1000,
        description="A cold front end: one-off delay before the first request is handled (0, the default: a warm "
        "server, as a benchmark against a running server sees).",
    )
    discipline: Literal["event_loop", "fifo"] = Field(
        "event_loop",
        description="'event_loop': parse and tokenize are separate turns of an asyncio loop, so a burst is "
        "parsed in full before any request is tokenized and submitted; 'fifo': each request's whole cost "
        "in one turn, first come first served.",
    )


class CostConfig(StrictModel):
    """Options of the iteration cost model."""

    cpu_overhead: bool = Field(True, description="Add the engine's per-iteration CPU time (schedule, prepare, sample).")
    step_scale: Float = Field(
        1.0,
        gt=0,
        le=100,
        description="Multiply every GPU term of a pass (linear ops, LM head, attention, all-reduce; not the CPU time) "
        "by this: a per-GPU correction of the step cost fitted on real runs by python -m sim calibrate-serving, set "
        "by the scenario's calibration file unless given here (docs/uncertainty.md). Applies to the scenario's gpu, "
        "not to the pools of a disaggregation block.",
    )


class ClientConfig(StrictModel):
    """Client behaviour under overload: give up after a timeout, retry rejected requests with backoff."""

    timeout_s: Float = Field(
        gt=0,
        le=MAX_DURATION_S,
        description="A request unfinished this long after it was sent is abandoned (timed_out).",
    )
    max_retries: Int = Field(0, ge=0, le=1000, description="Re-sends after a rejection (HTTP 429).")
    backoff_s: Float = Field(
        1.0,
        ge=0,
        le=MAX_DURATION_S,
        description="First retry delay; doubles with every retry (backoff: exponential) or stays fixed.",
    )
    backoff: Literal["exponential", "fixed"] = Field(
        "exponential",
        description="Retry delay rule: 'exponential' waits backoff_s * 2**k before re-send k+1; 'fixed' "
        "waits backoff_s every time (e.g. 'retry a 429 after 8 s').",
    )


class AdmissionConfig(StrictModel):
    """Server-side admission control."""

    max_queue: Int = Field(
        ge=1,
        description="Requests waiting beyond this are rejected (HTTP 429); >= 1, since a request is always "
        "queued for at least the instant before its first pass.",
    )


class SLOConfig(StrictModel):
    """Latency targets; a request meets the SLO when each given bound holds for it."""

    ttft_p99_s: Float | None = Field(None, gt=0, le=MAX_DURATION_S, description="Time-to-first-token bound in seconds.")
    tpot_p99_s: Float | None = Field(
        None, gt=0, le=MAX_DURATION_S, description="Time-per-output-token bound in seconds."
    )
    e2e_p99_s: Float | None = Field(None, gt=0, le=MAX_DURATION_S, description="End-to-end latency bound in seconds.")

    @model_validator(mode="after")
    def _one_bound(self) -> SLOConfig:
        if self.ttft_p99_s is None and self.tpot_p99_s is None and self.e2e_p99_s is None:
            raise ValueError("give at least one of ttft_p99_s, tpot_p99_s, e2e_p99_s")
        return self


class MetricsConfig(StrictModel):
    """What is measured and kept."""

    warmup_s: Float = Field(
        0.0, ge=0, le=MAX_DURATION_S, description="Exclude requests that arrived before this time from percentiles."
    )
    max_iteration_rows: Int = Field(
        200_000,
        ge=1,
        le=100_000_000,
        description="Per policy, keep (in memory and in iterations.csv) every k-th iteration beyond this many "
        "rows (summaries use all).",
    )
    percentiles: list[Float] = Field(
        [50.0, 90.0, 99.0],
        min_length=1,
        max_length=20,
        description="Percentiles (in (0, 100]) of TTFT, TPOT, ITL and E2E written to benchmark.json (run --json), "
        "as benchmark_serving's --metric-percentiles; summary.csv keeps its fixed p50/p90/p99 columns.",
    )
    format: Literal["csv", "parquet"] = Field(
        "csv",
        description="File format of the per-request and per-iteration records: csv (requests.csv, iterations.csv) "
        "or parquet (requests.parquet, iterations.parquet: full precision, typed columns, far faster to write for "
        "large runs; needs pyarrow: pip install 'batchsim[parquet]'). summary.csv stays CSV. run --format overrides.",
    )

    @field_validator("percentiles")
    @classmethod
    def _percentiles_in_range(cls, values: list[float]) -> list[float]:
        bad = [q for q in values if not 0 < q <= 100]
        if bad:
            raise ValueError(f"{bad[0]:g} is not a percentile: each must be in (0, 100]")
        return sorted(set(values))


class EngineConfig(StrictModel):
    """How the simulator itself runs (never what it simulates: results are the same either way)."""

    merge_decode_steps: bool = Field(
        True,
        description="Merge consecutive pure decode passes into one SimPy event where no arrival, completion, "
        "preemption, timeout or wake-up can fall between them (one iteration row per pass still); "
        "false for debugging. Off for speculative decoding and disaggregated pools.",
    )
    fast_path: bool = Field(
        True,
        description="Run a policy on the engine's fast path (slot arrays instead of per-request objects, "
        "sim/serving/fast) where it applies; the path taken and why is recorded in scenario.resolved.yaml "
        "(derived.engine_path). The records are bit-identical either way; false to check that.",
    )
