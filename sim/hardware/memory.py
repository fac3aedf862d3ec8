"""KV-cache memory budget of one tensor-parallel worker.

budget = GPU memory x utilization - weights / TP - activation reserve, cut into blocks of
``block_size`` tokens (vLLM's PagedAttention layout). A scenario may instead pin the block
count the real engine logged (vLLM prints ``# GPU blocks``): matching it is what brings
simulated TTFT within a few percent of a real engine (LLMServingSim's validation moved
TTFT error from -20.7% to +0.6% that way), because the estimate below cannot know the
engine's exact activation peak, CUDA-graph pools or fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.errors import UserError
from sim.hardware.catalog import GPUSpec, ModelSpec, check_tensor_parallel
from sim.hardware.pipeline import check_pipeline_parallel, stage_layers, stage_weight_bytes

GIB = 1 << 30
# CUDA context, cuBLAS workspaces and NCCL buffers live outside torch's allocator but
# inside the utilization budget (vLLM counts them as "non-torch" memory): ~0.5-1 GiB.
NON_TORCH_BYTES = GIB
# vLLM sizes activations by profiling one forward pass of max_num_batched_tokens tokens
# and sampling for max_num_seqs (256) sequences; we estimate that peak the same way.
PROFILE_SEQS = 256


@dataclass(frozen=True)
class KVBudget:
    """KV-cache capacity of one worker (every TP rank holds its share of each token).

    Attributes:
        bytes_per_token: KV bytes one token takes on one GPU.
        block_size: tokens per block.
        num_blocks: blocks available to the cache.
        gpu_memory_bytes: device memory.
        weight_bytes_per_gpu: weights resident on one GPU.
        activation_reserve_bytes: kept free for activations and non-torch allocations.
        available_bytes: memory x utilization - weights - reserve (the estimate, even when pinned).
        pinned: the block count was given (``memory.kv_blocks``), not estimated.
    """

    bytes_per_token: int
    block_size: int
    num_blocks: int
    gpu_memory_bytes: int
    weight_bytes_per_gpu: int
    activation_reserve_bytes: int
    available_bytes: int
    pinned: bool

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache holds: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block on one GPU."""
        return self.bytes_per_token * self.block_size


def kv_bytes_per_token(model: ModelSpec, tensor_parallel: int) -> int:
    """KV bytes per token per GPU: 2 (K and V) x layers x KV heads/TP x head dim x dtype.

    KV heads are replicated when TP exceeds them, so a rank never holds less than one.
    Multi-head latent attention (DeepSeek) caches one latent of kv_lora_rank + rope_dim
    values per token and layer instead of K and V; every rank holds all of it (the latent
    is shared by all heads, so it cannot be split by head; vLLM replicates it).

    Raises:
        UserError: TP does not divide the model's heads.
    """
    check_tensor_parallel(model, tensor_parallel)
    if model.mla is not None:
        return model.num_layers * model.mla.cached_width * model.dtype_bytes
    kv_heads = model.kv_heads_per_gpu(tensor_parallel)
    return 2 * model.num_layers * kv_heads * model.head_dim * model.dtype_bytes


def estimate_activation_reserve_bytes(model: ModelSpec, tensor_parallel: int) -> int:
    """Activation peak of vLLM's memory-profiling pass plus non-torch memory, per GPU.

    The profiling pass runs ``min(max_positions, 8192)`` (at least 2048) tokens; its peak
    is one layer's largest live tensors (fused gate/up output, activation output, two
    residual-width buffers) plus fp32 logits and probabilities for 256 sampled sequences.
    """
    tokens = max(2048, min(model.max_positions, 8192))
    up_width = (2 if model.gated_mlp else 1) * model.mlp_hidden_size // tensor_parallel
    per_token = up_width + model.mlp_hidden_size // tensor_parallel + 2 * model.hidden_size
    logits = 2 * PROFILE_SEQS * model.vocab_size * 4
    return NON_TORCH_BYTES + tokens * per_token * model.dtype_bytes + logits


def kv_budget(
    model: ModelSpec,
    gpu: GPUSpec,
    tensor_parallel: int,
    *,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    activation_reserve_gb: float | None = None,
    kv_blocks: int | None = None,
    pipeline_parallel: int = 1,
) -> KVBudget:
    """KV-cache budget of one worker of ``model`` on ``tensor_parallel`` x ``gpu``.

    Args:
        model: the model.
        gpu: the GPU.
        tensor_parallel: GPUs the weights are split over.
        gpu_memory_utilization: fraction of device memory the engine may use.
        block_size: tokens per KV block.
        activation_reserve_gb: GiB kept free for activations (default: estimated).
        kv_blocks: pin the block count (as the real engine logged it).
        pipeline_parallel: pipeline stages of the replica (:func:`pipeline_kv_budget`).

    Raises:
        UserError: bad arguments, or the weights leave no room for a single KV block
            (the message states the weight size per GPU, the memory available and the
            smallest tensor-parallel degree that fits).
    """
    _check_arguments(gpu_memory_utilization, block_size, activation_reserve_gb, kv_blocks)
    if pipeline_parallel != 1:
        return pipeline_kv_budget(
            model, gpu, tensor_parallel, pipeline_parallel, gpu_memory_utilization, block_size,
            activation_reserve_gb, kv_blocks,
        )  # fmt: skip
    per_token = kv_bytes_per_token(model, tensor_parallel)
    gpu_bytes = int(gpu.memory_gb * GIB)
    weights = -(-model.weight_bytes // tensor_parallel)
    reserve = _reserve_bytes(model, tensor_parallel, activation_reserve_gb)
    available = _available_bytes(
        model, gpu, tensor_parallel, gpu_memory_utilization, activation_reserve_gb
    )
    if per_token <= available < per_token * block_size:
        fits = available // per_token
        raise UserError(
            f"memory.block_size = {block_size}: one block of {block_size} tokens takes "
            f"{per_token * block_size / GIB:.2f} GiB of KV, more than the {available / GIB:.2f} GiB left for "
            f"the KV cache ({fits} tokens); use a block_size <= {fits} (vLLM uses 16)",
            field="memory.block_size",
        )
    if available < per_token * block_size:
        _raise_does_not_fit(
            model, gpu, tensor_parallel, gpu_memory_utilization, block_size, activation_reserve_gb
        )
    blocks = kv_blocks if kv_blocks is not None else available // (per_token * block_size)
    return KVBudget(
        per_token, block_size, blocks, gpu_bytes, weights, reserve, available, kv_blocks is not None
    )


def pipeline_kv_budget(
    model: ModelSpec,
    gpu: GPUSpec,
    tensor_parallel: int,
    pipeline_parallel: int,
    utilization: float,
    block_size: int,
    reserve_gb: float | None,
    kv_blocks: int | None,
) -> KVBudget:
    """KV budget of a replica of ``pipeline_parallel`` stages of ``tensor_parallel`` GPUs.

    Each stage stores the KV of its own layers, so a block of ``block_size`` tokens takes the stage's
    share of the per-token KV on each of its GPUs; a stage's blocks are what its memory, less its own
    weights (:func:`~sim.hardware.pipeline.stage_weight_bytes`) and the activation reserve, holds. As
    vLLM does (the executor takes the least ``num_gpu_blocks`` any worker reports), the replica has the
    blocks of its tightest stage; the budget reports that stage's per-token bytes and free memory, and
    the heaviest stage's weights.

    Raises:
        UserError: a bad degree, or a stage without room for one block (naming ``pipeline_parallel``).
    """
    check_tensor_parallel(model, tensor_parallel)
    check_pipeline_parallel(model, pipeline_parallel)
    per_layer = kv_bytes_per_token(model, tensor_parallel) // model.num_layers
    reserve = _reserve_bytes(model, tensor_parallel, reserve_gb)
    usable = int(gpu.memory_gb * GIB * utilization)
    layers = stage_layers(model.num_layers, pipeline_parallel)
    stages = []
    for s, count in enumerate(layers):
        weights = stage_weight_bytes(model, count, first=s == 0, last=s == len(layers) - 1)
        weights = -(-weights // tensor_parallel)
        available = usable - weights - reserve
        stages.append((available // (per_layer * count * block_size), per_layer * count, available, weights, s))
    blocks, per_token, available, _, tightest = min(stages)
    if blocks < 1:
        raise UserError(
            f"{model.name} does not fit on {gpu.name} at tensor_parallel={tensor_parallel} x "
            f"pipeline_parallel={pipeline_parallel}: stage {tightest} ({layers[tightest]} layers) leaves "
            f"{max(available, 0) / GIB:.2f} GiB per GPU for its KV cache, less than one block of {block_size} "
            f"tokens ({per_token * block_size / GIB:.3f} GiB); use more stages, a larger tensor_parallel or a "
            "GPU with more memory",
            field="pipeline_parallel",
        )
    heaviest = max(weights for *_, weights, _ in stages)
    pinned = kv_blocks is not None
    count = kv_blocks if kv_blocks is not None else blocks
    return KVBudget(per_token, block_size, count, int(gpu.memory_gb * GIB), heaviest, reserve, available, pinned)


def _reserve_bytes(model: ModelSpec, tensor_parallel: int, reserve_gb: float | None) -> int:
    if reserve_gb is None:
        return estimate_activation_reserve_bytes(model, tensor_parallel)
    return int(reserve_gb * GIB)


def _check_arguments(
    util: float, block_size: int, reserve_gb: float | None, kv_blocks: int | None
) -> None:
    if not 0 < util <= 1:
        raise UserError(f"must be in (0, 1], got {util}", field="memory.gpu_memory_utilization")
    if not isinstance(block_size, int) or block_size < 1:
        raise UserError(
            f"must be a positive integer, got {block_size!r}", field="memory.block_size"
        )
    if reserve_gb is not None and reserve_gb < 0:
        raise UserError(f"must be >= 0, got {reserve_gb}", field="memory.activation_reserve_gb")
    if kv_blocks is not None and (not isinstance(kv_blocks, int) or kv_blocks < 1):
        raise UserError(f"must be a positive integer, got {kv_blocks!r}", field="memory.kv_blocks")


def _available_bytes(
    model: ModelSpec, gpu: GPUSpec, tp: int, util: float, reserve_gb: float | None
) -> int:
    weights = -(-model.weight_bytes // tp)
    return int(gpu.memory_gb * GIB * util) - weights - _reserve_bytes(model, tp, reserve_gb)


def _raise_does_not_fit(
    model: ModelSpec, gpu: GPUSpec, tp: int, util: float, block_size: int, reserve_gb: float | None
) -> None:
    usable_gib = gpu.memory_gb * util
    weights_gib = model.weight_bytes / tp / GIB
    reserve = _reserve_bytes(model, tp, reserve_gb)
    candidates = [
        d
        for d in (2, 4, 8, 16, 32, 64)
        if d > tp
        and model.num_q_heads % d == 0
        and (model.num_kv_heads % d == 0 or d % model.num_kv_heads == 0)
    ]
    fitting = [
        d
        for d in candidates
        if _available_bytes(model, gpu, d, util, reserve_gb)
        >= kv_bytes_per_token(model, d) * block_size
    ]
    hint = f"use tensor_parallel >= {fitting[0]}" if fitting else "use a GPU with more memory"
    short_gib = (model.weight_bytes / tp + reserve) / GIB - usable_gib
    raise UserError(
        f"{model.name} does not fit on {gpu.name} at tensor_parallel={tp}: weights take "
        f"{model.weight_bytes / tp / 1e9:.1f} GB ({weights_gib:.1f} GiB) per GPU but only "
        f"{usable_gib:.1f} GiB is available "
        f"({gpu.memory_gb:g} GiB x gpu_memory_utilization {util:g}), less {reserve / GIB:.1f} GiB "
        f"activation reserve, leaving no room for the KV cache ({max(short_gib, 0.0):.1f} GiB short per GPU, "
        f"{max(short_gib, 0.0) * tp:.0f} GiB over all {tp}); {hint}",
        field="tensor_parallel",
    )


def with_draft_model(kv: KVBudget, draft: ModelSpec, tensor_parallel: int) -> KVBudget:
    """The target's KV budget once a draft model (speculative decoding) shares its GPUs.

    The draft's weights (its shard at the same tensor-parallel degree) come out of the memory
    left for the KV cache, and every target block is paired with a draft block for the same
    tokens, so blocks are counted at target + draft KV bytes per token. That is how vLLM
    splits the cache between the two (vLLM v0 ``spec_decode_worker.split_num_cache_blocks_evenly``:
    both models get the same block count, together no larger than the target's alone). The
    activation reserve stays the target's: draft and target passes never run at once, and the
    larger peak is the target's. A pinned block count (``memory.kv_blocks``) is kept: the engine
    logged it with the draft loaded.

    Raises:
        UserError: (no field; the caller names the policy) the draft's weights and one block of
            both caches do not fit in what the target leaves.
    """
    draft_weights = -(-draft.weight_bytes // tensor_parallel)
    pair_block = (kv.bytes_per_token + kv_bytes_per_token(draft, tensor_parallel)) * kv.block_size
    available = kv.available_bytes - draft_weights
    if available < pair_block:
        raise UserError(
            f"draft model {draft.name} does not fit next to the target: its weights take "
            f"{draft_weights / GIB:.2f} GiB per GPU (tensor_parallel={tensor_parallel}), and with one KV block of "
            f"both models it needs {(draft_weights + pair_block) / GIB:.2f} GiB, but the target leaves "
            f"{max(kv.available_bytes, 0) / GIB:.2f} GiB for its KV cache; use a smaller draft model, a larger "
            "tensor_parallel or gpu_memory_utilization"
        )
    blocks = kv.num_blocks if kv.pinned else available // pair_block
    return replace(
        kv, num_blocks=blocks, weight_bytes_per_gpu=kv.weight_bytes_per_gpu + draft_weights, available_bytes=available
    )
