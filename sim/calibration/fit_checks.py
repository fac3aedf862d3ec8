"""The last check before a calibration or roofline file is written: every fitted number usable.

The profiles are checked as they are read (:mod:`sim.calibration.profiles`), yet a fit on
valid rows can still go wrong: a degenerate design matrix, medians of 1e300 ms times 80
layers overflowing, a held-out half with no row above 0.05 ms to score on. A run would
then price every pass with garbage (NaN medians once gave ``launch_ms: 4.6e-310`` and
``mape: .nan``, written with exit code 0). So before a file is written every number in
it is checked, by the name it is written under:

* every number: finite, and not subnormal (below 2.2e-308 a float has lost its precision;
  no measured time is that small, only an arithmetic accident is);
* ``ms`` (the values of a curve): > 0, a pass takes time;
* ``*_ms`` (coefficients, latencies): >= 0 (the non-negative fit may zero a term), and an
  attention form (``decode``, ``prefill``) must have some term > 0;
* ``mape``, ``worst``: >= 0; ``rows`` (rows scored, or LM-head knots): >= 1.

A calibration of one (model, GPU, TP) must also load as the run would load it
(:class:`~sim.hardware.cost_model.CostModel`: increasing knots, non-decreasing values).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

from sim.errors import UserError, shown
from sim.hardware.catalog import ModelSpec

_ATTENTION_FORMS = ("decode", "prefill")


def check_fitted(data: dict, what: str) -> None:
    """Raise unless every number of ``data`` (a calibration or roofline file) is usable.

    Args:
        data: the file's content, as it would be written.
        what: the file, for the message (e.g. ``"calibration of llama-2-7b on a100-80gb TP1"``).

    Raises:
        UserError: the first unusable number, by its dotted name, with its value and why.
    """
    for name, value in _numbers(data, ""):
        problem = _problem(name, value)
        if problem:
            raise UserError(
                f"{what}: fitted {name} = {shown(value)} {problem}; nothing was written (check the profile rows "
                "it was fitted on)",
                field="profiles",
            )
    for name, form in _attention_forms(data, ""):
        if not any(v > 0 for k, v in form.items() if k.endswith("_ms")):
            raise UserError(
                f"{what}: fitted {name} has every term 0, so attention would take no time; nothing was written",
                field="profiles",
            )


def check_loadable(data: dict, model: ModelSpec, what: str) -> None:
    """Raise unless ``data`` loads as a run loads a calibration of ``model`` (see module docstring)."""
    from sim.hardware.cost_model import CostModel

    try:
        CostModel(data, model, label="calibrated", source=what)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{what}: a run could not load it ({exc}); nothing was written", field="profiles") from None


def _numbers(node: Any, name: str) -> Iterator[tuple[str, float]]:
    """(dotted name, value) of every number in ``node``; list items take their list's name."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, f"{name}.{key}" if name else str(key))
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _numbers(value, name)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield name, node


def _problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be written under ``name``, or None."""
    if not math.isfinite(value):
        return "is not a finite number"
    if value != 0 and abs(value) < sys.float_info.min:
        return "is subnormal (an arithmetic accident, not a measurement)"
    key = name.rsplit(".", 1)[-1]
    if key == "ms" and value <= 0:
        return "must be > 0 ms (a pass takes time)"
    if (key.endswith("_ms") or key in ("mape", "worst")) and value < 0:
        return "must be >= 0"
    if key == "rows" and value < 1:
        return "must be >= 1 (a fit error scored on no rows is no score)"
    return None


def _attention_forms(node: Any, name: str) -> Iterator[tuple[str, dict]]:
    """Every ``decode``/``prefill`` mapping of coefficients in ``node``, with its dotted name."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        full = f"{name}.{key}" if name else str(key)
        if key in _ATTENTION_FORMS and isinstance(value, dict) and any(k.endswith("_ms") for k in value):
            yield full, value
        else:
            yield from _attention_forms(value, full)
