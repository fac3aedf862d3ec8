"""Batching policies: one explicit table from config kind to policy class (:mod:`sim.policies.table`).

Each policy only decides what the next iteration runs (``schedule(view) -> IterationPlan``);
the engine in :mod:`sim.serving` owns time, memory and bookkeeping. The names below load on
first use, so a policy module can import the config layer without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

__all__ = ["POLICIES", "IterationPlan", "Policy", "SchedulerView", "make_policy"]
__getattr__ = lazy_attributes(
    __name__,
    {
        "POLICIES": "sim.policies.table",
        "make_policy": "sim.policies.table",
        "IterationPlan": "sim.policies.base",
        "Policy": "sim.policies.base",
        "SchedulerView": "sim.policies.base",
    },
)

if TYPE_CHECKING:
    from sim.policies.base import IterationPlan, Policy, SchedulerView
    from sim.policies.table import POLICIES, make_policy
