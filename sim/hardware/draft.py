"""The draft model of speculative decoding: catalog checks and its cost model.

A draft model proposes tokens the target verifies, so it must share the target's
tokenizer: a different vocabulary is refused (a scenario mistake, exit code 2). It runs
on the target's GPUs at the same tensor-parallel degree (vLLM's default draft TP).
"""

from __future__ import annotations

from typing import Any

from sim.errors import UserError
from sim.hardware.catalog import ModelSpec, get_model
from sim.hardware.cost_model import CostModel, load_cost_model


def draft_cost_models(
    policies: list[Any], target: ModelSpec, gpu: str, tensor_parallel: int, *, cpu_overhead: bool
) -> dict[str, CostModel]:
    """Cost model of the draft model of every policy with ``speculative.method: draft_model``, by policy name.

    Raises:
        UserError: unknown draft model, a vocabulary different from the target's, or a
            tensor-parallel degree the draft model's heads cannot be split over.
    """
    found: dict[str, CostModel] = {}
    for index, policy in enumerate(policies):
        spec = getattr(policy, "speculative", None)
        if spec is None or spec.method != "draft_model":
            continue
        field = f"policies[{index}].speculative.draft_model"
        draft = _draft_spec(spec.draft_model, target, field)
        try:
            # A policy with its own engine CPU model prices GPU time only, its draft passes too.
            own_cpu = getattr(policy, "engine_cpu", None) is not None
            found[policy.name] = load_cost_model(
                draft.name, gpu, tensor_parallel, cpu_overhead=cpu_overhead and not own_cpu
            )
        except UserError as exc:
            raise UserError(f"draft model {draft.name}: {exc}", field=field) from None
    return found


def _draft_spec(name: str, target: ModelSpec, field: str) -> ModelSpec:
    try:
        draft = get_model(name)
    except UserError as exc:
        raise UserError(str(exc).removeprefix("model: "), field=field) from None
    if draft.vocab_size != target.vocab_size:
        raise UserError(
            f"'{name}' has a vocabulary of {draft.vocab_size} tokens, the target {target.name} "
            f"{target.vocab_size}: a draft model must share the target's tokenizer",
            field=field,
        )
    return draft
