"""Send order of a request stream: as drawn, or sorted by prompt length.

A client that batches an offline job can sort its prompts before sending them; it
knows each prompt's length but not how long each answer will be. Reordering only
permutes the requests (prompt and output length travel together) over unchanged send
slots, so every order of one scenario holds the same requests (common random numbers).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

SendOrder = Literal["arrival", "prompt_ascending", "prompt_descending"]


def send_permutation(order: SendOrder, prompt_tokens: np.ndarray) -> np.ndarray:
    """Indices that put the drawn requests in send order.

    Args:
        order: ``arrival`` (as drawn), ``prompt_ascending`` or ``prompt_descending``.
        prompt_tokens: prompt length of each drawn request.

    Returns:
        A permutation ``p`` of ``range(len(prompt_tokens))``: send slot ``i`` gets drawn
        request ``p[i]``. Sorting is stable, so equal prompts keep their drawn order.

    Raises:
        ValueError: an unknown order.
    """
    n = len(prompt_tokens)
    if order == "arrival":
        return np.arange(n)
    if order == "prompt_ascending":
        return np.argsort(prompt_tokens, kind="stable")
    if order == "prompt_descending":
        return np.argsort(-np.asarray(prompt_tokens, dtype=np.int64), kind="stable")
    raise ValueError(f"unknown send order {order!r}")
