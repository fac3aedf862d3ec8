"""Pipeline parallelism as vLLM runs it: which layers each stage holds, what a stage's GPUs store,
and what moving a micro-batch's activations from one stage to the next costs.

A replica of ``pipeline_parallel`` P x ``tensor_parallel`` TP GPUs is P stages of TP GPUs each.

* **Layers per stage** (:func:`stage_layers`): vLLM's ``get_pp_indices``
  (``vllm/distributed/utils.py``): L // P layers each, the remainder spread one by one over the
  stages before the last, counting backwards from the second-to-last ("the last partition is
  excluded because it often contains an additional norm layer").
* **Weights per GPU** (:func:`stage_weight_bytes`): the stage's share of the transformer layers,
  plus the embedding on the first stage and the LM head on the last (a pipeline's first and last
  ranks each hold one vocabulary matrix, tied or not: the other ranks have ``PPMissingLayer`` in
  their place), all split over the stage's TP GPUs.
* **Activations between stages** (:class:`ActivationTransfer`): a stage that is not the last sends
  its ``IntermediateTensors``, the hidden states and the residual of every token (vLLM's Llama-family
  models: ``{"hidden_states": ..., "residual": ...}``), with ``send_tensor_dict(...,
  all_gather_group=get_tp_group())``: each TP rank sends 1/TP of each tensor to its peer of the next
  stage, whose TP group all-gathers the rest. Every receiving GPU so takes in the whole tensor over
  its own link, 2 x tokens x hidden x dtype bytes at the GPU's link rate, whatever TP.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import UserError
from sim.hardware.catalog import GPUSpec, ModelSpec

ACTIVATION_TENSORS = 2
"""Tensors a stage hands to the next per token: the hidden states and the residual (vLLM's Llama-family
``IntermediateTensors``). Models without a separate residual stream send one; two is their upper bound."""

HOP_LATENCY_S = 2 * 0.128e-3
"""Fixed cost of one stage-to-stage hand-off. ``GroupCoordinator.send_tensor_dict`` first sends the tensors'
metadata with ``send_object`` over the CPU (gloo) group: two blocking sends, the pickled size and then the
bytes, before any GPU data moves. vLLM PR #4757 measured one gloo operation carrying a tensor dict's metadata at
0.128 ms (``Broadcast time (after): 0.128173828125ms``, one op instead of two); two of them are 0.256 ms."""


def check_pipeline_parallel(model: ModelSpec, pipeline_parallel: int) -> None:
    """Refuse a pipeline-parallel degree that leaves a stage without a layer.

    Raises:
        UserError: P < 1 or more stages than the model has layers.
    """
    p = pipeline_parallel
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise UserError(f"must be a positive integer, got {p!r}", field="pipeline_parallel")
    if p > model.num_layers:
        raise UserError(
            f"{p} stages for the {model.num_layers} layers of {model.name}: every stage needs a layer; "
            f"allowed: 1..{model.num_layers}",
            field="pipeline_parallel",
        )


def stage_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Transformer layers of each pipeline stage, first stage first (vLLM ``get_pp_indices``).

    Args:
        num_layers: the model's layers.
        stages: pipeline stages (1 <= stages <= num_layers).
    """
    partitions = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):  # the remainder to the stages before the last
        partitions[-i] += 1
    return tuple(partitions)


def stage_weight_bytes(model: ModelSpec, layers: int, *, first: bool, last: bool) -> int:
    """Weights of one pipeline stage of ``layers`` layers, over all its TP GPUs.

    Args:
        model: the model.
        layers: transformer layers the stage holds.
        first: it holds the embedding.
        last: it holds the LM head.
    """
    if first and last:  # the whole model (one matrix when tied)
        return model.weight_bytes
    vocab_matrix = model.vocab_size * model.hidden_size * model.dtype_bytes
    transformer = model.weight_bytes - model.embedding_params * model.dtype_bytes
    return -(-transformer * layers // model.num_layers) + vocab_matrix * (int(first) + int(last))


@dataclass(frozen=True)
class ActivationTransfer:
    """Time to move one micro-batch's activations from a stage to the next.

    Attributes:
        bytes_per_token: bytes every receiving GPU takes in per token (all tensors, all TP slices).
        bytes_per_s: the GPU's link rate, one direction (``GPUSpec.nvlink_gb_per_s``).
        latency_s: fixed cost of one hand-off (:data:`HOP_LATENCY_S`).
    """

    bytes_per_token: int
    bytes_per_s: float
    latency_s: float = HOP_LATENCY_S

    @classmethod
    def of(cls, model: ModelSpec, gpu: GPUSpec) -> ActivationTransfer:
        """The hand-off of ``model``'s activations between stages of ``gpu`` GPUs."""
        return cls(ACTIVATION_TENSORS * model.hidden_size * model.dtype_bytes, gpu.nvlink_gb_per_s * 1e9)

    def seconds(self, tokens: int) -> float:
        """Seconds to hand ``tokens`` tokens' activations to the next stage."""
        return self.latency_s + tokens * self.bytes_per_token / self.bytes_per_s
