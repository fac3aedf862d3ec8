"""Validation against real serving runs: replay measured runs in batchsim and compare.

A *validation folder* (``../shared/validation/<set>/``) holds ``summary.csv`` (one row
per real run, the figures vLLM's ``benchmark_serving.py`` printed) and one CSV per run
with every request's lengths and measured TTFT. :func:`load_validation_set` reads and
checks it; :func:`replay_run` simulates one run in batchsim with the real server's
settings; :mod:`sim.validation.metrics` computes the figures exactly as
benchmark_serving computes them; :func:`validate_set` puts measured next to simulated.
``python -m sim validate-real DIR`` and ``python -m sim report`` write the tables
(docs/validation.md explains the method and the results).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

__all__ = ["RealRun", "load_validation_set", "benchmark_metrics", "replay_run", "replay_scenario", "validate_set"]
__getattr__ = lazy_attributes(
    __name__,
    {
        "RealRun": "sim.validation.data",
        "load_validation_set": "sim.validation.data",
        "benchmark_metrics": "sim.validation.metrics",
        "replay_run": "sim.validation.replay",
        "replay_scenario": "sim.validation.replay",
        "validate_set": "sim.validation.report",
    },
)

if TYPE_CHECKING:
    from sim.validation.data import RealRun, load_validation_set
    from sim.validation.metrics import benchmark_metrics
    from sim.validation.replay import replay_run, replay_scenario
    from sim.validation.report import validate_set
