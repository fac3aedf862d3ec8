"""The request stream's schema: arrival processes, length distributions, the workload block."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.base import (
    MAX_DURATION_S,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_TOKENS,
    MIN_RATE,
    RECORD_BYTES_PER_REQUEST,
    Float,
    Int,
    StrictModel,
)


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
    format: Literal["csv", "mooncake"] = Field(
        "csv",
        description="'csv': batchsim/Splitwise columns; 'mooncake': Mooncake FAST'25 JSONL (timestamp ms, "
        "input_length, output_length, hash_ids of 512-token blocks), which also gives prompt content identity "
        "for prefix caching.",
    )
    max_prompt_tokens: Int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="Mooncake traces: keep only the first this many tokens of each prompt (and their leading "
        "hash ids), to fit a shorter context window (default: no clipping).",
    )
    concurrency: Int | None = Field(
        None,
        ge=1,
        le=MAX_REQUESTS,
        description="Replay the trace's requests as a closed loop of this many clients instead of at their "
        "arrival times: the rows are sent in trace order, never more than this many in flight, each client "
        "sending the next row when its request ends (GuideLLM's synchronous mode is 1, its concurrent mode C). "
        "The trace then needs no arrival column (default: open loop at the trace's times).",
    )
    think_time_s: Float = Field(
        0.0,
        ge=0,
        le=MAX_DURATION_S,
        description="With concurrency: mean think time between a response and the client's next request "
        "(exponential; 0 = none).",
    )

    @model_validator(mode="after")
    def _think_needs_clients(self) -> TraceArrival:
        if self.think_time_s > 0 and self.concurrency is None:
            raise ValueError("think_time_s needs concurrency (only closed-loop clients think)")
        return self


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


class SharedPrefix(StrictModel):
    """A shared system prompt: a fraction of requests start with one of a few identical prefixes."""

    tokens: Int = Field(ge=1, le=MAX_TOKENS, description="Prefix length in tokens, added before the drawn prompt.")
    fraction: Float = Field(ge=0, le=1, description="Share of requests that carry a prefix (drawn per request).")
    variants: Int = Field(
        1, ge=1, le=1_000_000, description="Distinct prefixes; each prefixed request picks one uniformly."
    )


class Sessions(StrictModel):
    """Multi-turn conversations: turn k's prompt is the whole conversation so far plus a new user message."""

    turns: Length = Field(description="Turns per session (a length distribution over whole numbers >= 1).")
    think_time_s: Float = Field(
        0.0,
        ge=0,
        le=MAX_DURATION_S,
        description="Mean think time between a turn's answer and the next turn (exponential; 0 = none); "
        "each session is a closed loop, its first turn sent at the arrival process's times.",
    )


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
    shared_prefix: SharedPrefix | None = Field(
        None, description="A shared system prompt before the drawn prompts (default: none; prompts share nothing)."
    )
    sessions: Sessions | None = Field(
        None,
        description="Multi-turn sessions: prompt_tokens draws each new user message; arrivals start sessions "
        "(default: independent requests).",
    )
    text: Literal["chat", "code", "summarization", "random"] = Field(
        "chat",
        description="What the requests ask for: sets how often a speculative drafter guesses right (a policy's "
        "speculative.acceptance_rate, unless it sets one; docs/speculative.md): 'random' tokens are never "
        "predicted, code and summarization (outputs that copy the input) more often than open chat.",
    )
    order: Literal["arrival", "prompt_ascending", "prompt_descending"] = Field(
        "arrival",
        description="Send order of the requests: 'arrival' as drawn; 'prompt_ascending'/'prompt_descending' "
        "sort them by prompt length (stable; a client cannot know output lengths), keeping the same send "
        "times and the same requests, only reassigned to the time slots (or closed-loop turns).",
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
    def _content_fits(self) -> Workload:
        if self.arrival.kind == "trace" and (self.shared_prefix or self.sessions):
            raise ValueError("shared_prefix and sessions generate synthetic requests; a trace arrival cannot use them")
        if self.sessions is not None and (self.order != "arrival" or self.arrival.kind == "closed_loop"):
            raise ValueError("sessions need order: arrival and an open-loop arrival kind (sessions are closed loops)")
        return self

    @model_validator(mode="after")
    def _lengths_given(self) -> Workload:
        if self.arrival.kind != "trace":
            for name in ("prompt_tokens", "output_tokens"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name} is required for arrival kind '{self.arrival.kind}'")
        return self
