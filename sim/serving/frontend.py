"""The API front end: the OpenAI-compatible server that parses and tokenizes requests
before the engine sees them.

``workers`` event loops share one ready queue. A request costs two turns of a loop: a
*parse* turn (``per_request_ms``: HTTP, JSON, validation) and a *tokenize* turn
(``per_prompt_token_us`` per prompt token, then the hand-off to the engine). Under the
``event_loop`` discipline the tokenize turn joins the back of the ready queue when the
parse turn ends, as an asyncio continuation does, so a burst of N requests is parsed in
full before the first one is tokenized; under ``fifo`` a request takes both turns at
once, first come first served. Those turns are the front end's *capacity*: one loop
serves them one at a time. Its *latency* is apart: a request reaches the engine
``latency_ms`` after its last turn (the HTTP transit, the hop to the engine process, and
the first token's way back through detokenization and streaming, folded into the way in:
TTFT and E2E shift alike), and any number of requests can be in that delay at once, so it
costs no capacity. A cold front end (``startup_ms`` > 0, an explicit option) opens that
long after the first request arrives; a warm one (the default) at once. This is a SimPy
resource of ``workers`` servers, written as timeout callbacks so that it costs one heap
entry per turn and no process per request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

import numpy as np
import simpy

from sim.config import FrontendConfig

PARSE, TOKENIZE, BOTH = range(3)


class FrontEnd:
    """API-server event loops in front of the router.

    Args:
        env: the SimPy environment.
        config: the front end's costs and workers.
        prompt_tokens: prompt length per request id (for the tokenization cost).
        deliver: called with a request id when the front end hands it to the engine.
    """

    def __init__(
        self,
        env: simpy.Environment,
        config: FrontendConfig,
        prompt_tokens: np.ndarray,
        deliver: Callable[[int], None],
    ) -> None:
        self._env = env
        self._parse_s = config.per_request_ms / 1e3
        self._token_s = config.per_prompt_token_us / 1e6
        self._split = config.discipline == "event_loop"
        self._startup_s = config.startup_ms / 1e3
        self._latency_s = config.latency_ms / 1e3
        self._workers = config.workers
        self._free = 0  # closed until the first arrival plus the start-up delay
        self._opened = False
        self._prompt = prompt_tokens
        self._deliver = deliver
        self._ready: deque[tuple[int, int]] = deque()

    def submit(self, rid: int) -> None:
        """A request arrives at the server."""
        self._ready.append((rid, PARSE if self._split else BOTH))
        if not self._opened:
            self._opened = True
            if self._startup_s > 0:
                self._env.timeout(self._startup_s).callbacks.append(self._open)
                return
            self._free = self._workers
        self._dispatch()

    def _open(self, _event: simpy.Event) -> None:
        self._free = self._workers
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free and self._ready:
            rid, turn = self._ready.popleft()
            self._free -= 1
            self._env.timeout(self._turn_s(rid, turn)).callbacks.append(partial(self._turn_done, rid, turn))

    def _turn_s(self, rid: int, turn: int) -> float:
        tokenize_s = self._token_s * int(self._prompt[rid])
        if turn == PARSE:
            return self._parse_s
        return tokenize_s if turn == TOKENIZE else self._parse_s + tokenize_s

    def _turn_done(self, rid: int, turn: int, _event: simpy.Event) -> None:
        self._free += 1
        if turn == PARSE:
            self._ready.append((rid, TOKENIZE))
        elif self._latency_s > 0:
            self._env.timeout(self._latency_s).callbacks.append(lambda _event: self._deliver(rid))
        else:
            self._deliver(rid)
        self._dispatch()
