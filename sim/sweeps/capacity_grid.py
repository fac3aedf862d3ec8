"""The grid of a capacity search: deployments to compare, each searched for its highest rate.

``python -m sim capacity FILE --slo ... --param pipeline_parallel=1,2 --param tensor_parallel=2,4``
searches every policy at every grid point (the cartesian product, as a sweep's, the last parameter
varying fastest). Each point's scenario is validated before anything runs; a point whose
deployment cannot serve the requests (the model does not fit its GPUs, a request does not fit a
replica's KV cache) is not an error, it is part of the answer: its rows say why and it gets no runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sim.config import Scenario
from sim.errors import UserError
from sim.sweeps.grid import describe_point, expand_grid, normalize_params, validate_points

Lane = tuple[int, str]
"""One search: (grid point, policy name)."""


def capacity_points(
    base: Scenario, params: Mapping[str, Sequence[Any]] | None, searched_path: str
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The grid points of a capacity search, and why each point that cannot serve the requests cannot.

    Args:
        base: the scenario the points override.
        params: scenario path -> values (None or empty: the scenario alone, one empty point).
        searched_path: the path the search itself varies, which the grid may not set.

    Raises:
        UserError: a bad grid, one setting ``searched_path``, or a point whose scenario is invalid.
    """
    if not params:
        return [{}], {}
    grid = normalize_params(params)
    if searched_path in grid:
        raise UserError(f"--param {searched_path}: the capacity search varies it itself; grid other fields")
    points = expand_grid(grid)
    scenarios = validate_points(base, points)
    unservable = {index: why for index, scenario in enumerate(scenarios) if (why := why_unservable(scenario))}
    return points, unservable


def why_unservable(scenario: Scenario) -> str:
    """Why ``scenario``'s deployment cannot serve its requests under its policies ("" if it can)."""
    from sim.resolve import resolve
    from sim.runner import check_servable

    try:
        check_servable(resolve(scenario), list(scenario.policies))
    except UserError as exc:
        return str(exc)
    return ""


def describe_lane(lane: Lane, points: Sequence[Mapping[str, Any]]) -> str:
    """``policy 'vllm' (pipeline_parallel=2, tensor_parallel=2)``, or ``policy 'vllm'`` without a grid."""
    point, policy = lane
    where = describe_point(points[point])
    return f"policy '{policy}'" + (f" ({where})" if where else "")
