"""Scenario schema: the typed, validated, frozen description of one experiment.

The schema lives in section modules (``scenario``: the :class:`Scenario` itself; ``workload``,
``serving``, ``disagg``; each policy kind's config beside its policy in ``sim/policies/``, joined
by ``policies``; what combines with what in ``compat``). Every public name is re-exported here and
loads on first use, so a policy module can import the config layer without an import cycle.
Loading and overrides live in :mod:`sim.io.scenario`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

_HOMES = {
    **dict.fromkeys(
        (
            "Scenario",
        ),
        "sim.config.scenario",
    ),
    **dict.fromkeys(
        (
            "StrictModel",
            "Float",
            "Int",
            "PositiveFloat",
            "MAX_DURATION_S",
            "MAX_RATE",
            "MIN_RATE",
            "MAX_KV_BLOCKS",
            "MAX_REQUESTS",
            "MAX_TOKENS",
            "RECORD_BYTES_PER_REQUEST",
        ),
        "sim.config.base",
    ),
    **dict.fromkeys(
        (
            "DisaggregationConfig",
            "LinkConfig",
            "PoolConfig",
            "LINK_DEFAULTS",
            "expand_pool_presets",
        ),
        "sim.config.disagg",
    ),
    **dict.fromkeys(
        (
            "with_overrides",
        ),
        "sim.config.overrides",
    ),
    **dict.fromkeys(
        (
            "AllReduceConfig",
        ),
        "sim.config.policy_base",
    ),
    **dict.fromkeys(
        (
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
        ),
        "sim.config.policies",
    ),
    **dict.fromkeys(
        (
            "AdmissionConfig",
            "ClientConfig",
            "CostConfig",
            "EngineConfig",
            "FrontendConfig",
            "MemoryConfig",
            "MetricsConfig",
            "SLOConfig",
        ),
        "sim.config.serving",
    ),
    **dict.fromkeys(
        (
            "format_validation_error",
        ),
        "sim.config.validation_errors",
    ),
    **dict.fromkeys(
        (
            "Arrival",
            "Length",
            "BurstArrival",
            "ClosedLoopArrival",
            "ConstantArrival",
            "EmpiricalLength",
            "FixedLength",
            "GammaArrival",
            "LognormalLength",
            "NormalLength",
            "PoissonArrival",
            "ScheduleArrival",
            "SchedulePhase",
            "Sessions",
            "SharedPrefix",
            "TraceArrival",
            "UniformLength",
            "Workload",
            "ZipfLength",
        ),
        "sim.config.workload",
    ),
}
__all__ = [  # noqa: RUF022 - sorted
    "ACCEPTANCE_BY_TEXT",
    "AcceptanceDistribution",
    "AdmissionConfig",
    "AllReduceConfig",
    "Arrival",
    "BetaAcceptance",
    "BurstArrival",
    "ChunkedPrefillPolicyConfig",
    "ClientConfig",
    "ClosedLoopArrival",
    "ConstantArrival",
    "ContinuousPolicyConfig",
    "CostConfig",
    "DisaggregationConfig",
    "EmpiricalLength",
    "EngineCPUConfig",
    "EngineConfig",
    "FixedLength",
    "Float",
    "FrontendConfig",
    "GammaArrival",
    "Int",
    "LINK_DEFAULTS",
    "Length",
    "LinkConfig",
    "LognormalLength",
    "MAX_DURATION_S",
    "MAX_KV_BLOCKS",
    "MAX_RATE",
    "MAX_REQUESTS",
    "MAX_TOKENS",
    "MIN_RATE",
    "MemoryConfig",
    "MetricsConfig",
    "NormalLength",
    "PagedPolicyConfig",
    "PoissonArrival",
    "PolicyConfig",
    "PolicyConfigBase",
    "PoolConfig",
    "PositiveFloat",
    "RECORD_BYTES_PER_REQUEST",
    "SLOConfig",
    "Scenario",
    "ScheduleArrival",
    "SchedulePhase",
    "Sessions",
    "SharedPrefix",
    "SpeculativeConfig",
    "StaticPolicyConfig",
    "StrictModel",
    "TraceArrival",
    "UniformAcceptance",
    "UniformLength",
    "Workload",
    "ZipfLength",
    "expand_pool_presets",
    "format_validation_error",
    "with_overrides",
]
__getattr__ = lazy_attributes(__name__, _HOMES)

if TYPE_CHECKING:
    from sim.config.base import (
        MAX_DURATION_S,
        MAX_KV_BLOCKS,
        MAX_RATE,
        MAX_REQUESTS,
        MAX_TOKENS,
        MIN_RATE,
        RECORD_BYTES_PER_REQUEST,
        Float,
        Int,
        PositiveFloat,
        StrictModel,
    )
    from sim.config.disagg import (
        LINK_DEFAULTS,
        DisaggregationConfig,
        LinkConfig,
        PoolConfig,
        expand_pool_presets,
    )
    from sim.config.overrides import (
        with_overrides,
    )
    from sim.config.policies import (
        ACCEPTANCE_BY_TEXT,
        AcceptanceDistribution,
        BetaAcceptance,
        ChunkedPrefillPolicyConfig,
        ContinuousPolicyConfig,
        EngineCPUConfig,
        PagedPolicyConfig,
        PolicyConfig,
        PolicyConfigBase,
        SpeculativeConfig,
        StaticPolicyConfig,
        UniformAcceptance,
    )
    from sim.config.policy_base import (
        AllReduceConfig,
    )
    from sim.config.scenario import (
        Scenario,
    )
    from sim.config.serving import (
        AdmissionConfig,
        ClientConfig,
        CostConfig,
        EngineConfig,
        FrontendConfig,
        MemoryConfig,
        MetricsConfig,
        SLOConfig,
    )
    from sim.config.validation_errors import (
        format_validation_error,
    )
    from sim.config.workload import (
        Arrival,
        BurstArrival,
        ClosedLoopArrival,
        ConstantArrival,
        EmpiricalLength,
        FixedLength,
        GammaArrival,
        Length,
        LognormalLength,
        NormalLength,
        PoissonArrival,
        ScheduleArrival,
        SchedulePhase,
        Sessions,
        SharedPrefix,
        TraceArrival,
        UniformLength,
        Workload,
        ZipfLength,
    )
