"""Shared system prompts and multi-turn sessions: exact savings, TTFT and capacity, direction vs the vLLM paper."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import setup
from pydantic import ValidationError

from sim.config import ChunkedPrefillPolicyConfig, Workload
from sim.serving.engine import Engine
from sim.workload.source import build_request_stream

POLICY = ChunkedPrefillPolicyConfig(name="v1", chunk_size=2048)


class Cost:
    def time_from_totals_s(self, tokens: int, seqs: int, work: float, decodes: int, kv: int) -> float:
        return 0.005 + tokens * 5e-5 + decodes * 2e-5 + kv * 1e-8


def _workload(prefix_tokens: int, fraction: float, rate: float = 10.0, requests: int = 400) -> Workload:
    return Workload.model_validate(
        {
            "requests": requests,
            "arrival": {"kind": "poisson", "rate": rate},
            "prompt_tokens": {"kind": "uniform", "low": 50, "high": 200},
            "output_tokens": {"kind": "uniform", "low": 8, "high": 64},
            "shared_prefix": {"tokens": prefix_tokens, "fraction": fraction, "variants": 2},
        }
    )


def _run(workload: Workload, caching: bool, kv_blocks: int = 20_000):
    stream = build_request_stream(workload, seed=1)
    out = Engine(stream, POLICY, setup(Cost(), kv_blocks=kv_blocks, block_size=16, prefix_caching=caching)).run()
    return stream, out


@pytest.mark.parametrize("prefix_tokens", [1000, 1024])
def test_warm_requests_save_exactly_the_prefix_full_blocks(prefix_tokens: int) -> None:
    stream, out = _run(_workload(prefix_tokens, 0.8), caching=True)
    requests = out.requests
    warm = requests["arrival_s"] > 5.0  # both variants long computed by then
    prefixed = (stream.prompt_tokens > 200).astype(bool)  # user parts are <= 200 tokens
    expected = np.where(prefixed, (prefix_tokens // 16) * 16, 0)
    assert (requests["cached_prompt_tokens"][warm] == expected[warm]).all()
    assert 0.75 < prefixed.mean() < 0.85


def test_caching_cuts_ttft_and_raises_capacity() -> None:
    workload = _workload(2000, 0.9, rate=6.0)
    _, off = _run(workload, caching=False)
    _, on = _run(workload, caching=True)
    assert on.requests["ttft_s"].mean() < 0.5 * off.requests["ttft_s"].mean()
    # Capacity: an offline burst finishes sooner with the prefix computed once per variant.
    burst = workload.model_copy(update={"arrival": Workload.model_validate(
        {"arrival": {"kind": "burst"}, "prompt_tokens": {"kind": "fixed", "value": 1},
         "output_tokens": {"kind": "fixed", "value": 1}}).arrival})  # fmt: skip
    _, off = _run(burst, caching=False)
    _, on = _run(burst, caching=True)
    assert on.requests["completion_s"].max() < 0.8 * off.requests["completion_s"].max()


def test_gain_of_caching_grows_with_the_prefix_length() -> None:
    """vLLM paper (Kwon et al. 2023, fig. 16): 1.67x with an 80-token shared prefix, 3.58x with 341 tokens."""
    gains = []
    for prefix_tokens in (80, 341, 1000):
        burst = _workload(prefix_tokens, 1.0).model_copy(update={"arrival": Workload.model_validate(
            {"arrival": {"kind": "burst"}, "prompt_tokens": {"kind": "fixed", "value": 1},
             "output_tokens": {"kind": "fixed", "value": 1}}).arrival})  # fmt: skip
        _, off = _run(burst, caching=False)
        _, on = _run(burst, caching=True)
        gains.append(off.requests["completion_s"].max() / on.requests["completion_s"].max())
    assert gains == sorted(gains) and gains[0] > 1.0


def test_sessions_reuse_the_conversation_so_far() -> None:
    workload = Workload.model_validate(
        {
            "requests": 120,
            "arrival": {"kind": "poisson", "rate": 2.0},
            "prompt_tokens": {"kind": "uniform", "low": 40, "high": 120},
            "output_tokens": {"kind": "uniform", "low": 20, "high": 60},
            "sessions": {"turns": {"kind": "fixed", "value": 4}, "think_time_s": 1.0},
        }
    )
    stream, out = _run(workload, caching=True)
    assert stream.sessions is not None and (out.requests["status"] == "completed").all()
    requests = out.requests
    later = stream.sessions.next_turn[:-1] >= 0  # turn t has a turn t+1
    nxt = stream.sessions.next_turn[:-1][later]
    # Closed loop: the next turn is sent after the previous one completed.
    assert (requests["arrival_s"].to_numpy()[nxt] >= requests["completion_s"].to_numpy()[:-1][later]).all()
    # It reuses every full block of the previous prompt + answer (its KV, minus the last token).
    previous = stream.prompt_tokens[:-1][later] + stream.output_tokens[:-1][later]
    assert (requests["cached_prompt_tokens"].to_numpy()[nxt] == (previous - 1) // 16 * 16).all()


def test_sessions_and_traces_do_not_mix() -> None:
    with pytest.raises(ValidationError, match="trace arrival cannot use them"):
        Workload.model_validate(
            {"arrival": {"kind": "trace", "path": "x.jsonl", "format": "mooncake"},
             "shared_prefix": {"tokens": 10, "fraction": 1.0}}  # fmt: skip
        )
