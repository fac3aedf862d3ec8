"""Out-of-range flags: where a run's figures rest on less than the validation behind the intervals.

A summary row's ``flags`` column lists, separated by ``;``, every flag that fires (``none`` where none does):

- ``extrapolated``: at least :data:`EXTRAPOLATED_SHARE` of the pass time was priced beyond the step
  shapes the cost model's profiles cover (``extrapolated_frac``, :mod:`sim.hardware.profiled_range`:
  token counts, decode batch sizes, contexts, prefill chunks);
- ``uncalibrated_gpu``: the GPU has no profiles: a datasheet roofline with A100 efficiencies prices it;
- ``uncalibrated_model``: the model has no calibration of its own (nor a same-shape twin's) on this GPU: a
  roofline with efficiencies fitted on the GPU's other models prices it (``transferred``);
- ``near_capacity``: ``load_frac`` above :data:`NEAR_CAPACITY` of the simulated capacity, where a small
  error in a step's cost becomes a large error in queueing latency.

:func:`flag_lines` writes one line per flag that fired, naming the policies, for ``summary.md`` and the terminal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from sim.uncertainty.model_error import cost_class

EXTRAPOLATED_SHARE = 0.01
"""Share of pass time priced by extrapolation from which ``extrapolated`` fires."""
NEAR_CAPACITY = 0.9
"""``load_frac`` above which ``near_capacity`` fires."""
FLAGS: dict[str, str] = {
    "extrapolated": "GPU time priced beyond the profiled token counts, batch sizes or contexts",
    "uncalibrated_gpu": "a GPU without profiles, priced by a datasheet roofline with A100 efficiencies",
    "uncalibrated_model": "a model without its own calibration on this GPU, priced by a roofline fitted on the "
    "GPU's other models",
    "near_capacity": f"load above {NEAR_CAPACITY:g} of the simulated capacity, where a small error in a step's cost "
    "becomes a large error in latency",
}
"""Flag -> what it means (in the order flags are listed)."""


def row_flags(row: Mapping[str, Any], cost_label: str) -> list[str]:
    """The flags of one summary row priced by a cost model labelled ``cost_label``."""
    klass = cost_class(cost_label)
    fired = {
        "extrapolated": _finite(row.get("extrapolated_frac")) >= EXTRAPOLATED_SHARE,
        "uncalibrated_gpu": klass == "roofline",
        "uncalibrated_model": klass == "transferred",
        "near_capacity": _finite(row.get("load_frac")) > NEAR_CAPACITY,
    }
    return [name for name in FLAGS if fired[name]]


def flag_lines(summary: pd.DataFrame) -> list[str]:
    """One line per flag fired in ``summary`` (its ``flags`` column): the flag, what it means, and per policy the
    figure behind it."""
    if "flags" not in summary.columns:
        return []
    lines = []
    for name, meaning in FLAGS.items():
        hits = [row for _, row in summary.iterrows() if name in str(row["flags"] or "").split(";")]
        if hits:
            detail = ", ".join(f"{row['policy']}{_detail(name, row)}" for row in hits)
            lines.append(f"flag {name}: {meaning} ({detail}).")
    return lines


def _detail(name: str, row: pd.Series) -> str:
    if name == "near_capacity":
        return f" at load {row['load_frac']:.2f}"
    if name == "extrapolated":
        return f" {row['extrapolated_frac']:.0%} of GPU time"
    return ""


def _finite(value: Any) -> float:
    """``value`` as a float; -inf where it is missing or NaN (so no threshold fires on it)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return number if not math.isnan(number) else -math.inf
