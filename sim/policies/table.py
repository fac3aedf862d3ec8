"""The batching policies: one table from a scenario's ``kind`` to the policy that implements it.

Each entry is a :class:`~sim.policies.base.Policy` subclass that carries its config class
(``config_class``, whose ``kind`` literal is the key) and its traits (memory discipline,
which features it runs). Adding a policy is its own file under ``sim/policies/`` and one
row here (docs/extending.md).
"""

from __future__ import annotations

from typing import Any

from sim.errors import UserError, did_you_mean
from sim.policies.base import Policy
from sim.policies.chunked_prefill import ChunkedPrefillPolicy
from sim.policies.continuous import ContinuousPolicy
from sim.policies.paged import PagedPolicy
from sim.policies.static import StaticPolicy

POLICIES: dict[str, type[Policy]] = {
    "static": StaticPolicy,
    "continuous": ContinuousPolicy,
    "paged": PagedPolicy,
    "chunked_prefill": ChunkedPrefillPolicy,
}
"""Policy kind (the config's ``kind``) -> policy class."""


def policy_class(kind: str) -> type[Policy]:
    """The policy class of ``kind``.

    Raises:
        UserError: ``kind`` is not a known policy.
    """
    if kind not in POLICIES:
        raise UserError(
            f"unknown policy kind {kind!r}{did_you_mean(str(kind), POLICIES)}; choose one of {', '.join(POLICIES)}",
            field="policies.kind",
        )
    return POLICIES[kind]


def make_policy(config: Any) -> Policy:
    """Build the policy a config describes.

    Args:
        config: a policy config (``StaticPolicyConfig``, ...).

    Raises:
        UserError: the config's kind is not a known policy.
    """
    return policy_class(str(getattr(config, "kind", None)))(config)


def kinds_with(trait: str, value: Any) -> tuple[str, ...]:
    """The kinds whose policy class has ``trait == value`` (``memory``, ``speculates``, ...)."""
    return tuple(kind for kind, cls in POLICIES.items() if getattr(cls, trait) == value)


def kinds_for_pool(role: str) -> tuple[str, ...]:
    """The kinds that can run a disaggregated ``role`` pool ('prefill' or 'decode')."""
    return tuple(kind for kind, cls in POLICIES.items() if role in cls.pool_roles)
