"""Model architectures and GPU specifications known to batchsim.

Model shapes are the public Hugging Face ``config.json`` values (layers, query/KV heads,
hidden and MLP sizes, vocabulary, context length); the six models with A100 profiles
agree with the Vidur configs in ``../shared/profiles/model_configs`` except that Vidur
pads Llama-2's vocabulary to 32768 for its tensor-parallel LM head (HF: 32000).
GPU figures are vendor datasheet values: dense BF16 tensor-core peak (no sparsity), HBM
bandwidth, and device memory as CUDA reports it (``torch.cuda.mem_get_info`` total, in
GiB), which is what vLLM's ``gpu_memory_utilization`` multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from sim.errors import UserError, did_you_mean


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts feed-forward layers (Hugging Face ``config.json`` names in brackets).

    Attributes:
        num_experts: routed experts per MoE layer (``num_local_experts`` / ``n_routed_experts``
            / ``num_experts``).
        top_k: routed experts each token is sent to (``num_experts_per_tok``).
        expert_ffn: one expert's gated-MLP width (``moe_intermediate_size``; Mixtral:
            ``intermediate_size``).
        shared_experts: experts every token passes through (``n_shared_experts``, DeepSeek),
            each ``expert_ffn`` wide.
        dense_layers: leading layers with a dense MLP of ``ModelSpec.mlp_hidden_size``
            instead of experts (``first_k_dense_replace``, DeepSeek).
    """

    num_experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    dense_layers: int = 0

    def expert_params(self, hidden_size: int) -> int:
        """Weights of one gated expert (gate, up and down projections)."""
        return 3 * hidden_size * self.expert_ffn

    def router_params(self, hidden_size: int) -> int:
        """Router weights; a single expert needs no router (it takes every token)."""
        return hidden_size * self.num_experts if self.num_experts > 1 else 0


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): K and V are cached as one compressed latent.

    Attributes:
        kv_lora_rank: width of the cached KV latent (``kv_lora_rank``).
        q_lora_rank: width of the query's low-rank bottleneck (``q_lora_rank``; 0 = none,
            DeepSeek-V2-Lite projects queries directly).
        rope_dim: rotary part of each query/key head, cached once per token (``qk_rope_head_dim``).
        nope_dim: non-rotary part of each query/key head (``qk_nope_head_dim``).
        v_head_dim: value head width (``v_head_dim``).
    """

    kv_lora_rank: int
    q_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_head_dim: int

    @property
    def cached_width(self) -> int:
        """Values cached per token and layer: the latent plus the shared rotary key."""
        return self.kv_lora_rank + self.rope_dim

    def params(self, hidden_size: int, heads: int) -> int:
        """Attention weights of one layer: query path, KV down/up projections, output."""
        qk = heads * (self.nope_dim + self.rope_dim)
        query = hidden_size * self.q_lora_rank + self.q_lora_rank * qk if self.q_lora_rank else hidden_size * qk
        kv_down = hidden_size * self.cached_width
        kv_up = self.kv_lora_rank * heads * (self.nope_dim + self.v_head_dim)
        return query + kv_down + kv_up + heads * self.v_head_dim * hidden_size


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    Attributes:
        name: batchsim name, e.g. ``"llama-2-7b"``.
        hf_name: Hugging Face repository, e.g. ``"meta-llama/Llama-2-7b-hf"``.
        num_layers: transformer blocks.
        num_q_heads: attention (query) heads.
        num_kv_heads: key/value heads (fewer than query heads with GQA).
        hidden_size: model width.
        mlp_hidden_size: MLP intermediate width.
        vocab_size: vocabulary (rows of the embedding and LM head).
        gated_mlp: SwiGLU-style MLP with fused gate+up projection (3 matrices, not 2).
        max_positions: longest context the model supports.
        dtype_bytes: bytes per weight and KV element (2 = fp16/bf16).
        tied_embeddings: the LM head reuses the embedding matrix (OPT).
        rotary: rotary position embeddings (False: learned positions, OPT).
        parallel_block: attention and MLP read the same normed input (one norm per
            layer, phi-2) instead of running one after the other (two norms).
        explicit_head_dim: head width when config.json sets ``head_dim`` apart from
            hidden / heads (Mistral-Nemo: 128, not 160); 0 = hidden // heads.
        moe: mixture-of-experts FFN (None: dense MLP of ``mlp_hidden_size`` in every layer).
        mla: multi-head latent attention (None: multi-head / grouped-query attention).
        weight_dtype_bytes: bytes per transformer weight when stored narrower than
            ``dtype_bytes`` (DeepSeek-V3's fp8 release: 1); embeddings, LM head, activations
            and KV stay at ``dtype_bytes``. 0 = ``dtype_bytes``.
    """

    name: str
    hf_name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    hidden_size: int
    mlp_hidden_size: int
    vocab_size: int
    gated_mlp: bool
    max_positions: int
    dtype_bytes: int = 2
    tied_embeddings: bool = False
    rotary: bool = True
    parallel_block: bool = False
    explicit_head_dim: int = 0
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    weight_dtype_bytes: int = 0

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.explicit_head_dim or self.hidden_size // self.num_q_heads

    @property
    def num_params(self) -> int:
        """Parameter count (weights; biases and norms are under 0.1% and left out).

        For a MoE model this is the *total* (every expert): what memory must hold.
        """
        return self._params(active=False)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: all but the routed experts it is not sent to."""
        return self._params(active=True)

    @property
    def embedding_params(self) -> int:
        """Embedding and LM-head weights (one matrix when tied)."""
        return (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size

    @property
    def weight_bytes_per_param(self) -> int:
        """Bytes of one transformer-layer weight (narrower than ``dtype_bytes`` for fp8)."""
        return self.weight_dtype_bytes or self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights: layers at ``weight_bytes_per_param``, embeddings at ``dtype_bytes``."""
        embeddings = self.embedding_params
        return (self.num_params - embeddings) * self.weight_bytes_per_param + embeddings * self.dtype_bytes

    def _params(self, *, active: bool) -> int:
        h, hd = self.hidden_size, self.head_dim
        if self.mla is None:
            attention = h * (self.num_q_heads + 2 * self.num_kv_heads) * hd + self.num_q_heads * hd * h
        else:
            attention = self.mla.params(h, self.num_q_heads)
        mlp = (3 if self.gated_mlp else 2) * h * self.mlp_hidden_size
        if self.moe is None:
            return self.num_layers * (attention + mlp) + self.embedding_params
        moe = self.moe
        experts = moe.shared_experts + (moe.top_k if active else moe.num_experts)
        moe_layer = experts * moe.expert_params(h) + moe.router_params(h)
        moe_layers = self.num_layers - moe.dense_layers
        return self.num_layers * attention + moe.dense_layers * mlp + moe_layers * moe_layer + self.embedding_params

    def q_heads_per_gpu(self, tensor_parallel: int) -> int:
        """Query heads each tensor-parallel rank holds."""
        return self.num_q_heads // tensor_parallel

    def kv_heads_per_gpu(self, tensor_parallel: int) -> int:
        """KV heads each rank holds; replicated (one per rank) when TP exceeds them."""
        return max(1, self.num_kv_heads // tensor_parallel)


NON_LAYER_FIELDS = frozenset({"name", "hf_name", "vocab_size", "max_positions", "tied_embeddings", "explicit_head_dim"})
"""ModelSpec fields that no per-layer kernel sees: the names, the vocabulary (the embedding gather and the
LM head, priced apart), the longest context (and with it RoPE scaling, which only rewrites the cos/sin table
built once at load), whether the LM head reuses the embedding matrix (the same GEMM either way), and
``explicit_head_dim`` (compared as the resulting :attr:`ModelSpec.head_dim` instead)."""


def layer_shapes(model: ModelSpec) -> tuple[tuple[str, object], ...]:
    """What every transformer-layer kernel of ``model`` sees: layers, heads, widths, MLP and attention kind.

    Two models with equal layer shapes run the same per-layer GEMMs, norms, activations and attention on
    the same matrix sizes, so one's measured kernel times are the other's. Every ModelSpec field counts
    except :data:`NON_LAYER_FIELDS`, so a field added later counts until it is shown not to matter.
    """
    kept = tuple((f.name, getattr(model, f.name)) for f in fields(model) if f.name not in NON_LAYER_FIELDS)
    return (*kept, ("head_dim", model.head_dim))


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator.

    Attributes:
        name: batchsim name, e.g. ``"a100-80gb"``.
        peak_bf16_tflops: dense BF16 tensor-core peak, TFLOP/s.
        hbm_gb_per_s: HBM bandwidth, GB/s (1e9 bytes).
        memory_gb: device memory in GiB as CUDA reports it.
        nvlink_gb_per_s: GPU-to-GPU link bandwidth per direction per GPU, GB/s (scales
            all-reduce): NVLink, or the PCIe link where ``interconnect`` is "PCIe".
        interconnect: "NVLink" (NVSwitch or bridge) or "PCIe" (no NVLink).
        tdp_w: board power limit (TDP), W, from the datasheet; 0 = unknown (no energy figures).
        idle_w: power with the model loaded and no kernel running, W.
        usd_per_hour: rental price of one GPU-hour, USD; 0 = no listed price (set ``gpu_hour_usd``).
            Sources of these three: :data:`sim.hardware.power.SOURCES` and docs/cost.md.
    """

    name: str
    peak_bf16_tflops: float
    hbm_gb_per_s: float
    memory_gb: float
    nvlink_gb_per_s: float = 300.0
    interconnect: str = "NVLink"
    tdp_w: float = 0.0
    idle_w: float = 0.0
    usd_per_hour: float = 0.0


def _llama(
    name: str, hf: str, layers: int, heads: int, kv: int, h: int, ffn: int, vocab: int, max_pos: int
) -> ModelSpec:
    return ModelSpec(
        name, hf, layers, heads, kv, h, ffn, vocab, gated_mlp=True, max_positions=max_pos
    )


# Mixture-of-experts models, from each Hugging Face repository's config.json (named per entry).
# Mixtral: num_local_experts, num_experts_per_tok, intermediate_size (one expert's width).
# DeepSeek: n_routed_experts, n_shared_experts, num_experts_per_tok, moe_intermediate_size,
# first_k_dense_replace (those layers' dense MLP: intermediate_size), kv_lora_rank, q_lora_rank,
# qk_rope_head_dim, qk_nope_head_dim, v_head_dim; DeepSeek-V3's multi-token-prediction layer
# (num_nextn_predict_layers) is not served and not counted. Qwen3-MoE: num_experts,
# num_experts_per_tok, moe_intermediate_size, head_dim; every layer is MoE (decoder_sparse_step 1,
# no mlp_only_layers), so intermediate_size (= top-k x expert width) only sizes the activation reserve.
MOE_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 32, 32, 8, 4096, 14336, 32000,
        gated_mlp=True, max_positions=32768, moe=MoESpec(num_experts=8, top_k=2, expert_ffn=14336),
    ),
    ModelSpec(
        "mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1", 56, 48, 8, 6144, 16384, 32768,
        gated_mlp=True, max_positions=65536, moe=MoESpec(num_experts=8, top_k=2, expert_ffn=16384),
    ),
    ModelSpec(
        "deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 27, 16, 16, 2048, 10944, 102400,
        gated_mlp=True, max_positions=163840, explicit_head_dim=192,
        moe=MoESpec(num_experts=64, top_k=6, expert_ffn=1408, shared_experts=2, dense_layers=1),
        mla=MLASpec(kv_lora_rank=512, q_lora_rank=0, rope_dim=64, nope_dim=128, v_head_dim=128),
    ),
    # As released: fp8 (e4m3, 128x128 block scales) transformer weights, bf16 embeddings/LM head.
    _DEEPSEEK_V3 := ModelSpec(
        "deepseek-v3", "deepseek-ai/DeepSeek-V3", 61, 128, 128, 7168, 18432, 129280,
        gated_mlp=True, max_positions=163840, explicit_head_dim=192, weight_dtype_bytes=1,
        moe=MoESpec(num_experts=256, top_k=8, expert_ffn=2048, shared_experts=1, dense_layers=3),
        mla=MLASpec(kv_lora_rank=512, q_lora_rank=1536, rope_dim=64, nope_dim=128, v_head_dim=128),
    ),
    # The same weights upcast to bf16 (DeepSeek-V3's inference/fp8_cast_bf16.py): twice the memory.
    replace(_DEEPSEEK_V3, name="deepseek-v3-bf16", weight_dtype_bytes=0),
    ModelSpec(
        "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 48, 32, 4, 2048, 6144, 151936,
        gated_mlp=True, max_positions=40960, explicit_head_dim=128,
        moe=MoESpec(num_experts=128, top_k=8, expert_ffn=768),
    ),
    ModelSpec(
        "qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 94, 64, 4, 4096, 12288, 151936,
        gated_mlp=True, max_positions=40960, explicit_head_dim=128,
        moe=MoESpec(num_experts=128, top_k=8, expert_ffn=1536),
    ),
)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama-2-7b", "meta-llama/Llama-2-7b-hf", 32, 32, 32, 4096, 11008, 32000, 4096),
        _llama("llama-2-70b", "meta-llama/Llama-2-70b-hf", 80, 64, 8, 8192, 28672, 32000, 4096),
        _llama("llama-3-8b", "meta-llama/Meta-Llama-3-8B", 32, 32, 8, 4096, 14336, 128256, 8192),
        _llama("llama-3-70b", "meta-llama/Meta-Llama-3-70B", 80, 64, 8, 8192, 28672, 128256, 8192),
        _llama(
            "codellama-34b",
            "codellama/CodeLlama-34b-Instruct-hf",
            48,
            64,
            8,
            8192,
            22016,
            32000,
            16384,
        ),
        ModelSpec(
            "phi-2",
            "microsoft/phi-2",
            32,
            32,
            32,
            2560,
            10240,
            51200,
            gated_mlp=False,
            max_positions=2048,
            parallel_block=True,
        ),
        # Mistral's 4096-token sliding window is not modelled: attention cost and KV use
        # are those of full attention (an upper bound beyond 4096 tokens of context).
        _llama("mistral-7b", "mistralai/Mistral-7B-v0.1", 32, 32, 8, 4096, 14336, 32000, 32768),
        ModelSpec(
            "opt-13b",
            "facebook/opt-13b",
            40,
            40,
            40,
            5120,
            20480,
            50272,
            gated_mlp=False,
            max_positions=2048,
            tied_embeddings=True,
            rotary=False,
        ),
        _llama("llama-3.1-8b", "meta-llama/Llama-3.1-8B", 32, 32, 8, 4096, 14336, 128256, 131072),
        _llama("qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 28, 4, 3584, 18944, 152064, 131072),
        # InternLM-20B and Qwen-72B: heads, KV heads, width, MLP width, vocabulary and gated
        # MLP from the profile CSVs' shape columns (n_head, n_kv_head, n_embd,
        # n_expanded_embd, vocab_size, use_gated_mlp); layers and context from config.json
        # (num_hidden_layers 60 / 80; max_position_embeddings 4096, Qwen's seq_length 32768).
        # Qwen's config.json intermediate_size (49152) counts gate + up; per projection 24576.
        _llama("internlm-20b", "internlm/internlm-20b", 60, 40, 40, 5120, 13824, 103168, 4096),
        _llama("qwen-72b", "Qwen/Qwen-72B", 80, 64, 64, 8192, 24576, 152064, 32768),
        # config.json: num_hidden_layers, num_attention_heads, num_key_value_heads,
        # hidden_size, intermediate_size, vocab_size, max_position_embeddings.
        _llama(
            "llama-3.1-70b", "meta-llama/Llama-3.1-70B", 80, 64, 8, 8192, 28672, 128256, 131072
        ),
        _llama("qwen2.5-72b", "Qwen/Qwen2.5-72B", 80, 64, 8, 8192, 29568, 152064, 131072),
        # Mistral-Nemo config.json also sets head_dim 128 (hidden 5120 / 32 heads would be
        # 160); its max_position_embeddings is 1024000 but the model card states a 128k
        # context window, which is what is used here.
        ModelSpec(
            "mistral-nemo-12b",
            "mistralai/Mistral-Nemo-Base-2407",
            40,
            32,
            8,
            5120,
            14336,
            131072,
            gated_mlp=True,
            max_positions=131072,
            explicit_head_dim=128,
        ),
        *MOE_MODELS,
    )
}

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        # tdp_w, idle_w, usd_per_hour: sources in sim.hardware.power.SOURCES (docs/cost.md).
        GPUSpec(
            "a100-80gb",
            peak_bf16_tflops=312.0,
            hbm_gb_per_s=2039.0,
            memory_gb=79.15,
            tdp_w=400.0,
            idle_w=46.0,
            usd_per_hour=2.16,
        ),
        GPUSpec("a100-40gb", peak_bf16_tflops=312.0, hbm_gb_per_s=1555.0, memory_gb=39.39, tdp_w=400.0, idle_w=46.0),
        GPUSpec(
            "h100-sxm",
            peak_bf16_tflops=989.0,
            hbm_gb_per_s=3350.0,
            memory_gb=79.11,
            nvlink_gb_per_s=450.0,
            tdp_w=700.0,
            idle_w=80.0,
            usd_per_hour=3.35,
        ),
        GPUSpec(
            "h200",
            peak_bf16_tflops=989.0,
            hbm_gb_per_s=4800.0,
            memory_gb=139.8,
            nvlink_gb_per_s=450.0,
            tdp_w=700.0,
            idle_w=80.0,
            usd_per_hour=4.46,
        ),
        # A40 and L40S: PCIe Gen4 x16 cards without NVLink here (32 GB/s per direction);
        # 48 GB GDDR6 is 46068 MiB as nvidia-smi lists it (44.99 GiB). L40S: 362.05 TFLOP/s
        # dense BF16 (733 is the sparsity figure).
        GPUSpec(
            "a40",
            peak_bf16_tflops=149.7,
            hbm_gb_per_s=696.0,
            memory_gb=44.99,
            nvlink_gb_per_s=32.0,
            interconnect="PCIe",
            tdp_w=300.0,
            idle_w=96.0,
            usd_per_hour=0.86,
        ),
        GPUSpec(
            "l40s",
            peak_bf16_tflops=362.05,
            hbm_gb_per_s=864.0,
            memory_gb=44.99,
            nvlink_gb_per_s=32.0,
            interconnect="PCIe",
            tdp_w=350.0,
            idle_w=96.0,
            usd_per_hour=1.33,
        ),
    )
}


def _lookup(kind: str, name: str, table: dict) -> object:
    if not isinstance(name, str) or name not in table:
        raise UserError(
            f"unknown {kind} '{name}'{did_you_mean(str(name), table)}; "
            f"known: {', '.join(sorted(table))}",
            field=kind,
        )
    return table[name]


def get_model(name: str) -> ModelSpec:
    """The catalog model called ``name``.

    Raises:
        UserError: unknown name (with a did-you-mean hint and the list of models).
    """
    spec = _lookup("model", name, MODELS)
    assert isinstance(spec, ModelSpec)
    return spec


def get_gpu(name: str) -> GPUSpec:
    """The catalog GPU called ``name``.

    Raises:
        UserError: unknown name (with a did-you-mean hint and the list of GPUs).
    """
    spec = _lookup("gpu", name, GPUS)
    assert isinstance(spec, GPUSpec)
    return spec


def check_tensor_parallel(model: ModelSpec, tensor_parallel: int) -> None:
    """Reject a tensor-parallel degree the model's heads cannot be split over.

    Query heads must divide evenly; KV heads must divide evenly or be replicated
    (TP a multiple of the KV heads, as vLLM does for GQA models).

    Raises:
        UserError: TP < 1, or it does not divide the heads.
    """
    tp, q, kv = tensor_parallel, model.num_q_heads, model.num_kv_heads
    if not isinstance(tp, int) or tp < 1:
        raise UserError(f"must be a positive integer, got {tp!r}", field="tensor_parallel")
    if q % tp or (kv % tp and tp % kv):
        allowed = [d for d in range(1, q + 1) if q % d == 0 and (kv % d == 0 or d % kv == 0)]
        raise UserError(
            f"{tp} does not divide the {q} query / {kv} KV heads of {model.name}; "
            f"allowed: {', '.join(map(str, allowed))}",
            field="tensor_parallel",
        )
