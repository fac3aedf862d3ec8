"""One policy's simulation on a resolved scenario: a colocated policy or a disaggregated deployment.

The one place that tells the two apart, shared by :mod:`sim.runner` (every policy of a run) and
:mod:`sim.saturation` (the capacity replay of a policy).
"""

from __future__ import annotations

from typing import Any

from sim.config import DisaggregationConfig
from sim.resolve import ResolvedScenario
from sim.serving.engine import ProgressCallback, SimOutput, simulate


def simulate_policy(resolved: ResolvedScenario, policy: Any, progress: ProgressCallback | None = None) -> SimOutput:
    """The raw records of ``policy`` (a policy config or the disaggregation block) on ``resolved``'s stream."""
    if isinstance(policy, DisaggregationConfig):
        from sim.disaggregation import simulate_disaggregated

        return simulate_disaggregated(resolved, policy, progress)
    return simulate(resolved.stream, policy, resolved.engine_setup(policy), progress=progress)
