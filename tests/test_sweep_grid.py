"""Parameter grids: parsing, expansion, seeds, and clean UserErrors for every mistake."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import Scenario
from sim.errors import UserError
from sim.io.scenario import scenario_from_dict
from sim.sweeps.grid import (
    expand_grid,
    normalize_params,
    normalize_seeds,
    parse_param_option,
    parse_param_options,
    parse_seeds_option,
    validate_points,
)
from sim.sweeps.runner import SweepPlan

BASE = {
    "name": "grid",
    "workload": {
        "requests": 100,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "fixed", "value": 64},
        "output_tokens": {"kind": "fixed", "value": 16},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 8},
    ],
}


@pytest.fixture
def base() -> Scenario:
    return scenario_from_dict(BASE)


def test_param_option_values_are_yaml_scalars() -> None:
    assert parse_param_option("workload.arrival.rate=1,2.5,4") == (
        "workload.arrival.rate",
        [1, 2.5, 4],
    )
    assert parse_param_option(" router = random , round_robin ") == (
        "router",
        ["random", "round_robin"],
    )
    assert parse_param_option("memory.kv_blocks=null,500") == ("memory.kv_blocks", [None, 500])


@pytest.mark.parametrize(
    "text", ["workload.arrival.rate", "=1,2", "rate=1,,2", "rate=", "rate={a: 1}", "rate=[1]"]
)
def test_bad_param_syntax_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError):
        parse_param_option(text)


def test_repeated_param_and_repeated_value_are_user_errors() -> None:
    with pytest.raises(UserError, match="twice"):
        parse_param_options(["workload.arrival.rate=1,2", "workload.arrival.rate=4"])
    with pytest.raises(UserError, match="twice"):
        parse_param_options(["workload.arrival.rate=1,2,1"])


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"seed": [1, 2]},
        {"point": [1]},
        {"": [1]},
        {"workload.requests": 5},
        {"workload.requests": []},
        {"router": "random"},
    ],
)
def test_bad_grids_are_user_errors(params: dict) -> None:
    with pytest.raises(UserError):
        normalize_params(params)


def test_numpy_values_and_seeds_become_plain_numbers() -> None:
    grid = normalize_params({"workload.arrival.rate": np.linspace(1.0, 2.0, 3), "x": range(2)})
    assert grid == {"workload.arrival.rate": [1.0, 1.5, 2.0], "x": [0, 1]}
    assert all(type(v) is float for v in grid["workload.arrival.rate"])
    assert normalize_seeds(np.arange(3)) == [0, 1, 2] and normalize_seeds(np.int64(2)) == [0, 1]


def test_grid_expansion_is_the_full_product_in_a_fixed_order() -> None:
    points = expand_grid({"a": [1, 2, 3], "b": ["x", "y"]})
    assert len(points) == 6
    assert (
        points[0] == {"a": 1, "b": "x"}
        and points[1] == {"a": 1, "b": "y"}
        and points[-1] == {"a": 3, "b": "y"}
    )
    assert len({tuple(p.items()) for p in points}) == 6


def test_seeds() -> None:
    assert normalize_seeds(3) == [0, 1, 2]
    assert normalize_seeds([7, 2]) == [7, 2]
    assert parse_seeds_option("3") == [0, 1, 2]
    assert parse_seeds_option("5,1") == [5, 1]
    for bad in (0, -1, [], [1, 1], [-2], [1.5], True):
        with pytest.raises(UserError):
            normalize_seeds(bad)  # type: ignore[arg-type]
    for text in ("0", "a", "1,,2", "-1", "4,"):
        with pytest.raises(UserError):
            parse_seeds_option(text)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"workload.arrival.rte": [1]}, "rte"),  # typo in a key
        ({"policies[contnuous].max_batch_size": [8]}, "contnuous"),  # typo in a selector
        ({"workload.arrival.rate": [1, -2]}, "point 1"),  # the second point is invalid
        ({"policies[static].max_batch_size": [8, 0]}, "max_batch_size"),
    ],
)
def test_every_point_is_validated_before_running(
    base: Scenario, params: dict, message: str
) -> None:
    with pytest.raises(UserError, match=message):
        SweepPlan.build(base, params, 1)


def test_points_may_create_optional_blocks(base: Scenario) -> None:
    # The base has no slo block; sweeping one of its bounds creates it.
    scenarios = validate_points(base, expand_grid({"slo.ttft_p99_s": [0.5, 1.0]}))
    assert [s.slo.ttft_p99_s for s in scenarios] == [0.5, 1.0]
    assert base.slo is None


def test_plan_columns_put_parameters_first_and_yield_to_a_parameter_named_like_a_metric(
    base: Scenario,
) -> None:
    plan = SweepPlan.build(base, {"replicas": [1, 2], "workload.arrival.rate": [1.0]}, [0, 3])
    assert plan.columns[:4] == ["replicas", "workload.arrival.rate", "seed", "point"]
    assert plan.columns.count("replicas") == 1 and plan.columns[-1] == "error"
    assert plan.keys == [(0, 0), (0, 3), (1, 0), (1, 3)]
    tasks = plan.tasks()
    assert tasks[1].overrides == {"replicas": 1, "workload.arrival.rate": 1.0, "seed": 3}
