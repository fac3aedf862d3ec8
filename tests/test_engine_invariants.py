"""Engine invariants over random small workloads (hypothesis), under every policy.

Every request ends exactly once; completed ones generated exactly their output tokens;
KV never exceeds the budget; a replica's passes never overlap or go back in time; no
first token comes before arrival + the request's own prefill time; token totals of the
iteration rows add up to the requests' lengths. Also with multi-step scheduling (paged,
1..12 steps), the engine CPU-time model and pipeline stages (2 or 3 virtual engines per replica,
one iteration row per stage pass).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from budget import examples
from fakes import LayeredLinearCost, make_stream, setup
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sim.config import (
    AdmissionConfig,
    ChunkedPrefillPolicyConfig,
    ClientConfig,
    ContinuousPolicyConfig,
    EngineCPUConfig,
    FrontendConfig,
    PagedPolicyConfig,
    StaticPolicyConfig,
)
from sim.metrics.summary import model_passes
from sim.serving.engine import Engine
from sim.serving.pipeline import PipelineSetup
from sim.workload.stream import ClosedLoop

COST = LayeredLinearCost(base_s=0.01, per_token_s=2e-4, per_kv_token_s=1e-6)
EPS = 1e-9


class Hop:
    """Activations handed between pipeline stages: 0.1 ms plus 1 µs per token."""

    def seconds(self, tokens: int) -> float:
        return 1e-4 + 1e-6 * tokens


def _policy(kind: str, mbs: int, knob: int, pad: bool, steps: int = 1, allocate: str = "chunk",
            scheduling: str = "sarathi"):
    if kind == "static":
        return StaticPolicyConfig(
            name=kind, max_batch_size=mbs, max_wait_s=knob / 100, pad_finished=pad
        )
    if kind == "continuous":
        return ContinuousPolicyConfig(name=kind, max_batch_size=mbs)
    if kind == "paged":
        return PagedPolicyConfig(
            name=kind, max_batch_size=mbs, max_num_batched_tokens=knob, num_scheduler_steps=steps
        )
    return ChunkedPrefillPolicyConfig(
        name=kind, max_batch_size=mbs, chunk_size=knob, allocate=allocate, scheduling=scheduling
    )


@st.composite
def runs(draw):
    n = draw(st.integers(1, 30))
    prompt = np.array(draw(st.lists(st.integers(1, 90), min_size=n, max_size=n)))
    output = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)))
    closed = None
    arrival = np.sort(np.array(draw(st.lists(st.floats(0, 3), min_size=n, max_size=n))))
    if draw(st.booleans()) and draw(st.booleans()):
        think = np.array(draw(st.lists(st.sampled_from([0.0, 0.01, 0.2]), min_size=n, max_size=n)))
        closed, arrival = ClosedLoop(draw(st.integers(1, 4)), think), np.full(n, np.nan)
    stream = make_stream(arrival, prompt, output, closed_loop=closed)
    kind = draw(st.sampled_from(["static", "continuous", "paged", "chunked_prefill"]))
    steps = draw(st.one_of(st.just(1), st.integers(2, 12)))
    allocate = draw(st.sampled_from(["chunk", "prompt"]))
    scheduling = draw(st.sampled_from(["sarathi", "vllm-v1"]))  # the vLLM V1 presets' rules too
    policy = _policy(
        kind, draw(st.integers(1, 12)), draw(st.integers(1, 120)), draw(st.booleans()), steps, allocate, scheduling
    )
    block_size = draw(st.sampled_from([1, 4, 16]))
    # From the least KV that lets every request run alone (tight: preemption) upwards.
    if kind in ("paged", "chunked_prefill"):
        need = int(np.max(-(-(prompt + output - 1) // block_size)))
    else:
        need = -(-stream.max_request_tokens // block_size)
    # Pipeline stages: each virtual engine has 1/P of the blocks, so each gets what one replica would.
    stages = draw(st.sampled_from([1, 1, 2, 3]))
    kv_blocks = stages * (need + draw(st.one_of(st.just(0), st.integers(0, 2 * need))))
    layers = tuple(draw(st.lists(st.integers(1, 4), min_size=stages, max_size=stages)))
    client = None
    if draw(st.booleans()):
        client = ClientConfig(
            timeout_s=draw(st.floats(0.05, 4)), max_retries=draw(st.integers(0, 3)), backoff_s=0.03
        )
    admission = AdmissionConfig(max_queue=draw(st.integers(1, 5))) if draw(st.booleans()) else None
    kwargs = dict(
        kv_blocks=kv_blocks,
        block_size=block_size,
        replicas=draw(st.integers(1, 3)),
        router=draw(st.sampled_from(["round_robin", "least_outstanding", "random"])),
        client=client,
        admission=admission,
        seed=draw(st.integers(0, 3)),
        # Over max_model_len: refused on sight (HTTP 400), never routed, never retried.
        refuse=np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))) if draw(st.booleans()) else None,
        engine_cpu=_engine_cpu(draw) if draw(st.booleans()) else None,
        frontend=_frontend(draw) if draw(st.booleans()) else None,
        pipeline=PipelineSetup.of(layers, Hop()) if stages > 1 else None,
    )
    return stream, policy, kwargs


def _frontend(draw) -> FrontendConfig:
    return FrontendConfig(
        per_request_ms=draw(st.sampled_from([0.0, 1.0, 20.0])), per_prompt_token_us=draw(st.sampled_from([0.0, 50.0])),
        workers=draw(st.integers(1, 3)), startup_ms=draw(st.sampled_from([0.0, 100.0])),
        discipline=draw(st.sampled_from(["event_loop", "fifo"])),
    )  # fmt: skip


def _engine_cpu(draw) -> EngineCPUConfig:
    times = st.sampled_from([0.0, 0.5, 3.0])
    return EngineCPUConfig(
        step_ms=draw(times), step_us_per_seq=draw(times) * 100, pass_ms=draw(times),
        pass_us_per_seq=draw(times) * 10, overlap_step=draw(st.booleans()),
    )  # fmt: skip


@pytest.mark.slow
@settings(max_examples=examples(2.5))
@given(runs())
def test_every_request_ends_once_and_the_books_balance(case):
    stream, policy, kwargs = case
    engine = Engine(stream, policy, setup(COST, **kwargs), audit_every=1)  # replica invariants after every pass
    out = engine.run()
    req, it = out.requests, out.iterations
    _check_endings(engine, stream, req, kwargs)
    _check_times(stream, req)
    _check_iterations(it, policy, kwargs)
    _check_token_totals(stream, req, it, policy)
    if stream.closed_loop is not None:
        _check_client_concurrency(req, stream.closed_loop.clients)
    for status in ("timed_out", "rejected"):
        if (req["status"] == status).any():
            event(status)
    if req["preemptions"].sum():
        event(f"{policy.kind} preempted")
    if getattr(policy, "num_scheduler_steps", 1) > 1:
        event("multi-step")
    if kwargs["pipeline"] is not None:
        event("pipeline stages")
    _check_itl(out.itl, req, engine.records.generated_tokens, getattr(policy, "num_scheduler_steps", 1))


def _check_endings(engine, stream, req, kwargs) -> None:
    assert req["request_id"].tolist() == list(range(len(stream)))
    assert req["status"].notna().all() and req["completion_s"].notna().all()
    done = (req["status"] == "completed").to_numpy()
    generated = engine.records.generated_tokens
    assert np.array_equal(generated[done], stream.output_tokens[done])
    assert np.all(generated <= stream.output_tokens)
    refused = kwargs["refuse"] if kwargs["refuse"] is not None else np.zeros(len(stream), bool)
    assert (req["status"][refused] == "rejected").all() and req["first_scheduled_s"][refused].isna().all()
    assert np.all(req["retries"][refused] == 0) and np.all(generated[refused] == 0)
    if kwargs["client"] is None and kwargs["admission"] is None:
        assert done[~refused].all()
    timed_out = (req["status"] == "timed_out").to_numpy()
    if timed_out.any():  # abandoned exactly at first send + timeout
        waited = req["completion_s"][timed_out] - req["arrival_s"][timed_out]
        assert np.allclose(waited, kwargs["client"].timeout_s, atol=1e-9)
    rejected = (req["status"] == "rejected").to_numpy()
    max_retries = kwargs["client"].max_retries if kwargs["client"] else 0
    assert np.all(req["retries"][rejected & ~refused] == max_retries)
    assert np.all(req["retries"] <= max_retries)


def _check_times(stream, req) -> None:
    done = (req["status"] == "completed").to_numpy()
    a, s, f, c = (
        req[k].to_numpy()
        for k in ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s")
    )
    assert (
        np.all(a[done] - EPS <= s[done])
        and np.all(s[done] < f[done])
        and np.all(f[done] <= c[done] + EPS)
    )
    got_token = ~np.isnan(f)
    floor = a + np.array([COST.prefill_alone_s(int(p)) for p in stream.prompt_tokens])
    assert np.all(f[got_token] >= floor[got_token] - EPS)
    one_token = done & (stream.output_tokens == 1)
    assert np.array_equal(f[one_token], c[one_token]) and req["tpot_s"][one_token].isna().all()


def _check_iterations(it: pd.DataFrame, policy, kwargs) -> None:
    stages = 1 if kwargs["pipeline"] is None else kwargs["pipeline"].stages
    assert np.all(it["kv_blocks_used"] <= it["kv_blocks_total"]) and np.all(
        it["kv_blocks_total"] == kwargs["kv_blocks"] // stages
    )
    assert np.all(it["duration_s"] > 0) and np.all(it["batch_size"] >= 1)
    workers = ["replica", "stage"] if stages > 1 else "replica"  # a worker: a replica, or one stage of it
    for _, rows in it.groupby(workers):
        ends = (rows["start_s"] + rows["duration_s"]).to_numpy()
        assert np.all(
            rows["start_s"].to_numpy()[1:] >= ends[:-1]
        )  # one pass at a time, time monotone
    assert np.all(it["batch_size"] <= policy.max_batch_size)
    if policy.kind == "chunked_prefill":
        assert np.all(it["prefill_tokens"] + it["decode_tokens"] <= policy.chunk_size)
    if policy.kind == "paged":  # prefill-first: a pass prefills or decodes, never both
        assert not np.any((it["prefill_tokens"] > 0) & (it["decode_tokens"] > 0))


def _check_token_totals(stream, req, it, policy) -> None:
    """Each prompt token is computed once and each later output token decoded once, unless
    preemption recomputes or a client abandons work part-way."""
    all_done = bool((req["status"] == "completed").all())
    # Static padding, and multi-step blocks charging requests that finished inside them.
    padded = (policy.kind == "static" and policy.pad_finished) or getattr(policy, "num_scheduler_steps", 1) > 1
    it = model_passes(it)  # one row per pass (under pipeline stages, each stage has a row)
    prefill, decode = int(it["prefill_tokens"].sum()), int(it["decode_tokens"].sum())
    if all_done and req["preemptions"].sum() == 0:
        assert prefill == int(stream.prompt_tokens.sum())
        want_decode = int((stream.output_tokens - 1).sum())
        assert decode >= want_decode if padded else decode == want_decode
    elif all_done:
        assert prefill > int(stream.prompt_tokens.sum())


def _check_itl(itl: pd.DataFrame, req, generated: np.ndarray, steps: int) -> None:
    """Inter-token gaps: one per stream event after a request's first token, each event
    carrying at least one token (exactly one without multi-step)."""
    assert np.all(itl["count"] > 0) and np.all(itl["gap_s"] >= -EPS)
    events, later_tokens = int(itl["count"].sum()), int(np.maximum(generated - 1, 0).sum())
    assert events <= later_tokens
    if steps == 1 and (req["status"] == "completed").all():
        assert events == later_tokens


def _check_client_concurrency(req, clients: int) -> None:
    """Closed loop: a client has at most one request out at a time."""
    events = np.concatenate(
        [
            np.stack([req["arrival_s"], np.ones(len(req))], 1),
            np.stack([req["completion_s"], -np.ones(len(req))], 1),
        ]
    )
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # ends before sends at equal times
    assert np.cumsum(events[:, 1]).max() <= clients
