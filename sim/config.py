"""Scenario schema: the typed, validated, frozen description of one experiment.

A scenario names a model and GPU, a workload (arrival process and length
distributions) and the batching policies to compare on it. Every field is documented
here (``Field(description=...)``); ``python -m sim schema`` exports them as JSON Schema.
Derived values (KV blocks, the calibration used) live in
:class:`sim.runner.ResolvedScenario`, never written back into this config.

Loading and overrides live in :mod:`sim.scenario_io`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

PositiveFloat = Annotated[float, Field(gt=0)]


class StrictModel(BaseModel):
    """Base for every config block: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- arrivals
class PoissonArrival(StrictModel):
    """Open-loop Poisson arrivals: exponential inter-arrival times."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, description="Mean arrival rate in requests per second.")


class GammaArrival(StrictModel):
    """Bursty open-loop arrivals: gamma inter-arrival times with a given coefficient of variation."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0, description="Mean arrival rate in requests per second.")
    cv: float = Field(gt=0, description="Coefficient of variation of inter-arrival times (1 = Poisson, >1 = bursty).")


class ConstantArrival(StrictModel):
    """Evenly spaced arrivals (a deterministic load generator)."""

    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0, description="Requests per second; inter-arrival time is exactly 1/rate.")


class BurstArrival(StrictModel):
    """Every request arrives at t=0: offline (throughput) batch processing."""

    kind: Literal["burst"] = "burst"


class ClosedLoopArrival(StrictModel):
    """N clients, each sending its next request when its previous one ends, after a think time."""

    kind: Literal["closed_loop"] = "closed_loop"
    clients: int = Field(ge=1, description="Number of concurrent clients (the client-side semaphore).")
    think_time_s: float = Field(
        0.0, ge=0, description="Mean think time between a response and the next request (exponential; 0 = none)."
    )


class TraceArrival(StrictModel):
    """Replay arrival times (and, unless given, lengths) from a CSV trace."""

    kind: Literal["trace"] = "trace"
    path: str = Field(
        description="CSV path (relative to the scenario file) or a registered trace name, e.g. 'azure-conv-2023'."
    )
    time_scale: float = Field(
        1.0, gt=0, description="Multiply trace inter-arrival times by this (0.5 = twice the load)."
    )
    limit: int | None = Field(None, ge=1, description="Use at most this many trace rows (from the start).")


class SchedulePhase(StrictModel):
    """One phase of a piecewise-constant Poisson rate."""

    duration_s: float = Field(gt=0, description="Length of this phase in seconds.")
    rate: float = Field(ge=0, description="Poisson rate in requests per second during this phase.")


class ScheduleArrival(StrictModel):
    """Piecewise Poisson arrivals (load ramps); the phases repeat cyclically until all requests are sent."""

    kind: Literal["schedule"] = "schedule"
    phases: list[SchedulePhase] = Field(min_length=1, description="Phases in order; at least one must have rate > 0.")

    @model_validator(mode="after")
    def _some_load(self) -> ScheduleArrival:
        if all(p.rate == 0 for p in self.phases):
            raise ValueError("at least one phase must have rate > 0")
        return self


Arrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BurstArrival | ClosedLoopArrival | TraceArrival | ScheduleArrival,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- lengths
class FixedLength(StrictModel):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, description="Token count.")

    @property
    def upper_bound(self) -> int:
        return self.value


class UniformLength(StrictModel):
    """Integer uniform on [low, high], both inclusive."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, description="Smallest token count (inclusive).")
    high: int = Field(ge=1, description="Largest token count (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    @property
    def upper_bound(self) -> int:
        return self.high


class _Clamped(StrictModel):
    min: int = Field(1, ge=1, description="Clamp: smallest token count.")
    max: int = Field(4096, ge=1, description="Clamp: largest token count.")

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
    mean: float = Field(gt=0, description="Mean token count.")
    std: float = Field(ge=0, description="Standard deviation in tokens.")


class LognormalLength(_Clamped):
    """Log-normal distribution (heavy right tail), rounded and clamped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, description="Median token count (exp(mu)).")
    sigma: float = Field(ge=0, description="Standard deviation of log(tokens).")


class ZipfLength(_Clamped):
    """Zipf (power-law) distribution with exponent a, clamped to [min, max]."""

    kind: Literal["zipf"] = "zipf"
    a: float = Field(gt=1, description="Zipf exponent (> 1).")


class EmpiricalLength(StrictModel):
    """Resample token counts from a column of a CSV file (with replacement)."""

    kind: Literal["empirical"] = "empirical"
    path: str = Field(description="CSV path (relative to the scenario file) or a registered trace name.")
    column: str = Field(description="Column holding token counts, e.g. 'num_decode_tokens'.")
    min: int = Field(1, ge=1, description="Clamp: smallest token count.")
    max: int | None = Field(None, ge=1, description="Clamp: largest token count (default: the column's maximum).")


Length = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | ZipfLength | EmpiricalLength,
    Field(discriminator="kind"),
]


class Workload(StrictModel):
    """The request stream: how many, when they arrive, how long they are."""

    requests: int | None = Field(
        None, ge=1, description="Number of requests (default 1000; for a trace: all rows, capped by arrival.limit)."
    )
    arrival: Arrival = Field(description="Arrival process; see the arrival kinds.")
    prompt_tokens: Length | None = Field(
        None, description="Prompt length distribution (required unless the arrival is a trace, which supplies lengths)."
    )
    output_tokens: Length | None = Field(
        None, description="Output length distribution (required unless the arrival is a trace)."
    )
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="The max_tokens every client sends; outputs are clipped to it and static/continuous reserve "
        "prompt + max_output_tokens of KV per request (default: the output distribution's upper bound).",
    )

    @model_validator(mode="after")
    def _lengths_given(self) -> Workload:
        if self.arrival.kind != "trace":
            for name in ("prompt_tokens", "output_tokens"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name} is required for arrival kind '{self.arrival.kind}'")
        return self


# --------------------------------------------------------------------------- policies
class _PolicyBase(StrictModel):
    name: str = Field(min_length=1, description="Label of this policy in tables and plots (unique in the scenario).")
    max_batch_size: int = Field(ge=1, description="Most sequences in one iteration.")


class StaticPolicyConfig(_PolicyBase):
    """Request-level batching: a batch runs until its longest sequence ends; nothing joins meanwhile."""

    kind: Literal["static"] = "static"
    max_wait_s: float = Field(0.0, ge=0, description="Wait up to this long for a batch to fill before starting it.")
    pad_finished: bool = Field(
        True, description="Finished sequences keep costing compute (padding) until the batch ends."
    )


class ContinuousPolicyConfig(_PolicyBase):
    """Orca iteration-level batching: requests join and leave after every iteration; KV reserved for max output."""

    kind: Literal["continuous"] = "continuous"


class PagedPolicyConfig(_PolicyBase):
    """vLLM-style paged KV: blocks allocated as tokens grow, prefill-first, preemption by recompute."""

    kind: Literal["paged"] = "paged"
    max_batch_size: int = Field(256, ge=1, description="Most sequences in one iteration (vLLM max_num_seqs).")
    max_num_batched_tokens: int = Field(4096, ge=1, description="Token budget of one prefill iteration.")


class ChunkedPrefillPolicyConfig(_PolicyBase):
    """Sarathi-Serve: a per-iteration token budget; decodes first, prefills chunked into the rest; paged KV."""

    kind: Literal["chunked_prefill"] = "chunked_prefill"
    max_batch_size: int = Field(256, ge=1, description="Most sequences in one iteration.")
    chunk_size: int = Field(512, ge=1, description="Token budget of every iteration (decodes + prefill chunks).")


PolicyConfig = Annotated[
    StaticPolicyConfig | ContinuousPolicyConfig | PagedPolicyConfig | ChunkedPrefillPolicyConfig,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- the rest
class MemoryConfig(StrictModel):
    """KV-cache budget: GPU memory x utilization - weights/TP - activation reserve."""

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory the engine may use.")
    block_size: int = Field(16, ge=1, description="Tokens per KV block.")
    activation_reserve_gb: float | None = Field(
        None, ge=0, description="GiB kept for activations (default: estimated from the model and token budget)."
    )
    kv_blocks: int | None = Field(
        None,
        ge=1,
        description="Pin the KV capacity in blocks per GPU worker (as vLLM logs '# GPU blocks'); "
        "overrides the estimate.",
    )


class CostConfig(StrictModel):
    """Options of the iteration cost model."""

    cpu_overhead: bool = Field(True, description="Add the engine's per-iteration CPU time (schedule, prepare, sample).")


class ClientConfig(StrictModel):
    """Client behaviour under overload: give up after a timeout, retry rejected requests with backoff."""

    timeout_s: float = Field(
        gt=0, description="A request unfinished this long after it was sent is abandoned (timed_out)."
    )
    max_retries: int = Field(0, ge=0, description="Re-sends after a rejection (HTTP 429).")
    backoff_s: float = Field(1.0, ge=0, description="First retry delay; doubles with every retry.")


class AdmissionConfig(StrictModel):
    """Server-side admission control."""

    max_queue: int = Field(ge=0, description="Requests waiting beyond this are rejected (HTTP 429).")


class SLOConfig(StrictModel):
    """Latency targets; a request meets the SLO when each given bound holds for it."""

    ttft_p99_s: float | None = Field(None, gt=0, description="Time-to-first-token bound in seconds.")
    tpot_p99_s: float | None = Field(None, gt=0, description="Time-per-output-token bound in seconds.")
    e2e_p99_s: float | None = Field(None, gt=0, description="End-to-end latency bound in seconds.")

    @model_validator(mode="after")
    def _one_bound(self) -> SLOConfig:
        if self.ttft_p99_s is None and self.tpot_p99_s is None and self.e2e_p99_s is None:
            raise ValueError("give at least one of ttft_p99_s, tpot_p99_s, e2e_p99_s")
        return self


class MetricsConfig(StrictModel):
    """What is measured and kept."""

    warmup_s: float = Field(0.0, ge=0, description="Exclude requests that arrived before this time from percentiles.")
    max_iteration_rows: int = Field(
        200_000,
        ge=1,
        description="iterations.csv keeps every k-th iteration beyond this many rows (summaries use all).",
    )


class Scenario(StrictModel):
    """One experiment: hardware, workload and the policies compared on the same request stream."""

    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$", description="Scenario name; results go to results/NAME/."
    )
    seed: int = Field(0, ge=0, description="Seed of every random stream; same seed, same requests for every policy.")
    model: str = Field("llama-2-7b", description="Model name (python -m sim list models).")
    gpu: str = Field("a100-80gb", description="GPU name (python -m sim list gpus).")
    tensor_parallel: int = Field(1, ge=1, description="GPUs per replica (tensor-parallel degree).")
    replicas: int = Field(1, ge=1, description="Independent model replicas behind the router.")
    router: Literal["round_robin", "least_outstanding", "random"] = Field(
        "round_robin", description="How requests are spread over replicas."
    )
    memory: MemoryConfig = Field(default=MemoryConfig(), description="KV-cache budget.")
    cost: CostConfig = Field(default=CostConfig(), description="Cost model options.")
    workload: Workload = Field(description="The request stream.")
    policies: list[PolicyConfig] = Field(min_length=1, description="Batching policies to compare.")
    client: ClientConfig | None = Field(None, description="Client timeouts and retries (default: patient clients).")
    admission: AdmissionConfig | None = Field(None, description="Queue limit (default: unbounded queue).")
    slo: SLOConfig | None = Field(None, description="Latency targets; adds SLO attainment and goodput columns.")
    metrics: MetricsConfig = Field(default=MetricsConfig(), description="Warm-up and record keeping.")
    gpu_hour_usd: float | None = Field(None, gt=0, description="Price of one GPU-hour, for requests per dollar.")

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
