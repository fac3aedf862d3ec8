"""How far a cost model's numbers were measured: the step shapes its fits saw, and the passes beyond them.

Every GPU term of the cost model comes from kernel profiles of bounded shapes
(``../shared/README.md``, profiles/):

- linear ops (and the LM head, scaled from the MLP up-projection at the same row count): the
  token counts of the model's own MLP profile, i.e. the last knot of a calibration's ``linear``
  curve (4096 for most models, 32768 for Llama-3 8B on the A100); a roofline (transferred or
  uncalibrated) has efficiencies fitted on profiles of up to :data:`ROOFLINE_MAX_TOKENS` tokens;
- attention, on every GPU the fit of one A100 FlashAttention profile
  (``a100/attention_llama-2-70b_tp2.csv``, measured): decode batches of 1-128 sequences with
  32-4032 cached tokens each; prefill chunks of 64-4096 tokens on 0-4032 cached tokens.

A pass outside these shapes is priced by extrapolating a curve or a fitted form.
:func:`extrapolated_passes` says which passes of a run were, from the iteration columns, and
:func:`extrapolated_share` what share of the GPU time they took. Without per-sequence records
a pass's decode context and its prefill pieces' chunks and contexts are their means per
sequence (``decode_kv_tokens`` / decode sequences, ``prefill_*`` / prefill pieces), so a pass
mixing one long sequence among short ones is judged by the mean. The CPU terms (a host-side
profile) and the all-reduce (its own message-size profile) are not judged here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the cost model imports this module; a cheap command must not load pandas through it
    import pandas as pd

ROOFLINE_MAX_TOKENS = 4096
"""Largest token count of the linear-op profiles the roofline efficiencies were fitted on (every profiled model
but Llama-3 8B/70B on the A100 stops at 4096: ../shared/profiles/*/mlp/*.csv)."""
ATTENTION_MAX_DECODE_SEQS = 128
"""Largest decode batch of the attention profile (``a100/attention_llama-2-70b_tp2.csv``, batch_size 1-128)."""
ATTENTION_MAX_CONTEXT = 4032
"""Largest cached context of the attention profile, decode and prefill rows (kv_cache_size up to 4032)."""
ATTENTION_MAX_CHUNK = 4096
"""Largest prefill chunk of the attention profile (prefill_chunk_size 64-4096)."""


@dataclass(frozen=True)
class ProfiledRange:
    """The largest step shapes a cost model's fits were measured at.

    Attributes:
        max_tokens: tokens of one pass (linear ops).
        max_decode_seqs: decode sequences of one pass (decode attention).
        max_context: cached tokens per sequence (decode) or before a prefill chunk.
        max_chunk: prefill tokens per piece (prefill attention).
    """

    max_tokens: int
    max_decode_seqs: int = ATTENTION_MAX_DECODE_SEQS
    max_context: int = ATTENTION_MAX_CONTEXT
    max_chunk: int = ATTENTION_MAX_CHUNK

    @classmethod
    def of(cls, calibration: dict, *, profiled_linear: bool) -> ProfiledRange:
        """The range of a calibration: its linear curve's last knot where the curve is profiled
        (``profiled_linear``: a calibration or a same-shape twin), else the roofline's fitted range."""
        if profiled_linear:
            return cls(max_tokens=int(calibration["linear"]["tokens"][-1]))
        return cls(max_tokens=ROOFLINE_MAX_TOKENS)


def extrapolated_passes(iterations: pd.DataFrame, profiled: ProfiledRange) -> np.ndarray:
    """Per iteration row: True where the pass lies beyond ``profiled`` in any of its shapes.

    Reads ``prefill_tokens``, ``decode_tokens``, ``batch_size``, ``decode_kv_tokens`` and
    ``prefill_context_tokens`` (0 where absent).
    """
    prefill = _column(iterations, "prefill_tokens")
    decode = _column(iterations, "decode_tokens")
    pieces = np.where(prefill > 0, np.maximum(_column(iterations, "batch_size") - decode, 1), 0)
    beyond = prefill + decode > profiled.max_tokens
    beyond |= decode > profiled.max_decode_seqs
    beyond |= _mean_per(_column(iterations, "decode_kv_tokens"), decode) > profiled.max_context
    beyond |= _mean_per(prefill, pieces) > profiled.max_chunk
    beyond |= _mean_per(_column(iterations, "prefill_context_tokens"), pieces) > profiled.max_context
    return beyond


def extrapolated_share(iterations: pd.DataFrame, profiled: ProfiledRange | None) -> float:
    """Share of the run's pass time spent in passes beyond ``profiled`` (0 for no passes; NaN without a range)."""
    if profiled is None:
        return float("nan")
    durations = _column(iterations, "duration_s")
    total = float(durations.sum())
    if total <= 0:
        return 0.0
    return float(durations[extrapolated_passes(iterations, profiled)].sum()) / total


def _column(iterations: pd.DataFrame, name: str) -> np.ndarray:
    if name not in iterations.columns:
        return np.zeros(len(iterations))
    return iterations[name].to_numpy(dtype=np.float64)


def _mean_per(amount: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``amount / count`` where ``count`` > 0, else 0."""
    out = np.zeros_like(amount)
    np.divide(amount, count, out=out, where=count > 0)
    return out
