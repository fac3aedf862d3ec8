"""Energy and cost per token: conservation, the power model's physics, and how cost follows batching.

Conservation is checked against an independent path: :func:`sim.metrics.energy.fleet_power_w`
looks up, per replica and instant, which pass runs, and the test integrates that step function
exactly (it is constant between consecutive pass boundaries) over the run window; the summary's
``energy_j`` sums per-pass energies plus idle energy instead. Bill conservation links
``usd_per_mtok`` to ``requests_per_usd``, which are computed by different functions.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.config import Scenario
from sim.fleet import colocated_pools
from sim.hardware.catalog import GPUS, get_gpu, get_model
from sim.hardware.power import SOURCES, PowerModel
from sim.hardware.utilization import PassWork
from sim.metrics.energy import ENERGY_COLUMNS, Pool, fleet_power_w, run_energy_j
from sim.metrics.summary import EXTRA_COLUMNS, SUMMARY_COLUMNS, run_window_s
from sim.resolve import resolve


def _scenario(**changes: object) -> Scenario:
    """Llama-2-7B on A100s at moderate Poisson load: passes with idle gaps between them."""
    base = {
        "name": "energy",
        "seed": 3,
        "replicas": 2,
        "workload": {
            "requests": 150,
            "arrival": {"kind": "poisson", "rate": 2.0},
            "prompt_tokens": {"kind": "uniform", "low": 64, "high": 1024},
            "output_tokens": {"kind": "uniform", "low": 4, "high": 200},
        },
        "policies": [
            {"name": "static", "kind": "static", "max_batch_size": 8},
            {"name": "continuous", "kind": "continuous", "max_batch_size": 16},
        ],
    }
    return Scenario(**base).replace(**changes) if changes else Scenario(**base)


def _integral_j(iterations: pd.DataFrame, pools: tuple[Pool, ...], start_s: float, end_s: float) -> float:
    """Exact integral of the fleet's power over [start, end]: constant between pass boundaries."""
    ends = iterations["start_s"] + iterations["duration_s"]
    edges = np.unique(np.concatenate([[start_s, end_s], iterations["start_s"].to_numpy(), ends.to_numpy()]))
    edges = edges[(edges >= start_s) & (edges <= end_s)]
    middles = (edges[:-1] + edges[1:]) / 2
    return float(np.sum(fleet_power_w(iterations, pools, middles) * np.diff(edges)))


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_energy_is_power_integrated_over_the_timeline(gpu: str) -> None:
    scenario = _scenario(gpu=gpu)
    result = sim.run(scenario, load_frac=False)
    pools = colocated_pools(resolve(scenario))
    for name, row in result.summary.set_index("policy").iterrows():
        requests = result.requests[result.requests["policy"] == name]
        iterations = result.iterations[result.iterations["policy"] == name]
        start_s, end_s = run_window_s(requests, iterations)
        integral = _integral_j(iterations, pools, start_s, end_s)
        assert row["energy_j"] == pytest.approx(integral, rel=1e-9)
        # the run has idle time (a GPU not in a pass draws idle power), so both terms matter
        assert row["gpu_busy_frac"] < 0.95
        assert row["power_w"] * row["duration_s"] == pytest.approx(integral, rel=1e-9)


@st.composite
def _passes(draw: st.DrawFn) -> pd.DataFrame:
    """Non-overlapping passes on 1-3 replicas with random gaps and batch contents."""
    rows = []
    for replica in range(draw(st.integers(1, 3))):
        clock = draw(st.floats(0.0, 1.0))
        for _ in range(draw(st.integers(0, 12))):
            clock += draw(st.floats(0.0, 0.5))  # a gap (idle) before the pass
            duration = draw(st.floats(1e-4, 0.2))
            decode = draw(st.integers(0, 64))
            prefill = draw(st.integers(0, 4096))
            rows.append({
                "replica": replica, "start_s": clock, "duration_s": duration, "prefill_tokens": prefill,
                "batch_size": decode + (1 if prefill else 0), "decode_tokens": decode,
                "prefill_attn_work": prefill * prefill / 2, "decode_kv_tokens": decode * draw(st.integers(1, 4096)),
            })  # fmt: skip
            clock += duration
    return pd.DataFrame(rows, columns=["replica", "start_s", "duration_s", "prefill_tokens", "batch_size",
                                       "decode_tokens", "prefill_attn_work", "decode_kv_tokens"])  # fmt: skip


@settings(max_examples=examples(0.5))
@given(passes=_passes(), tail_s=st.floats(0.0, 2.0), gpu=st.sampled_from(["a100-80gb", "h100-sxm", "a40"]))
def test_pass_plus_idle_energy_equals_the_integral_on_any_timeline(
    passes: pd.DataFrame, tail_s: float, gpu: str
) -> None:
    spec = get_gpu(gpu)
    replicas = 3
    pool = Pool(PassWork.of(get_model("llama-2-7b"), spec, 1), PowerModel.of(spec), 1, tuple(range(replicas)))
    end_s = float((passes["start_s"] + passes["duration_s"]).max()) + tail_s if len(passes) else tail_s
    total = run_energy_j(passes, (pool,), end_s)
    assert total == pytest.approx(_integral_j(passes, (pool,), 0.0, end_s), rel=1e-9, abs=1e-9)
    assert replicas * spec.idle_w * end_s - 1e-9 <= total <= replicas * spec.tdp_w * end_s + 1e-9


@settings(max_examples=examples(2))
@given(
    mfu=st.floats(0, 1), mbu=st.floats(0, 1), more=st.floats(0, 1), gpu=st.sampled_from(sorted(GPUS))
)  # fmt: skip
def test_power_stays_between_idle_and_tdp_and_grows_with_work(mfu: float, mbu: float, more: float, gpu: str) -> None:
    model = PowerModel.of(get_gpu(gpu))
    assert model is not None
    watts = float(model.pass_watts(np.array([mfu]), np.array([mbu]))[0])
    assert model.idle_w <= watts <= model.tdp_w
    assert float(model.pass_watts(np.array([mfu + more]), np.array([mbu]))[0]) >= watts
    assert float(model.pass_watts(np.array([mfu]), np.array([mbu + more]))[0]) >= watts


def test_every_catalog_gpu_has_power_figures_with_their_sources() -> None:
    for name, gpu in GPUS.items():
        assert 0 < gpu.idle_w < gpu.tdp_w, name
        assert set(SOURCES[name]) == {"tdp_w", "idle_w", "usd_per_hour"}, name
        assert all(SOURCES[name].values()), name


def test_energy_columns_come_last_after_load_frac() -> None:
    columns = SUMMARY_COLUMNS + EXTRA_COLUMNS
    assert columns[-len(ENERGY_COLUMNS) - 1 :] == ("load_frac", *ENERGY_COLUMNS)


def _saturated(batch: int, gpu: str = "a100-80gb") -> Scenario:
    """A closed loop with more clients than any batch holds: the GPU never waits for work."""
    return Scenario(
        name=f"sat{batch}",
        seed=5,
        gpu=gpu,
        workload={
            "requests": 400,
            "arrival": {"kind": "closed_loop", "clients": 96},
            "prompt_tokens": {"kind": "uniform", "low": 64, "high": 512},
            "output_tokens": {"kind": "uniform", "low": 32, "high": 256},
        },
        policies=[{"name": "continuous", "kind": "continuous", "max_batch_size": batch}],
    )


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_cost_and_energy_per_token_fall_as_batching_gets_more_efficient(gpu: str) -> None:
    rows = pd.DataFrame(
        [sim.run(_saturated(batch, gpu), load_frac=False).summary.iloc[0] for batch in (1, 2, 4, 8, 16, 32, 64)]
    ).sort_values("mean_batch_size")
    assert (rows["gpu_busy_frac"] > 0.99).all()  # saturated: cost is paid for busy GPUs only
    assert rows["mean_batch_size"].is_monotonic_increasing and rows["mean_batch_size"].is_unique
    assert (np.diff(rows["usd_per_mtok"]) < 0).all()
    assert (np.diff(rows["joules_per_token"]) < 0).all()


def test_the_bill_is_split_between_input_and_output_tokens_and_matches_requests_per_usd() -> None:
    scenario = _saturated(16).replace(input_price_ratio=0.25, gpu_hour_usd=3.0)
    result = sim.run(scenario, load_frac=False)
    row = result.summary.iloc[0]
    done = result.requests[result.requests["status"] == "completed"]
    billed = row["usd_per_mtok"] * done["output_tokens"].sum() + row["usd_per_mtok_input"] * done["prompt_tokens"].sum()
    assert billed / 1e6 == pytest.approx(row["completed"] / row["requests_per_usd"], rel=1e-9)
    assert row["usd_per_mtok_input"] == pytest.approx(0.25 * row["usd_per_mtok"])
    assert row["fleet_usd_per_hour"] == 3.0


def test_scenario_price_overrides_the_catalog_and_a_gpu_without_price_gives_nan() -> None:
    catalog = sim.run(_saturated(8), load_frac=False).summary.iloc[0]
    doubled = sim.run(_saturated(8).replace(gpu_hour_usd=2 * get_gpu("a100-80gb").usd_per_hour), load_frac=False)
    assert doubled.summary.iloc[0]["usd_per_mtok"] == pytest.approx(2 * catalog["usd_per_mtok"])
    unpriced = sim.run(_saturated(8, gpu="a100-40gb"), load_frac=False).summary.iloc[0]
    assert math.isnan(unpriced["usd_per_mtok"]) and math.isnan(unpriced["requests_per_usd"])
    assert unpriced["joules_per_token"] > 0  # energy needs no price


def test_disaggregated_energy_is_the_sum_of_its_pools() -> None:
    scenario = _scenario(
        replicas=2,
        disaggregation={
            "name": "disagg",
            "prefill": {
                "replicas": 1,
                "gpu": "h100-sxm",
                "policy": {"name": "p", "kind": "paged", "max_batch_size": 64},
            },
            "decode": {"replicas": 1, "policy": {"name": "d", "kind": "paged", "max_batch_size": 64}},
        },
    )
    result = sim.run(scenario, policies=["disagg"], load_frac=False)
    row = result.summary.iloc[0]
    from sim.disaggregation import disaggregated_pools

    pools = disaggregated_pools(resolve(scenario), scenario.disaggregation)
    start_s, end_s = run_window_s(result.requests, result.iterations)
    assert row["energy_j"] == pytest.approx(_integral_j(result.iterations, pools, start_s, end_s), rel=1e-9)
    prices = get_gpu("h100-sxm").usd_per_hour + get_gpu("a100-80gb").usd_per_hour
    assert row["fleet_usd_per_hour"] == pytest.approx(prices)


@pytest.mark.parametrize(
    ("price", "message"),
    [
        ({"a10": 1.0}, "did you mean 'a40'"),
        ({"a40": 0}, "positive number of USD"),
        (-2.0, "positive number of USD"),
        (True, "not the boolean"),
    ],
)
def test_bad_gpu_prices_are_one_line_errors(price: object, message: str) -> None:
    with pytest.raises(sim.UserError) as caught:
        _saturated(8).replace(gpu_hour_usd=price)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_price_per_gpu_type_prices_only_that_type() -> None:
    scenario = _scenario(
        replicas=1,
        gpu_hour_usd={"h100-sxm": 9.0},
        disaggregation={
            "name": "disagg",
            "prefill": {"gpu": "h100-sxm", "policy": {"name": "p", "kind": "paged", "max_batch_size": 64}},
            "decode": {"policy": {"name": "d", "kind": "paged", "max_batch_size": 64}},
        },
    )
    rows = sim.run(scenario, load_frac=False).summary.set_index("policy")
    assert rows.loc["continuous", "fleet_usd_per_hour"] == get_gpu("a100-80gb").usd_per_hour
    assert rows.loc["disagg", "fleet_usd_per_hour"] == pytest.approx(9.0 + get_gpu("a100-80gb").usd_per_hour)


def test_pipeline_stages_draw_power_on_their_own_gpus_at_the_same_time() -> None:
    """Under pipeline parallelism every row is one stage's pass on that stage's GPUs, while the other
    stages run theirs: counting a row on the whole replica's GPUs would double the busy power and push
    the fleet above its TDP (and the idle energy below zero) at high load."""
    scenario = _scenario(
        pipeline_parallel=2,
        replicas=1,
        workload={"requests": 120, "arrival": {"kind": "poisson", "rate": 40.0},
                  "prompt_tokens": {"kind": "uniform", "low": 64, "high": 1024},
                  "output_tokens": {"kind": "uniform", "low": 4, "high": 200}},
    )  # fmt: skip
    result = sim.run(scenario, load_frac=False)
    resolved = resolve(scenario)
    pools = colocated_pools(resolved)
    power = PowerModel.of(resolved.gpu)
    assert pools[0].gpus_per_row == 1 and resolved.num_gpus == 2
    for name, row in result.summary.set_index("policy").iterrows():
        requests = result.requests[result.requests["policy"] == name]
        iterations = result.iterations[result.iterations["policy"] == name]
        assert set(iterations["stage"]) == {0, 1}
        start_s, end_s = run_window_s(requests, iterations)
        assert row["energy_j"] == pytest.approx(_integral_j(iterations, pools, start_s, end_s), rel=1e-9)
        assert resolved.num_gpus * power.idle_w <= row["power_w"] <= resolved.num_gpus * power.tdp_w
        stage_busy_s = iterations.groupby("stage")["duration_s"].sum()
        assert (stage_busy_s <= end_s - start_s + 1e-9).all()  # one stage's rows never overlap each other
