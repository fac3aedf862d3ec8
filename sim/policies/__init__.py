"""Batching policies: one explicit table from config kind to policy class.

Each policy only decides what the next iteration runs (``schedule(view) -> IterationPlan``);
the engine in :mod:`sim.serving` owns time, memory and bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.errors import UserError, did_you_mean
from sim.policies.base import IterationPlan, Policy, SchedulerView
from sim.policies.chunked_prefill import ChunkedPrefillPolicy
from sim.policies.continuous import ContinuousPolicy
from sim.policies.paged import PagedPolicy
from sim.policies.static import StaticPolicy

POLICIES: dict[str, Callable[[Any], Policy]] = {
    "static": StaticPolicy,
    "continuous": ContinuousPolicy,
    "paged": PagedPolicy,
    "chunked_prefill": ChunkedPrefillPolicy,
}
"""Policy kind (the config's ``kind``) -> policy class."""


def make_policy(config: Any) -> Policy:
    """Build the policy a config describes.

    Args:
        config: a policy config from :mod:`sim.config` (StaticPolicyConfig, ...).

    Raises:
        UserError: the config's kind is not a known policy.
    """
    kind = getattr(config, "kind", None)
    if kind not in POLICIES:
        raise UserError(
            f"unknown policy kind {kind!r}{did_you_mean(str(kind), POLICIES)}; "
            f"choose one of {', '.join(POLICIES)}",
            field="policies.kind",
        )
    return POLICIES[kind](config)


__all__ = ["POLICIES", "IterationPlan", "Policy", "SchedulerView", "make_policy"]
