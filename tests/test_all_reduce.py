"""Tensor-parallel all-reduce as engines run it (sim.hardware.all_reduce): the algorithm by message size and
interconnect, CUDA graph against eager, the per-pass pricing and the iterations column that reports it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from sim.config import Scenario
from sim.errors import UserError
from sim.hardware.all_reduce import (
    CUSTOM_AR_WORLD_SIZES,
    EAGER_LAUNCHES,
    LAUNCH_US,
    MIB,
    NCCL_EAGER,
    VLLM_V0_GRAPHS,
    VLLM_V1_GRAPHS,
    AllReduceSpec,
    algorithms,
    bus_floor_ms,
    custom_fit,
    per_call_ms,
)
from sim.hardware.calibration_files import CALIBRATION_DIR, read_yaml
from sim.hardware.catalog import GPUS, get_gpu
from sim.hardware.cost_model import TABLE_SIZE, calibrated_configs, load_cost_model
from sim.hardware.curves import PiecewiseLinear
from sim.metrics.records import ALL_REDUCE_COLUMN

SIZES = np.unique(np.round(np.geomspace(16, 256 * MIB, 400)).astype(np.int64) // 16 * 16).astype(float)
NVLINK = [name for name, gpu in GPUS.items() if gpu.interconnect == "NVLink"]
PCIE = [name for name, gpu in GPUS.items() if gpu.interconnect == "PCIe"]


def _nccl_curves() -> list[tuple[str, int, PiecewiseLinear]]:
    """(GPU, GPUs, NCCL curve) of every committed calibration and roofline file with an all-reduce section."""
    found = []
    for path in sorted(CALIBRATION_DIR.glob("*.yaml")):
        data = read_yaml(path)
        sections = data.get("all_reduce", {}) or {}
        for section in sections.get("curves", {sections.get("gpus"): sections}).values():
            if section and "message_bytes" in section:
                found.append(
                    (data["gpu"], int(section["gpus"]), PiecewiseLinear(section["message_bytes"], section["ms"]))
                )
    assert len(found) > 30
    return found


NCCL_CURVES = _nccl_curves()


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize(
    "spec", [AllReduceSpec(), VLLM_V1_GRAPHS, NCCL_EAGER, AllReduceSpec(custom_max_bytes=64 * MIB)]
)
def test_every_call_is_above_the_links_bandwidth_floor(spec: AllReduceSpec, graphed: bool) -> None:
    for gpu_name, gpus, curve in NCCL_CURVES:
        if gpus > 8:  # 16 GPUs span two nodes: the NVLink floor is not theirs
            continue
        gpu = get_gpu(gpu_name)
        ms = per_call_ms(spec, gpu, gpus, curve.at, SIZES, graphed=graphed)
        floor = bus_floor_ms(gpu, gpus, SIZES)
        assert (ms >= floor).all(), (gpu_name, gpus, SIZES[ms < floor][:3])


@pytest.mark.parametrize("gpu_name", NVLINK)
@pytest.mark.parametrize("gpus", CUSTOM_AR_WORLD_SIZES)
def test_time_grows_with_the_message_within_each_algorithm(gpu_name: str, gpus: int) -> None:
    """Per call the time is monotone in size wherever the algorithm stays the same (at a switch the engine's
    choice may be faster; the per-pass tables take the upper envelope, next test)."""
    gpu, curve = get_gpu(gpu_name), NCCL_CURVES[0][2]
    ms = per_call_ms(AllReduceSpec(), gpu, gpus, curve.at, SIZES, graphed=True)
    algo = algorithms(AllReduceSpec(), gpu, gpus, SIZES)
    for name in ("one_shot", "two_shot", "nccl"):
        run = ms[algo == name]
        assert (np.diff(run) >= 0).all(), name
    assert set(algo) <= {"one_shot", "two_shot", "nccl"} and "one_shot" in set(algo)


@pytest.mark.parametrize("config", [c for c in calibrated_configs() if c[2] > 1][::3], ids=str)
def test_pass_all_reduce_never_decreases_with_tokens_past_the_table_too(config: tuple[str, str, int]) -> None:
    for spec in (AllReduceSpec(), VLLM_V1_GRAPHS, NCCL_EAGER):
        cost = load_cost_model(*config, all_reduce=spec)
        for graph_flag in (True, False):
            table = cost._ar.graph if graph_flag else cost._ar.eager
            assert (np.diff(table) >= 0).all()
            beyond = [cost._ar.pass_s(TABLE_SIZE - 2 + k, graph_flag) for k in range(4)]
            beyond += [cost._ar.pass_s(float(TABLE_SIZE * 3), graph_flag)]
            assert all(b >= a for a, b in zip(beyond, beyond[1:], strict=False)), beyond


@pytest.mark.parametrize("limit", [256 * 1024, 1 * MIB, 8 * MIB, 32 * MIB])
@pytest.mark.parametrize("gpus", CUSTOM_AR_WORLD_SIZES)
def test_nccl_takes_over_exactly_at_the_engines_size_limit(limit: int, gpus: int) -> None:
    spec, h100 = AllReduceSpec(custom_max_bytes=limit), get_gpu("h100-sxm")
    size = np.array([limit - 16, limit, limit + 16], float)
    assert list(algorithms(spec, h100, gpus, size)[1:]) == ["nccl", "nccl"]
    below = algorithms(spec, h100, gpus, size[:1])[0]
    assert below != "nccl"
    nccl = NCCL_CURVES[0][2].at
    fit, scale = custom_fit(h100, gpus, below)
    ms = per_call_ms(spec, h100, gpus, nccl, size, graphed=True)
    assert ms[0] == pytest.approx(float(fit.ms(size[:1], scale)[0]))
    assert ms[1:] == pytest.approx(nccl(size[1:]))


@pytest.mark.parametrize(("gpus", "one_shot_below"), [(2, None), (4, 512 * 1024), (6, 256 * 1024), (8, 256 * 1024)])
def test_one_shot_and_two_shot_switch_where_the_kernel_does(gpus: int, one_shot_below: int | None) -> None:
    h100, sizes = get_gpu("h100-sxm"), np.array([16.0, 255 * 1024, 256 * 1024, 511 * 1024, 512 * 1024, 4 * MIB])
    algo = list(algorithms(AllReduceSpec(), h100, gpus, sizes))
    expected = ["one_shot" if one_shot_below is None or s < one_shot_below else "two_shot" for s in sizes]
    assert algo == expected


@given(size=st.floats(16, 256 * MIB), gpus=st.sampled_from([2, 4, 8]), graphed=st.booleans())
@pytest.mark.parametrize("gpu_name", PCIE)
def test_a_pcie_gpu_never_runs_the_custom_kernel(gpu_name: str, size: float, gpus: int, graphed: bool) -> None:
    gpu, nccl = get_gpu(gpu_name), NCCL_CURVES[0][2].at
    assert algorithms(AllReduceSpec(custom_max_bytes=1 << 40), gpu, gpus, np.array([size]))[0] == "nccl"
    ms = per_call_ms(AllReduceSpec(custom_max_bytes=1 << 40), gpu, gpus, nccl, np.array([size]), graphed=graphed)
    assert float(ms[0]) == pytest.approx(float(nccl(np.array([size]))[0]) + (0 if graphed else LAUNCH_US * 1e-3))


def test_unsupported_gpu_counts_and_nccl_setting_use_nccl() -> None:
    h100 = get_gpu("h100-sxm")
    assert set(algorithms(AllReduceSpec(), h100, 3, SIZES)) == {"nccl"}  # not a custom-kernel world size
    assert set(algorithms(AllReduceSpec(), h100, 16, SIZES)) == {"nccl"}
    assert set(algorithms(NCCL_EAGER, h100, 4, SIZES)) == {"nccl"}


@pytest.mark.parametrize("gpu_name", ["h100-sxm", "a100-80gb", "a40"])
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_graph_and_eager_differ_by_the_launch_overhead_only(gpu_name: str, gpus: int) -> None:
    gpu, nccl = get_gpu(gpu_name), NCCL_CURVES[0][2].at
    for spec in (AllReduceSpec(), NCCL_EAGER):
        algo = algorithms(spec, gpu, gpus, SIZES)
        launches = np.array([EAGER_LAUNCHES[a] for a in algo])
        eager = per_call_ms(spec, gpu, gpus, nccl, SIZES, graphed=False)
        graph = per_call_ms(spec, gpu, gpus, nccl, SIZES, graphed=True)
        np.testing.assert_allclose(eager - graph, launches * LAUNCH_US * 1e-3, rtol=1e-9)


def test_a_graphed_decode_pass_saves_exactly_its_launches() -> None:
    """Llama-2-70B TP4 decode of 20 (16 KiB per token, one-shot): eager costs 2 launches x 160 all-reduces more."""
    graphed = load_cost_model("llama-2-70b", "h100-sxm", 4, cpu_overhead=False, all_reduce=VLLM_V0_GRAPHS)
    eager = graphed.with_all_reduce(AllReduceSpec())
    decode = (0, 0, 0.0, 20, 20 * 1000)
    saved = (
        eager.breakdown_from_totals_s(*decode)["all_reduce"] - graphed.breakdown_from_totals_s(*decode)["all_reduce"]
    )
    assert saved == pytest.approx(2 * 80 * 2 * LAUNCH_US * 1e-6)
    assert eager.time_from_totals_s(*decode) - graphed.time_from_totals_s(*decode) == pytest.approx(saved)


def test_which_passes_are_graphed_follows_the_engine() -> None:
    v0, v1 = VLLM_V0_GRAPHS, VLLM_V1_GRAPHS
    assert v0.graphed(256, 0) and not v0.graphed(257, 0) and not v0.graphed(100, 1)  # v0: decode batches
    assert v1.graphed(512, 3) and not v1.graphed(513, 0)  # v1: any pass up to 512 tokens
    assert not AllReduceSpec().graphed(1, 0)  # no CUDA graphs: eager, as the profiles were measured
    cost = load_cost_model("codellama-34b", "h100-sxm", 2, cpu_overhead=False, all_reduce=v0)
    mixed = (64, 1, 64 * 32.0, 8, 8000)
    assert (
        cost.breakdown_from_totals_s(*mixed)["all_reduce"]
        > cost.with_all_reduce(v1).breakdown_from_totals_s(*mixed)["all_reduce"]
    )


@pytest.mark.parametrize(
    ("sizes", "batches", "expected"),
    [(None, None, (0, False)), ([1, 2, 4, 8, 512], "all", (512, True)), ([1, 2, 4, 256], "decode", (256, False))],
)
def test_a_policys_cuda_graphs_decide_which_passes_are_graphed(
    sizes: list[int] | None, batches: str | None, expected: tuple[int, bool]
) -> None:
    graphs = None if sizes is None else SimpleNamespace(capture_sizes=sizes, batches=batches)
    block = SimpleNamespace(algorithm="nccl", custom_max_bytes=123)
    spec = AllReduceSpec.of(SimpleNamespace(all_reduce=block, cuda_graphs=graphs))
    assert (spec.graph_max_tokens, spec.graph_mixed_batches) == expected
    assert (spec.algorithm, spec.custom_max_bytes) == ("nccl", 123)
    assert AllReduceSpec.of(object()) == AllReduceSpec()  # a policy with neither block: the defaults


def test_custom_kernel_replaces_most_of_the_profiled_nccl_time_at_decode() -> None:
    """The motivating step of issue 27: Llama-2-70B TP4, H100, decode of 20: the NCCL profile alone (eager) prices
    all-reduce at 6-7 ms; the engine's graphed custom kernel at 160 x ~9 µs."""
    nccl = load_cost_model("llama-2-70b", "h100-sxm", 4, cpu_overhead=False, all_reduce=NCCL_EAGER)
    engine = load_cost_model("llama-2-70b", "h100-sxm", 4, cpu_overhead=False, all_reduce=VLLM_V0_GRAPHS)
    decode = (0, 0, 0.0, 20, 20 * 1000)
    before, after = (c.breakdown_from_totals_s(*decode)["all_reduce"] for c in (nccl, engine))
    assert before > 6e-3 and 1e-3 < after < 2e-3
    fit, _ = custom_fit(get_gpu("h100-sxm"), 4, "one_shot")
    assert after == pytest.approx(160 * float(fit.ms(np.array([20 * 8192 * 2.0]))[0]) * 1e-3)


def test_tp1_has_no_all_reduce_and_the_setting_changes_nothing() -> None:
    cost = load_cost_model("llama-2-7b", "a100-80gb", 1)
    assert cost.with_all_reduce(NCCL_EAGER).time_from_totals_s(0, 0, 0.0, 8, 800) == cost.time_from_totals_s(
        0, 0, 0.0, 8, 800
    )
    assert (cost.all_reduce_s(np.array([1, 100]), np.array([0, 1])) == 0).all()


# ------------------------------------------------------------------------------------------ iterations column
SCENARIO = {
    "name": "all_reduce",
    "seed": 5,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "tensor_parallel": 2,
    "workload": {
        "requests": 60,
        "arrival": {"kind": "poisson", "rate": 8.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 1200},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 80},
    },
    "policies": [
        {"name": "custom", "kind": "paged", "max_batch_size": 64},
        {
            "name": "small-limit",
            "kind": "chunked_prefill",
            "max_batch_size": 64,
            "chunk_size": 256,
            "all_reduce": {"custom_max_bytes": 64 * 1024},
        },
        {
            "name": "nccl",
            "kind": "chunked_prefill",
            "max_batch_size": 64,
            "chunk_size": 256,
            "all_reduce": {"algorithm": "nccl"},
        },
    ],  # fmt: skip
    "metrics": {"max_iteration_rows": 100000},
}


@pytest.fixture(scope="module")
def result() -> sim.RunResult:
    return sim.run(Scenario.model_validate(SCENARIO))


def test_iterations_column_is_each_passs_all_reduce_from_the_breakdown(result: sim.RunResult) -> None:
    it = result.iterations
    assert it.columns[-1] == ALL_REDUCE_COLUMN
    for policy in SCENARIO["policies"]:
        spec = AllReduceSpec(**policy.get("all_reduce", {}))
        cost = load_cost_model("llama-2-7b", "a100-80gb", 2, all_reduce=spec)
        rows = it[it["policy"] == policy["name"]]
        assert len(rows) > 20
        for row in rows.itertuples():
            totals = (row.prefill_tokens, row.batch_size - row.decode_tokens, row.prefill_attn_work,
                      row.decode_tokens, row.decode_kv_tokens)  # fmt: skip
            assert row.all_reduce_s == cost.breakdown_from_totals_s(*totals)["all_reduce"]
            assert 0 < row.all_reduce_s < row.duration_s


def test_each_policy_is_priced_with_its_own_all_reduce(result: sim.RunResult) -> None:
    it = result.iterations
    share = {
        name: (g[ALL_REDUCE_COLUMN].sum() / g["duration_s"].sum()) for name, g in it.groupby("policy", observed=True)
    }
    assert share["nccl"] > 1.5 * share["custom"], share  # the profiled NCCL time against the custom kernel
    # 64 KiB is 8 tokens of Llama-2-7B: above that the small-limit policy runs NCCL, below it the custom kernel.
    nccl, custom = (load_cost_model("llama-2-7b", "a100-80gb", 2, all_reduce=AllReduceSpec(algorithm=a))
                    for a in ("nccl", "custom"))  # fmt: skip
    rows = it[it["policy"] == "small-limit"]
    tokens = (rows["prefill_tokens"] + rows["decode_tokens"]).to_numpy()
    pieces = (rows["batch_size"] - rows["decode_tokens"]).to_numpy()
    small = tokens * 4096 * 2 < 64 * 1024
    assert small.any() and (~small).any()
    np.testing.assert_array_equal(rows[ALL_REDUCE_COLUMN].to_numpy()[small], custom.all_reduce_s(tokens, pieces)[small])
    assert (rows[ALL_REDUCE_COLUMN].to_numpy()[~small] >= nccl.all_reduce_s(tokens, pieces)[~small]).all()


def test_tp1_runs_report_zero_all_reduce() -> None:
    tp1 = dict(SCENARIO, tensor_parallel=1, policies=SCENARIO["policies"][:1])
    tp1["workload"] = dict(SCENARIO["workload"], requests=10)
    it = sim.run(Scenario.model_validate(tp1)).iterations
    assert len(it) and (it[ALL_REDUCE_COLUMN] == 0).all()


def test_all_reduce_setting_is_a_validated_policy_field() -> None:
    bad = dict(SCENARIO, policies=[{"name": "x", "kind": "paged", "max_batch_size": 4,
                                    "all_reduce": {"algorithm": "ring"}}])  # fmt: skip
    with pytest.raises(UserError, match=r"policies\[0\]\.all_reduce\.algorithm = 'ring': must be 'custom' or 'nccl'"):
        Scenario.model_validate(bad)
