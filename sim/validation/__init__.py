"""Validation against real serving runs: replay measured runs in batchsim and compare.

A *validation folder* (``../shared/validation/<set>/``) holds real measurements in one or
more shapes (:mod:`sim.validation.folder`): bursts (``summary.csv`` + one request CSV per
run, :mod:`sim.validation.data`), constant-rate load stages (:mod:`sim.validation.stages`)
and per-request server traces (:mod:`sim.validation.spans`). :func:`load_cases` reads and
checks a folder into replayable cases, each with its measured server
(:mod:`sim.validation.server`: the preset of its engine version and its recorded flags);
:func:`validate_folder` replays them and puts measured next to simulated.
``python -m sim validate-real DIR`` and ``python -m sim report`` write the tables
(docs/validation.md explains the method and the results).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

__all__ = [
    "RealRun", "load_validation_set", "load_cases", "benchmark_metrics", "replay_run", "replay_scenario",
    "validate_folder", "validate_set",
]  # fmt: skip
__getattr__ = lazy_attributes(
    __name__,
    {
        "RealRun": "sim.validation.data",
        "load_validation_set": "sim.validation.data",
        "load_cases": "sim.validation.folder",
        "benchmark_metrics": "sim.validation.metrics",
        "replay_run": "sim.validation.replay",
        "replay_scenario": "sim.validation.replay",
        "validate_folder": "sim.validation.report",
        "validate_set": "sim.validation.report",
    },
)

if TYPE_CHECKING:
    from sim.validation.data import RealRun, load_validation_set
    from sim.validation.folder import load_cases
    from sim.validation.metrics import benchmark_metrics
    from sim.validation.replay import replay_run, replay_scenario
    from sim.validation.report import validate_folder, validate_set
