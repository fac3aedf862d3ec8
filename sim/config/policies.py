"""The scenario's ``policies`` entries: one config per policy kind, joined from the policy table.

Each kind's config is defined beside its policy (``sim/policies/<kind>.py``); this module
makes the discriminated union the schema validates against, in the table's order, and
re-exports every config so ``from sim.config import PagedPolicyConfig`` keeps working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field

from sim.config.policy_base import (
    ACCEPTANCE_BY_TEXT,
    AcceptanceDistribution,
    BetaAcceptance,
    EngineCPUConfig,
    PolicyConfigBase,
    SpeculativeConfig,
    UniformAcceptance,
    fill_acceptance,
)
from sim.policies.chunked_prefill import ChunkedPrefillPolicyConfig
from sim.policies.continuous import ContinuousPolicyConfig
from sim.policies.paged import PagedPolicyConfig
from sim.policies.static import StaticPolicyConfig
from sim.policies.table import POLICIES

if TYPE_CHECKING:  # what a type checker sees; at run time the union is the table's
    PolicyConfig = StaticPolicyConfig | ContinuousPolicyConfig | PagedPolicyConfig | ChunkedPrefillPolicyConfig
else:
    PolicyConfig = Annotated[
        Union[tuple(cls.config_class for cls in POLICIES.values())],  # noqa: UP007
        Field(discriminator="kind"),
    ]
    """Any policy kind's config, chosen by ``kind`` (the table :data:`sim.policies.table.POLICIES`)."""

__all__ = [
    "ACCEPTANCE_BY_TEXT",
    "AcceptanceDistribution",
    "BetaAcceptance",
    "ChunkedPrefillPolicyConfig",
    "ContinuousPolicyConfig",
    "EngineCPUConfig",
    "PagedPolicyConfig",
    "PolicyConfig",
    "PolicyConfigBase",
    "SpeculativeConfig",
    "StaticPolicyConfig",
    "UniformAcceptance",
    "fill_acceptance",
]
