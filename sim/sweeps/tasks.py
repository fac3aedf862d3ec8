"""Work units of sweeps and capacity searches, and the function workers run on them.

A :class:`Task` is plain data: the base scenario as a dict, the overrides of one point
(seed included), the folder relative data paths resolve against, and optionally the
policies to run. Workers rebuild and validate the scenario themselves and call the
point function; no engine object ever crosses a process boundary, so the same task
gives the same numbers in-process, in a process pool or on a Ray cluster.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim.config import Scenario
from sim.io.scenario import scenario_from_dict, scenario_to_dict

PointFn = Callable[[Scenario, Sequence[str] | None], pd.DataFrame]
"""``(scenario, policies or None) -> summary`` with one row per policy, in scenario order."""


def summary_point(scenario: Scenario, policies: Sequence[str] | None = None) -> pd.DataFrame:
    """The default point function: :func:`sim.runner.run` and its summary table."""
    from sim.runner import run

    return run(scenario, policies=policies).summary


@dataclass(frozen=True)
class Task:
    """One simulation to run: a base scenario dict plus overrides.

    Attributes:
        key: identifies the result, e.g. ``(point, seed)``.
        scenario: the base scenario as plain data (:func:`scenario_dict`).
        overrides: dotted-path overrides of this point, including ``seed``.
        base_dir: folder relative trace/length paths resolve against.
        policies: run only these policies (None: all).
    """

    key: tuple[Any, ...]
    scenario: dict[str, Any]
    overrides: dict[str, Any]
    base_dir: str | None = None
    policies: tuple[str, ...] | None = None

    def build(self) -> Scenario:
        """Validate the scenario of this task."""
        return build_scenario(self.scenario, self.overrides, self.base_dir)

    def policy_names(self) -> list[str]:
        """Policies this task runs, from the plain data (known even if it fails to validate)."""
        names = [str(p.get("name")) for p in self.scenario.get("policies", []) if isinstance(p, dict)]
        return [n for n in names if self.policies is None or n in self.policies]


@dataclass(frozen=True)
class TaskResult:
    """What a worker sends back: the summary rows, or the error that stopped the task.

    Attributes:
        key: the task's key.
        summary: one row per policy (None when the task failed).
        error: ``"ExceptionType: message"`` on one line; empty when it succeeded.
        policies: the policies the task ran, so failed tasks still report one row each.
    """

    key: tuple[Any, ...]
    summary: pd.DataFrame | None
    error: str
    policies: tuple[str, ...]


def execute(task: Task, point_fn: PointFn = summary_point) -> TaskResult:
    """Run one task; an exception becomes its ``error``, so one bad point never stops a sweep."""
    names = tuple(task.policy_names())
    if multiprocessing.parent_process() is not None:  # a pool worker (never a caller's own process)
        # What the worker holds before the point (modules, the loaded cost model) is not the point's garbage:
        # frozen, the collection after each policy scans the point's objects only, as `run` does (sim/cli.py).
        gc.freeze()
    try:
        summary = point_fn(task.build(), task.policies)
    except Exception as exc:  # noqa: BLE001 - reported per point, by design
        return TaskResult(task.key, None, one_line_error(exc), names)
    return TaskResult(task.key, summary, "", names)


def one_line_error(exc: BaseException) -> str:
    """``Type: message`` with newlines folded, so it fits one CSV cell and one log line."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain data of a scenario, with unset optional fields left out.

    Left-out ``None`` blocks (``slo``, ``client``, ...) let an override such as
    ``slo.ttft_p99_s=2`` create the block instead of failing on ``None``; every such
    field defaults to ``None``, so dropping them changes nothing.
    """
    return _drop_none(scenario_to_dict(scenario))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def build_scenario(raw: dict[str, Any], overrides: dict[str, Any], base_dir: str | None) -> Scenario:
    """Validate ``raw`` with ``overrides``; relative data paths resolve against ``base_dir``."""
    scenario = scenario_from_dict(raw, overrides)
    scenario._base_dir = base_dir
    return scenario
