"""Which draft tokens the target model accepts: one fixed trace per request, from named streams.

The standard model of speculative decoding (Leviathan et al., ICML 2023): each draft token
is accepted with probability a, independently, and verification stops at the first
rejection, so a step with gamma draft tokens yields k accepted tokens plus one token from
the target (the correction, or the bonus token when all gamma were accepted):
P(k = j) = a^j (1 - a) for j < gamma, P(k = gamma) = a^gamma, and the mean number of tokens
per step is (1 - a^(gamma+1)) / (1 - a).

Instead of drawing k step by step (which would tie the draws to how a policy batches), every
request gets one Bernoulli(a_r) bit per output position, drawn once from the ``"spec_accept"``
stream: a step that starts at output position g accepts the leading run of ones in bits
g .. g + gamma - 1. Each bit is looked at by at most one step, so k is exactly the truncated
geometric above; and a request's acceptance pattern is the same under every policy, batch
and arrival rate (common random numbers). The uniforms do not depend on a, so a higher rate
accepts a superset of the tokens a lower one does. Per-request rates (a distribution) come
from a second stream, ``"spec_acceptance_rate"``; neither touches any other stream.
"""

from __future__ import annotations

import numpy as np

from sim.config import SpeculativeConfig
from sim.config.policies import BetaAcceptance, UniformAcceptance
from sim.rng import RandomStreams

ACCEPT_STREAM = "spec_accept"
RATE_STREAM = "spec_acceptance_rate"
_MAX_RUN = 255  # runs are stored clipped (uint8): gamma is at most 32


def mean_tokens_per_step(acceptance_rate: float, gamma: int) -> float:
    """Expected tokens per speculative step: (1 - a^(gamma+1)) / (1 - a), gamma + 1 at a = 1."""
    a = acceptance_rate
    return float(gamma + 1) if a >= 1.0 else (1.0 - a ** (gamma + 1)) / (1.0 - a)


def request_rates(config: SpeculativeConfig, num_requests: int, streams: RandomStreams) -> np.ndarray:
    """Per-request acceptance rates: the configured number, or draws from its distribution."""
    rate = config.acceptance_rate
    if isinstance(rate, (int, float)):
        return np.full(num_requests, float(rate))
    rng = streams.generator(RATE_STREAM)
    if isinstance(rate, BetaAcceptance):
        return rng.beta(rate.mean * rate.concentration, (1.0 - rate.mean) * rate.concentration, num_requests)
    assert isinstance(rate, UniformAcceptance)
    return rng.uniform(rate.low, rate.high, num_requests)


class AcceptanceTrace:
    """Accepted draft tokens of every request at every output position.

    Args:
        output_tokens: each request's output length (its bits cover positions 0 .. n - 1).
        rates: each request's per-token acceptance rate in [0, 1].
        rng: the generator of the ``"spec_accept"`` stream.

    Memory: one byte per output token of the stream (only when speculation is on).
    """

    def __init__(self, output_tokens: np.ndarray, rates: np.ndarray, rng: np.random.Generator) -> None:
        lengths = np.asarray(output_tokens, dtype=np.int64)
        self.rates = np.asarray(rates, dtype=float)
        self._offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if lengths.size else lengths
        accept = rng.random(int(lengths.sum()), dtype=np.float32) < np.repeat(self.rates, lengths)
        self._runs = _leading_runs(accept, lengths)

    def accepted(self, rid: int, position: int, gamma: int) -> int:
        """Draft tokens accepted by a step of request ``rid`` drafting output positions
        ``position`` .. ``position + gamma - 1``: the leading run of accepted bits, at most gamma."""
        run = int(self._runs[self._offsets[rid] + position])
        return run if run < gamma else gamma


def build_trace(config: SpeculativeConfig, output_tokens: np.ndarray, seed: int) -> AcceptanceTrace:
    """The acceptance trace of a stream under ``config``, from the scenario seed's named streams."""
    streams = RandomStreams(seed)
    rates = request_rates(config, len(output_tokens), streams)
    return AcceptanceTrace(output_tokens, rates, streams.generator(ACCEPT_STREAM))


def _leading_runs(accept: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For every position, the run of True starting there, not crossing its request's end (clipped)."""
    total = accept.size
    index = np.arange(total, dtype=np.int64)
    # Next rejected position at or after each index (total if none), by a reversed running minimum.
    next_false = np.where(accept, total, index)[::-1]
    next_false = np.minimum.accumulate(next_false)[::-1]
    ends = np.repeat(np.cumsum(lengths), lengths)
    runs = np.minimum(next_false, ends) - index
    return np.minimum(runs, _MAX_RUN).astype(np.uint8)
