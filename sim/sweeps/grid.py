"""Parameter grids: parsing ``--param PATH=V1,V2`` options and expanding them into points.

A grid maps dotted scenario paths (the same paths ``--set`` takes, e.g.
``workload.arrival.rate`` or ``policies[continuous].max_batch_size``) to the values to
try. Its points are the cartesian product, numbered in a fixed order (the last
parameter varies fastest), so a point index means the same overrides in every run of
the same sweep, which is what resuming relies on. Every point's scenario is validated
before anything runs, so a typo fails at once rather than after an hour of sweeping.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sim.config import Scenario
from sim.config.overrides import split_path
from sim.errors import UserError, shown
from sim.io.yaml_reader import parse_option_value

RESERVED_COLUMNS = ("seed", "point", "error")
"""Columns the sweep table adds itself; a parameter may not use these names."""

_SCALARS = (str, int, float, bool, type(None))


def parse_param_option(text: str) -> tuple[str, list[Any]]:
    """Parse one ``--param PATH=V1,V2,...`` option; values are read as YAML scalars.

    Raises:
        UserError: no ``=``, an empty path, an empty value or a non-scalar value.
    """
    if "=" not in text:
        raise UserError(f"--param expects PATH=V1,V2,..., got '{text}'")
    path, values_text = (part.strip() for part in text.split("=", 1))
    if not path:
        raise UserError(f"--param '{text}': the path before '=' is empty")
    items = [item.strip() for item in values_text.split(",")]
    if any(not item for item in items):
        raise UserError(
            f"--param {path}: empty value in '{values_text}'; give V1,V2,... with no empty items"
        )
    return path, [_parse_scalar(path, item) for item in items]


def _parse_scalar(path: str, item: str) -> Any:
    value = parse_option_value(item, f"--param {path}")
    if not isinstance(value, _SCALARS):
        raise UserError(
            f"--param {path}: value {shown(item)} is not a single number, word or true/false"
        )
    return value


def parse_param_options(items: Sequence[str]) -> dict[str, list[Any]]:
    """Parse every ``--param`` option into a grid (see :func:`normalize_params`)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        path, values = parse_param_option(item)
        if path in grid:
            raise UserError(f"--param {path} is given twice; list all its values in one option")
        grid[path] = values
    return normalize_params(grid)


def normalize_params(params: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """Check a grid and return it as ``{path: [values]}``, keeping its order.

    Raises:
        UserError: an empty grid, a bad path, a reserved name, a scalar instead of a
            list, an empty or repeated value.
    """
    if not params:
        raise UserError(
            "a sweep needs at least one parameter, e.g. --param workload.arrival.rate=1,2,4"
        )
    grid: dict[str, list[Any]] = {}
    for path, values in params.items():
        _check_path(path)
        grid[path] = _check_values(path, values)
    return grid


def _check_path(path: Any) -> None:
    if not isinstance(path, str) or not path.strip():
        raise UserError(
            f"sweep parameter {path!r}: must be a dotted scenario path "
            "such as 'workload.arrival.rate'"
        )
    if path in RESERVED_COLUMNS or path == "name":
        hint = "; give seeds with --seeds / seeds=" if path == "seed" else ""
        raise UserError(f"sweep parameter '{path}' is not allowed (reserved){hint}")
    split_path(path)  # raises UserError for an empty path


def _check_values(path: str, values: Any) -> list[Any]:
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise UserError(f"sweep parameter '{path}': give a list of values, got {values!r}")
    listed = [_plain(v) for v in values]
    if not listed:
        raise UserError(f"sweep parameter '{path}': the list of values is empty")
    repeated = [v for i, v in enumerate(listed) if v in listed[:i]]
    if repeated:
        raise UserError(f"sweep parameter '{path}': value {repeated[0]!r} is listed twice")
    return listed


def _plain(value: Any) -> Any:
    # numpy scalars (from np.linspace, np.arange) as Python numbers: they validate, print
    # and go to JSON like the numbers a user would type.
    return value.item() if isinstance(value, np.generic) else value


def expand_grid(params: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """All combinations of a grid, as override dicts; the last parameter varies fastest."""
    paths = list(params)
    return [
        dict(zip(paths, combo, strict=True))
        for combo in itertools.product(*(params[p] for p in paths))
    ]


def normalize_seeds(seeds: Sequence[int] | int) -> list[int]:
    """``N`` -> seeds 0..N-1; a sequence is checked (non-negative, distinct integers), order kept.

    Raises:
        UserError: a count below 1, a negative, repeated or non-integer seed.
    """
    seeds = _plain(seeds)
    if isinstance(seeds, bool) or not isinstance(seeds, (int, Iterable)):
        raise UserError(f"seeds = {seeds!r}: give a count or a list of integers")
    if isinstance(seeds, int):
        if seeds < 1:
            raise UserError(f"seeds = {seeds}: a seed count must be >= 1")
        return list(range(seeds))
    listed = [_plain(s) for s in seeds]
    if not listed or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in listed):
        raise UserError(
            f"seeds = {listed!r}: give a count or a non-empty list of non-negative integers"
        )
    if len(set(listed)) != len(listed):
        raise UserError(f"seeds = {listed!r}: a seed is listed twice")
    return listed


def parse_seeds_option(text: str) -> list[int]:
    """``--seeds 3`` -> [0, 1, 2]; ``--seeds 0,7,9`` -> [0, 7, 9]."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() for item in items):
        raise UserError(f"--seeds '{text}': give a count (3 = seeds 0,1,2) or a list such as 0,7,9")
    numbers = [int(item) for item in items]
    return normalize_seeds(numbers[0] if len(numbers) == 1 and "," not in text else numbers)


def describe_point(overrides: Mapping[str, Any]) -> str:
    """``workload.arrival.rate=4, policies[continuous].max_batch_size=16``."""
    return ", ".join(f"{path}={value}" for path, value in overrides.items())


def validate_points(base: Scenario, points: Sequence[Mapping[str, Any]]) -> list[Scenario]:
    """Apply every point's overrides to ``base`` and validate; returns the scenarios in order.

    Raises:
        UserError: naming the first point whose scenario is invalid and why.
    """
    from sim.sweeps.tasks import build_scenario, scenario_dict

    raw = scenario_dict(base)
    scenarios = []
    for index, overrides in enumerate(points):
        try:
            scenarios.append(build_scenario(raw, dict(overrides), base.base_dir))
        except UserError as exc:
            raise UserError(f"sweep point {index} ({describe_point(overrides)}): {exc}") from None
    return scenarios
