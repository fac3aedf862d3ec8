"""Sweep and capacity: ``--workers`` capped at the tasks and the CPUs (said, not refused), and
progress bars drawn only on a terminal, as ``run``'s are."""

from __future__ import annotations

import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import sim.sweeps.backends as backends
from sim.cli import main
from sim.sweeps.backends import WorkerCount

TINY = {
    "name": "workers_tiny",
    "seed": 3,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 40,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 128},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 32},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 16},
    ],
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, so a bar is drawn into it."""

    def isatty(self) -> bool:
        return True


# --------------------------------------------------------------------------- the cap
@given(requested=st.integers(0, 5000), tasks=st.integers(0, 200), cpus=st.integers(1, 256))
def test_workers_are_capped_at_the_tasks_and_the_cpus(requested: int, tasks: int, cpus: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "cpu_count", lambda: cpus)
        count = WorkerCount.for_tasks(requested, tasks)
    assert 1 <= count.used <= max(1, min(tasks, cpus))
    assert count.used <= (requested or cpus)  # never more than asked for (0: every core)
    assert count.used == max(1, min(requested or cpus, tasks, cpus))
    cut = bool(requested) and tasks > 0 and count.used < requested
    assert bool(count.note()) == cut and ("note" in count.metadata()) == cut
    if cut:
        assert count.note().startswith(f"workers: {requested} requested, {count.used} used (capped at ")


def test_a_cluster_keeps_the_count_asked_for() -> None:
    count = WorkerCount.for_tasks(1000, 2, cluster=True)  # a Ray cluster's workers are not ours to start
    assert count.used == 1000 and count.note() == ""


def test_sweep_with_1000_workers_for_two_points_starts_two(
    scenario_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pools: list[int] = []

    class CountedPool(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: object) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(backends, "ProcessPoolExecutor", CountedPool)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # so the two tasks, not this machine, are the cap
    out = tmp_path / "out"
    argv = ["sweep", str(scenario_file), "--param", "workload.requests=20,30", "--workers", "1000"]
    assert main([*argv, "--out", str(out), "--no-plots"]) == 0
    assert pools == [2]
    note = "workers: 1000 requested, 2 used (capped at 2 tasks at a time)"
    assert note in capsys.readouterr().err.splitlines()
    assert json.loads((out / "sweep.json").read_text())["workers"] == {"requested": 1000, "used": 2, "note": note}


def test_capacity_starts_at_most_one_worker_per_policy_and_seed(
    scenario_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    opened: list[int | None] = []
    open_backend = backends.open_backend

    def in_process(name: str, workers: int | None = 1, address: str | None = None) -> backends.Backend:
        opened.append(workers)
        return open_backend(name, 1, address)  # the search itself in this process: quick

    monkeypatch.setattr(backends, "open_backend", in_process)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    argv = ["capacity", str(scenario_file), "--slo", "ttft_p99_s=5", "--workers", "50", "--tolerance", "0.2"]
    assert main([*argv, "--out", str(tmp_path / "cap")]) == 0
    assert opened == [2]  # two policies x one seed run at once
    assert "workers: 50 requested, 2 used (capped at 2 tasks at a time)" in capsys.readouterr().err


# --------------------------------------------------------------------------- bars on a terminal only
@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_no_bar_reaches_a_redirected_stderr(
    command: str, scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--param", "workload.requests=20,30"] if command == "sweep" else ["--slo", "ttft_p99_s=5"]
    argv = [command, str(scenario_file), *extra, "--workers", "1", "--out", str(tmp_path / "o")]
    assert main([*argv, *(["--no-plots"] if command == "sweep" else ["--tolerance", "0.2"])]) == 0
    error = capsys.readouterr().err
    assert "\r" not in error and "|" not in error and f"{command}:" not in error, error


@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_a_terminal_gets_the_bar(
    command: str, scenario_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    extra = ["--param", "workload.requests=20,30"] if command == "sweep" else ["--slo", "ttft_p99_s=5"]
    argv = [command, str(scenario_file), *extra, "--workers", "1", "--out", str(tmp_path / "o")]
    assert main([*argv, *(["--no-plots"] if command == "sweep" else ["--tolerance", "0.2"])]) == 0
    assert f"{command}: " in terminal.getvalue() and "\r" in terminal.getvalue()
