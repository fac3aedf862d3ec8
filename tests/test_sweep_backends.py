"""Sweeps on the real engine: identical to the last digit in-process, in a process pool and on Ray,
and equal to a loop of :func:`sim.runner.run` calls (the API and the sweep share one code path)."""

from __future__ import annotations

import importlib.util
import socket
import time
from contextlib import ExitStack

import pandas as pd
import pytest

from sim.config import Scenario
from sim.errors import UserError
from sim.io.scenario import scenario_from_dict
from sim.runner import run
from sim.sweeps import sweep
from sim.sweeps.backends import open_backend, resolve_workers

TINY = {
    "name": "sweep_tiny",
    "seed": 11,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 120,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 256},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 96},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 8},
        {"name": "vllm", "kind": "paged", "max_batch_size": 64},
    ],
    "slo": {"ttft_p99_s": 1.0, "tpot_p99_s": 0.05},
}
POLICIES = ["static", "continuous", "vllm"]
PARAMS = {"workload.arrival.rate": [2.0, 16.0], "policies[continuous].max_batch_size": [4, 32]}
SEEDS = [0, 5]


@pytest.fixture(scope="module")
def base() -> Scenario:
    return scenario_from_dict(TINY)


@pytest.fixture(scope="module")
def serial(base: Scenario) -> pd.DataFrame:
    return sweep(base, PARAMS, SEEDS, workers=1)


def assert_identical(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, expected, check_exact=True)


def test_sweep_equals_a_loop_of_runs(base: Scenario, serial: pd.DataFrame) -> None:
    assert len(serial) == 2 * 2 * len(SEEDS) * len(POLICIES)
    assert (serial["error"] == "").all() and (serial["completed"] == 120).all()
    for (rate, batch, seed), rows in serial.groupby([*PARAMS, "seed"], sort=False):
        scenario = base.replace(
            **{
                "workload.arrival.rate": rate,
                "policies[continuous].max_batch_size": batch,
                "seed": seed,
            }
        )
        expected = run(scenario).summary
        got = rows[list(expected.columns)].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, expected, check_exact=True, check_dtype=False)


def test_swept_values_reach_the_runs(serial: pd.DataFrame) -> None:
    # Same stream at both batch sizes: only continuous batching's numbers may move.
    by_batch = {
        b: rows.set_index(["workload.arrival.rate", "seed", "policy"])
        for b, rows in serial.groupby("policies[continuous].max_batch_size")
    }
    small, large = by_batch[4], by_batch[32]
    others = small.index.get_level_values("policy") != "continuous"
    assert small.loc[others, "e2e_mean_s"].tolist() == large.loc[others, "e2e_mean_s"].tolist()
    assert (small.xs("continuous", level="policy")["mean_batch_size"] <= 4).all()
    assert (large.xs("continuous", level="policy")["mean_batch_size"] > 4).any()
    # Offered load is physical: requests cannot complete faster than they arrive (plus a tail).
    assert (serial["throughput_rps"] <= serial["workload.arrival.rate"] * 1.5).all()


@pytest.mark.slow
def test_pool_of_two_is_identical_to_in_process(base: Scenario, serial: pd.DataFrame) -> None:
    assert_identical(sweep(base, PARAMS, SEEDS, workers=2), serial)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install '.[ray]')"
)
def test_ray_on_two_cpus_is_identical_to_in_process(base: Scenario, serial: pd.DataFrame) -> None:
    from sim.sweeps.ray_backend import shutdown_ray

    try:
        assert_identical(sweep(base, PARAMS, SEEDS, workers=2, backend="ray"), serial)
    finally:
        shutdown_ray()  # sweeps keep their Ray up; later tests fork pools and want no Ray threads


def test_backend_mistakes_are_user_errors() -> None:
    with pytest.raises(UserError, match="did you mean 'ray'"):
        open_backend("rey")
    with pytest.raises(UserError, match="ray backend"):
        open_backend("local", 2, address="auto")
    with pytest.raises(UserError):
        resolve_workers(-1)
    assert (
        resolve_workers(0) >= 1
        and resolve_workers(None) == resolve_workers(0)
        and resolve_workers(3) == 3
    )


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_unreachable_ray_cluster_is_a_user_error(
    base: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # A machine with no Ray: "auto" would also join any Ray running here (another pytest worker's,
    # another user's), found through the cluster file and a scan of the processes; hide both.
    from ray._private import services

    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    monkeypatch.setattr(services, "find_gcs_addresses", frozenset)
    with pytest.raises(UserError, match="cannot reach a Ray cluster"):
        sweep(base, {"workload.requests": [20]}, backend="ray", address="auto")


# --------------------------------------------------------------------------- ray address checks (no Ray needed)
@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("head.example:6380", ("head.example", 6380)),
        ("[::1]:6379", ("::1", 6379)),
        ("ray://head.example", ("head.example", 10001)),
        ("ray://head.example:10002", ("head.example", 10002)),
    ],
)
def test_ray_addresses_name_a_host_and_port(address: str, endpoint: tuple[str, int]) -> None:
    from sim.sweeps.ray_backend import _endpoint

    assert _endpoint(address) == endpoint


@pytest.mark.parametrize("address", ["head.example", "10.0.0.5:port", "10.0.0.5:99999", ":6379"])
def test_malformed_ray_addresses_are_user_errors(address: str) -> None:
    from sim.sweeps.ray_backend import check_reachable

    with pytest.raises(UserError, match="expected HOST:PORT"):
        check_reachable(address)


def test_a_refused_ray_address_fails_at_once() -> None:
    from sim.sweeps.ray_backend import check_reachable

    started = time.monotonic()
    with pytest.raises(UserError, match=r"'127\.0\.0\.1:1': cannot reach a Ray cluster \(connection refused\)"):
        check_reachable("127.0.0.1:1", timeout_s=30)
    assert time.monotonic() - started < 5


def test_a_silent_ray_address_fails_after_the_timeout() -> None:
    from sim.sweeps.ray_backend import check_reachable

    # A listener whose accept queue is full drops new connection attempts: they hang.
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener, ExitStack() as held:
        if not _fill_accept_queue(listener, held):
            pytest.skip("this system accepts every connection: no way to make one hang")
        started = time.monotonic()
        with pytest.raises(UserError, match=r"no answer within 0\.5 s"):
            check_reachable(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        assert 0.4 < time.monotonic() - started < 3


def _fill_accept_queue(listener: socket.socket, held: ExitStack) -> bool:
    """Connect until a connection attempt times out; False if none ever does."""
    for _ in range(8):
        probe = held.enter_context(socket.socket())
        probe.settimeout(0.3)
        try:
            probe.connect(listener.getsockname())
        except TimeoutError:
            return True
    return False


# --------------------------------------------------------------------------- bit-identity whatever the BLAS threads
# Ray starts its workers with OMP_NUM_THREADS=1, a local pool or the parent may run BLAS on every
# core; a sum whose order follows the thread count (OpenBLAS splits a dot product across threads)
# then differs in the last bit between backends. These runs stream > 10,000 ITL gaps per policy,
# the size from which OpenBLAS 0.3 spreads a dot product over its threads.
BLAS_SWEEP = """
import sys
from sim.io.scenario import scenario_from_dict
from sim.sweeps import sweep
scenario = scenario_from_dict({tiny!r}).replace(**{{"workload.requests": 1500}})
sweep(scenario, {{"workload.arrival.rate": [4.0, 8.0]}}, [0], workers=1, out=sys.argv[1])
"""


def test_sweep_files_are_bit_identical_whatever_the_blas_thread_count(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = BLAS_SWEEP.format(tiny={**TINY, "policies": TINY["policies"][1:2]})
    files = {}
    for threads in ("1", "4"):
        env = {**os.environ, "PYTHONPATH": str(repo), "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        out = tmp_path / f"threads{threads}"
        subprocess.run([sys.executable, "-c", script, str(out)], cwd=repo, env=env, check=True, timeout=300)
        files[threads] = (out / "sweep.csv").read_text()
    assert "itl_mean_s" in files["1"].splitlines()[0]
    assert files["1"] == files["4"]
