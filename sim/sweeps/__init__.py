"""Sweeps, SLO capacity search and execution backends.

* :func:`sweep`: every combination of a parameter grid, for several seeds, as one tidy
  DataFrame (and an incrementally written, resumable ``sweep.csv``);
* :func:`capacity`: per policy, the highest arrival rate that meets a latency SLO;
* backends: ``local`` (a process pool) and ``ray`` (a local Ray or a cluster).

``python -m sim sweep`` and ``python -m sim capacity`` call these same functions.
"""

from sim.sweeps.capacity import capacity
from sim.sweeps.runner import sweep

__all__ = ["capacity", "sweep"]
