"""Which pass of one replica is running at given instants (its passes never overlap).

Two readers ask it: the energy model (the power drawn at an instant: a pass covers ``[start, end)``) and
``validate-real``'s engine clock (when an engine loop that reads requests between passes takes one in).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def running_pass(passes: pd.DataFrame, times: np.ndarray, *, starting_counts: bool = True) -> np.ndarray:
    """Per instant, the row position (in ``passes``) of the pass running then, or -1 when none is.

    Args:
        passes: one replica's iteration rows (``start_s``, ``duration_s``), in any order.
        times: the instants.
        starting_counts: whether a pass starting at the very instant counts as running then (False: only
            passes started strictly before it).
    """
    start = passes["start_s"].to_numpy(dtype=float)
    order = np.argsort(start, kind="stable")
    start = start[order]
    end = start + passes["duration_s"].to_numpy(dtype=float)[order]
    latest = np.searchsorted(start, times, side="right" if starting_counts else "left") - 1
    clipped = np.maximum(latest, 0)
    running = (latest >= 0) & (times < end[clipped])
    return np.where(running, order[clipped], -1)
