"""What combines with what: the one table of feature pairs a scenario may not use together.

Every feature either simulates with every other or is refused here, by ``validate`` and
``run`` alike (the scenario's own validation calls :func:`check_combinations`), with one
line naming both fields and why. The policies' traits (:mod:`sim.policies.table`: memory
discipline, ``speculates``, ``multi_step``, ``pool_roles``) decide; nothing is accepted
and then ignored. docs/extending.md lists the whole matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.policies.table import POLICIES, kinds_for_pool, kinds_with


@dataclass(frozen=True)
class Refusal:
    """One pair of features that cannot run together.

    Attributes:
        field: the policy field the message is attached to (the second feature is in ``reason``).
        applies: ``applies(policy_config, policy_class, pool)`` with pool None, 'prefill' or 'decode'.
        reason: why, formatted with ``kind``, ``steps`` and the kinds that would do (``allowed``).
    """

    field: str
    applies: Callable[[Any, Any, str | None], bool]
    reason: str


def _steps(policy: Any) -> int:
    return int(getattr(policy, "num_scheduler_steps", 1))


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "prefix_caching",
        lambda p, cls, pool: bool(p.prefix_caching) and cls.memory != "paged",
        "prefix caching shares paged KV blocks, and kind '{kind}' reserves contiguous KV per request; "
        "allowed for {paged}",
    ),
    Refusal(
        "speculative",
        lambda p, cls, pool: p.speculative is not None and not cls.speculates,
        "kind '{kind}' cannot speculate (a static batch's generate() drafts for batch size 1 only); allowed for "
        "{speculating}",
    ),
    Refusal(
        "speculative",
        lambda p, cls, pool: p.speculative is not None and _steps(p) > 1,
        "speculative decoding needs num_scheduler_steps = 1, got {steps} (vLLM runs speculative decoding one "
        "step at a time, never in multi-step blocks)",
    ),
    Refusal(
        "num_scheduler_steps",
        lambda p, cls, pool: _steps(p) > 1 and not cls.multi_step,
        "kind '{kind}' plans one pass at a time; multi-step scheduling (vLLM 0.6 --num-scheduler-steps) is "
        "allowed for {multi_step}",
    ),
    Refusal(
        "kind",
        lambda p, cls, pool: pool is not None and pool not in cls.pool_roles,
        "kind '{kind}' cannot run a {pool} pool; allowed: {pool_kinds}",
    ),
    Refusal(
        "speculative",
        lambda p, cls, pool: pool == "prefill" and p.speculative is not None,
        "a prefill pool never decodes (each request leaves after its first token): set speculative on "
        "disaggregation.decode.policy",
    ),
    Refusal(
        "num_scheduler_steps",
        lambda p, cls, pool: pool == "prefill" and _steps(p) > 1,
        "a prefill pool never decodes (each request leaves after its first token): multi-step scheduling "
        "belongs on disaggregation.decode.policy",
    ),
)
"""Every refused pair, each attached to one of its two fields."""

PIPELINE_REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "speculative",
        lambda p, cls, pool: p.speculative is not None,
        "speculative decoding cannot run with pipeline_parallel = {stages}: batchsim does not model where a "
        "drafter runs among pipeline stages; use pipeline_parallel: 1 or drop speculative",
    ),
)
"""Pairs of a colocated policy's feature with ``pipeline_parallel`` > 1 (checked only then)."""


def refusal(policy: Any, pool: str | None = None, stages: int = 1) -> tuple[str, str] | None:
    """(field, reason) of the first pair ``policy`` may not combine (in pool ``pool``, on ``stages``
    pipeline stages), or None."""
    cls = POLICIES[policy.kind]
    rules = REFUSALS + (PIPELINE_REFUSALS if stages > 1 and pool is None else ())
    for rule in rules:
        if rule.applies(policy, cls, pool):
            reason = rule.reason.format(
                kind=policy.kind, steps=_steps(policy), pool=pool, stages=stages,
                paged=", ".join(kinds_with("memory", "paged")), speculating=", ".join(kinds_with("speculates", True)),
                multi_step=", ".join(kinds_with("multi_step", True)),
                pool_kinds=", ".join(kinds_for_pool(pool)) if pool else "",
            )  # fmt: skip
            return rule.field, reason
    return None


def check_combinations(scenario: Any) -> None:
    """Raise ValueError with one line for the first refused pair of ``scenario``'s features.

    Raises:
        ValueError: ``<path>.<field>: <why, naming the other feature>``.
    """
    entries: list[tuple[str, Any, str | None]] = [
        (f"policies[{i}]", policy, None) for i, policy in enumerate(scenario.policies)
    ]
    block = scenario.disaggregation
    if block is not None:
        pools = ("prefill", "decode")
        entries += [(f"disaggregation.{pool}.policy", getattr(block, pool).policy, pool) for pool in pools]
    stages = int(getattr(scenario, "pipeline_parallel", 1))
    for path, policy, pool in entries:
        found = refusal(policy, pool, stages)
        if found is not None:
            field, reason = found
            raise ValueError(f"{path}.{field}: {reason}")
