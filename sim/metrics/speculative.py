"""Summary statistics of speculative decoding, from the per-request counters.

Per request the engine counts verification steps S_r, draft tokens proposed P_r and
accepted A_r (``spec_steps``, ``spec_proposed_tokens``, ``spec_accepted_tokens``). Each
step yields its accepted drafts plus one token of the target, and verifies P + 1 positions
per sequence (gamma_r drafts and the token fed in), of which the rejected ones are wasted:

* ``spec_tokens_per_step`` = sum(S + A) / sum(S): tokens per sequence per step;
* ``spec_acceptance`` = sum(A) / sum(P): share of draft tokens accepted;
* ``spec_wasted_frac`` = sum(P - A) / sum(P + S): share of the verified positions whose
  result was thrown away (target compute spent on rejected drafts).

All NaN for a run without speculative steps (or a requests table without the columns).
"""

from __future__ import annotations

import math

import pandas as pd

SPEC_COLUMNS: tuple[str, ...] = ("spec_tokens_per_step", "spec_acceptance", "spec_wasted_frac")


def spec_stats(requests: pd.DataFrame) -> dict[str, float]:
    """The speculative-decoding summary columns (``SPEC_COLUMNS``) over all requests of a run."""
    nan = dict.fromkeys(SPEC_COLUMNS, math.nan)
    if "spec_steps" not in requests:
        return nan
    steps = float(requests["spec_steps"].sum())
    if steps <= 0:
        return nan
    proposed = float(requests["spec_proposed_tokens"].sum())
    accepted = float(requests["spec_accepted_tokens"].sum())
    return {
        "spec_tokens_per_step": (steps + accepted) / steps,
        "spec_acceptance": accepted / proposed if proposed else math.nan,
        "spec_wasted_frac": (proposed - accepted) / (proposed + steps),
    }
