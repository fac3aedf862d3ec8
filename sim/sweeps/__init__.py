"""Sweeps, SLO capacity search and execution backends.

* :func:`sweep`: every combination of a parameter grid, for several seeds, as one tidy
  DataFrame (and an incrementally written, resumable ``sweep.csv``);
* :func:`capacity`: per policy, the highest arrival rate that meets a latency SLO;
* backends: ``local`` (a process pool) and ``ray`` (a local Ray or a cluster).

``python -m sim sweep`` and ``python -m sim capacity`` call these same functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

__all__ = ["capacity", "sweep"]
__getattr__ = lazy_attributes(__name__, {"capacity": "sim.sweeps.slo_capacity", "sweep": "sim.sweeps.runner"})

if TYPE_CHECKING:
    from sim.sweeps.runner import sweep
    from sim.sweeps.slo_capacity import capacity
