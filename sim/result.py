"""What a run returns, as plain data: the summary and the per-request and per-iteration tables.

Writers (:mod:`sim.io.outputs`, :mod:`sim.report`) take this type; :class:`sim.runner.RunResult`
extends it with ``save`` and notebook display, so the data never depends on its writers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sim.config import Scenario


@dataclass
class RunData:
    """Outcome of one scenario: one summary row per policy plus per-request and per-iteration records.

    The data only; :class:`sim.runner.RunResult` adds saving and display.

    Attributes:
        scenario: the validated scenario that was run.
        facts: derived values (KV capacity, calibration used, ...).
        summary: one row per policy; columns as ``summary.csv``.
        requests: one row per request per policy (categorical ``policy`` column first).
        iterations: per policy every k-th forward pass, k = ``facts["iterations_every"][policy]``
            (1 up to ``metrics.max_iteration_rows`` passes; the summary used all of them).
        runtime_s: wall-clock seconds the simulations and summaries took.
        summary_only: ``requests`` and ``iterations`` are empty (right columns, no rows):
            only the summary was kept, so no per-request/per-iteration files or plots.
        benchmark: per policy, its figures under vLLM benchmark_serving's result keys
            (:mod:`sim.metrics.benchmark`; written as ``benchmark.json`` by ``run --json``).
    """

    scenario: Scenario
    facts: dict[str, Any]
    summary: pd.DataFrame
    requests: pd.DataFrame
    iterations: pd.DataFrame
    runtime_s: float = 0.0
    seed: int = field(default=0)
    summary_only: bool = False
    benchmark: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def iterations_every(self) -> dict[str, int]:
        """Per policy, how many forward passes each row of ``iterations`` stands for (its k).

        1 for a policy the facts do not name (every pass kept); pass it as ``every`` to
        :func:`sim.report.plots.timeline` so sampled rows count for the passes dropped.
        """
        recorded = self.facts.get("iterations_every", {})
        return {str(name): int(recorded.get(name, 1)) for name in self.summary.get("policy", [])}

    @property
    def replicas_per_policy(self) -> dict[str, int] | None:
        """Per policy, the GPU workers its summary averages over (all of them, busy or not);
        None for a summary without that column."""
        if "replicas" not in self.summary.columns:
            return None
        counts = zip(self.summary["policy"], self.summary["replicas"], strict=True)
        return {str(name): int(count) for name, count in counts}
