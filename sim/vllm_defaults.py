"""vLLM's engine defaults by version, as its source sets them at each release tag.

Each ``vllm_*`` function resolves one version's defaults for a deployment (GPU, context
length) and for what the policy entry already sets (``given``: vLLM derives some defaults
from others, e.g. the CUDA-graph sizes from ``max_num_seqs``). ``SOURCES_*`` cite, per
policy field, the file and tag each value was read from (the PyPI release's source of that
version). ``sim/presets.py`` puts them in the preset table; docs/presets.md explains them.

What the code does at each tag, in short:

- Token budget and sequence cap: V0 (0.6.0, 0.9.2 with VLLM_USE_V1=0) runs 256 sequences and,
  without chunked prefill, a budget of max(max_model_len, 2048); it turns chunked prefill on
  by itself only for contexts over 32K tokens. V1 (0.9 onwards) picks 8192 tokens / 1024
  sequences on a GPU with >= 70 GiB whose CUDA name does not contain "a100", else 2048 / 256
  (``EngineArgs`` for the OpenAI server; PR #17885 kept the A100 on the small budget).
- ``--no-enable-chunked-prefill``: V1 ignores it for generative models up to 0.11.0
  (``_set_default_args`` sets it True) and honours it from 0.11.1.
- Async scheduling (the next step scheduled while the GPU runs this one): off by default up to
  0.13.0, on from 0.14.0 unless speculation other than EAGLE-type is configured.
- CUDA graphs: V0 pads pure decode batches to [1, 2, 4, 8, 16, ...] up to max_num_seqs; V1 pads
  every pass of at most the largest size; 0.11.0 captures [1, 2, 4] + multiples of 8 up to
  min(2 max_num_seqs, 512), 0.15.1 multiples of 8 below 256 and of 16 from 256 up to
  min(2 max_num_seqs x decode tokens per sequence, 512, max_num_batched_tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VLLM_06_CPU: dict[str, Any] = {
    "step_ms": 1.0, "step_us_per_seq": 40.0, "pass_ms": 0.2, "pass_us_per_seq": 6.5, "overlap_step": False,
}  # fmt: skip
"""vLLM 0.6 engine CPU time, fitted jointly on the three A100 validation runs (docs/validation.md)."""

VLLM_V1_CPU: dict[str, Any] = {
    "step_ms": 0.0, "step_us_per_seq": 11.6, "pass_ms": 0.15, "pass_us_per_seq": 0.0, "overlap_step": False,
}  # fmt: skip
"""vLLM V1 (0.11+) engine CPU time: the scheduler's and the output update's per-request loops
(``Scheduler.schedule`` and ``update_from_output`` walk every running request: the step term, which
async scheduling overlaps with the GPU) and one fixed cost per pass (input preparation and sampling,
vectorised). Fitted by ``scripts/fit_serving.py`` on the vLLM 0.11 folder of ../shared/validation."""

V0_FRONTEND: dict[str, Any] = {"per_request_ms": 3.1, "latency_ms": 3.2}
"""vLLM V0's OpenAI server (0.6, 0.9): one asyncio loop spends ``per_request_ms`` per request (HTTP,
JSON, validation, tokenization; a burst is parsed before any request is submitted) and a request waits
``latency_ms`` outside it (the hop to the engine process and the stream back). Fitted by
``scripts/fit_serving.py`` jointly with :data:`V1_FRONTEND` (the loop's time per request is shared)."""

V1_FRONTEND: dict[str, Any] = {"per_request_ms": 3.1, "latency_ms": 16.0}
"""vLLM V1's OpenAI server (0.11+): the same loop, and a longer path outside it: the API server, the
EngineCore process it talks to over ZMQ, and the output processor that detokenizes each chunk before it
is streamed (``vllm/v1/engine/async_llm.py``, ``core_client.py``, ``output_processor.py``)."""

LARGE_GPU_GIB = 70
"""V1's threshold for the large token budget: ``device_memory >= 70 * GiB_bytes`` (get_batch_defaults)."""

SPEC_WITHOUT_ASYNC = ("ngram", "draft_model")
"""Speculative methods that turn 0.14+'s default async scheduling off (only EAGLE-type drafting keeps it)."""


class PresetConflict(ValueError):
    """A policy entry asks for something this vLLM version does not do (the message says why).

    Attributes:
        field: the entry's field that asks for it.
    """

    def __init__(self, message: str, field: str = "kind") -> None:
        super().__init__(message)
        self.field = field


def _given_int(given: Mapping[str, Any], key: str) -> int | None:
    """A positive integer the entry sets, else None (a malformed value is left for the schema to report)."""
    value = given.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _speculative(given: Mapping[str, Any]) -> tuple[str | None, int]:
    """(method, draft tokens per step) of the entry's speculative block; (None, 0) without one."""
    spec = given.get("speculative")
    if not isinstance(spec, Mapping):
        return None, 0
    gamma = spec.get("num_speculative_tokens", 4)  # SpeculativeConfig's default
    return spec.get("method"), gamma if isinstance(gamma, int) and gamma > 0 else 4


def large_gpu(gpu: str, memory_gib: float) -> bool:
    """V1's large-budget test: >= 70 GiB of device memory and no "a100" in the device name (the catalog
    name stands in for CUDA's, e.g. "NVIDIA A100-SXM4-80GB")."""
    return memory_gib >= LARGE_GPU_GIB and "a100" not in gpu.lower()


# ----------------------------------------------------------------------------------------- CUDA graphs
def v0_capture_sizes(max_num_seqs: int) -> list[int]:
    """V0: [1, 2, 4, 8, 16, ..., 8192] up to the first size >= max_num_seqs (0.6.0 ``_get_max_graph_batch_size``,
    0.9.2 ``VllmConfig._set_cudagraph_sizes`` without V1)."""
    possible = [1, 2, 4] + [8 * i for i in range(1, 1025)]
    top = next((size for size in possible if size >= max_num_seqs), possible[-1])
    return [size for size in possible if size <= top]


def v1_capture_sizes_0110(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """0.11.0: [1, 2, 4] + multiples of 8 up to min(2 x max_num_seqs, 512), none above the token budget."""
    top = min(2 * max_num_seqs, 512)
    return [size for size in [1, 2, 4, *range(8, top + 1, 8)] if size <= max_num_batched_tokens]


def v1_capture_sizes_0151(max_num_seqs: int, max_num_batched_tokens: int, decode_tokens: int) -> list[int]:
    """0.15.1: 1, 2, 4, multiples of 8 below 256, multiples of 16 from 256, up to
    min(2 x max_num_seqs x decode tokens per sequence, 512, max_num_batched_tokens)."""
    top = min(max_num_seqs * decode_tokens * 2, 512, max_num_batched_tokens)
    sizes = [size for size in (1, 2, 4) if size <= top]
    sizes += list(range(8, min(top + 1, 256), 8))
    sizes += list(range(256, top + 1, 16))
    return sizes


# ------------------------------------------------------------------------------------------- V0 engine
def _v0_chunked(given: Mapping[str, Any], max_model_len: int, *, prefix_caching_blocks: bool) -> bool:
    """Whether V0 runs chunked prefill: the entry's kind if it names one (V0 honours the flag), else on
    for contexts over 32K tokens without speculation (0.6.0: and without prefix caching)."""
    kind = given.get("kind")
    if kind in ("paged", "chunked_prefill"):
        return kind == "chunked_prefill"
    blocked = _speculative(given)[0] is not None or (prefix_caching_blocks and given.get("prefix_caching") is True)
    return max_model_len > 32768 and not blocked


def _v0_fields(given: Mapping[str, Any], max_model_len: int, chunked: bool, chunk_tokens: int) -> dict[str, Any]:
    seqs = _given_int(given, "max_batch_size") or 256
    common = {"max_batch_size": 256, "gpu_memory_utilization": 0.9, "prefix_caching": False,
              "num_scheduler_steps": 1, "engine_cpu": VLLM_06_CPU, "frontend": V0_FRONTEND,
              "cuda_graphs": {"capture_sizes": v0_capture_sizes(seqs), "batches": "decode"}}  # fmt: skip
    if chunked:  # V0's chunked prefill reserves a prompt's blocks when it is first scheduled
        return {"kind": "chunked_prefill", "chunk_size": chunk_tokens, "allocate": "prompt", **common}
    return {"kind": "paged", "max_num_batched_tokens": max(max_model_len, 2048), **common}


def vllm_0_6_0(gpu: str, memory_gib: float, max_model_len: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.6.0 (V0): prefill-first; chunked prefill (512 tokens) only for contexts over 32K."""
    chunked = _v0_chunked(given, max_model_len, prefix_caching_blocks=True)
    return _v0_fields(given, max_model_len, chunked, 512)


def vllm_0_9_2_v0(gpu: str, memory_gib: float, max_model_len: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.9.2 with VLLM_USE_V1=0: as 0.6.0, a chunked budget of 2048 tokens."""
    chunked = _v0_chunked(given, max_model_len, prefix_caching_blocks=False)
    fields = _v0_fields(given, max_model_len, chunked, 2048)
    if not chunked:  # 0.9.2 also caps the default budget at max_num_seqs x max_model_len
        seqs = _given_int(given, "max_batch_size") or 256
        fields["max_num_batched_tokens"] = min(seqs * max_model_len, fields["max_num_batched_tokens"])
    return fields


# ------------------------------------------------------------------------------------------- V1 engine
def _v1_budget(gpu: str, memory_gib: float, given: Mapping[str, Any], max_model_len: int, *,
               cap_by_context: bool) -> tuple[int, int]:  # fmt: skip
    """(max_num_batched_tokens, max_num_seqs) as V1 resolves them for the OpenAI server."""
    large = large_gpu(gpu, memory_gib)
    default_seqs = 1024 if large else 256
    tokens = _given_int(given, "chunk_size")
    if tokens is None:
        tokens = 8192 if large else 2048
        if cap_by_context:  # 0.11.1+: a default budget never exceeds max_num_seqs x max_model_len
            tokens = min((_given_int(given, "max_batch_size") or default_seqs) * max_model_len, tokens)
    seqs = _given_int(given, "max_batch_size") or min(default_seqs, tokens)
    return tokens, seqs


def vllm_0_11_0(gpu: str, memory_gib: float, max_model_len: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.11.0 (V1): chunked prefill forced on, prefix caching on, no async scheduling."""
    if given.get("kind") == "paged":
        raise PresetConflict(
            "vLLM 0.11.0 ignores --no-enable-chunked-prefill for generative models (V1 sets it True: "
            "vllm/engine/arg_utils.py EngineArgs._set_default_args at v0.11.0); drop kind"
        )
    tokens, seqs = _v1_budget(gpu, memory_gib, given, max_model_len, cap_by_context=False)
    return {"kind": "chunked_prefill", "chunk_size": tokens, "max_batch_size": seqs, "allocate": "chunk",
            "scheduling": "vllm-v1", "prefix_caching": True, "gpu_memory_utilization": 0.9, "engine_cpu": VLLM_V1_CPU,
            "frontend": V1_FRONTEND,
            "cuda_graphs": {"capture_sizes": v1_capture_sizes_0110(seqs, tokens), "batches": "all"}}  # fmt: skip


def vllm_0_15_1(gpu: str, memory_gib: float, max_model_len: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.15.1 (V1): chunked prefill and prefix caching on, async scheduling on by default."""
    if given.get("kind") == "paged":
        raise PresetConflict(
            "vLLM 0.15.1 honours --no-enable-chunked-prefill, but its V1 scheduler then puts whole prompts "
            "beside the decodes in one token budget, which no batchsim kind models ('paged' is V0's "
            "prefill-first); drop kind"
        )
    tokens, seqs = _v1_budget(gpu, memory_gib, given, max_model_len, cap_by_context=True)
    method, gamma = _speculative(given)
    overlap = method not in SPEC_WITHOUT_ASYNC
    sizes = v1_capture_sizes_0151(seqs, tokens, 1 + gamma)
    return {"kind": "chunked_prefill", "chunk_size": tokens, "max_batch_size": seqs, "allocate": "chunk",
            "scheduling": "vllm-v1", "prefix_caching": True, "gpu_memory_utilization": 0.9,
            "engine_cpu": dict(VLLM_V1_CPU, overlap_step=overlap), "frontend": V1_FRONTEND,
            "cuda_graphs": {"capture_sizes": sizes, "batches": "all"}}  # fmt: skip


# ---------------------------------------------------------------------------------------------- sources
def _at(path: str, tag: str, what: str) -> str:
    return f"vllm-project/vllm {path} at {tag}: {what}"


_CPU_FIT = "CPU time: the linear model fitted on the vLLM 0.6.0 validation runs (docs/validation.md)"
_V1_CPU_FIT = (
    "CPU time: V1's per-pass and per-request-per-step terms fitted by scripts/fit_serving.py on the vLLM 0.11 "
    "folder of ../shared/validation (docs/validation.md)"
)
_V0_FRONTEND = _at(
    "vllm/entrypoints/openai/api_server.py", "v0.6.0",
    "one uvicorn/asyncio loop parses, validates and tokenizes each request, then sends it to the engine process "
    "over ZMQ (vllm/entrypoints/openai/rpc/client.py); per_request_ms and latency_ms fitted by "
    "scripts/fit_serving.py on ../shared/validation",
)  # fmt: skip
_V1_FRONTEND = _at(
    "vllm/v1/engine/async_llm.py", "v0.11.0",
    "the API server's loop hands each request to the EngineCore process over ZMQ (core_client.py) and the "
    "output processor detokenizes each chunk before it is streamed (output_processor.py); latency_ms fitted by "
    "scripts/fit_serving.py on ../shared/validation (per_request_ms shared with V0's loop)",
)  # fmt: skip

SOURCES_0_6_0: dict[str, str] = {
    "kind": _at(
        "vllm/engine/arg_utils.py",
        "v0.6.0",
        "EngineArgs.create_engine_config turns chunked prefill on "
        "only for max_model_len > 32768 (no speculation, no prefix caching); --no-enable-chunked-prefill "
        "honoured",
    ),
    "max_batch_size": _at("vllm/engine/arg_utils.py", "v0.6.0", "EngineArgs.max_num_seqs = 256"),
    "max_num_batched_tokens": _at(
        "vllm/config.py", "v0.6.0", "SchedulerConfig: max(max_model_len, 2048) without chunked prefill"
    ),
    "chunk_size": _at("vllm/config.py", "v0.6.0", "SchedulerConfig: 512 with chunked prefill"),
    "allocate": _at(
        "vllm/core/block_manager_v1.py",
        "v0.6.0",
        "a prompt's blocks are allocated when it is first scheduled, also when chunked",
    ),
    "prefix_caching": _at("vllm/engine/arg_utils.py", "v0.6.0", "EngineArgs.enable_prefix_caching = False"),
    "gpu_memory_utilization": _at("vllm/engine/arg_utils.py", "v0.6.0", "EngineArgs.gpu_memory_utilization = 0.90"),
    "num_scheduler_steps": _at(
        "vllm/engine/arg_utils.py", "v0.6.0", "EngineArgs.num_scheduler_steps = 1 (multi-step is opt-in)"
    ),
    "engine_cpu": _at(
        "vllm/engine/llm_engine.py",
        "v0.6.0",
        "one step scheduled after another (no overlap; async output processing is inside the fit)",
    )
    + "; "
    + _CPU_FIT,
    "frontend": _V0_FRONTEND,
    "cuda_graphs": _at(
        "vllm/worker/model_runner.py",
        "v0.6.0",
        "_BATCH_SIZES_TO_CAPTURE [1, 2, 4, 8, 16, ...] "
        "up to _get_max_graph_batch_size(max_num_seqs); pure decode batches only "
        "(_use_captured_graph), padded by _get_graph_batch_size",
    ),
}
"""Where each vllm-0.6 default comes from."""

SOURCES_0_9_2: dict[str, str] = {
    "kind": _at(
        "vllm/engine/arg_utils.py",
        "v0.9.2",
        "EngineArgs._set_default_args_v0 (VLLM_USE_V1=0): chunked "
        "prefill only for max_model_len > 32768 without speculation; --no-enable-chunked-prefill honoured",
    ),
    "max_batch_size": _at("vllm/engine/arg_utils.py", "v0.9.2", "_set_default_args_v0: max_num_seqs = 256"),
    "max_num_batched_tokens": _at(
        "vllm/config.py",
        "v0.9.2",
        "SchedulerConfig.__post_init__: max(max_model_len, 2048), at most max_num_seqs x max_model_len",
    ),
    "chunk_size": _at(
        "vllm/config.py",
        "v0.9.2",
        "SchedulerConfig.__post_init__: DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048 with chunked prefill",
    ),
    "allocate": _at(
        "vllm/core/block_manager.py",
        "v0.9.2",
        "a prompt's blocks are allocated when it is first scheduled, also when chunked",
    ),
    "prefix_caching": _at(
        "vllm/config.py", "v0.9.2", "CacheConfig.enable_prefix_caching = None, left unset (off) by the V0 defaults"
    ),
    "gpu_memory_utilization": _at("vllm/config.py", "v0.9.2", "CacheConfig.gpu_memory_utilization = 0.9"),
    "num_scheduler_steps": _at("vllm/config.py", "v0.9.2", "SchedulerConfig.num_scheduler_steps = 1"),
    "frontend": _V0_FRONTEND,
    "engine_cpu": _at("vllm/engine/llm_engine.py", "v0.9.2", "the V0 engine loop, one step after another")
    + "; "
    + _CPU_FIT
    + ", reused for 0.9 (not measured)",
    "cuda_graphs": _at(
        "vllm/config.py",
        "v0.9.2",
        "VllmConfig._set_cudagraph_sizes (V0 branch): [1, 2, 4] + "
        "multiples of 8 up to the first >= max_num_seqs; vllm/worker/model_runner.py: pure decode "
        "batches only (_use_captured_graph), padded by pad_for_cudagraph",
    ),
}
"""Where each vllm-0.9 (V0 engine) default comes from."""

_V1_BUDGET = (
    "get_batch_defaults for the OpenAI server: 8192 tokens / 1024 sequences if device memory >= 70 GiB and 'a100' "
    "not in the device name, else 2048 / 256; max_num_seqs at most the token budget"
)

SOURCES_0_11_0: dict[str, str] = {
    "kind": _at(
        "vllm/engine/arg_utils.py",
        "v0.11.0",
        "EngineArgs._set_default_args sets enable_chunked_prefill "
        "= True for generative models: --no-enable-chunked-prefill is ignored",
    ),
    "chunk_size": _at("vllm/engine/arg_utils.py", "v0.11.0", "EngineArgs._set_default_args " + _V1_BUDGET),
    "max_batch_size": _at("vllm/engine/arg_utils.py", "v0.11.0", "EngineArgs._set_default_args " + _V1_BUDGET),
    "allocate": _at(
        "vllm/v1/core/sched/scheduler.py",
        "v0.11.0",
        "blocks allocated for the tokens scheduled in each step (KVCacheManager.allocate_slots)",
    ),
    "scheduling": _at(
        "vllm/v1/core/sched/scheduler.py",
        "v0.11.0",
        "Scheduler.schedule: no admission watermark (vllm/v1/core/kv_cache_manager.py allocate_slots checks "
        "get_num_free_blocks only), no WAITING request started in a step that preempted ('if not "
        "preempted_reqs'), victims popped from the end of self.running (most recently started or resumed)",
    ),
    "prefix_caching": _at(
        "vllm/engine/arg_utils.py",
        "v0.11.0",
        "_set_default_args: enable_prefix_caching = True; "
        "full blocks only (vllm/v1/core/kv_cache_utils.py get_request_block_hasher)",
    ),
    "gpu_memory_utilization": _at("vllm/config/cache.py", "v0.11.0", "CacheConfig.gpu_memory_utilization = 0.9"),
    "engine_cpu": _at(
        "vllm/config/scheduler.py", "v0.11.0", "SchedulerConfig.async_scheduling = False: scheduling not overlapped"
    )
    + "; "
    + _V1_CPU_FIT,
    "frontend": _V1_FRONTEND,
    "cuda_graphs": _at(
        "vllm/config/__init__.py",
        "v0.11.0",
        "VllmConfig._set_cudagraph_sizes with "
        "SchedulerConfig.cuda_graph_sizes = [min(2 x max_num_seqs, 512)]: [1, 2, 4] + multiples of "
        "8, none above max_num_batched_tokens; FULL_AND_PIECEWISE by default; "
        "vllm/v1/worker/gpu_model_runner.py _get_num_input_tokens pads every pass of at most "
        "the largest size",
    ),
}
"""Where each vllm-0.11 default comes from."""

SOURCES_0_15_1: dict[str, str] = {
    "kind": _at(
        "vllm/engine/arg_utils.py",
        "v0.15.1",
        "_set_default_chunked_prefill_and_prefix_caching_args: "
        "chunked prefill on unless set; --no-enable-chunked-prefill honoured since v0.11.1 (not modelled)",
    ),
    "chunk_size": _at(
        "vllm/engine/arg_utils.py",
        "v0.15.1",
        "EngineArgs." + _V1_BUDGET + "; a default budget at most max_num_seqs x max_model_len",
    ),
    "max_batch_size": _at("vllm/engine/arg_utils.py", "v0.15.1", "EngineArgs." + _V1_BUDGET),
    "allocate": _at(
        "vllm/v1/core/sched/scheduler.py",
        "v0.15.1",
        "blocks allocated for the tokens scheduled in each step (KVCacheManager.allocate_slots)",
    ),
    "scheduling": _at(
        "vllm/v1/core/sched/scheduler.py",
        "v0.15.1",
        "Scheduler.schedule: no admission watermark (vllm/v1/core/kv_cache_manager.py allocate_slots checks "
        "get_num_free_blocks only), no WAITING request started in a step that preempted ('if not "
        "preempted_reqs'), victims popped from the end of self.running (most recently started or resumed)",
    ),
    "prefix_caching": _at(
        "vllm/config/cache.py", "v0.15.1", "CacheConfig.enable_prefix_caching = True; full blocks only"
    ),
    "gpu_memory_utilization": _at("vllm/config/cache.py", "v0.15.1", "CacheConfig.gpu_memory_utilization = 0.9"),
    "engine_cpu": _at(
        "vllm/config/vllm.py",
        "v0.15.1",
        "async scheduling on when unset (since v0.14.0), off with "
        "ngram or draft-model speculation: the next step is scheduled while the GPU runs",
    )
    + "; "
    + _V1_CPU_FIT,
    "frontend": _V1_FRONTEND,
    "cuda_graphs": _at(
        "vllm/config/vllm.py",
        "v0.15.1",
        "VllmConfig._set_cudagraph_sizes: max_cudagraph_capture_"
        "size = min(2 x max_num_seqs x (1 + speculative tokens), 512, max_num_batched_tokens); "
        "1, 2, 4, multiples of 8 below 256, of 16 from 256; FULL_AND_PIECEWISE (optimization "
        "level O2); vllm/v1/cudagraph_dispatcher.py pads every pass of at most the largest size",
    ),
}
"""Where each vllm-0.15 default comes from."""
