"""The sweep loop: grid x seeds -> tasks -> backend -> one tidy table.

Every (point, seed) is one task that runs all policies on one request stream (common
random numbers, as :func:`sim.runner.run` does). Results stream back in completion
order; each point's rows are appended to ``sweep.csv`` as it arrives. When all are in,
the rows are put in grid order, the file is rewritten so, and the final table is parsed
from exactly that text: an in-memory sweep, a resumed one and the file on disk all hold
the same numbers to the last digit, in the same order.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from sim.config import Scenario
from sim.errors import UserError
from sim.io.scenario import load_scenario
from sim.metrics.summary import EXTRA_COLUMNS, SUMMARY_COLUMNS
from sim.progress import is_terminal
from sim.sweeps.backends import Backend, WorkerCount, open_capped_backend
from sim.sweeps.grid import (
    describe_point,
    expand_grid,
    normalize_params,
    normalize_seeds,
    validate_points,
)
from sim.sweeps.store import SweepFile, check_folder, order_rows, parse_rows, rows_text
from sim.sweeps.tasks import PointFn, Task, TaskResult, execute, scenario_dict, summary_point
from sim.uncertainty.trust import TRUST_COLUMNS


def sweep(
    scenario: Scenario | str | Path,
    params: Mapping[str, Sequence[Any]],
    seeds: Sequence[int] | int = (0,),
    *,
    workers: int | None = 1,
    backend: str = "local",
    address: str | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Run every combination of ``params`` for every seed; one row per point x policy x seed.

    The CLI's ``python -m sim sweep`` calls this same function.

    Args:
        scenario: a Scenario or the path of a scenario YAML file.
        params: dotted scenario path -> values, e.g. ``{"workload.arrival.rate": [1, 2, 4]}``;
            the points are all combinations (the last parameter varies fastest).
        seeds: seeds to run each point with; an int N means seeds 0..N-1.
        workers: processes (local) or CPUs of a local Ray; 1 runs in this process,
            None or 0 uses every core.
        backend: ``"local"`` (process pool) or ``"ray"``.
        address: Ray cluster address (``"auto"`` joins a running cluster); ray backend only.
        out: folder for ``sweep.csv`` (appended point by point) and ``sweep.json``.
        resume: keep the finished points already in ``out/sweep.csv``; run only the rest.
        progress: show a progress bar over points on stderr and print failed points.

    Returns:
        Columns: one per parameter (named by its path), ``seed``, ``point``, every summary
        column, and ``error`` ("" when the point ran; failed points keep their rows with
        NaN metrics). Sorted by point, seed, then the scenario's policy order. On the ray
        backend, ``table.attrs["execution"]`` says how the Ray was got and what it cost
        (``{"backend": "ray", "ray_start": "started" | "joined" | "reused", "ray_startup_s": 4.8}``),
        as ``sweep.json`` does under ``execution``; absent when no task had to run.

    Raises:
        UserError: a bad parameter, seed or backend, a point whose scenario is invalid
            (checked for every point before anything runs), an ``out`` that cannot be a
            folder, or a Ray ``address`` that does not answer in time (both checked before
            anything is written).
    """
    return run_sweep(
        scenario,
        params,
        seeds,
        workers=workers,
        backend=backend,
        address=address,
        out=out,
        resume=resume,
        progress=progress,
    )


def run_sweep(
    scenario: Scenario | str | Path,
    params: Mapping[str, Sequence[Any]],
    seeds: Sequence[int] | int = (0,),
    *,
    point_fn: PointFn = summary_point,
    workers: int | None = 1,
    backend: str = "local",
    address: str | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """:func:`sweep` with an injectable ``point_fn(scenario, policies) -> summary``, for tests."""
    if resume and out is None:
        raise UserError("resume needs the output folder of the interrupted sweep (out= / --out)", field="resume")
    plan = SweepPlan.build(scenario, params, seeds)
    if out is not None:
        check_folder(Path(out))  # before anything runs or is written
    # Fails fast when Ray is missing or its --address does not answer, still before writing.
    engine, count = open_capped_backend(backend, workers, address, tasks=len(plan.keys))
    with closing(engine), _open_store(plan, out) as store:  # closing: a joined Ray, whatever fails
        texts = store.start(resume, plan.expected_rows) if store else []
        todo = plan.tasks(skip=plan.keys_in(texts))
        done = len(plan.keys) - len(todo)
        workers_up = engine if todo else nullcontext()  # a fully resumed sweep starts none
        with workers_up, progress_bar(progress, "sweep", "point", len(plan.keys), done) as bar:
            report_startup(engine, bar, progress, count)
            for result in _results(engine, point_fn, todo):
                text = rows_text(plan.point_frame(result))
                if store:
                    store.append(text)
                texts.append(text)
                bar.update(1)
                _report_failure(plan, result, bar, progress)
        rows = order_rows(plan.columns, texts)
        execution = engine.startup.metadata() if engine.startup else None
        if store:
            store.finish(rows, execution, count.metadata())  # completion order -> grid order: identical files
    table = plan.table(rows)
    if execution is not None:
        table.attrs["execution"] = execution  # not a column: it varies from run to run
    return table


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: base scenario, grid points, seeds and the table's columns."""

    base: Scenario
    params: dict[str, list[Any]]
    points: list[dict[str, Any]]
    seeds: list[int]
    policy_counts: list[int]

    @classmethod
    def build(
        cls,
        scenario: Scenario | str | Path,
        params: Mapping[str, Sequence[Any]],
        seeds: Sequence[int] | int,
    ) -> SweepPlan:
        """Check everything and validate every point's scenario, before anything runs."""
        base = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        grid = normalize_params(params)
        points = expand_grid(grid)
        scenarios = validate_points(base, points)
        return cls(base, grid, points, normalize_seeds(seeds), [len(s.policies) for s in scenarios])

    @cached_property
    def metric_columns(self) -> list[str]:
        """Summary columns with their intervals and flags (each point's own run), less any a parameter is
        named after (``replicas``)."""
        return [c for c in (*SUMMARY_COLUMNS, *EXTRA_COLUMNS, *TRUST_COLUMNS) if c not in self.params]

    @cached_property
    def columns(self) -> list[str]:
        """Every column of the sweep table, in order."""
        return [*self.params, "seed", "point", *self.metric_columns, "error"]

    @cached_property
    def keys(self) -> list[tuple[int, int]]:
        """(point, seed) of every task, points outermost."""
        return [(point, seed) for point in range(len(self.points)) for seed in self.seeds]

    def expected_rows(self, key: tuple[int, int]) -> int:
        """Rows a finished (point, seed) has: one per policy; 0 for keys not in this sweep."""
        point, seed = key
        in_sweep = 0 <= point < len(self.points) and seed in self.seeds
        return self.policy_counts[point] if in_sweep else 0

    def manifest(self) -> dict[str, Any]:
        """What the rows of ``sweep.csv`` mean; a resumed sweep must match it."""
        return {"scenario": scenario_dict(self.base), "params": self.params, "seeds": self.seeds}

    def keys_in(self, lines: Sequence[str]) -> set[tuple[int, int]]:
        """(point, seed) keys present in CSV row lines of this sweep."""
        if not lines:
            return set()
        frame = parse_rows(self.columns, lines)
        return set(zip(frame["point"].astype(int), frame["seed"].astype(int), strict=True))

    def tasks(self, skip: set[tuple[int, int]] = frozenset()) -> list[Task]:  # type: ignore[assignment]
        """One task per (point, seed) not in ``skip``, in grid order."""
        raw = scenario_dict(self.base)
        return [
            Task((point, seed), raw, {**self.points[point], "seed": seed}, self.base.base_dir)
            for point, seed in self.keys
            if (point, seed) not in skip
        ]

    def point_frame(self, result: TaskResult) -> pd.DataFrame:
        """The rows of one finished task: parameters, seed, point, summary columns, error."""
        point, seed = result.key
        if result.summary is not None:
            frame = result.summary.reset_index(drop=True).reindex(columns=self.metric_columns)
        else:
            rows = {"scenario": self.base.name, "policy": list(result.policies)}
            frame = pd.DataFrame(rows).reindex(columns=self.metric_columns)
        head = {**self.points[point], "seed": seed, "point": point}
        for position, (name, value) in enumerate(head.items()):
            frame.insert(position, name, [value] * len(frame))
        frame["error"] = result.error
        return frame

    def table(self, texts: Sequence[str]) -> pd.DataFrame:
        """The final table from the written row text, sorted by point, seed, policy order."""
        frame = parse_rows(self.columns, texts)
        return frame.sort_values(["point", "seed"], kind="stable").reset_index(drop=True)


def _results(engine: Backend, point_fn: PointFn, todo: list[Task]) -> Iterator[TaskResult]:
    if not todo:
        return iter(())
    return engine.imap_unordered(partial(execute, point_fn=point_fn), todo)


def _open_store(plan: SweepPlan, out: str | Path | None) -> Any:
    if out is None:
        return nullcontext(None)
    return SweepFile(Path(out), plan.columns, plan.manifest())


class _NoBar:
    """Stands in for tqdm when no progress is shown: even a disabled tqdm starts a monitor
    thread, and a process with threads can no longer fork its workers safely."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, n: int = 1) -> None:
        """Nothing to show."""

    def write(self, text: str, file: Any = None) -> None:
        """Nothing to show."""


class _LinesOnly(_NoBar):
    """Stands in for tqdm on a redirected stderr (a log file, CI, a pipe): no bar frames, which
    would fill the log with carriage-return redraws, but the lines written through it (a failed
    point, how many workers run, Ray's start-up) still reach it."""

    def write(self, text: str, file: Any = None) -> None:
        """Print ``text`` as one line."""
        print(text, file=file or sys.stderr, flush=True)


def progress_bar(enabled: bool, desc: str, unit: str, total: int | None = None, initial: int = 0) -> Any:
    """A tqdm bar on stderr when it is a terminal (as ``run``'s, :mod:`sim.progress`); its lines but
    no bar on a redirected stderr; a silent stand-in (no thread) when not ``enabled``."""
    if not enabled:
        return _NoBar()
    if not is_terminal(sys.stderr):
        return _LinesOnly()
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def report_startup(engine: Backend, bar: Any, progress: bool, count: WorkerCount | None = None) -> None:
    """Say on the progress output how many workers run when fewer than asked for, and what getting
    them cost (Ray: start, join or reuse)."""
    if not progress:
        return
    if count is not None and count.note():
        bar.write(count.note(), file=sys.stderr)
    if engine.startup is not None:
        bar.write(engine.startup.line(), file=sys.stderr)


def _report_failure(plan: SweepPlan, result: TaskResult, bar: Any, progress: bool) -> None:
    if result.error and progress:
        point, seed = result.key
        where = describe_point(plan.points[point])
        bar.write(f"point {point} ({where}), seed {seed} failed: {result.error}", file=sys.stderr)
