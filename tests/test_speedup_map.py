"""The speedup map: its numbers are sim.run's, its loads are fractions of a searched capacity."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from sim.report.speedup import speedup_markdown, speedup_table
from sim.studies import speedup_map as speedup_map_module
from sim.studies.regenerate import save_speedup_map, write_speedup_map
from sim.studies.speedup_map import BURST, MapConfig, SpeedupMap, measure_map
from sim.studies.speedup_map_text import (
    article_table,
    conclusion,
    length_order,
    map_markdown,
    wasted_share,
)

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
TINY = MapConfig(classes=("short", "long"), loads=(0.9,), batch_sizes=(4, 8), seeds=(0, 1),
                 batches_per_run=4, workers=1)  # fmt: skip


@pytest.fixture(scope="module")
def measured() -> tuple[SpeedupMap, list[dict[str, Any]]]:
    """A tiny map, with every call to the capacity search recorded."""
    calls: list[dict[str, Any]] = []
    real = speedup_map_module.capacity

    def spy(scenario: Any, slo: Any, **kwargs: Any) -> pd.DataFrame:
        report = real(scenario, slo, **kwargs)
        calls.append({"scenario": scenario, "slo": slo, "kwargs": kwargs, "report": report})
        return report

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(speedup_map_module, "capacity", spy)  # workers=1: the search runs in this process
        result = measure_map(SCENARIOS, TINY, log=lambda _: None)
    return result, calls


def _direct(name: str, batch: int, arrival: dict[str, Any], seed: int) -> pd.DataFrame:
    """The map point built by hand from the seed-table file and run through the public API."""
    scenario = sim.load_scenario(SCENARIOS / "seed_table" / f"{name}.yaml").replace(**{
        "workload.requests": TINY.batches_per_run * batch, "workload.arrival": arrival,
        "policies[static].max_batch_size": batch, "policies[continuous].max_batch_size": batch, "seed": seed,
    })  # fmt: skip
    return sim.run(scenario, policies=["static", "continuous"]).summary.set_index("policy")


def test_a_map_point_is_exactly_a_direct_run(measured: tuple[SpeedupMap, list[dict[str, Any]]]) -> None:
    result, _ = measured
    row = result.table[(result.table["length_class"] == "long") & (result.table["load"] == 0.9)
                       & (result.table["max_batch_size"] == 8)].iloc[0]  # fmt: skip
    direct = [_direct("long", 8, {"kind": "poisson", "rate": row["rate_rps"]}, seed) for seed in TINY.seeds]
    runs = result.runs[(result.runs["length_class"] == "long") & (result.runs["load"] == 0.9)
                       & (result.runs["max_batch_size"] == 8)].set_index(["seed", "policy"])  # fmt: skip
    for seed, summary in zip(TINY.seeds, direct, strict=True):
        for policy in ("static", "continuous"):
            for metric in ("e2e_mean_s", "e2e_p50_s", "output_tps", "throughput_rps"):
                assert runs.loc[(seed, policy), metric] == summary.loc[policy, metric]
    static = [d.loc["static", "e2e_mean_s"] for d in direct]
    fast = [d.loc["continuous", "e2e_mean_s"] for d in direct]
    assert row["static_e2e_mean_s"] == pytest.approx(np.mean(static), rel=1e-12)
    assert row["speedup"] == pytest.approx(np.mean(static) / np.mean(fast), rel=1e-12)


def test_loads_are_fractions_of_the_searched_capacity(measured: tuple[SpeedupMap, list[dict[str, Any]]]) -> None:
    result, calls = measured
    assert len(calls) == len(TINY.classes) * len(TINY.batch_sizes)
    caps = result.capacity.set_index(["length_class", "max_batch_size"])
    found = {}
    for call in calls:
        scenario = call["scenario"]
        assert [p.name for p in scenario.policies] == ["static"]
        assert scenario.workload.arrival.kind == "poisson"
        found[(scenario.name, scenario.policies[0].max_batch_size)] = float(call["report"]["rate_rps"].iloc[0])
    names = {"short": "seed_short", "long": "seed_long"}
    for (name, batch), row in caps.iterrows():
        assert row["capacity_rps"] == found[(names[name], batch)]
        assert row["capacity_rps"] <= row["saturation_rps"] or "not monotone" in row["note"]
    poisson = result.table[result.table["load"] != BURST]
    for row in poisson.itertuples(index=False):
        capacity_rps = caps.loc[(row.length_class, row.max_batch_size), "capacity_rps"]
        assert row.rate_rps == pytest.approx(float(row.load) * capacity_rps, rel=1e-12)


def test_capacity_is_the_search_answer_for_the_stated_slo(measured: tuple[SpeedupMap, list[dict[str, Any]]]) -> None:
    result, _ = measured
    bursts = [_direct("short", 4, {"kind": "burst"}, seed) for seed in TINY.seeds]
    saturation = float(np.mean([b.loc["static", "throughput_rps"] for b in bursts]))
    row = result.capacity.set_index(["length_class", "max_batch_size"]).loc[("short", 4)]
    assert row["saturation_rps"] == pytest.approx(saturation, rel=1e-12)
    base = sim.load_scenario(SCENARIOS / "seed_table" / "short.yaml").replace(**{
        "workload.requests": 16, "workload.arrival": {"kind": "poisson", "rate": saturation},
        "policies": [{"name": "static", "kind": "static", "max_batch_size": 4}],
    })  # fmt: skip
    slo = {"e2e_p99_s": TINY.slo_batches * 4 / saturation}
    report = sim.capacity(base, slo, rate_high=saturation, seeds=TINY.capacity_seeds, tolerance=TINY.tolerance)
    assert row["capacity_rps"] == pytest.approx(float(report["rate_rps"].iloc[0]), rel=1e-12)


def test_table_invariants(measured: tuple[SpeedupMap, list[dict[str, Any]]]) -> None:
    table = measured[0].table
    assert table["speedup"].to_numpy() == pytest.approx(
        (table["static_e2e_mean_s"] / table["continuous_e2e_mean_s"]).to_numpy(), rel=1e-12)
    assert table["throughput_gain"].to_numpy() == pytest.approx(
        (table["continuous_output_tps"] / table["static_output_tps"]).to_numpy(), rel=1e-12)
    # A ratio of sums is a weighted mean of the per-seed ratios: it lies between them.
    assert (table["speedup_min"] <= table["speedup"] * (1 + 1e-12)).all()
    assert (table["speedup"] <= table["speedup_max"] * (1 + 1e-12)).all()
    for name in TINY.classes:
        for batch in TINY.batch_sizes:
            cells = table[(table["length_class"] == name) & (table["max_batch_size"] == batch)]
            assert list(cells["load"]) == [BURST, *TINY.loads]
            assert math.isnan(cells["rate_rps"].iloc[0])
    assert (table["requests"] == TINY.batches_per_run * table["max_batch_size"]).all()
    assert (measured[0].runs["completed"] == measured[0].runs["requests"]).all()


def test_csv_column_order_is_pinned(measured: tuple[SpeedupMap, list[dict[str, Any]]], tmp_path: Path) -> None:
    save_speedup_map(measured[0], tmp_path, plots=True)
    frame = pd.read_csv(tmp_path / "speedup_map.csv")
    assert list(frame.columns[:7]) == ["length_class", "load", "max_batch_size", "static_e2e_mean_s",
                                       "continuous_e2e_mean_s", "speedup", "throughput_gain"]  # fmt: skip
    assert set(frame["load"].astype(str)) == {"burst", "0.9"}
    for name in TINY.classes:
        assert (tmp_path / f"speedup_map_{name}.png").stat().st_size > 0
    text = (tmp_path / "speedup_map.md").read_text()
    assert text == map_markdown(measured[0])


@pytest.mark.slow
def test_workers_do_not_change_the_numbers() -> None:
    config = MapConfig(classes=("short",), loads=(0.7,), batch_sizes=(4,), seeds=(3,), batches_per_run=3)
    one = measure_map(SCENARIOS, config, log=lambda _: None)
    two = measure_map(SCENARIOS, MapConfig(**{**config.__dict__, "workers": 2}), log=lambda _: None)
    pd.testing.assert_frame_equal(one.table, two.table)


def test_wasted_share_matches_sampling() -> None:
    rng = np.random.default_rng(1)
    for low, high, batch in ((10, 99, 8), (1000, 2000, 32)):
        draws = rng.integers(low, high + 1, size=(100_000, batch))
        sampled = 1 - draws.mean() / draws.max(axis=1).mean()
        assert wasted_share(low, high, batch) == pytest.approx(sampled, abs=2e-3)
    assert wasted_share(50, 50, 16) == pytest.approx(0.0)


def _fake_map(speedups: dict[tuple[str, str | float, int], float]) -> SpeedupMap:
    rows = [{"length_class": c, "load": load, "max_batch_size": b, "static_e2e_mean_s": 2.0 * s,
             "continuous_e2e_mean_s": 2.0, "speedup": s, "throughput_gain": 1.0, "speedup_spread": 0.01}
            for (c, load, b), s in speedups.items()]  # fmt: skip
    config = MapConfig(classes=("short", "medium", "long"), loads=(0.9,), batch_sizes=(16,), seeds=(0,))
    lengths = {"short": (10, 99), "medium": (100, 500), "long": (1000, 2000)}
    return SpeedupMap(pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), config, lengths, "test")


def test_verdict_and_article_table_follow_the_data() -> None:
    fake = _fake_map({("short", BURST, 16): 1.6, ("medium", BURST, 16): 1.5, ("long", BURST, 16): 1.3,
                      ("short", 0.9, 16): 2.0, ("medium", 0.9, 16): 3.0, ("long", 0.9, 16): 4.0})  # fmt: skip
    order = length_order(fake).set_index("load")
    assert order.loc[BURST, "verdict"] == "reversed" and order.loc[0.9, "verdict"] == "holds"
    article = article_table(fake, 16, 0.9).set_index("length_class")
    assert article.loc["long", "static_ms"] == pytest.approx(8000.0)
    assert article.loc["medium", "article_speedup"] == 4.0
    text = conclusion(fake)
    assert "holds in 1 of 2" in text and "reversed in 1" in text and "2 of 6 cells" in text
    swapped = _fake_map({**{k: 1.5 for k in [("short", BURST, 16), ("medium", BURST, 16), ("long", BURST, 16)]},
                         ("short", 0.9, 16): 4.0, ("medium", 0.9, 16): 3.0, ("long", 0.9, 16): 2.0})  # fmt: skip
    assert "holds in 0 of 2" in conclusion(swapped) and "reversed in 1" in conclusion(swapped)


def test_batching_speedup_takes_the_map_conclusion() -> None:
    summary = pd.DataFrame({"policy": ["static", "continuous"], "e2e_mean_s": [2.0, 1.0], "output_tps": [1.0, 2.0]})
    table = speedup_table({"case": summary})
    closing = "**What the map says** test paragraph.\n"
    text = speedup_markdown(table, conclusion=closing)
    assert text.endswith(closing) and "Where the gain comes from" not in text
    assert "Where the gain comes from" in speedup_markdown(table)


def test_map_is_skipped_without_the_seed_table(tmp_path: Path) -> None:
    messages: list[str] = []
    assert write_speedup_map(tmp_path, tmp_path / "out", log=messages.append) is None
    assert messages and "skipped the speedup map" in messages[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("top_speedup", [1.8, 5.19, 40.0])
def test_heatmap_colour_bar_reads_in_plain_multiples(top_speedup: float) -> None:
    """Colour-bar ticks read like the cells ("2x"), never the log axis' default "2x10^0"."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sim.studies.speedup_map_plot import speedup_heatmap

    loads, sizes = [BURST, 0.9], [8, 16]
    speedups = np.geomspace(1.2, top_speedup, len(loads) * len(sizes))
    table = pd.DataFrame(
        [{"length_class": "mixed", "load": load, "max_batch_size": size} for load in loads for size in sizes]
    ).assign(speedup=speedups, speedup_spread=0.05)
    fig = speedup_heatmap(table, "mixed", band=(1.5, 1.6))  # the bar's top is the map's maximum
    FigureCanvasAgg(fig).draw()
    bar = fig.axes[1]
    low, high = sorted(bar.get_ylim())
    labels = bar.get_yticklabels(minor=False) + bar.get_yticklabels(minor=True)
    shown = [(t.get_text(), t.get_position()[1]) for t in labels]
    visible = [(text, at) for text, at in shown if text and low <= at <= high]
    assert len(visible) >= 3, shown
    for text, at in visible:
        assert "10^" not in text and "$" not in text and text == f"{at:g}x"
