"""The request stream: the one hand-off between the workload layer and the engine.

Built once per (scenario, seed) and given unchanged to every policy, so all policies
see identical requests at identical times (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.workload.content import PromptContent


@dataclass(frozen=True)
class ClosedLoop:
    """Closed-loop clients: ``clients`` requests are sent at t=0; whenever one ends
    (completed, timed out or finally rejected) its client sends the next request index
    after ``think_time_s[next_index]`` seconds."""

    clients: int
    think_time_s: np.ndarray  # float64, one per request index

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError("clients must be >= 1")


@dataclass(frozen=True)
class SessionChain:
    """Multi-turn sessions, each a closed loop: when request r ends its session sends
    ``next_turn[r]`` (-1: r was the last turn) after ``think_time_s[next_turn[r]]`` seconds.
    First turns are sent at their ``arrival_s``; later turns have NaN there."""

    next_turn: np.ndarray  # int64, one per request
    think_time_s: np.ndarray  # float64, one per request


@dataclass(frozen=True)
class RequestStream:
    """Requests in send order, as parallel numpy arrays.

    Attributes:
        arrival_s: send time of each request (sorted ascending); all NaN for closed loop.
        prompt_tokens: prompt length of each request (int64, >= 1).
        output_tokens: tokens each request generates before EOS/max_tokens (int64, >= 1).
        max_output_tokens: the max_tokens clients send; static and continuous batching
            reserve prompt + max_output_tokens of KV per request. >= every output_tokens.
        closed_loop: set for closed-loop workloads, else None.
        content: which prompt blocks the requests share (prefix caching); None: nothing known.
        sessions: multi-turn session chaining; None: independent requests.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    max_output_tokens: int
    closed_loop: ClosedLoop | None = None
    content: PromptContent | None = None
    sessions: SessionChain | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if not (len(self.arrival_s) == len(self.output_tokens) == n):
            raise ValueError("arrival_s, prompt_tokens and output_tokens must have equal length")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("token counts must be >= 1")
        if n and self.output_tokens.max() > self.max_output_tokens:
            raise ValueError("max_output_tokens must be >= every output_tokens")
        if self.closed_loop is None and n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("arrival_s must be sorted")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def max_request_tokens(self) -> int:
        """Largest KV footprint any one request can reach (prompt + max output)."""
        return int(self.prompt_tokens.max()) + self.max_output_tokens if len(self) else 0
