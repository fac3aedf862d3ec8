"""The scenario: the typed, validated, frozen description of one experiment.

A scenario names a model and GPU, a workload (arrival process and length distributions)
and the batching policies to compare on it. Every field is documented here and in the
section modules (``Field(description=...)``); ``python -m sim schema`` exports them as JSON
Schema. Derived values (KV blocks, the calibration used) live in
:class:`sim.resolve.ResolvedScenario`, never written back into this config. Which features
combine is one table, :mod:`sim.config.compat`, checked here so ``validate`` and ``run``
refuse the same things with the same line. Loading and overrides live in :mod:`sim.io.scenario`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from sim.config.base import MAX_TOKENS, Float, Int, StrictModel
from sim.config.compat import check_combinations
from sim.config.disagg import DisaggregationConfig, expand_pool_presets
from sim.config.overrides import with_overrides
from sim.config.policies import PolicyConfig, fill_acceptance
from sim.config.serving import (
    AdmissionConfig,
    ClientConfig,
    CostConfig,
    EngineConfig,
    FrontendConfig,
    MemoryConfig,
    MetricsConfig,
    SLOConfig,
)
from sim.config.validation_errors import format_validation_error
from sim.config.workload import Workload
from sim.errors import UserError, did_you_mean, shown


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
    pipeline_parallel: Int = Field(
        1,
        ge=1,
        le=1024,
        description="Pipeline stages per replica, each holding its share of the layers on tensor_parallel GPUs "
        "(a replica spans pipeline_parallel x tensor_parallel GPUs), run as vLLM V0 runs them: one scheduler per "
        "stage (virtual engine) with 1/P of the KV blocks, up to P micro-batches in the pipeline. Applies to the "
        "colocated policies; a disaggregated pool has its own tensor_parallel and one stage.",
    )
    expert_parallel: Int = Field(
        1,
        ge=1,
        le=1024,
        description="Mixture-of-experts models: split the routed experts into this many groups of the replica's "
        "GPUs (divides tensor_parallel and the expert count), each expert tensor-parallel over "
        "tensor_parallel / expert_parallel GPUs, with an all-to-all per MoE layer; 1 = every expert on every GPU.",
    )
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
    router: Literal["round_robin", "least_outstanding", "random", "prefix_affinity"] = Field(
        "round_robin",
        description="How requests are spread over replicas ('prefix_affinity': the replica caching the longest "
        "prefix of the prompt, within router_load_cap).",
    )
    router_load_cap: Float = Field(
        1.5,
        ge=1,
        le=1000,
        description="prefix_affinity: a replica with more than this multiple of the mean outstanding tokens (plus "
        "one request) is passed over for affinity, so one hot prefix cannot overload one replica.",
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
    engine: EngineConfig = Field(default=EngineConfig(), description="Simulator speed options (results never change).")
    gpu_hour_usd: Float | dict[str, Float] | None = Field(
        None,
        description="Price of one GPU-hour in USD, for requests per dollar and USD per million tokens: one number "
        "for every GPU of the scenario, or a price per GPU type ({h100-sxm: 2.5}; the others keep theirs). Default: "
        "the catalog's price of each GPU (python -m sim list gpus; sources in docs/cost.md).",
    )
    input_price_ratio: Float = Field(
        0.0,
        ge=0,
        le=1e3,
        description="What one prompt token costs in output tokens when the GPU bill is split into usd_per_mtok "
        "(output) and usd_per_mtok_input, e.g. 0.25 for input priced at a quarter of output (default 0: the bill "
        "is on output tokens).",
    )
    disaggregation: DisaggregationConfig | None = Field(
        None,
        description="A prefill/decode disaggregated deployment run on the same requests next to the colocated "
        "policies (which use replicas), as its own row labelled by its name (default: none).",
    )
    calibration: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="A serving calibration file written by python -m sim calibrate-serving (a path relative to the "
        "scenario file, else to the working directory): its terms of each vllm-* preset's engine generation "
        "(front end, engine CPU time) replace the preset's, and its step scale of this scenario's gpu becomes "
        "cost.step_scale; what a policy or cost block sets itself still wins (docs/uncertainty.md).",
    )

    # Folder of the scenario file: relative data paths are resolved against it.
    _base_dir: str | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        # Built in code, a scenario reports mistakes exactly as a YAML file does.
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise UserError(format_validation_error(exc, Scenario)) from None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Scenario:
        """Validate plain data (as read from YAML); any mistake is one :class:`UserError`."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UserError(format_validation_error(exc, cls)) from None

    @model_validator(mode="before")
    @classmethod
    def _expand_presets(cls, data: Any) -> Any:
        # Presets fill policy entries before validation, so a preset's values are validated
        # exactly like hand-written ones and the resolved scenario shows them all.
        if isinstance(data, dict) and isinstance(data.get("disaggregation"), dict):
            raw = data
            data = expand_pool_presets(raw, lambda gpu: _deployment_facts(raw if gpu is None else {**raw, "gpu": gpu}))
        if not isinstance(data, dict) or not isinstance(data.get("policies"), list):
            return data
        serving = None
        if data.get("calibration") is not None:
            from sim.io.serving_calibration import calibrated_raw

            data, serving = calibrated_raw(data)
        if any(isinstance(p, dict) and "preset" in p for p in data["policies"]):
            from sim.presets import expand_preset

            facts = _deployment_facts(data)
            policies = [expand_preset(p, facts, serving) if isinstance(p, dict) else p for p in data["policies"]]
            data = {**data, "policies": policies}
        return _fill_acceptance(data)

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
        counts = Counter(p.name for p in policies)  # not list.count per name: quadratic in the number of policies
        dupes = sorted(name for name, count in counts.items() if count > 1)
        if dupes:
            raise ValueError(f"policy names must be unique; repeated: {', '.join(dupes)}")
        return policies

    @field_validator("gpu_hour_usd")
    @classmethod
    def _prices(cls, price: float | dict[str, float] | None) -> float | dict[str, float] | None:
        from sim.hardware.catalog import GPUS

        for gpu, usd in (price.items() if isinstance(price, dict) else [(None, price)]):
            if gpu is not None and gpu not in GPUS:
                raise ValueError(f"unknown GPU {shown(gpu)}{did_you_mean(gpu, GPUS)}; known: {', '.join(GPUS)}")
            if usd is not None and not 0 < usd <= 1e6:
                where = f"the price of {gpu}" if gpu else "the price"
                raise ValueError(f"{where} must be a positive number of USD per GPU-hour up to 1e6, got {usd!r}")
        return price

    @model_validator(mode="after")
    def _disaggregation_name_free(self) -> Scenario:
        block = self.disaggregation
        if block is not None and block.name in {p.name for p in self.policies}:
            raise ValueError(f"disaggregation.name '{block.name}' is also a policy name; rows need distinct labels")
        return self

    @model_validator(mode="after")
    def _features_combine(self) -> Scenario:
        check_combinations(self)
        return self

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
        new = type(self).from_data(with_overrides(self.model_dump(mode="json"), overrides))
        new._base_dir = self._base_dir
        return new


def _fill_acceptance(data: dict[str, Any]) -> dict[str, Any]:
    """Speculative policies without an acceptance rate take their method's rate on the workload's text."""
    workload = data.get("workload")
    text = workload.get("text", "chat") if isinstance(workload, dict) else "chat"
    data = {**data, "policies": [fill_acceptance(p, text) for p in data["policies"]]}
    block = data.get("disaggregation")
    if isinstance(block, dict):
        pools = {
            pool: {**block[pool], "policy": fill_acceptance(block[pool].get("policy"), text)}
            for pool in ("prefill", "decode")
            if isinstance(block.get(pool), dict)
        }
        data["disaggregation"] = {**block, **pools}
    return data


def _deployment_facts(data: dict[str, Any]) -> Any:
    """GPU and context length as far as the raw scenario tells them (defaults where unknown)."""
    from sim.hardware.catalog import GPUS, MODELS
    from sim.presets import DeploymentFacts

    gpu = str(data.get("gpu", "a100-80gb"))
    model = MODELS.get(str(data.get("model", "llama-2-7b")))
    max_len = data.get("max_model_len") or (model.max_positions if model else 2048)
    memory = GPUS[gpu].memory_gb if gpu in GPUS else 80.0
    return DeploymentFacts(gpu, float(memory), int(max_len) if isinstance(max_len, int) else 2048)
