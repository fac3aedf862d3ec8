"""CUDA-graph padding: a pass that replays a captured graph is priced at the graph's batch size.

Engines capture one CUDA graph per batch size in a list and replay the smallest graph that
holds a pass, filling the rest with dummy rows; a pass larger than the largest graph runs
eagerly at its own size. vLLM V0 does this for pure decode passes only (its model runner's
``_use_captured_graph``); vLLM V1 for every pass of at most the largest size, decode passes
in a full graph and prefill or mixed passes in a piecewise one (``CudagraphDispatcher``).
docs/presets.md cites the versions.

The dummy rows go through the graph's GEMMs, activations and all-reduces like real tokens,
but attention reads no context for them and no logits are computed for them in V1. Here
they are priced as decode rows with an empty context: the linear layers and the all-reduce
see the padded token count and decode attention reads no extra KV. The LM head and the
per-sequence decode-attention term also count them, which slightly over-prices a padded
pass (both are nearly flat in the batch size at decode sizes).

:class:`CUDAGraphPadding` wraps a cost model; :func:`with_cuda_graphs` applies it where a
policy sets ``cuda_graphs`` (``sim.serving.setup.build_replicas``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from sim.serving.pricing import CostModelLike


def padded_size(tokens: int, capture_sizes: Sequence[int]) -> int:
    """The smallest captured size >= ``tokens``; ``tokens`` itself above the largest (eager).

    Args:
        tokens: tokens of the pass (sequences, for a pure decode pass).
        capture_sizes: the captured sizes, increasing.
    """
    if tokens <= 0 or tokens > capture_sizes[-1]:
        return tokens
    return capture_sizes[bisect_left(capture_sizes, tokens)]


class CUDAGraphPadding:
    """A cost model that prices each pass at the CUDA-graph size it replays at.

    Args:
        inner: the cost model of unpadded passes.
        capture_sizes: the captured sizes, increasing.
        pad_mixed: True: every pass of at most the largest size replays a graph (vLLM V1);
            False: pure decode passes only (vLLM V0).
    """

    def __init__(self, inner: CostModelLike, capture_sizes: Sequence[int], *, pad_mixed: bool) -> None:
        sizes = list(capture_sizes)
        if not sizes or sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError(f"capture sizes must be positive and increasing, got {sizes[:8]!r}")
        self.inner = inner
        self._inner = inner.time_from_totals_s
        self._largest = sizes[-1]
        # One lookup per pass on the engine's hot path: the padded size of every count up to the largest.
        self._pad_to = [padded_size(n, sizes) for n in range(self._largest + 1)]
        self._pad_mixed = pad_mixed
        self.capture_sizes = tuple(sizes)

    def time_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> float:
        """The inner model's time for the pass with its dummy rows added as empty-context decodes."""
        tokens = num_prefill_tokens + num_decode_seqs
        if 0 < tokens <= self._largest and (self._pad_mixed or num_prefill_seqs == 0):
            num_decode_seqs += self._pad_to[tokens] - tokens
        return self._inner(num_prefill_tokens, num_prefill_seqs, prefill_attn_work, num_decode_seqs, decode_kv_tokens)

    def padded_decodes(self, num_decode_seqs: int) -> int:
        """The decode rows a pure decode pass of ``num_decode_seqs`` sequences is priced with (its graph's size)."""
        if 0 < num_decode_seqs <= self._largest:
            return self._pad_to[num_decode_seqs]
        return num_decode_seqs

    def padded_totals(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> tuple[int, int, float, int, int]:
        """The totals the inner model prices for this pass: its dummy rows added as empty-context decodes
        (what :meth:`time_from_totals_s` does, kept out of that hot path)."""
        tokens = num_prefill_tokens + num_decode_seqs
        if 0 < tokens <= self._largest and (self._pad_mixed or num_prefill_seqs == 0):
            num_decode_seqs += self._pad_to[tokens] - tokens
        return num_prefill_tokens, num_prefill_seqs, prefill_attn_work, num_decode_seqs, decode_kv_tokens


def with_cuda_graphs(cost_model: CostModelLike, cuda_graphs: Any) -> CostModelLike:
    """``cost_model`` padded to the capture sizes of a policy's ``cuda_graphs`` block (None: as it is)."""
    if cuda_graphs is None:
        return cost_model
    return CUDAGraphPadding(cost_model, cuda_graphs.capture_sizes, pad_mixed=cuda_graphs.batches == "all")


def pass_breakdown(cost_model: Any) -> Callable[..., dict[str, float]] | None:
    """Seconds per cost-model term of a pass as ``cost_model`` prices it (None if it gives no breakdown).

    A padded model's breakdown is its inner model's on the padded totals. It is not a method of
    :class:`CUDAGraphPadding`, so that features which use a breakdown only where the cost model has one
    (speculative verification) keep pricing a padded model as they always have.
    """
    if isinstance(cost_model, CUDAGraphPadding):
        inner = pass_breakdown(cost_model.inner)
        if inner is None:
            return None
        return lambda *totals: inner(*cost_model.padded_totals(*totals))
    return getattr(cost_model, "breakdown_from_totals_s", None)
