"""Checks that a resolved scenario can be served at all, before anything is simulated.

``python -m sim validate`` and ``run`` call the same functions, so a file that validates
never fails later on the same grounds: every request must fit the server's context
window (``max_model_len``, vLLM's "maximum context length" error) and, under every
policy, the KV cache of one replica; and the arrivals must stay within the span where
the float64 clock still resolves microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from sim.errors import UserError
from sim.workload.stream import RequestStream

MAX_SIMULATED_S = 1e9
"""Latest arrival time: beyond ~1e9 s a float64 second no longer resolves 1 µs."""


def over_length_mask(stream: RequestStream, max_model_len: int) -> np.ndarray:
    """Requests whose prompt + output tokens exceed ``max_model_len`` (True = too long).

    The output length stands for the request's ``max_tokens``: a server (vLLM's OpenAI
    front end) refuses a request whose prompt plus requested tokens exceed the window.
    """
    total = stream.prompt_tokens.astype(np.int64) + stream.output_tokens.astype(np.int64)
    return total > max_model_len


def check_context_window(stream: RequestStream, max_model_len: int, over_length: str, source: str) -> np.ndarray:
    """The over-length mask; raise when ``over_length`` is 'error' and any request is too long.

    Args:
        stream: the requests.
        max_model_len: the context window in tokens.
        over_length: 'error' or 'reject' (the scenario option).
        source: where the limit comes from, for the message.
    """
    mask = over_length_mask(stream, max_model_len)
    if over_length == "error" and mask.any():
        first = int(np.argmax(mask))
        prompt, output = int(stream.prompt_tokens[first]), int(stream.output_tokens[first])
        raise UserError(
            f"request {first} needs {prompt + output} tokens ({prompt} prompt + {output} output) but the "
            f"maximum context length is {max_model_len} tokens ({source}); {int(mask.sum())} of {len(mask)} "
            "requests are too long: clamp the lengths, raise max_model_len (up to the model's window), "
            "or set over_length: reject to count them as rejected (HTTP 400)",
            field="max_model_len",
        )
    return mask


def check_arrival_span(stream: RequestStream) -> None:
    """Refuse arrivals so late that the simulated clock would lose its microseconds."""
    if len(stream) and stream.closed_loop is None:
        last_s = float(np.nanmax(stream.arrival_s))
        if last_s > MAX_SIMULATED_S:
            raise UserError(
                f"the last request arrives at {last_s:.3g} s; batchsim keeps arrivals within "
                f"{MAX_SIMULATED_S:.0e} s (31 years) so that microsecond durations stay exact: "
                "raise the arrival rate or lower the request count",
                field="workload.arrival",
            )


def check_requests_fit(
    stream: RequestStream, memory: str, kv_blocks: int, block_size: int, skip: np.ndarray | None = None
) -> None:
    """Refuse a request that could not run even alone on an empty replica (it would never be admitted).

    Args:
        stream: the requests.
        memory: the policy's KV discipline, 'reserve' (prompt + max output at admission) or 'paged'.
        kv_blocks: blocks per replica.
        block_size: tokens per block.
        skip: requests refused before reaching a replica (over-length and rejected).
    """
    if not len(stream):
        return
    prompt = stream.prompt_tokens.astype(np.int64)
    if memory == "reserve":
        tokens = prompt + stream.max_output_tokens
        what = f"prompt + max_output_tokens ({stream.max_output_tokens}), reserved at admission"
    else:
        tokens = prompt + stream.output_tokens.astype(np.int64) - 1
        what = "prompt + output tokens - 1 (its KV at its last step)"
    if skip is not None:
        tokens = np.where(skip, 0, tokens)
    worst = int(np.argmax(tokens))
    needed_blocks = -(-int(tokens[worst]) // block_size)
    if needed_blocks > kv_blocks:
        raise UserError(
            f"request {worst} needs {int(tokens[worst])} tokens of KV ({what}) = {needed_blocks} "
            f"blocks of {block_size}, but kv_blocks is {kv_blocks}; raise memory.kv_blocks / "
            "GPU memory (tensor_parallel, memory.gpu_memory_utilization), or lower "
            "workload.max_output_tokens / the length clamps",
            field="workload",
        )


def check_policies_fit(
    stream: RequestStream, policies: Iterable[Any], kv_blocks: int, block_size: int, skip: np.ndarray | None
) -> None:
    """:func:`check_requests_fit` under every policy config, naming the policy that fails."""
    from sim.policies import make_policy

    for config in policies:
        try:
            check_requests_fit(stream, make_policy(config).memory, kv_blocks, block_size, skip)
        except UserError as exc:
            raise UserError(f"policy '{config.name}': {exc}") from None


def warmup_warning(warmup_s: float, summary: Any) -> str | None:
    """A warning when ``metrics.warmup_s`` left no completed request to measure (blank latency columns)."""
    if warmup_s <= 0 or not len(summary) or not (summary["completed"] > 0).any():
        return None
    if summary["e2e_p50_s"].isna().all():
        return (
            f"metrics.warmup_s = {warmup_s:g} s is beyond every completed request's arrival: latency "
            "percentiles and SLO columns are empty; lower metrics.warmup_s"
        )
    return None
