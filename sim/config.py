"""Scenario schema: the typed, validated, frozen description of one experiment.

A scenario names a model and GPU, a workload (arrival process and length
distributions) and the batching policies to compare on it. Every field is documented
here (``Field(description=...)``); ``python -m sim schema`` exports them as JSON Schema.
Derived values (KV blocks, the calibration used) live in
:class:`sim.runner.ResolvedScenario`, never written back into this config.

Loading and overrides live in :mod:`sim.scenario_io`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

PositiveFloat = Annotated[float, Field(gt=0)]

# Bounds that keep a run physical and its clock exact. Simulated time is a float64: past
# ~1e9 s (31 years) a microsecond is no longer representable, so latencies would round to 0.
MAX_DURATION_S = 1e7
"""Longest time-like setting (think time, timeout, phase, warm-up): 116 days."""
MIN_RATE = 1e-6
"""Slowest arrival rate, requests/s (one request per 11.6 days)."""
MAX_RATE = 1e9
MAX_REQUESTS = 100_000_000
"""Most requests in one run: at ~600 bytes of records per request and policy, 60 GB."""
RECORD_BYTES_PER_REQUEST = 600
MAX_KV_BLOCKS = 1_000_000_000
"""Most KV blocks per worker (counts are int32 in the iteration records)."""
MAX_TOKENS = 10_000_000
"""Longest prompt or output of one request (the longest context windows are ~1e7 tokens)."""
"""Most KV blocks per worker (counts are int32 in the iteration records)."""


def _not_a_boolean(value: Any) -> Any:
    # YAML's `requests: true` would otherwise be read as 1.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not the boolean {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_not_a_boolean)]
"""An integer field: a boolean is an error, not 0 or 1."""
Float = Annotated[float, BeforeValidator(_not_a_boolean)]
"""A float field: a boolean is an error (inf and nan are refused by StrictModel)."""


class StrictModel(BaseModel):
    """Base for every config block: unknown keys and inf/nan are errors; instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- arrivals
class PoissonArrival(StrictModel):
    """Open-loop Poisson arrivals: exponential inter-arrival times."""

    kind: Literal["poisson"] = "poisson"
    rate: Float = Field(ge=MIN_RATE, le=MAX_RATE, description="Mean arrival rate in requests per second.")


class GammaArrival(StrictModel):
    """Bursty open-loop arrivals: gamma inter-arrival times with a given coefficient of variation."""

    kind: Literal["gamma"] = "gamma"
    rate: Float = Field(ge=MIN_RATE, le=MAX_RATE, description="Mean arrival rate in requests per second.")
    cv: Float = Field(
        gt=0, le=1000, description="Coefficient of variation of inter-arrival times (1 = Poisson, >1 = bursty)."
    )


class ConstantArrival(StrictModel):
    """Evenly spaced arrivals (a deterministic load generator)."""

    kind: Literal["constant"] = "constant"
    rate: Float = Field(
        ge=MIN_RATE, le=MAX_RATE, description="Requests per second; inter-arrival time is exactly 1/rate."
    )


class BurstArrival(StrictModel):
    """Every request arrives at t=0: offline (throughput) batch processing."""

    kind: Literal["burst"] = "burst"


class ClosedLoopArrival(StrictModel):
    """N clients, each sending its next request when its previous one ends, after a think time."""

    kind: Literal["closed_loop"] = "closed_loop"
    clients: Int = Field(ge=1, description="Number of concurrent clients (the client-side semaphore).")
    think_time_s: Float = Field(
        0.0,
        ge=0,
        le=MAX_DURATION_S,
        description="Mean think time between a response and the next request (exponential; 0 = none).",
    )


class TraceArrival(StrictModel):
    """Replay arrival times (and, unless given, lengths) from a CSV trace."""

    kind: Literal["trace"] = "trace"
    path: str = Field(
        description="CSV path (relative to the scenario file) or a registered trace name, e.g. 'azure-conv-2023'."
    )
    time_scale: Float = Field(
        1.0, ge=1e-6, le=1e6, description="Multiply trace inter-arrival times by this (0.5 = twice the load)."
    )
    limit: Int | None = Field(None, ge=1, description="Use at most this many trace rows (from the start).")


class SchedulePhase(StrictModel):
    """One phase of a piecewise-constant Poisson rate."""

    duration_s: Float = Field(gt=0, le=MAX_DURATION_S, description="Length of this phase in seconds.")
    rate: Float = Field(ge=0, le=MAX_RATE, description="Poisson rate in requests per second during this phase.")


class ScheduleArrival(StrictModel):
    """Piecewise Poisson arrivals (load ramps); the phases repeat cyclically until all requests are sent."""

    kind: Literal["schedule"] = "schedule"
    phases: list[SchedulePhase] = Field(min_length=1, description="Phases in order; at least one must have rate > 0.")

    @model_validator(mode="after")
    def _some_load(self) -> ScheduleArrival:
        if all(p.rate < MIN_RATE for p in self.phases):
            raise ValueError(f"at least one phase must have rate >= {MIN_RATE:g}")
        return self


Arrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BurstArrival | ClosedLoopArrival | TraceArrival | ScheduleArrival,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- lengths
class FixedLength(StrictModel):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    value: Int = Field(ge=1, le=MAX_TOKENS, description="Token count.")

    @property
    def upper_bound(self) -> int:
        return self.value


class UniformLength(StrictModel):
    """Integer uniform on [low, high], both inclusive."""

    kind: Literal["uniform"] = "uniform"
    low: Int = Field(ge=1, le=MAX_TOKENS, description="Smallest token count (inclusive).")
    high: Int = Field(ge=1, le=MAX_TOKENS, description="Largest token count (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    @property
    def upper_bound(self) -> int:
        return self.high


class _Clamped(StrictModel):
    min: Int = Field(1, ge=1, le=MAX_TOKENS, description="Clamp: smallest token count.")
    max: Int = Field(4096, ge=1, le=MAX_TOKENS, description="Clamp: largest token count.")

    @model_validator(mode="after")
    def _ordered(self) -> Any:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    @property
    def upper_bound(self) -> int:
        return self.max


class NormalLength(_Clamped):
    """Normal distribution, rounded and clamped to [min, max]."""

    kind: Literal["normal"] = "normal"
    mean: Float = Field(gt=0, le=MAX_TOKENS, description="Mean token count.")
    std: Float = Field(ge=0, le=MAX_TOKENS, description="Standard deviation in tokens.")


class LognormalLength(_Clamped):
    """Log-normal distribution (heavy right tail), rounded and clamped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    median: Float = Field(gt=0, le=MAX_TOKENS, description="Median token count (exp(mu)).")
    sigma: Float = Field(ge=0, le=1000, description="Standard deviation of log(tokens).")


class ZipfLength(_Clamped):
    """Zipf (power-law) distribution with exponent a, clamped to [min, max]."""

    kind: Literal["zipf"] = "zipf"
    a: Float = Field(gt=1, le=100, description="Zipf exponent (> 1).")


class EmpiricalLength(StrictModel):
    """Resample token counts from a column of a CSV file (with replacement)."""

    kind: Literal["empirical"] = "empirical"
    path: str = Field(description="CSV path (relative to the scenario file) or a registered trace name.")
    column: str = Field(description="Column holding token counts, e.g. 'num_decode_tokens'.")
    min: Int = Field(1, ge=1, le=MAX_TOKENS, description="Clamp: smallest token count.")
    max: Int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Clamp: largest token count (default: the column's maximum)."
    )


Length = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | ZipfLength | EmpiricalLength,
    Field(discriminator="kind"),
]


class Workload(StrictModel):
    """The request stream: how many, when they arrive, how long they are."""

    requests: Int | None = Field(
        None, ge=1, description="Number of requests (default 1000; for a trace: all rows, capped by arrival.limit)."
    )
    arrival: Arrival = Field(description="Arrival process; see the arrival kinds.")
    prompt_tokens: Length | None = Field(
        None, description="Prompt length distribution (required unless the arrival is a trace, which supplies lengths)."
    )
    output_tokens: Length | None = Field(
        None, description="Output length distribution (required unless the arrival is a trace)."
    )
    max_output_tokens: Int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="The max_tokens every client sends; outputs are clipped to it and static/continuous reserve "
        "prompt + max_output_tokens of KV per request (default: the output distribution's upper bound).",
    )

    @field_validator("requests")
    @classmethod
    def _requests_fit_in_memory(cls, requests: int | None) -> int | None:
        if requests is not None and requests > MAX_REQUESTS:
            need_gb = requests * RECORD_BYTES_PER_REQUEST / 1e9
            raise ValueError(
                f"{requests:.3g} requests would need about {need_gb:,.3g} GB of records per policy "
                f"(~{RECORD_BYTES_PER_REQUEST} bytes each); at most {MAX_REQUESTS:,} are allowed"
            )
        return requests

    @model_validator(mode="after")
    def _lengths_given(self) -> Workload:
        if self.arrival.kind != "trace":
            for name in ("prompt_tokens", "output_tokens"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name} is required for arrival kind '{self.arrival.kind}'")
        return self


# --------------------------------------------------------------------------- policies
class EngineCPUConfig(StrictModel):
    """Engine CPU time around the GPU work of a forward pass, as a linear model in the batch size.

    A *scheduling step* (the scheduler's decision, once per ``num_scheduler_steps`` passes)
    costs ``step_ms + step_us_per_seq * R``; every *forward pass* costs ``pass_ms +
    pass_us_per_seq * R`` (input preparation, sampling, output processing; R sequences).
    """

    step_ms: Float = Field(0.0, ge=0, le=1000, description="CPU time of one scheduling step, fixed part (ms).")
    step_us_per_seq: Float = Field(
        0.0, ge=0, le=10_000, description="CPU time of one scheduling step per sequence (µs)."
    )
    pass_ms: Float = Field(0.0, ge=0, le=1000, description="CPU time of one forward pass, fixed part (ms).")
    pass_us_per_seq: Float = Field(0.0, ge=0, le=10_000, description="CPU time of one forward pass per sequence (µs).")
    overlap_step: bool = Field(
        False,
        description="The next step is scheduled while the GPU runs the current pass (vLLM v1 async "
        "scheduling): only scheduling time beyond the pass's GPU time adds to it.",
    )


class _PolicyBase(StrictModel):
    name: str = Field(min_length=1, description="Label of this policy in tables and plots (unique in the scenario).")
    max_batch_size: Int = Field(ge=1, le=1_000_000, description="Most sequences in one iteration.")
    preset: str | None = Field(
        None,
        description="Engine preset whose documented defaults fill every field not set here "
        "(python -m sim list presets).",
    )
    gpu_memory_utilization: Float | None = Field(
        None, gt=0, le=1, description="This engine's share of GPU memory (default: memory.gpu_memory_utilization)."
    )
    engine_cpu: EngineCPUConfig | None = Field(
        None,
        description="Engine CPU-time model of this policy (default: cost.cpu_overhead, Vidur's per-pass profile).",
    )


class StaticPolicyConfig(_PolicyBase):
    """Request-level batching: a batch runs until its longest sequence ends; nothing joins meanwhile."""

    kind: Literal["static"] = "static"
    max_wait_s: Float = Field(
        0.0, ge=0, le=MAX_DURATION_S, description="Wait up to this long for a batch to fill before starting it."
    )
    pad_finished: bool = Field(
        True, description="Finished sequences keep costing compute (padding) until the batch ends."
    )


class ContinuousPolicyConfig(_PolicyBase):
    """Orca iteration-level batching: requests join and leave after every iteration; KV reserved for max output."""

    kind: Literal["continuous"] = "continuous"


class PagedPolicyConfig(_PolicyBase):
    """vLLM v0 (prefill-first, no chunking): paged KV allocated as tokens grow, preemption by recompute."""

    kind: Literal["paged"] = "paged"
    max_batch_size: Int = Field(
        256, ge=1, le=1_000_000, description="Most sequences in one iteration (vLLM max_num_seqs)."
    )
    max_num_batched_tokens: Int = Field(4096, ge=1, le=MAX_TOKENS, description="Token budget of one prefill iteration.")
    num_scheduler_steps: Int = Field(
        1,
        ge=1,
        le=256,
        description="Decode passes per scheduling step (vLLM 0.6 multi-step): requests that finish inside "
        "a block keep their slot to its end, prefills wait for the boundary, tokens stream K at a time.",
    )


class ChunkedPrefillPolicyConfig(_PolicyBase):
    """Sarathi-Serve: a per-iteration token budget; decodes first, prefills chunked into the rest; paged KV."""

    kind: Literal["chunked_prefill"] = "chunked_prefill"
    max_batch_size: Int = Field(256, ge=1, le=1_000_000, description="Most sequences in one iteration.")
    chunk_size: Int = Field(
        512, ge=1, le=MAX_TOKENS, description="Token budget of every iteration (decodes + prefill chunks)."
    )
    allocate: Literal["chunk", "prompt"] = Field(
        "chunk",
        description="KV allocation of a prefill: 'chunk' as each chunk is computed (vLLM v1), 'prompt' the "
        "whole prompt's blocks at admission (Sarathi-Serve, vLLM v0 chunked prefill).",
    )


PolicyConfig = Annotated[
    StaticPolicyConfig | ContinuousPolicyConfig | PagedPolicyConfig | ChunkedPrefillPolicyConfig,
    Field(discriminator="kind"),
]


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
    startup_ms: Float = Field(
        260.0,
        ge=0,
        le=MAX_DURATION_S * 1000,
        description="One-off delay before the first request is handled (a cold front end; 0 = warmed up).",
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


class ClientConfig(StrictModel):
    """Client behaviour under overload: give up after a timeout, retry rejected requests with backoff."""

    timeout_s: Float = Field(
        gt=0,
        le=MAX_DURATION_S,
        description="A request unfinished this long after it was sent is abandoned (timed_out).",
    )
    max_retries: Int = Field(0, ge=0, le=1000, description="Re-sends after a rejection (HTTP 429).")
    backoff_s: Float = Field(1.0, ge=0, le=MAX_DURATION_S, description="First retry delay; doubles with every retry.")


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


class Scenario(StrictModel):
    """One experiment: hardware, workload and the policies compared on the same request stream."""

    name: str = Field(
        min_length=1,
        max_length=128,
        description="Scenario name; results go to results/NAME/ (letters, digits, _ - .; not starting with '.').",
    )
    seed: Int = Field(
        0, ge=0, le=2**63 - 1, description="Seed of every random stream; same seed, same requests for every policy."
    )
    model: str = Field("llama-2-7b", description="Model name (python -m sim list models).")
    gpu: str = Field("a100-80gb", description="GPU name (python -m sim list gpus).")
    tensor_parallel: Int = Field(1, ge=1, le=1024, description="GPUs per replica (tensor-parallel degree).")
    replicas: Int = Field(1, ge=1, le=10_000, description="Independent model replicas behind the router.")
    max_model_len: Int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="Longest request (prompt + output tokens) the server accepts, as vLLM's --max-model-len "
        "(default: the model's context window).",
    )
    over_length: Literal["error", "reject"] = Field(
        "error",
        description="A request longer than max_model_len: 'error' stops before simulating (the scenario "
        "is not servable as given); 'reject' counts it as rejected when sent, as a server answers HTTP 400.",
    )
    router: Literal["round_robin", "least_outstanding", "random"] = Field(
        "round_robin", description="How requests are spread over replicas."
    )
    memory: MemoryConfig = Field(default=MemoryConfig(), description="KV-cache budget.")
    cost: CostConfig = Field(default=CostConfig(), description="Cost model options.")
    workload: Workload = Field(description="The request stream.")
    policies: list[PolicyConfig] = Field(min_length=1, description="Batching policies to compare.")
    frontend: FrontendConfig | None = Field(
        None, description="API front end before the router (default: none, requests reach the engine when sent)."
    )
    client: ClientConfig | None = Field(None, description="Client timeouts and retries (default: patient clients).")
    admission: AdmissionConfig | None = Field(None, description="Queue limit (default: unbounded queue).")
    slo: SLOConfig | None = Field(None, description="Latency targets; adds SLO attainment and goodput columns.")
    metrics: MetricsConfig = Field(default=MetricsConfig(), description="Warm-up and record keeping.")
    gpu_hour_usd: Float | None = Field(
        None, gt=0, le=1e6, description="Price of one GPU-hour, for requests per dollar."
    )

    # Folder of the scenario file: relative data paths are resolved against it.
    _base_dir: str | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        # Built in code, a scenario reports mistakes exactly as a YAML file does.
        try:
            super().__init__(**data)
        except ValidationError as exc:
            from sim.errors import UserError
            from sim.scenario_io import format_validation_error

            raise UserError(format_validation_error(exc)) from None

    @model_validator(mode="before")
    @classmethod
    def _expand_presets(cls, data: Any) -> Any:
        # Presets fill policy entries before validation, so a preset's values are validated
        # exactly like hand-written ones and the resolved scenario shows them all.
        if not isinstance(data, dict) or not isinstance(data.get("policies"), list):
            return data
        if not any(isinstance(p, dict) and "preset" in p for p in data["policies"]):
            return data
        from sim.presets import expand_preset

        facts = _deployment_facts(data)
        return {**data, "policies": [expand_preset(p, facts) if isinstance(p, dict) else p for p in data["policies"]]}

    @field_validator("name")
    @classmethod
    def _safe_folder_name(cls, name: str) -> str:
        # The name becomes a folder under results/: '.', '..', '/x' or 'a/b' would write elsewhere.
        if not re.fullmatch(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*", name):
            raise ValueError(
                "must be a plain folder name: letters, digits, '_', '-' and '.', not starting with '.' "
                "(no path separators, not '.' or '..')"
            )
        return name

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, policies: list[Any]) -> list[Any]:
        names = [p.name for p in policies]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"policy names must be unique; repeated: {', '.join(dupes)}")
        return policies

    @property
    def base_dir(self) -> str | None:
        """Folder the scenario was loaded from (None when built in code)."""
        return self._base_dir

    def policy(self, name: str) -> Any:
        """The policy config called ``name``."""
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(name)

    def replace(self, **overrides: Any) -> Scenario:
        """A copy with dotted-path overrides, validated like a file.

        Example: ``scenario.replace(**{"workload.arrival.rate": 4.0, "policies[continuous].max_batch_size": 32})``.
        """
        from sim.scenario_io import apply_overrides

        return apply_overrides(self, overrides)


def _deployment_facts(data: dict[str, Any]) -> Any:
    """GPU and context length as far as the raw scenario tells them (defaults where unknown)."""
    from sim.hardware.catalog import GPUS, MODELS
    from sim.presets import DeploymentFacts

    gpu = str(data.get("gpu", "a100-80gb"))
    model = MODELS.get(str(data.get("model", "llama-2-7b")))
    max_len = data.get("max_model_len") or (model.max_positions if model else 2048)
    memory = GPUS[gpu].memory_gb if gpu in GPUS else 80.0
    return DeploymentFacts(gpu, float(memory), int(max_len) if isinstance(max_len, int) else 2048)
