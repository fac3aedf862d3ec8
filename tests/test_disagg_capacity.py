"""Split search: every prefill:decode split of N GPUs is searched and the best one is marked."""

from __future__ import annotations

import pytest
from fakes import disagg_scenario

from sim.config import Scenario
from sim.errors import UserError
from sim.sweeps.split import split_search, splits


def _scenario() -> dict:
    return disagg_scenario(link={"kind": "nvlink"})


def test_splits_respect_pool_tensor_parallel() -> None:
    raw = _scenario()
    raw["disaggregation"]["decode"] = {**raw["disaggregation"]["decode"], "tensor_parallel": 2}
    assert splits(Scenario(**raw), 5) == [(1, 4), (3, 2)]
    with pytest.raises(UserError, match="split-gpus"):
        splits(Scenario(**raw), 2)


@pytest.mark.slow
def test_split_search_reports_each_split_and_the_colocated_policy() -> None:
    raw = _scenario()
    raw["workload"]["requests"] = 120
    table = split_search(Scenario(**raw), {"ttft_p99_s": 2.0, "tpot_p99_s": 0.025}, 3, attainment=0.9,
                         tolerance=0.2)  # fmt: skip
    assert list(table["deployment"]) == ["1p1d 1:2", "1p1d 2:1", "vllm-v0"]
    assert table["best"].sum() == 1 and (table["gpus"] == 3).all()
    best = table[table["best"]].iloc[0]
    assert best["capacity_per_gpu"] == table.loc[table["prefill_gpus"].notna(), "capacity_per_gpu"].max()
    assert (table["capacity_per_gpu"] == table["rate_rps"] / 3).all()
