"""The one cost-model call the engine makes (implemented by :class:`sim.hardware.cost_model.CostModel`)."""

from __future__ import annotations

from typing import Protocol


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
