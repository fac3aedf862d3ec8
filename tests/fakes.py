"""Shared test doubles: cost models with exactly known iteration times, small streams, and a
nested comparison of calibration files with their refits."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sim.serving.setup import EngineSetup, ReplicaSetup
from sim.workload.stream import ClosedLoop, RequestStream


class LinearCost:
    """Iteration time = base + per_token * tokens computed + per_kv_token * decode KV tokens read.

    ``tokens computed`` counts prefill tokens plus one per decoding sequence. With the
    per-token terms at zero every iteration takes exactly ``base_s`` (deterministic service).
    """

    def __init__(
        self, base_s: float = 0.01, per_token_s: float = 0.0, per_kv_token_s: float = 0.0
    ) -> None:
        self.base_s = base_s
        self.per_token_s = per_token_s
        self.per_kv_token_s = per_kv_token_s
        self.calls = 0

    def time_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> float:
        self.calls += 1
        tokens = num_prefill_tokens + num_decode_seqs
        return self.base_s + self.per_token_s * tokens + self.per_kv_token_s * decode_kv_tokens

    def prefill_alone_s(self, prompt_tokens: int) -> float:
        """Time of a pass that only prefills one prompt: a floor on any first token."""
        return self.time_from_totals_s(prompt_tokens, 1, prompt_tokens * prompt_tokens / 2, 0, 0)


class LayeredLinearCost(LinearCost):
    """A :class:`LinearCost` that also breaks a pass down, as pipeline stages need: all of it is per-layer
    work (``linear``, and ``attention_decode`` for the decode KV read). Kept apart from ``LinearCost``:
    features that use a breakdown when there is one (speculative verification) must see none there."""

    def breakdown_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> dict[str, float]:
        """The same time as two cost-model terms."""
        tokens = num_prefill_tokens + num_decode_seqs
        return {
            "linear": self.base_s + self.per_token_s * tokens,
            "attention_decode": self.per_kv_token_s * decode_kv_tokens,
        }


def llama7b_like() -> LinearCost:
    """Magnitude of Llama-2-7B on one A100: ~12 ms per pass + 0.1 ms per token computed."""
    return LinearCost(base_s=0.012, per_token_s=1e-4)


def make_stream(
    arrival_s,
    prompt_tokens,
    output_tokens,
    max_output_tokens: int | None = None,
    closed_loop: ClosedLoop | None = None,
) -> RequestStream:
    """A RequestStream from plain sequences (scalars broadcast to the arrivals' length)."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    n = len(arrival)
    prompt = np.broadcast_to(np.asarray(prompt_tokens, dtype=np.int64), (n,)).copy()
    output = np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,)).copy()
    max_out = int(output.max()) if max_output_tokens is None and n else (max_output_tokens or 1)
    return RequestStream(arrival, prompt, output, max_out, closed_loop)


def poisson_arrivals(rate: float, n: int, seed: int) -> np.ndarray:
    """n Poisson arrival times at ``rate`` per second (test-local RNG)."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def assert_nested_close(committed: object, refit: object, path: str = "") -> None:
    """Equal structure, floats within 1e-4 relative (a committed file vs its refit)."""
    if isinstance(committed, dict):
        assert isinstance(refit, dict) and set(committed) == set(refit), path
        for key in committed:
            assert_nested_close(committed[key], refit[key], f"{path}.{key}")
    elif isinstance(committed, list):
        assert isinstance(refit, list) and len(committed) == len(refit), path
        for i, (a, b) in enumerate(zip(committed, refit, strict=True)):
            assert_nested_close(a, b, f"{path}[{i}]")
    elif isinstance(committed, float) or isinstance(refit, float):
        assert math.isclose(float(committed), float(refit), rel_tol=1e-4, abs_tol=1e-9), path  # type: ignore[arg-type]
    else:
        assert committed == refit, path


def decode_group_ops(max_size: int):  # noqa: ANN201 - a hypothesis strategy
    """Random DecodeGroup operations: ("add", prompt, generated, output), ("step",), ("remove", index)."""
    from hypothesis import strategies as st

    return st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 40), st.integers(0, 5), st.integers(1, 30)),
            st.just(("step",)),
            st.tuples(st.just("remove"), st.integers(0, 50)),
        ),
        max_size=max_size,
    )


def disagg_scenario(**disaggregation: object) -> dict:
    """A 1p1d disaggregated Llama-3-8B scenario dict (long prompts, short outputs, Poisson at
    3 req/s) next to a colocated prefill-first vLLM v0 policy on 2 replicas; ``disaggregation``
    keys (link, transfer) are added to its disaggregation block."""
    pool = {"replicas": 1, "policy": {"name": "x", "kind": "paged", "max_batch_size": 256}}
    return {
        "name": "dg",
        "seed": 3,
        "model": "llama-3-8b",
        "replicas": 2,
        "workload": {
            "requests": 300,
            "arrival": {"kind": "poisson", "rate": 3.0},
            "prompt_tokens": {"kind": "uniform", "low": 2000, "high": 4000},
            "output_tokens": {"kind": "uniform", "low": 50, "high": 150},
        },
        "policies": [{"name": "vllm-v0", "kind": "paged", "max_batch_size": 256, "max_num_batched_tokens": 8192}],
        "disaggregation": {"name": "1p1d", "prefill": pool, "decode": pool, **disaggregation},
    }


def assert_same_records(off: object, on: object) -> None:
    """Two engine outputs hold identical request, iteration and inter-token records, to the last bit."""
    import pandas as pd

    for table in ("requests", "iterations", "itl"):
        pd.testing.assert_frame_equal(getattr(off, table), getattr(on, table), check_exact=True)


def setup(cost_model: object, **fields: object) -> EngineSetup:
    """An :class:`EngineSetup` from flat keywords: replica fields (kv_blocks, block_size, engine_cpu,
    prefix_caching, draft_cost_model, merge_decode_steps) go to its ``replica``, the rest to it."""
    replica_names = {f.name for f in dataclasses.fields(ReplicaSetup)}
    replica = {k: v for k, v in fields.items() if k in replica_names}
    rest = {k: v for k, v in fields.items() if k not in replica_names}
    return EngineSetup(ReplicaSetup(cost_model, **replica), **rest)  # type: ignore[arg-type]
