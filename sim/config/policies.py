"""Batching-policy schema: one config per policy ``kind``, and the engine CPU-time model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

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


