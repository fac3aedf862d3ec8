"""The incident in money (sim.studies.money): each policy's fleet meets the clients' SLO when run
on its own, one A100 fewer does not, and static batching pays more per token than continuous."""

from __future__ import annotations

import pandas as pd
import pytest

import sim
from sim.io.scenario import load_scenario
from sim.studies.money import INCIDENT_SLO, SCENARIOS, incident_money


@pytest.fixture(scope="module")
def incident() -> pd.DataFrame:
    return incident_money(workers=1).set_index("policy")


def _meets(policy: str, replicas: int) -> bool:
    scenario = load_scenario(SCENARIOS / "incident.yaml").replace(replicas=replicas)
    row = sim.run(scenario, policies=[policy], load_frac=False).summary.iloc[0]
    return bool(row["completed"] == row["requests"] and row["e2e_p99_s"] <= INCIDENT_SLO["e2e_p99_s"])


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_each_policys_fleet_is_the_fewest_a100s_meeting_the_clients_slo(incident: pd.DataFrame, policy: str) -> None:
    a100s = int(incident.loc[policy, "a100s"])
    assert _meets(policy, a100s)
    assert a100s == 1 or not _meets(policy, a100s - 1)


def test_static_batching_costs_more_per_token_at_equal_slo(incident: pd.DataFrame) -> None:
    static, continuous = incident.loc["static"], incident.loc["continuous"]
    assert static["a100s"] > continuous["a100s"]
    assert static["usd_per_mtok"] > continuous["usd_per_mtok"]
    assert static["joules_per_token"] > continuous["joules_per_token"]
    assert static["one_a100_timed_out"] > 0 == continuous["one_a100_timed_out"]
