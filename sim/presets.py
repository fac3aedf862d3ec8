"""Engine presets: the documented defaults of real serving engines, by version.

A policy entry ``{name: x, preset: vllm-0.11}`` is filled with the preset's values for
every field it does not set itself (an explicit field always wins). Some defaults
depend on the deployment (vLLM >= 0.9 picks its token budget by GPU) or on other fields
(vLLM's CUDA-graph sizes follow ``max_num_seqs``), so a preset is a function of the
scenario's GPU and context length and of the entry. One table, ``PRESETS``; each entry
cites a source per field, which ``python -m sim list presets`` prints with the values
resolved on an A100, an H100 and an L40S (docs/presets.md).

CPU-time models: ``vidur`` means Vidur's profiled per-pass CPU time (an engine that
schedules every step, vLLM <= 0.5); the vLLM 0.6+ presets use the linear model fitted on
the real vLLM 0.6.0 runs in ../shared/validation (docs/validation.md), with scheduling
overlapped with the GPU where the version schedules asynchronously.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.errors import UserError, cut, did_you_mean, shown
from sim.vllm_defaults import (
    SOURCES_0_6_0,
    SOURCES_0_9_2,
    SOURCES_0_11_0,
    SOURCES_0_15_1,
    VLLM_06_CPU,
    VLLM_V1_CPU,
    PresetConflict,
    vllm_0_6_0,
    vllm_0_9_2_v0,
    vllm_0_11_0,
    vllm_0_15_1,
)

__all__ = ["PRESETS", "VLLM_06_CPU", "VLLM_V1_CPU", "DeploymentFacts", "Preset", "expand_preset", "preset_lines"]

LISTED_GPUS: tuple[tuple[str, float], ...] = (("a100-80gb", 79.15), ("h100-sxm", 79.11), ("l40s", 44.99))
"""The GPUs ``list presets`` resolves every preset on (catalog name, GiB as CUDA reports it)."""


@dataclass(frozen=True)
class DeploymentFacts:
    """What a preset may depend on."""

    gpu: str
    gpu_memory_gib: float
    max_model_len: int


Fields = Callable[[DeploymentFacts, Mapping[str, Any]], dict[str, Any]]
"""``fields(facts, given)``: the policy fields a preset sets, given the deployment and the entry's own fields."""


@dataclass(frozen=True)
class Preset:
    """One engine version's defaults.

    Attributes:
        label: how tables and listings describe the engine.
        fields: ``fields(facts, given)``, the policy fields it sets.
        sources: where each default comes from, by policy field (``"*"``: for all of them).
        alias_of: the preset this name stands for (None: its own).
        generation: the vLLM engine generation whose serving-stack terms (``frontend``, ``engine_cpu``) it
            shares, ``v0`` or ``v1``, which a serving calibration file fits per generation (None: no such terms).
    """

    label: str
    fields: Fields
    sources: dict[str, str] = field(default_factory=dict)
    alias_of: str | None = None
    generation: str | None = None


def _version(rule: Callable[..., dict[str, Any]]) -> Fields:
    """A vLLM version rule (``sim.vllm_defaults``) as a preset's ``fields``."""
    return lambda facts, given: rule(facts.gpu, facts.gpu_memory_gib, facts.max_model_len, given)


def _vllm_0_5(facts: DeploymentFacts, given: Mapping[str, Any]) -> dict[str, Any]:
    # Without chunked prefill vLLM v0 sets max_num_batched_tokens = max(max_model_len, 2048).
    return {"kind": "paged", "max_batch_size": 256, "max_num_batched_tokens": max(facts.max_model_len, 2048),
            "num_scheduler_steps": 1, "gpu_memory_utilization": 0.9}  # fmt: skip


_VLLM_0_15 = Preset(
    "vLLM 0.15.1 (V1: chunked prefill, prefix caching, async scheduling)",
    _version(vllm_0_15_1),
    SOURCES_0_15_1,
    generation="v1",
)

PRESETS: dict[str, Preset] = {
    "vllm-0.5": Preset(
        "vLLM 0.5 (v0: prefill-first, no chunking)",
        _vllm_0_5,
        {
            "*": "vLLM v0.5 SchedulerConfig/EngineArgs defaults: max_num_seqs 256, max_num_batched_tokens "
            "max(max_model_len, 2048) without chunked prefill, gpu_memory_utilization 0.90; CPU time: Vidur's "
            "profile (an engine that schedules and processes outputs every step); CUDA-graph padding not applied "
            "(Vidur's per-row CPU profile is inside its cost model, and padding would inflate it)"
        },
    ),
    "vllm-0.6": Preset(
        "vLLM 0.6.0 (V0: prefill-first, no chunking below 32K context)",
        _version(vllm_0_6_0),
        SOURCES_0_6_0,
        generation="v0",
    ),
    "vllm-0.9": Preset(
        "vLLM 0.9.2 with the V0 engine (VLLM_USE_V1=0)", _version(vllm_0_9_2_v0), SOURCES_0_9_2, generation="v0"
    ),
    "vllm-0.11": Preset(
        "vLLM 0.11.0 (V1: chunked prefill, prefix caching, no async scheduling)",
        _version(vllm_0_11_0),
        SOURCES_0_11_0,
        generation="v1",
    ),
    "vllm-0.15": _VLLM_0_15,
    "vllm-v1": Preset(
        _VLLM_0_15.label, _VLLM_0_15.fields, _VLLM_0_15.sources, alias_of="vllm-0.15", generation="v1"
    ),
    "sarathi": Preset(
        "Sarathi-Serve (chunked prefill, whole-prompt KV)",
        lambda facts, given: {
            "kind": "chunked_prefill",
            "chunk_size": 512,
            "max_batch_size": 128,
            "allocate": "prompt",
        },
        {
            "*": "Sarathi-Serve (Agrawal et al., OSDI 2024): token budget 512 (its strict-SLO setting), whole-prompt "
            "KV reserved at admission; batch cap 128 as Vidur's sarathi scheduler default"
        },
    ),
    "orca": Preset(
        "Orca (iteration-level batching, KV reserved for max output)",
        lambda facts, given: {"kind": "continuous", "max_batch_size": 128},
        {
            "*": "Orca (Yu et al., OSDI 2022): iteration-level scheduling with max-length KV reservation; batch cap "
            "128 as Vidur's orca scheduler default"
        },
    ),
    "faster-transformer": Preset(
        "FasterTransformer (request-level static batching)",
        lambda facts, given: {"kind": "static", "max_batch_size": 128, "pad_finished": True},
        {
            "*": "NVIDIA FasterTransformer: request-level batching, a batch decodes until its longest sequence; batch "
            "cap 128 as Vidur's faster_transformer scheduler default"
        },
    ),
}
"""Preset name -> engine defaults (``vllm-v1`` is the current V1 line, vllm-0.15)."""


ServingTerms = Mapping[str, Mapping[str, Mapping[str, float]]]
"""Serving-stack terms by engine generation, then by policy field: ``{"v1": {"frontend": {"latency_ms": 15.0},
"engine_cpu": {"pass_ms": 0.2}}}`` (what a serving calibration file holds, :mod:`sim.calibration.serving_file`)."""


def expand_preset(
    entry: dict[str, Any], facts: DeploymentFacts, serving: ServingTerms | None = None
) -> dict[str, Any]:
    """The policy entry with its preset's defaults filled in under the fields it sets itself.

    With ``serving`` (a calibration's terms), the terms of the preset's engine generation replace the
    preset's own within its ``frontend`` and ``engine_cpu`` blocks; a block the entry sets itself still
    wins whole. Order of precedence: the entry, the calibration, the preset.

    Raises:
        UserError: unknown preset, a ``kind`` that contradicts the preset's, or a setting the
            engine version does not honour (the message cites why).
    """
    name = entry.get("preset")
    if name is None:
        return entry
    label = f"policies[{cut(str(entry.get('name', '?')), 40)}]"
    if not isinstance(name, str) or name not in PRESETS:  # a list or mapping from --set cannot be looked up
        hint = did_you_mean(name, PRESETS) if isinstance(name, str) else ""
        raise UserError(f"{label}.preset = {shown(name)}: unknown preset{hint}; allowed: {', '.join(PRESETS)}")
    kind = entry.get("kind")
    try:
        defaults = PRESETS[name].fields(facts, entry)
    except PresetConflict as exc:
        raise UserError(f"{label}.{exc.field} = {shown(entry.get(exc.field))}: preset {name}: {exc}") from None
    if kind is not None and kind != defaults["kind"]:
        raise UserError(
            f"{label}.kind = {shown(kind)}: preset {name} is kind {defaults['kind']!r}; drop kind or the preset"
        )
    defaults = _with_serving_terms(defaults, PRESETS[name].generation, serving)
    return {**{k: v for k, v in defaults.items() if v is not None}, **entry}


def _with_serving_terms(
    defaults: dict[str, Any], generation: str | None, serving: ServingTerms | None
) -> dict[str, Any]:
    """``defaults`` with the calibration's terms of ``generation`` merged into the blocks the preset sets."""
    terms = (serving or {}).get(generation or "", {})
    merged = dict(defaults)
    for block, values in terms.items():
        if isinstance(merged.get(block), Mapping):
            merged[block] = {**merged[block], **values}
    return merged


def preset_lines(max_model_len: int = 8192) -> list[str]:
    """``python -m sim list presets``: per preset, its defaults resolved on each listed GPU, then their sources."""
    lines = [f"(resolved for max_model_len {max_model_len}; an entry's own fields change what depends on them)"]
    for name, preset in PRESETS.items():
        if preset.alias_of is not None:
            lines.append(f"{name:<19} alias of {preset.alias_of}")
            continue
        lines.append(f"{name:<19} {preset.label}")
        for gpu, memory in LISTED_GPUS:
            resolved = preset.fields(DeploymentFacts(gpu, memory, max_model_len), {})
            lines.append(f"{'':<21}{gpu + ':':<11} " + ", ".join(_shown_field(k, v) for k, v in resolved.items()))
        for key, source in preset.sources.items():
            lines.append(f"{'':<21}source{'' if key == '*' else f' ({key})'}: {source}")
    return lines


def _shown_field(key: str, value: Any) -> str:
    """One resolved field, short: CPU model by its overlap, CUDA graphs by their range and count."""
    if key == "engine_cpu":
        return "engine_cpu=0.6 fit, " + ("overlapped" if value["overlap_step"] else "not overlapped")
    if key == "cuda_graphs":
        sizes = value["capture_sizes"]
        shown = sizes if len(sizes) <= 6 else [*sizes[:5], "...", sizes[-1]]
        head = ",".join(map(str, shown))
        return f"cuda_graphs=[{head}] ({len(sizes)} sizes, {value['batches']} passes)"
    return f"{key}={value}"
