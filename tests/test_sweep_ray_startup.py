"""Ray's start-up is measured, reported, and paid once per process.

Most tests use a fake ``ray`` module (a real local Ray takes 5-15 s to start) that runs
remote functions at once, counts ``init``/``shutdown`` calls and takes its start-up on a fake
clock (so timings do not depend on the machine's speed); the last one uses a real Ray when it
is installed.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from test_sweep_resume import BASE, fake_point

from sim.io.scenario import scenario_from_dict
from sim.sweeps import ray_backend, sweep
from sim.sweeps.backends import open_backend
from sim.sweeps.runner import run_sweep

PARAMS = {"workload.arrival.rate": [1.0, 2.0]}


class _Ref:
    def __init__(self, value: Any) -> None:
        self.value = value


class _Context:
    def __init__(self, ray: FakeRay) -> None:
        self._ray = ray

    def get_job_id(self) -> str:
        return f"job-{self._ray.inits}"


class FakeRay:
    """Just enough of Ray's API for RayBackend; each ``init`` is a new job, as in Ray."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class WorkerCrashedError(Exception):
            pass

    STARTUP_S = 10.0  # what a local Ray's start takes on the fake clock

    def __init__(self) -> None:
        self.now = 0.0
        self.initialized = False
        self.inits = 0
        self.shutdowns = 0
        self.init_options: list[dict[str, Any]] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **options: Any) -> None:
        self.inits += 1
        self.init_options.append(options)
        self.initialized = True
        self.now += self.STARTUP_S

    def clock(self) -> float:
        """The fake clock the start-up is timed on: it moves only when ``init`` runs."""
        return self.now

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False

    def get_runtime_context(self) -> _Context:
        return _Context(self)

    def remote(self, **_options: Any) -> Callable[[Callable[..., Any]], Any]:
        def wrap(fn: Callable[..., Any]) -> Any:
            class Remote:
                @staticmethod
                def remote(*args: Any) -> _Ref:
                    assert self.initialized, "a task was submitted without a Ray"
                    return _Ref(fn(*args))

            return Remote

        return wrap

    def wait(self, refs: list[_Ref], num_returns: int = 1) -> tuple[list[_Ref], list[_Ref]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: _Ref | list[_Ref]) -> Any:
        return [r.value for r in ref] if isinstance(ref, list) else ref.value

    def cancel(self, ref: _Ref, force: bool = False) -> None:
        pass


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRay]:
    ray = FakeRay()
    monkeypatch.setattr(ray_backend, "_import_ray", lambda: ray)
    monkeypatch.setattr(ray_backend, "clock", ray.clock)
    monkeypatch.setattr(ray_backend, "_own", None)  # no Ray left over from another test
    monkeypatch.setattr(ray_backend, "check_reachable", lambda address, timeout_s=0.0: None)
    yield ray


def _sweep(**options: Any) -> pd.DataFrame:
    return run_sweep(scenario_from_dict(BASE), PARAMS, [0], point_fn=fake_point, backend="ray", **options)


def test_a_second_sweep_reuses_the_ray_the_first_started(fake_ray: FakeRay) -> None:
    first = _sweep(workers=2)
    second = _sweep(workers=2)
    assert fake_ray.inits == 1 and fake_ray.shutdowns == 0
    assert first.attrs["execution"]["ray_start"] == "started"
    assert second.attrs["execution"]["ray_start"] == "reused"
    assert second.attrs["execution"]["ray_startup_s"] < 0.5
    assert fake_ray.init_options[0]["num_cpus"] == 2
    assert fake_ray.init_options[0]["address"] == "local"  # never a cluster `ray start` left behind
    pd.testing.assert_frame_equal(first, second, check_exact=True)


def test_another_cpu_count_replaces_our_ray(fake_ray: FakeRay) -> None:
    _sweep(workers=2)
    assert _sweep(workers=1).attrs["execution"]["ray_start"] == "started"
    assert (fake_ray.inits, fake_ray.shutdowns) == (2, 1)
    assert fake_ray.init_options[1]["num_cpus"] == 1


def test_a_ray_initialized_by_someone_else_is_used_and_left_running(fake_ray: FakeRay) -> None:
    fake_ray.init()  # a notebook's own ray.init()
    for _ in range(2):
        assert _sweep(workers=2).attrs["execution"]["ray_start"] == "reused"
    ray_backend.shutdown_ray()
    assert (fake_ray.inits, fake_ray.shutdowns) == (1, 0) and fake_ray.initialized


def test_a_ray_of_ours_shut_down_and_reinitialized_by_the_user_is_theirs(fake_ray: FakeRay) -> None:
    _sweep(workers=2)
    fake_ray.shutdown()
    fake_ray.init()  # a new job: not the Ray we started, so never replaced or stopped
    assert _sweep(workers=4).attrs["execution"]["ray_start"] == "reused"
    assert (fake_ray.inits, fake_ray.shutdowns) == (2, 1)


def test_an_address_is_joined_once_and_then_reused(fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    monkeypatch.setattr(ray_backend, "check_reachable", lambda address, timeout_s=0.0: checked.append(address))
    assert _sweep(address="10.0.0.5:6379").attrs["execution"]["ray_start"] == "joined"
    assert _sweep(address="10.0.0.5:6379").attrs["execution"]["ray_start"] == "reused"
    assert fake_ray.inits == 1 and checked == ["10.0.0.5:6379"]  # no second reachability check either
    assert fake_ray.init_options[0]["address"] == "10.0.0.5:6379"
    assert _sweep(address="10.0.0.6:6379").attrs["execution"]["ray_start"] == "joined"  # another cluster
    assert (fake_ray.inits, fake_ray.shutdowns) == (2, 1)


def test_shutdown_ray_stops_the_ray_we_started(fake_ray: FakeRay) -> None:
    _sweep(workers=2)
    ray_backend.shutdown_ray()
    assert not fake_ray.initialized
    assert _sweep(workers=2).attrs["execution"]["ray_start"] == "started"


def test_the_start_up_is_on_the_progress_output_and_in_sweep_json(
    fake_ray: FakeRay, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _sweep(workers=2, out=tmp_path / "a", progress=True)
    _sweep(workers=2, out=tmp_path / "b", progress=True)
    err = capsys.readouterr().err
    assert "ray: started a local Ray (2 CPUs) in " in err and "ray.init " in err
    assert "ray: reusing the Ray already running in this process (no start-up" in err
    first = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert first["execution"]["ray_start"] == "started" and first["execution"]["ray_startup_s"] >= 0
    assert json.loads((tmp_path / "b" / "sweep.json").read_text())["execution"]["ray_start"] == "reused"
    assert (tmp_path / "a" / "sweep.csv").read_bytes() == (tmp_path / "b" / "sweep.csv").read_bytes()


def test_a_fully_resumed_sweep_starts_no_ray(fake_ray: FakeRay, tmp_path: Path) -> None:
    _sweep(workers=2, out=tmp_path)
    ray_backend.shutdown_ray()
    again = _sweep(workers=2, out=tmp_path, resume=True)
    assert fake_ray.inits == 1 and "execution" not in again.attrs
    assert json.loads((tmp_path / "sweep.json").read_text()).get("execution") is None


def test_a_resume_accepts_a_sweep_json_with_execution(fake_ray: FakeRay, tmp_path: Path) -> None:
    # execution varies from run to run; it must not make the folder look like another sweep's
    done = _sweep(workers=2, out=tmp_path)
    (tmp_path / "sweep.csv").write_text((tmp_path / "sweep.csv").read_text().splitlines(keepends=True)[0])
    pd.testing.assert_frame_equal(_sweep(workers=2, out=tmp_path, resume=True), done, check_exact=True)


def test_the_local_backend_reports_no_startup_and_writes_no_execution(tmp_path: Path) -> None:
    table = run_sweep(scenario_from_dict(BASE), PARAMS, [0], point_fn=fake_point, out=tmp_path)
    assert "execution" not in table.attrs
    assert "execution" not in json.loads((tmp_path / "sweep.json").read_text())
    assert open_backend("local", 1).startup is None


# --------------------------------------------------------------------------- a real Ray
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install '.[ray]')")
def test_a_real_ray_is_started_once_per_process() -> None:
    base = scenario_from_dict(BASE)  # the real engine: Ray workers cannot import this test module
    try:
        first = sweep(base, PARAMS, [0], backend="ray", workers=1)
        second = sweep(base, PARAMS, [0], backend="ray", workers=1)
    finally:
        ray_backend.shutdown_ray()  # later tests fork their pools: no Ray threads left behind
    assert first.attrs["execution"]["ray_start"] == "started" and first.attrs["execution"]["ray_startup_s"] > 0.5
    assert second.attrs["execution"]["ray_start"] == "reused" and second.attrs["execution"]["ray_startup_s"] < 0.5
    pd.testing.assert_frame_equal(first, second, check_exact=True)
    import ray

    assert not ray.is_initialized()
