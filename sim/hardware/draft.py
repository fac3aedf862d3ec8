"""The draft model of speculative decoding: catalog checks and its cost model.

A draft model proposes tokens the target verifies, so it must share the target's
tokenizer: a different vocabulary is refused (a scenario mistake, exit code 2). It runs
on the target's GPUs at the same tensor-parallel degree (vLLM's default draft TP), so its
weights and KV cache come out of the target's KV budget (:func:`kv_with_draft`), and a
draft that does not fit is refused naming ``policies[i].speculative.draft_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.errors import UserError
from sim.hardware.all_reduce import AllReduceSpec
from sim.hardware.catalog import ModelSpec, get_model
from sim.hardware.cost_model import CostModel, load_cost_model
from sim.hardware.memory import KVBudget, with_draft_model


@dataclass(frozen=True)
class DraftModel:
    """A policy's draft model.

    Attributes:
        spec: the catalog model.
        field: the scenario field that names it (``policies[i].speculative.draft_model``).
    """

    spec: ModelSpec
    field: str


def draft_models(policies: list[Any], target: ModelSpec) -> dict[str, DraftModel]:
    """The draft model of every policy with ``speculative.method: draft_model``, by policy name.

    Raises:
        UserError: unknown draft model, or a vocabulary different from the target's.
    """
    found: dict[str, DraftModel] = {}
    for index, policy in enumerate(policies):
        spec = getattr(policy, "speculative", None)
        if spec is not None and spec.method == "draft_model":
            field = f"policies[{index}].speculative.draft_model"
            found[policy.name] = DraftModel(_draft_spec(spec.draft_model, target, field), field)
    return found


def kv_with_draft(kv: KVBudget, draft: DraftModel, tensor_parallel: int) -> KVBudget:
    """``kv`` less the draft model's weights and KV cache (:func:`~sim.hardware.memory.with_draft_model`).

    Raises:
        UserError: naming ``draft.field``, when the draft model does not fit.
    """
    try:
        return with_draft_model(kv, draft.spec, tensor_parallel)
    except UserError as exc:
        raise UserError(str(exc), field=draft.field) from None


def draft_cost_models(
    policies: list[Any], target: ModelSpec, gpu: str, tensor_parallel: int, *, cpu_overhead: bool
) -> dict[str, CostModel]:
    """Cost model of the draft model of every policy with ``speculative.method: draft_model``, by policy name.

    Raises:
        UserError: unknown draft model, a vocabulary different from the target's, or a
            tensor-parallel degree the draft model's heads cannot be split over.
    """
    found: dict[str, CostModel] = {}
    by_name = {policy.name: policy for policy in policies}
    for name, draft in draft_models(policies, target).items():
        try:
            # A policy with its own engine CPU model prices GPU time only, its draft passes too.
            own_cpu = getattr(by_name[name], "engine_cpu", None) is not None
            found[name] = load_cost_model(
                draft.spec.name, gpu, tensor_parallel, cpu_overhead=cpu_overhead and not own_cpu,
                all_reduce=AllReduceSpec.of(by_name[name]),
            )  # fmt: skip
        except UserError as exc:
            raise UserError(f"draft model {draft.spec.name}: {exc}", field=draft.field) from None
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
