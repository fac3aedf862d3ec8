"""What every batching-policy config shares: the common fields, speculative decoding and the
engine CPU-time model.

Each policy kind's own config lives beside its policy (``sim/policies/<kind>.py``) and
subclasses :class:`PolicyConfigBase`; :mod:`sim.config.policies` joins them into the
scenario's ``policies`` union from the policy table. Which kinds may use which feature is
decided in one place, :mod:`sim.config.compat`, from the policies' traits.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.base import Float, Int, StrictModel
from sim.config.serving import FrontendConfig


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
        "scheduling): only scheduling time beyond the pass's GPU time adds to it, and a request that got its "
        "last token keeps its slot and KV through the next scheduling decision (its output not seen yet).",
    )


class CUDAGraphsConfig(StrictModel):
    """CUDA-graph replay: a pass whose batch fits a captured graph runs at the graph's size.

    An engine captures one graph per size in ``capture_sizes`` and replays the smallest one
    that holds the batch, padding it with dummy rows; a larger batch runs eagerly. The padded
    rows cost what real rows cost in the graph's GEMMs, so a pass is priced at the padded
    size: step time is a step function of the batch (docs/presets.md).
    """

    capture_sizes: list[Int] = Field(
        min_length=1,
        max_length=4096,
        description="Batch sizes (tokens of a pass) with a captured graph, increasing; a pass of n tokens, "
        "n <= the largest, is priced at the smallest size >= n.",
    )
    batches: Literal["decode", "all"] = Field(
        "all",
        description="Which passes replay a graph: 'decode' only pure decode passes (vLLM V0), 'all' every pass "
        "of at most the largest size, prefill and mixed too (vLLM V1 FULL_AND_PIECEWISE / PIECEWISE).",
    )

    @field_validator("capture_sizes")
    @classmethod
    def _increasing_and_positive(cls, sizes: list[int]) -> list[int]:
        if sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError(f"must be positive and strictly increasing, got {str(sizes)[:80]}")
        if sizes[-1] > 1_000_000:
            raise ValueError(f"the largest size must be <= 1000000 tokens, got {sizes[-1]}")
        return sizes

class AllReduceConfig(StrictModel):
    """Which kernel runs the tensor-parallel all-reduces (two per layer); defaults: vLLM's (0.4 to 0.15).

    vLLM runs its own all-reduce kernel on GPUs NVLink connects all-to-all, for messages below
    ``custom_max_bytes`` (one-shot or two-shot by size), and NCCL otherwise. Passes that replay a
    CUDA graph (the policy's ``cuda_graphs``) pay no launch overhead (docs/cost_model.md, "All-reduce").
    """

    algorithm: Literal["custom", "nccl"] = Field(
        "custom",
        description="'custom': vLLM's custom all-reduce below custom_max_bytes on NVLink GPUs (2, 4, 6 or 8 of "
        "them), NCCL above and on PCIe GPUs; 'nccl': NCCL always (--disable-custom-all-reduce).",
    )
    custom_max_bytes: Int = Field(
        8 * 1024 * 1024,
        ge=0,
        le=1 << 40,
        description="Messages strictly smaller than this run the custom kernel (vLLM CustomAllreduce max_size, 8 MiB).",
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
        "prompt lookup (free), or an 'eagle' head (one target-shaped decoder layer and the LM head per draft token, "
        "plus draft_step_ms)."
    )
    num_speculative_tokens: Int = Field(
        4, ge=1, le=32, description="Draft tokens proposed per sequence per step (gamma)."
    )
    acceptance_rate: Float | AcceptanceDistribution | None = Field(
        None,
        description="Probability that each draft token is accepted (given the previous ones were): a number in "
        "[0, 1], or a per-request distribution ({kind: beta, mean, concentration} or {kind: uniform, low, high}); "
        "default: the published rate of the method on the workload's text (workload.text).",
    )
    draft_model: str | None = Field(
        None, description="Catalog model that drafts (method draft_model only; same vocabulary as the target)."
    )
    draft_cost_ratio: Float | None = Field(
        None,
        ge=0,
        le=1,
        description="method eagle: price one draft step as this share of a target decode step of the same batch "
        "instead of the head model (one target-shaped layer + LM head + draft_step_ms); default: the head model.",
    )
    draft_step_ms: Float = Field(
        0.45,
        ge=0,
        le=1000,
        description="method eagle: host and kernel-launch time of each draft step, beyond its GPU work (ms). "
        "0.45 reproduces vLLM 0.11 EAGLE-3 (4 tokens, H100) decoding random text at 10.7 ms per token against "
        "7.1 ms without speculation (docs/speculative.md).",
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
        # Compared with the defaults, not model_fields_set: a dumped and reloaded scenario sets every field.
        eagle_only = [name for name in ("draft_cost_ratio", "draft_step_ms")
                      if getattr(self, name) != type(self).model_fields[name].default]  # fmt: skip
        if self.method != "eagle" and eagle_only:
            raise ValueError(f"{' and '.join(eagle_only)} price an eagle head, not method {self.method!r}")
        return self


ACCEPTANCE_BY_TEXT: dict[str, dict[str, float]] = {
    "eagle": {"chat": 0.7, "code": 0.8, "summarization": 0.75, "random": 0.0},
    "draft_model": {"chat": 0.7, "code": 0.75, "summarization": 0.75, "random": 0.0},
    "ngram": {"chat": 0.3, "code": 0.5, "summarization": 0.6, "random": 0.0},
}
"""Per-token acceptance of each drafting method on each kind of text (approximate; docs/speculative.md gives
the sources): EAGLE heads accept ~0.7-0.8 per position on MT-bench chat and more on HumanEval code (Li et al.,
ICML 2024); small draft models 0.6-0.8 (Leviathan et al., ICML 2023), code above text (Chen et al., 2023);
prompt lookup (n-gram) pays on outputs that copy the input, summarization and code edits (Saxena, 2023; vLLM
blog, Oct 2024: 2.8x on CNN/DM), seldom in open chat. Random tokens are guessed with probability 1/vocab: 0."""


class PolicyConfigBase(StrictModel):
    """Fields every policy kind has; each kind's config (beside its policy in ``sim/policies/``) adds its own."""

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
        description="Prefix caching for this policy (default: memory.prefix_caching); kinds that reserve "
        "contiguous KV per request (static, continuous) never share it, so for them it must stay off.",
    )
    speculative: SpeculativeConfig | None = Field(
        None, description="Speculative decoding on every decode step (None: off; not every kind can speculate)."
    )
    cuda_graphs: CUDAGraphsConfig | None = Field(
        None,
        description="CUDA-graph capture sizes this engine replays passes at (None: every pass at its own size). "
        "Set by the vllm-* presets from each version's defaults (python -m sim list presets).",
    )
    frontend: FrontendConfig | None = Field(
        None,
        description="This engine's API front end (set by the vllm-* presets for their version's server; None: "
        "requests reach the engine when sent). The scenario's own frontend block, when given, applies to every "
        "policy instead.",
    )
    all_reduce: AllReduceConfig = Field(
        default_factory=AllReduceConfig,
        description="Which kernel runs the tensor-parallel all-reduces: vLLM's custom kernel (below a size limit, "
        "NVLink GPUs) or NCCL (TP > 1 only).",
    )
    num_scheduler_steps: Int = Field(
        1,
        ge=1,
        le=256,
        description="Decode passes per scheduling step (vLLM 0.6 multi-step; kinds that plan blocks of passes "
        "only): requests that finish inside a block keep their slot to its end, prefills wait for the boundary, "
        "tokens stream K at a time.",
    )


def fill_acceptance(policy: Any, text: Any) -> Any:
    """A raw policy entry whose ``speculative`` block sets no ``acceptance_rate`` gets the published rate of
    its method on ``text`` (:data:`ACCEPTANCE_BY_TEXT`), before validation, so the resolved scenario shows it.
    Anything malformed is returned unchanged for the schema to reject."""
    spec = policy.get("speculative") if isinstance(policy, dict) else None
    if not isinstance(spec, dict) or spec.get("acceptance_rate") is not None:
        return policy
    rates = ACCEPTANCE_BY_TEXT.get(spec.get("method"))  # type: ignore[arg-type]
    if rates is None or text not in rates:
        return policy
    return {**policy, "speculative": {**spec, "acceptance_rate": rates[text]}}
