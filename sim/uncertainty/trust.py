"""The columns a run appends to ``summary.csv`` so its numbers say how far to trust them.

After every column of :mod:`sim.metrics.summary` (never renaming one), in this order:

- ``replicates``: K, the seeds the figures were computed over (``run --replicates K``);
- ``extrapolated_frac``: the share of pass time priced beyond the profiled step shapes;
- ``flags``: the out-of-range flags that fired (:mod:`sim.uncertainty.flags`), ``;``-separated, or ``none``;
- ``interval_basis``: what the intervals rest on (statistical part; the model-error cell and its runs);
- ``<metric>_lo``, ``<metric>_hi`` for every figure of :data:`sim.uncertainty.intervals.HEADLINE`: its 90%
  interval. With K > 1 replicates each such figure is the replicates' mean; every other column, and the
  request and iteration records, are replicate 0's (the scenario's own seed).

:class:`PolicyEvidence` is what one policy's simulation leaves for these columns while its records are
alive (:mod:`sim.runner` collects it); :func:`with_trust_columns` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim.hardware.profiled_range import extrapolated_share
from sim.uncertainty.flags import row_flags
from sim.uncertainty.intervals import (
    HEADLINE,
    INTERVAL_COLUMNS,
    Bounds,
    ModelContext,
    basis_text,
    interval_columns,
    replicate_bounds,
    sampling_bounds,
    seed_free,
    unvalidated_error,
)

NO_FLAGS = "none"
"""The ``flags`` cell of a row where no flag fired (a word, so the CSV reads back as written)."""
TRUST_COLUMNS: tuple[str, ...] = ("replicates", "extrapolated_frac", "flags", "interval_basis", *INTERVAL_COLUMNS)
"""Columns appended after the summary's own, in this order."""


@dataclass(frozen=True)
class PolicyEvidence:
    """What one policy's run leaves for its trust columns.

    Attributes:
        extrapolated_frac: share of its pass time priced beyond the profiled step shapes (NaN: unknown).
        sampling: the statistical spread of its figures from its own requests (one replicate).
        exact: no seed changes the run: its figures are exact for its requests.
        requests: requests its latency figures were computed from.
        model: what its model error depends on.
    """

    extrapolated_frac: float
    sampling: Bounds
    exact: bool
    requests: int
    model: ModelContext


def policy_evidence(
    resolved: Any, policy: Any, out: Any, row: Mapping[str, Any], workload_fixed: bool
) -> PolicyEvidence:
    """What one policy's run leaves for its trust columns, from its full records ``out`` and summary ``row``
    (with ``load_frac``); ``workload_fixed``: no seed changes the requests
    (:func:`sim.uncertainty.intervals.workload_seed_free`)."""
    from sim.config import DisaggregationConfig

    cost = resolved.cost_model if isinstance(policy, DisaggregationConfig) else resolved.policy_cost_model(policy)
    exact = seed_free(resolved, policy, workload_fixed)
    warmup_s = resolved.scenario.metrics.warmup_s
    requests = out.requests
    measured = int(((requests["status"] == "completed") & (requests["arrival_s"] >= warmup_s)).sum())
    return PolicyEvidence(
        extrapolated_frac=extrapolated_share(out.iterations, cost.profiled),
        sampling=sampling_bounds(row, requests, warmup_s, exact=exact),
        exact=exact,
        requests=measured,
        model=ModelContext(getattr(policy, "preset", None), cost.label, unvalidated_error(cost)),
    )


def with_trust_columns(
    summary: pd.DataFrame,
    evidence: Mapping[str, PolicyEvidence],
    replicates: Sequence[pd.DataFrame] = (),
) -> pd.DataFrame:
    """``summary`` (replicate 0's rows) with :data:`TRUST_COLUMNS` appended.

    Args:
        summary: one row per policy of the scenario's own seed.
        evidence: per policy (by name), what its replicate-0 run left.
        replicates: the summaries of replicates 1..K-1 (the same policies); empty for one replicate.
    """
    count = 1 + len(replicates)
    rows = []
    for index in range(len(summary)):
        row = summary.iloc[index].to_dict()
        found = evidence[str(row["policy"])]
        bounds = found.sampling
        if replicates:
            others = [_row_of(frame, row["policy"]) for frame in replicates]
            means, bounds = replicate_bounds([row, *others])
            row |= means  # each headline figure: the replicates' mean
        row["replicates"] = count
        row["extrapolated_frac"] = found.extrapolated_frac
        row["flags"] = ";".join(row_flags(row, found.model.cost_label)) or NO_FLAGS
        row["interval_basis"] = basis_text(count, found.requests, found.exact, found.model, float(row["load_frac"]))
        row |= interval_columns(row, bounds, found.model)
        rows.append(row)
    columns = [*summary.columns, *(c for c in TRUST_COLUMNS if c not in summary.columns)]
    return pd.DataFrame(rows, columns=columns)


def _row_of(frame: pd.DataFrame, policy: str) -> dict[str, float]:
    match = frame[frame["policy"] == policy]
    return match.iloc[0].to_dict() if len(match) else dict.fromkeys(HEADLINE, float("nan"))
