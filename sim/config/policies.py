"""Batching-policy schema: one config per policy ``kind``, and the engine CPU-time model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.base import MAX_DURATION_S, MAX_TOKENS, Float, Int, StrictModel


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


# --------------------------------------------------------------------------- speculative decoding
class BetaAcceptance(StrictModel):
    """Per-request acceptance rate drawn from a Beta distribution (workloads that mix tasks)."""

    kind: Literal["beta"] = "beta"
    mean: Float = Field(gt=0, lt=1, description="Mean per-token acceptance rate over requests.")
    concentration: Float = Field(
        10.0, gt=0, le=1e6, description="alpha + beta of the Beta distribution: larger, less spread across requests."
    )


class UniformAcceptance(StrictModel):
    """Per-request acceptance rate drawn uniformly from [low, high]."""

    kind: Literal["uniform"] = "uniform"
    low: Float = Field(ge=0, le=1, description="Lowest per-token acceptance rate.")
    high: Float = Field(ge=0, le=1, description="Highest per-token acceptance rate.")

    @model_validator(mode="after")
    def _ordered(self) -> UniformAcceptance:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


AcceptanceDistribution = Annotated[BetaAcceptance | UniformAcceptance, Field(discriminator="kind")]


class SpeculativeConfig(StrictModel):
    """Speculative decoding: every decode step drafts gamma tokens per sequence, one target pass verifies them.

    Draft tokens are accepted left to right, each with probability ``acceptance_rate``
    (Leviathan et al., ICML 2023): a step yields 1 to gamma + 1 tokens, mean
    (1 - a^(gamma+1)) / (1 - a). See docs/speculative.md.
    """

    method: Literal["draft_model", "ngram", "eagle"] = Field(
        description="How tokens are drafted: a small 'draft_model' (priced by its own cost model), 'ngram' "
        "prompt lookup (free), or an 'eagle' head (draft_cost_ratio of a target decode step per draft token)."
    )
    num_speculative_tokens: Int = Field(
        4, ge=1, le=32, description="Draft tokens proposed per sequence per step (gamma)."
    )
    acceptance_rate: Float | AcceptanceDistribution = Field(
        0.7,
        description="Probability that each draft token is accepted (given the previous ones were): a number in "
        "[0, 1], or a per-request distribution ({kind: beta, mean, concentration} or {kind: uniform, low, high}).",
    )
    draft_model: str | None = Field(
        None, description="Catalog model that drafts (method draft_model only; same vocabulary as the target)."
    )
    draft_cost_ratio: Float = Field(
        0.05,
        ge=0,
        le=1,
        description="method eagle: time of one draft step relative to a target decode step of the same batch "
        "(ignored by ngram, which is free, and by draft_model, which is priced by its own cost model).",
    )

    @field_validator("acceptance_rate", mode="before")
    @classmethod
    def _rate_in_unit_interval(cls, value: Any) -> Any:
        # Checked here, before the union, so a bad number gives one message, not one per union member.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value <= 1:
            raise ValueError(f"acceptance_rate must be in [0, 1] (a probability), got {value}")
        return value

    @model_validator(mode="after")
    def _draft_model_iff_method(self) -> SpeculativeConfig:
        if self.method == "draft_model" and self.draft_model is None:
            raise ValueError("method draft_model needs draft_model: <catalog model> (python -m sim list models)")
        if self.method != "draft_model" and self.draft_model is not None:
            raise ValueError(f"draft_model is only used by method draft_model, not {self.method!r}")
        return self


_SPECULATIVE_DESCRIPTION = "Speculative decoding on every decode step (None: off)."


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
    prefix_caching: bool | None = Field(
        None,
        description="Prefix caching for this policy (default: memory.prefix_caching); static and continuous "
        "reserve contiguous KV per request and never share it, so for them it must stay off.",
    )


    @model_validator(mode="after")
    def _caching_needs_paged_memory(self) -> Any:
        kind = getattr(self, "kind", None)
        if self.prefix_caching and kind in RESERVE_KINDS:
            raise ValueError(
                f"prefix_caching = true is not allowed for kind '{kind}': it reserves contiguous "
                "KV per request; allowed for paged and chunked_prefill"
            )
        return self


RESERVE_KINDS = ("static", "continuous")
"""Policy kinds that reserve KV per request and so never use prefix caching."""


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
    speculative: SpeculativeConfig | None = Field(None, description=_SPECULATIVE_DESCRIPTION)


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
    speculative: SpeculativeConfig | None = Field(None, description=_SPECULATIVE_DESCRIPTION)

    @model_validator(mode="after")
    def _no_multi_step_speculation(self) -> PagedPolicyConfig:
        if self.speculative is not None and self.num_scheduler_steps > 1:
            raise ValueError(
                f"speculative decoding needs num_scheduler_steps = 1, got {self.num_scheduler_steps} "
                "(vLLM does not combine multi-step scheduling with speculative decoding)"
            )
        return self


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
    speculative: SpeculativeConfig | None = Field(None, description=_SPECULATIVE_DESCRIPTION)


PolicyConfig = Annotated[
    StaticPolicyConfig | ContinuousPolicyConfig | PagedPolicyConfig | ChunkedPrefillPolicyConfig,
    Field(discriminator="kind"),
]


