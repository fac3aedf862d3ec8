"""Pipeline parallelism (issue 27 item 5): stages, virtual engines, the per-stage KV budget and its records.

A single request's latency through the stages is the sum of its passes' stage times and hand-offs,
computed here by hand from a linear cost model with a breakdown; with many micro-batches the pipeline
runs at its slowest stage's rate; every request ends with its tokens and its KV given back (also in
tests/test_engine_invariants.py and tests/test_feature_matrix.py, which draw pipeline stages too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fakes import LayeredLinearCost, make_stream, setup

from sim.config import ContinuousPolicyConfig, PagedPolicyConfig, Scenario
from sim.errors import UserError
from sim.hardware.catalog import get_gpu, get_model
from sim.hardware.memory import kv_budget, kv_bytes_per_token
from sim.hardware.pipeline import HOP_LATENCY_S, ActivationTransfer, stage_layers, stage_weight_bytes
from sim.hardware.utilization import PassWork
from sim.metrics.summary import model_passes
from sim.resolve import resolve
from sim.serving.engine import Engine
from sim.serving.pipeline import PipelineReplica, PipelineSetup


class Hop:
    """A hand-off of ``latency_s`` plus ``per_token_s`` per token."""

    def __init__(self, latency_s: float, per_token_s: float) -> None:
        self.latency_s, self.per_token_s = latency_s, per_token_s

    def seconds(self, tokens: int) -> float:
        return self.latency_s + self.per_token_s * tokens


class SplitCost:
    """A pass of N tokens, R rows, prefill attention work W, decode context K costs
    a N (linear) + b R (LM head) + c W (prefill attention) + d K (decode attention) + h (host)."""

    def __init__(self, a: float, b: float, c: float, d: float, h: float) -> None:
        self.a, self.b, self.c, self.d, self.h = a, b, c, d, h

    def breakdown_from_totals_s(self, prefill, pieces, work, decodes, kv) -> dict[str, float]:  # noqa: ANN001
        parts = {"linear": self.a * (prefill + decodes), "lm_head": self.b * (pieces + decodes)}
        if pieces:
            parts["attention_prefill"] = self.c * work
        if decodes:
            parts["attention_decode"] = self.d * kv
        parts["cpu_overhead"] = self.h
        return parts

    def time_from_totals_s(self, *totals) -> float:  # noqa: ANN002
        return sum(self.breakdown_from_totals_s(*totals).values())


# --------------------------------------------------------------------------- layers and memory
@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [
        (80, 2, (40, 40)),
        (80, 3, (27, 27, 26)),
        (32, 3, (11, 11, 10)),
        (10, 4, (2, 3, 3, 2)),
        (61, 8, (7, 7, 8, 8, 8, 8, 8, 7)),
    ],
)
def test_stage_layers_follow_vllms_partition(layers: int, stages: int, expected: tuple[int, ...]) -> None:
    """L // P each; the remainder one by one to the stages before the last, from the second-to-last backwards."""
    assert stage_layers(layers, stages) == expected


def test_each_stage_holds_its_layers_and_one_vocabulary_matrix_at_the_ends() -> None:
    model = get_model("llama-2-70b")  # untied: embedding and LM head are two matrices
    vocab = model.vocab_size * model.hidden_size * model.dtype_bytes
    layers = model.weight_bytes - 2 * vocab
    first = stage_weight_bytes(model, 40, first=True, last=False)
    last = stage_weight_bytes(model, 40, first=False, last=True)
    assert first == last == layers // 2 + vocab
    assert stage_weight_bytes(model, 80, first=True, last=True) == model.weight_bytes


def test_pipeline_stages_split_the_weights_and_the_kv_of_a_token() -> None:
    """TP 2 x PP 2 holds what TP 4 holds per GPU: half the layers at twice the KV heads per GPU."""
    model, gpu = get_model("llama-2-70b"), get_gpu("a100-80gb")
    pp2 = kv_budget(model, gpu, 2, pipeline_parallel=2)
    assert pp2.bytes_per_token * 2 == kv_bytes_per_token(model, 2) == 2 * 80 * 4 * 128 * 2
    vocab = model.vocab_size * model.hidden_size * model.dtype_bytes
    assert pp2.weight_bytes_per_gpu == -(-((model.weight_bytes - 2 * vocab) // 2 + vocab) // 2)
    # The tightest stage decides: its free memory over its per-token KV.
    assert pp2.num_blocks == pp2.available_bytes // (pp2.bytes_per_token * 16) > 0
    tp4 = kv_budget(model, gpu, 4)  # the same four GPUs as TP 4: the same KV per GPU and per token
    assert tp4.bytes_per_token == pp2.bytes_per_token
    assert abs(tp4.num_blocks - pp2.num_blocks) < 0.01 * tp4.num_blocks


def test_a_stage_without_room_for_a_block_is_one_error_naming_pipeline_parallel() -> None:
    with pytest.raises(UserError) as err:
        kv_budget(get_model("llama-2-70b"), get_gpu("a100-40gb"), 1, pipeline_parallel=2)
    assert err.value.field == "pipeline_parallel" and "stage 0" in str(err.value) and "\n" not in str(err.value)


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(UserError) as err:
        resolve(_pp_scenario(model="qwen2.5-7b", pipeline_parallel=29))
    assert err.value.field == "pipeline_parallel" and "28 layers" in str(err.value)


def test_activations_cross_at_the_link_rate_whatever_the_tensor_parallel() -> None:
    model, gpu = get_model("llama-2-70b"), get_gpu("a100-80gb")
    hop = ActivationTransfer.of(model, gpu)
    assert hop.seconds(1000) == pytest.approx(HOP_LATENCY_S + 1000 * 2 * 8192 * 2 / 300e9, rel=1e-12)


# --------------------------------------------------------------------------- one request through the stages
def test_a_single_request_takes_the_sum_of_its_stage_times_and_hand_offs() -> None:
    a, b, c, d, h = 2e-5, 3e-4, 1e-8, 4e-7, 5e-4
    hop_latency, hop_per_token = 1e-4, 3e-7
    prompt, output = 200, 6
    cost = SplitCost(a, b, c, d, h)
    pipe = PipelineSetup.of((3, 1), Hop(hop_latency, hop_per_token))  # stage 0 holds 3/4 of the layers
    stream = make_stream([0.5], prompt, output)
    out = Engine(stream, ContinuousPolicyConfig(name="c", max_batch_size=4),
                 setup(cost, kv_blocks=64, block_size=16, pipeline=pipe)).run()  # fmt: skip

    def pass_latency(tokens: int, attention: float) -> float:  # by hand: stage 0, hand-off, stage 1
        layered = a * tokens + attention
        return (0.75 * layered + h) + (hop_latency + hop_per_token * tokens) + (0.25 * layered + b)

    expected = 0.5 + pass_latency(prompt, c * prompt * prompt / 2)
    first_token = expected
    for step in range(1, output):
        expected += pass_latency(1, d * (prompt + step))
    request = out.requests.iloc[0]
    assert math.isclose(request["first_token_s"], first_token, rel_tol=1e-12)
    assert math.isclose(request["completion_s"], expected, rel_tol=1e-12)
    rows = out.iterations
    assert len(rows) == 2 * output and sorted(set(rows["stage"])) == [0, 1]
    first, second = rows[rows["stage"] == 0], rows[rows["stage"] == 1]
    gaps = second["start_s"].to_numpy() - (first["start_s"] + first["duration_s"]).to_numpy()
    tokens = (first["prefill_tokens"] + first["decode_tokens"]).to_numpy()
    np.testing.assert_allclose(gaps, hop_latency + hop_per_token * tokens, rtol=1e-9)


# --------------------------------------------------------------------------- many micro-batches
@pytest.mark.parametrize("layers", [(3, 1), (1, 1), (1, 1, 1, 1)])
def test_many_micro_batches_run_at_the_slowest_stage_rate(layers: tuple[int, ...]) -> None:
    """Every pass costs T on one GPU group; stage s takes its share of T. With work for every virtual
    engine the pipeline completes 1 / (max share x T) passes per second, less the hand-off's cut."""
    pass_s, hop_s = 0.02, 1e-5
    stages = len(layers)
    pipe = PipelineSetup.of(layers, Hop(hop_s, 0.0))
    stream = make_stream(np.zeros(8 * stages), 16, 400)
    engine_setup = setup(LayeredLinearCost(base_s=pass_s), kv_blocks=4096, block_size=16, pipeline=pipe)
    out = Engine(stream, ContinuousPolicyConfig(name="c", max_batch_size=8), engine_setup).run()
    first = model_passes(out.iterations)
    steady = first[(first["start_s"] > 1.0) & (first["start_s"] < 6.0)]  # every engine busy decoding
    measured = (len(steady) - 1) / (steady["start_s"].iloc[-1] - steady["start_s"].iloc[0])
    slowest = max(layers) / sum(layers) * pass_s
    bound = 1 / slowest
    cycle = stages / (pass_s + (stages - 1) * hop_s)  # each engine waits for its own pass to finish
    assert measured <= bound * (1 + 1e-9)
    assert measured == pytest.approx(min(bound, cycle), rel=1e-3)
    assert measured >= 0.99 * bound
    assert measured > 1 / pass_s  # faster than the same passes one after another on one GPU group


def test_a_new_request_goes_to_the_virtual_engine_with_fewest_unfinished() -> None:
    stream = make_stream(np.zeros(5), 16, 4)
    pipe = PipelineSetup.of((1, 1, 1), Hop(0, 0))
    engine = Engine(
        stream,
        ContinuousPolicyConfig(name="c", max_batch_size=8),
        setup(LayeredLinearCost(), kv_blocks=64, block_size=16, pipeline=pipe),
    )
    front = engine.replicas[0]
    assert isinstance(front, PipelineReplica) and len(front.engines) == 3
    for rid in range(5):
        front.enqueue(rid, 0.0)
    assert [front._engine_of[rid] for rid in range(5)] == [0, 1, 2, 0, 1]
    assert [e.waiting_count for e in front.engines] == [2, 2, 1] and front.waiting_count == 5
    assert all(e.blocks.total_blocks == 64 // 3 for e in front.engines)


def test_multi_step_blocks_go_through_the_stages_pass_by_pass() -> None:
    pipe = PipelineSetup.of((1, 1), Hop(1e-4, 0.0))
    stream = make_stream(np.linspace(0, 0.2, 10), 30, 25)
    policy = PagedPolicyConfig(name="p", max_batch_size=4, num_scheduler_steps=4)
    engine = Engine(stream, policy, setup(LayeredLinearCost(0.01, 1e-4), kv_blocks=200, block_size=16, pipeline=pipe),
                    audit_every=1)  # fmt: skip
    out = engine.run()
    assert (out.requests["status"] == "completed").all()
    assert np.array_equal(engine.records.generated_tokens, stream.output_tokens)
    for _, rows in out.iterations.groupby(["replica", "stage"]):
        ends = (rows["start_s"] + rows["duration_s"]).to_numpy()
        assert np.all(rows["start_s"].to_numpy()[1:] >= ends[:-1] - 1e-12)  # a stage runs one micro-batch at a time


# --------------------------------------------------------------------------- summary and records
def _pp_scenario(**fields: object) -> Scenario:
    data = {
        "name": "pp", "seed": 1, "model": "llama-2-7b", "pipeline_parallel": 2,
        "workload": {"requests": 60, "arrival": {"kind": "poisson", "rate": 8.0},
                     "prompt_tokens": {"kind": "uniform", "low": 50, "high": 400},
                     "output_tokens": {"kind": "uniform", "low": 10, "high": 80}},
        "policies": [{"name": "sarathi", "kind": "chunked_prefill", "chunk_size": 512}],
    } | fields  # fmt: skip
    return Scenario.from_data(data)


def test_a_pipeline_run_counts_its_gpus_stages_and_passes() -> None:
    from sim.runner import run

    result = run(_pp_scenario(replicas=2))
    row = result.summary.iloc[0]
    iterations = result.iterations
    passes = iterations[iterations["stage"] == 0]
    assert row["num_gpus"] == 4 and row["replicas"] == 4  # 2 replicas x 2 stages of TP 1
    assert row["iterations"] == len(passes) == len(iterations) / 2
    span = row["duration_s"]
    assert row["gpu_busy_frac"] == pytest.approx(iterations["duration_s"].sum() / (span * 4), rel=1e-9)
    assert row["prefill_tokens_computed"] == passes["prefill_tokens"].sum()
    # MFU over all stage rows equals the whole model's FLOPs over the passes.
    work = PassWork.of(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1)
    assert PassWork.of(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1, stages=2).total_flops(iterations) == (
        pytest.approx(work.total_flops(passes), rel=1e-12)
    )
    assert result.facts["pipeline_stage_layers"] == [16, 16]
    assert (iterations["kv_blocks_total"] == result.facts["kv_blocks_per_virtual_engine"]).all()


def test_speculative_decoding_with_pipeline_stages_is_refused_in_one_line() -> None:
    with pytest.raises(UserError) as err:
        _pp_scenario(policies=[{"name": "s", "kind": "chunked_prefill", "speculative": {
            "method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}}])  # fmt: skip
    message = str(err.value)
    assert "speculative" in message and "pipeline_parallel" in message and "\n" not in message


def test_each_stage_is_its_own_trace_track_with_bubbles_between_micro_batches() -> None:
    from sim.report.series import timeline
    from sim.report.trace_events import trace_events
    from sim.runner import run

    result = run(_pp_scenario())
    document = trace_events(result.requests, result.iterations)
    names = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"replica 0, stage 0", "replica 0, stage 1"}
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    gaps = []
    for track in (0, 1):
        on_track = sorted((e["ts"], e["dur"]) for e in slices if e["tid"] == track)
        assert len(on_track) == len(slices) / 2
        ends = np.array([ts + dur for ts, dur in on_track[:-1]])
        starts = np.array([ts for ts, _ in on_track[1:]])
        assert np.all(starts >= ends - 1e-6)  # a stage runs one micro-batch at a time
        gaps.append(starts - ends)
    assert all((gap > 0).any() for gap in gaps)  # bubbles
    assert {e["args"]["virtual_engine"] for e in slices} == {0, 1}
    busy = timeline(result.iterations, replicas=result.replicas_per_policy).series["sarathi"]["busy"]
    assert busy.max() <= 1 + 1e-9 and busy.mean() < 1
