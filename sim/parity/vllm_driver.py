"""vLLM's side of a parity run: its real V1 ``Scheduler`` on the CPU, fed fake model outputs.

The scheduler is built as vLLM's own unit tests build it (``tests/v1/core/utils.py``
``create_scheduler`` at each supported tag): a ``VllmConfig`` with the scheduler and cache
limits, one full-attention KV group of ``num_blocks`` blocks and no model weights (the model
config reads a one-file local ``config.json``, so nothing is downloaded). Each step is
``schedule()``, then ``update_from_output`` with one sampled token for every request whose
prompt (or recompute) is complete and none for a partial prefill, as the GPU model runner
returns them. ``max_tokens`` is the request's output length, so it stops exactly there.

The clock: before each step the requests whose arrival time has passed are added; a step
lasts what batchsim's cost model says for its batch (:mod:`sim.parity.pricing`), so arrivals
fall between steps as they would on the GPU the deployment names. vLLM is imported only here,
and only when a recording is asked for (``pip install batchsim[parity]``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from sim.errors import UserError
from sim.parity.pricing import StepWalker
from sim.parity.trace import Requests, ScheduleTrace, Step

SUPPORTED = ("0.11.0", "0.15.1")
"""vLLM releases the driver is checked against (the ``parity`` extra pins them)."""

PRESETS_BY_LINE = {"0.11": "vllm-0.11", "0.15": "vllm-0.15"}
"""batchsim's preset for each vLLM release line the driver supports."""


def preset_for_version(version: str) -> str | None:
    """batchsim's preset for an installed vLLM version (None: a line no preset models)."""
    return PRESETS_BY_LINE.get(".".join(version.split(".")[:2]))


_VOCAB = 32000
_EOS = 2
_TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": _VOCAB,
    "max_position_embeddings": 1 << 20, "torch_dtype": "float16", "eos_token_id": _EOS, "bos_token_id": 1,
}  # fmt: skip
"""A model config with no weights: the scheduler only needs its context length and vocabulary."""


def import_vllm() -> Any:
    """vLLM's package, or a UserError that says how to install it (and which versions are checked)."""
    try:
        import vllm
        from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401 - the part the driver needs
    except Exception as exc:  # an import can fail inside vLLM with any error (missing CUDA libraries, ...)
        raise UserError(
            f"vLLM cannot be imported ({type(exc).__name__}: {str(exc)[:120]}); install one of "
            f"{', '.join(SUPPORTED)}: pip install 'batchsim[parity]' (or vllm==X --no-deps with torch)",
            field="vllm",
        ) from None
    return vllm


def _make_scheduler(sched: dict[str, Any], max_model_len: int, model_dir: Path) -> Any:
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = int(sched["block_size"])
    scheduler_config = SchedulerConfig(
        max_num_seqs=int(sched["max_num_seqs"]),
        max_num_batched_tokens=int(sched["max_num_batched_tokens"]),
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        **_scheduler_extras(SchedulerConfig),
    )
    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float16", seed=42, max_model_len=max_model_len
    )
    cache_config = CacheConfig(
        block_size=block_size, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto",
        enable_prefix_caching=bool(sched["enable_prefix_caching"]),
    )  # fmt: skip
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )  # fmt: skip
    blocks = int(sched["num_blocks"]) + 1  # vLLM keeps one block back as its null block
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    cache_config.num_gpu_blocks = blocks
    scheduler_class: Any = Scheduler
    if sched.get("async_scheduling"):
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        scheduler_class = AsyncScheduler
    return scheduler_class(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config), **_scheduler_kwargs(Scheduler, block_size),
    )  # fmt: skip


def _scheduler_extras(config_class: Any) -> dict[str, Any]:
    """Fields later versions need set (0.15 defaults ``async_scheduling`` to None, resolved by the engine)."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    extras: dict[str, Any] = {}
    if "async_scheduling" in fields:
        extras["async_scheduling"] = False  # the harness runs the scheduler synchronously (docs/validation.md)
    if "is_encoder_decoder" in fields:
        extras["is_encoder_decoder"] = False
    return extras


def _scheduler_kwargs(scheduler_class: Any, block_size: int) -> dict[str, Any]:
    import inspect

    params = inspect.signature(scheduler_class.__init__).parameters
    return {"block_size": block_size} if "block_size" in params else {}


def _token_ids(rid: int, prompt: int, keys: list[int] | None, block_size: int) -> list[int]:
    """Prompt token ids whose full blocks are equal exactly where the content keys are (vLLM hashes blocks)."""
    import random

    ids: list[int] = []
    for key in keys or []:
        rng = random.Random(f"key:{key}")
        ids += [rng.randrange(10, _VOCAB) for _ in range(block_size)]
    rng = random.Random(f"request:{rid}")
    ids += [rng.randrange(10, _VOCAB) for _ in range(prompt - len(ids))]
    return ids[:prompt]


def _sha256() -> Any:
    try:
        from vllm.utils.hashing import get_hash_fn_by_name  # 0.15
    except ImportError:
        from vllm.utils import get_hash_fn_by_name  # 0.11
    return get_hash_fn_by_name("sha256")


def _make_requests(requests: Requests, block_size: int) -> list[Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = _sha256()
    init_none_hash(hash_fn)  # as vLLM's engine does with its default prefix_caching_hash_algo
    hasher = get_request_block_hasher(block_size, hash_fn)
    made = []
    for rid, (prompt, output) in enumerate(zip(requests.prompt_tokens, requests.output_tokens, strict=True)):
        keys = requests.block_keys[rid] if requests.block_keys is not None else None
        params = SamplingParams(ignore_eos=True, max_tokens=output)
        made.append(
            Request(
                request_id=str(rid),
                prompt_token_ids=_token_ids(rid, prompt, keys, block_size),
                sampling_params=params,
                pooling_params=None,
                eos_token_id=_EOS,
                block_hasher=hasher,
            )  # fmt: skip
        )
    return made


def _placeholders(scheduler: Any) -> dict[str, int]:
    """Output placeholders per request (the async scheduler's tokens in flight; 0 when synchronous)."""
    return {rid: getattr(r, "num_output_placeholders", 0) for rid, r in scheduler.requests.items()}


def _fake_output(scheduler_output: Any, scheduler: Any, placeholders_before: dict[str, int]) -> Any:
    """One sampled token per request whose tokens are all computed after this step; none for a partial prefill.

    Called right after ``schedule()``. The async scheduler marks a request that will sample with one more
    output placeholder (``AsyncScheduler._update_after_schedule``); the synchronous one has computed
    all its tokens.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for req_id in ids:
        request = scheduler.requests[req_id]
        placeholders = getattr(request, "num_output_placeholders", 0)
        if placeholders or placeholders_before.get(req_id, 0):
            samples = placeholders > placeholders_before.get(req_id, 0)
        else:
            samples = request.num_computed_tokens >= request.num_tokens
        token = 10 + (int(req_id) * 7919 + request.num_output_tokens + placeholders) % (_VOCAB - 10)
        sampled.append([token] if samples else [])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
        logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
    )  # fmt: skip


def _preempted() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.PREEMPTED


def record_step(scheduler_output: Any, scheduler: Any, add: list[int], running_before: list[str]) -> Step:
    """What ``schedule()`` just did: in vLLM's order, running requests first, then resumed and new ones;
    the victims in the order it preempted them (from the tail of its running list)."""
    counts = scheduler_output.num_scheduled_tokens
    started = [r.req_id for r in scheduler_output.scheduled_new_reqs]
    cached = scheduler_output.scheduled_cached_reqs
    resumed = [rid for rid, again in zip(cached.req_ids, _resumed_flags(cached), strict=True) if again]
    order = [r.request_id for r in scheduler.running if r.request_id in counts]
    step = Step(add=add, run=[(int(r), int(counts[r])) for r in order])
    step.preempt = [int(r) for r in reversed(running_before) if scheduler.requests[r].status == _preempted()]
    for req_id in started + resumed:
        request = scheduler.requests[req_id]
        hit = request.num_computed_tokens - counts[req_id]
        if hit:
            step.hit.append((int(req_id), int(hit)))
    pool = scheduler.kv_cache_manager.block_pool
    step.kv = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    return step


def _resumed_flags(cached: Any) -> list[bool]:
    flags = getattr(cached, "resumed_from_preemption", None)
    if flags is not None:
        return list(flags)
    resumed: set[str] = getattr(cached, "resumed_req_ids", set())  # 0.15: a set of ids
    return [rid in resumed for rid in cached.req_ids]


def _drive(scheduler: Any, made: list[Any], requests: Requests, cost_model: Any, lagged: bool) -> list[Step]:
    """Step the scheduler to the end of the stream; with ``lagged`` (async scheduling) each step's output
    reaches the scheduler after the next step is scheduled, as ``EngineCore.step_with_batch_queue`` does
    with a batch queue of 2 while the GPU is the bottleneck."""
    walker = StepWalker(requests)
    steps: list[Step] = []
    pending: tuple[Any, Any] | None = None
    add: list[int] = []
    clock, sent, order = 0.0, 0, sorted(range(len(made)), key=lambda r: (requests.arrival_s[r], r))
    while sent < len(made) or scheduler.get_num_unfinished_requests() or pending:
        if not scheduler.get_num_unfinished_requests() and pending is None:
            clock = max(clock, requests.arrival_s[order[sent]])
        while sent < len(made) and requests.arrival_s[order[sent]] <= clock:
            scheduler.add_request(made[order[sent]])
            add.append(order[sent])
            sent += 1
        done = None
        if scheduler.get_num_unfinished_requests():
            before, running_before = _placeholders(scheduler), [r.request_id for r in scheduler.running]
            output = scheduler.schedule()
            done = (output, _fake_output(output, scheduler, before))
            if output.total_num_scheduled_tokens:  # an empty step runs nothing: its arrivals go to the next
                steps.append(record_step(output, scheduler, add, running_before))
                add = []
                clock += cost_model.time_from_totals_s(*walker.walk(steps[-1]).totals)
            elif pending is None:  # nothing in flight either: only an arrival can unblock it
                if sent == len(made):
                    raise RuntimeError(f"vLLM scheduled nothing with {len(scheduler.running)} requests running")
                clock = max(clock, requests.arrival_s[order[sent]])
        if pending is not None:
            scheduler.update_from_output(*pending)
            pending = None
        if done is not None:
            if lagged:
                pending = done
            else:
                scheduler.update_from_output(*done)
    return steps


def record(
    requests: Requests, deployment: dict[str, Any], scheduler_limits: dict[str, Any], cost_model: Any
) -> ScheduleTrace:
    """Run vLLM's scheduler on ``requests`` and return its schedule as a trace.

    Args:
        requests: the stream (arrivals, lengths, content keys).
        deployment: preset, model, GPU, tensor parallel, max_model_len (see :mod:`sim.parity.trace`).
        scheduler_limits: max_num_batched_tokens, max_num_seqs, block_size, num_blocks, enable_prefix_caching,
            and optionally async_scheduling (default false: each step's output before the next step).
        cost_model: prices each step to advance the clock (``time_from_totals_s``).
    """
    vllm = import_vllm()
    block_size = int(scheduler_limits["block_size"])
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(_TINY_MODEL))
        scheduler = _make_scheduler(scheduler_limits, int(deployment["max_model_len"]), Path(model_dir))
    made = _make_requests(requests, block_size)
    steps = _drive(scheduler, made, requests, cost_model, bool(scheduler_limits.get("async_scheduling")))
    engine = {"name": "vllm", "version": str(vllm.__version__)}
    return ScheduleTrace(engine, dict(deployment), dict(scheduler_limits), requests, steps)
