"""Engine presets: the documented defaults of real serving engines, by version.

A policy entry ``{name: x, preset: vllm-0.6}`` is filled with the preset's values for
every field it does not set itself (an explicit field always wins). Some defaults
depend on the deployment (vLLM >= 0.9 picks its token budget by GPU), so a preset is a
function of the scenario's GPU and context length. One table, ``PRESETS``; each entry
names its sources, which ``python -m sim list presets`` prints.

CPU-time models: ``vidur`` means Vidur's profiled per-pass CPU time (an engine that
schedules every step, vLLM <= 0.5); ``vllm-0.6`` is the linear model fitted on the real
vLLM 0.6.0 runs in ../shared/validation (docs/validation.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.errors import UserError, cut, did_you_mean, shown

VLLM_06_CPU: dict[str, Any] = {
    "step_ms": 1.0, "step_us_per_seq": 40.0, "pass_ms": 0.2, "pass_us_per_seq": 6.5, "overlap_step": False,
}  # fmt: skip
"""vLLM 0.6 engine CPU time, fitted jointly on the three A100 validation runs (docs/validation.md)."""

VLLM_V1_CPU: dict[str, Any] = dict(VLLM_06_CPU, overlap_step=True)
"""vLLM v1: the 0.6 costs with scheduling overlapped with the GPU (async scheduling); assumed, not measured."""


@dataclass(frozen=True)
class DeploymentFacts:
    """What a preset may depend on."""

    gpu: str
    gpu_memory_gib: float
    max_model_len: int


@dataclass(frozen=True)
class Preset:
    """One engine version's defaults.

    Attributes:
        label: how tables and listings describe the engine.
        fields: the policy fields it sets, given the deployment.
        sources: where each default comes from.
    """

    label: str
    fields: Callable[[DeploymentFacts], dict[str, Any]]
    sources: str


def _vllm_v0(steps: int, cpu: dict[str, Any] | None) -> Callable[[DeploymentFacts], dict[str, Any]]:
    def fields(facts: DeploymentFacts) -> dict[str, Any]:
        # Without chunked prefill vLLM v0 sets max_num_batched_tokens = max(max_model_len, 2048).
        return {"kind": "paged", "max_batch_size": 256, "max_num_batched_tokens": max(facts.max_model_len, 2048),
                "num_scheduler_steps": steps, "gpu_memory_utilization": 0.9, "engine_cpu": cpu}

    return fields


def _vllm_v1(facts: DeploymentFacts) -> dict[str, Any]:
    # vLLM >= 0.9 EngineArgs.get_batch_defaults (online server): large-memory GPUs other than the
    # A100 get 8192 tokens and 1024 sequences; the A100 and smaller GPUs 2048 and 256 (PR #17885).
    large = facts.gpu_memory_gib >= 70 and not facts.gpu.startswith("a100")
    return {"kind": "chunked_prefill", "chunk_size": 8192 if large else 2048,
            "max_batch_size": 1024 if large else 256, "allocate": "chunk",
            "gpu_memory_utilization": 0.9, "engine_cpu": VLLM_V1_CPU, "prefix_caching": True}


PRESETS: dict[str, Preset] = {
    "vllm-0.5": Preset(
        "vLLM 0.5 (v0: prefill-first, no chunking)",
        _vllm_v0(1, None),
        "vLLM v0.5 SchedulerConfig/EngineArgs defaults: max_num_seqs 256, max_num_batched_tokens "
        "max(max_model_len, 2048) without chunked prefill, gpu_memory_utilization 0.90; CPU time: Vidur's "
        "profile (an engine that schedules and processes outputs every step)",
    ),
    "vllm-0.6": Preset(
        "vLLM 0.6 (v0: prefill-first, no chunking)",
        _vllm_v0(1, VLLM_06_CPU),
        "vLLM v0.6.0 defaults as 0.5, --num-scheduler-steps 1 (multi-step is opt-in; the validation "
        "server used 10); CPU time fitted on the vLLM 0.6.0 validation runs",
    ),
    "vllm-v1": Preset(
        "vLLM v1 (chunked prefill, one token budget)",
        _vllm_v1,
        "vLLM >= 0.9 v1 engine: chunked prefill always on, max_num_batched_tokens/max_num_seqs 8192/1024 "
        "on >= 70 GiB GPUs other than the A100, else 2048/256 (EngineArgs.get_batch_defaults, online "
        "serving); KV allocated per computed chunk; automatic prefix caching on (v1's default); CPU time: the 0.6 "
        "fit with scheduling overlapped (assumed)",
    ),
    "sarathi": Preset(
        "Sarathi-Serve (chunked prefill, whole-prompt KV)",
        lambda facts: {"kind": "chunked_prefill", "chunk_size": 512, "max_batch_size": 128, "allocate": "prompt"},
        "Sarathi-Serve (Agrawal et al., OSDI 2024): token budget 512 (its strict-SLO setting), whole-prompt "
        "KV reserved at admission; batch cap 128 as Vidur's sarathi scheduler default",
    ),
    "orca": Preset(
        "Orca (iteration-level batching, KV reserved for max output)",
        lambda facts: {"kind": "continuous", "max_batch_size": 128},
        "Orca (Yu et al., OSDI 2022): iteration-level scheduling with max-length KV reservation; batch cap "
        "128 as Vidur's orca scheduler default",
    ),
    "faster-transformer": Preset(
        "FasterTransformer (request-level static batching)",
        lambda facts: {"kind": "static", "max_batch_size": 128, "pad_finished": True},
        "NVIDIA FasterTransformer: request-level batching, a batch decodes until its longest sequence; batch "
        "cap 128 as Vidur's faster_transformer scheduler default",
    ),
}
"""Preset name -> engine defaults."""


def expand_preset(entry: dict[str, Any], facts: DeploymentFacts) -> dict[str, Any]:
    """The policy entry with its preset's defaults filled in under the fields it sets itself.

    Raises:
        UserError: unknown preset, or a ``kind`` that contradicts the preset's.
    """
    name = entry.get("preset")
    if name is None:
        return entry
    label = f"policies[{cut(str(entry.get('name', '?')), 40)}]"
    if not isinstance(name, str) or name not in PRESETS:  # a list or mapping from --set cannot be looked up
        hint = did_you_mean(name, PRESETS) if isinstance(name, str) else ""
        raise UserError(f"{label}.preset = {shown(name)}: unknown preset{hint}; allowed: {', '.join(PRESETS)}")
    defaults = PRESETS[name].fields(facts)
    kind = entry.get("kind")
    if kind is not None and kind != defaults["kind"]:
        raise UserError(
            f"{label}.kind = {shown(kind)}: preset {name} is kind {defaults['kind']!r}; drop kind or the preset"
        )
    return {**{k: v for k, v in defaults.items() if v is not None}, **entry}


def preset_lines() -> list[str]:
    """``python -m sim list presets``: one block per preset with its defaults and sources."""
    example = DeploymentFacts("a100-80gb", 80.0, 4096)
    lines = []
    for name, preset in PRESETS.items():
        shown = ", ".join(f"{k}={v}" for k, v in preset.fields(example).items() if k != "engine_cpu")
        lines.append(f"{name:<19} {preset.label}: {shown}")
        lines.append(f"{'':<19} source: {preset.sources}")
    return lines
