"""The one cost-model call the engine makes (implemented by :class:`sim.hardware.cost_model.CostModel`)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class CostModelLike(Protocol):
    """Prices one forward pass from its totals (see ``docs/engine.md``, "Tokens")."""

    def time_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> float: ...


def all_reduce_seconds(model: CostModelLike, tokens: np.ndarray, prefill_seqs: np.ndarray) -> np.ndarray:
    """Seconds of tensor-parallel all-reduce inside passes of ``tokens`` tokens and ``prefill_seqs`` pieces.

    Only the reporting column ``all_reduce_s`` asks for it. A cost model of your own that has no
    ``all_reduce_s`` method prices its collectives inside its pass time, so its column reads zero.
    """
    price = getattr(model, "all_reduce_s", None)
    if price is None:
        return np.zeros(len(tokens))
    return np.asarray(price(tokens, prefill_seqs), dtype=float)
