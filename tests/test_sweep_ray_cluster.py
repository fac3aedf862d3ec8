"""A sweep joins a real Ray cluster and its points run there, not on a private local Ray.

The cluster is a head started as an operator would (``ray start --head --num-cpus 2 --block``, on free ports);
the sweep runs as a user runs it (``python -m sim sweep --backend ray --address HOST:PORT``, its own process).
Afterwards the cluster's own job table must list that process as a driver (a process holds one Ray connection,
so its tasks ran on this cluster, not on a private ``ray.init()``), and the head must still be the only node.
The rows must be the local backend's to the last digit. (Counting Ray sessions on the machine would be no
proof: another test may start a private Ray at the same time.)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RAY_CLI = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")  # this venv's first
# Ray >= 2.5x turns on token auth for `ray start`; a loopback test head opts out (as benchmarks/bench_sweep.py).
HEAD_ENV = {"RAY_AUTH_MODE": "disabled"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install '.[ray]')"),
    pytest.mark.skipif(RAY_CLI is None, reason="the `ray` command is not installed"),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def ray_head(log: Path) -> Iterator[str]:
    """A 2-CPU head on free ports; yields its address; stops only it."""
    port = _free_port()
    command = [str(RAY_CLI), "start", "--head", "--num-cpus", "2", "--port", str(port), "--include-dashboard=false",
               "--disable-usage-stats", "--block"]  # fmt: skip
    with open(log, "w") as sink:
        head = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **HEAD_ENV}
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert head.poll() is None, f"ray start --head exited with {head.returncode}: {log.read_text()[-500:]}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "ray start --head did not listen within 180 s"
                time.sleep(0.5)
        time.sleep(2.0)  # the GCS accepts connections a little before the raylet has registered
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # --block: ray start stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)


def _cluster_facts(address: str) -> tuple[list[int], list[float]]:
    """Driver PIDs in the cluster's job table, and the CPUs of each of its live nodes (asked in a fresh process:
    this one must not hold a Ray connection while later tests fork their pools)."""
    probe = (
        "import json, ray, ray._private.state as s\n"
        f"ray.init(address={address!r}, logging_level='ERROR')\n"
        "jobs = [j.get('DriverPid') or j.get('driver_pid') for j in s.jobs()]\n"
        "cpus = [n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']]\n"
        "print(json.dumps([[int(p) for p in jobs if p], cpus]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | HEAD_ENV
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    pids, cpus = json.loads(done.stdout.strip().splitlines()[-1])
    return pids, cpus


def test_a_sweep_joins_a_running_cluster_and_its_points_run_there(tmp_path: Path) -> None:
    scenario = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    scenario["workload"]["requests"] = 60
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(scenario))
    grid = ["--param", "workload.arrival.rate=1,4", "--seeds", "2", "--quiet", "--no-plots"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | HEAD_ENV

    def sweep(*extra: str, out: Path) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "sim", "sweep", str(base), *grid, "--out", str(out), *extra]
        return subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    local = sweep("--workers", "1", out=tmp_path / "local")
    assert local.wait(timeout=300) == 0, local.stderr.read() if local.stderr else ""
    with ray_head(tmp_path / "head.log") as address:
        joined = sweep("--backend", "ray", "--address", address, out=tmp_path / "ray")
        assert joined.wait(timeout=400) == 0, joined.stderr.read() if joined.stderr else ""
        drivers, cpus = _cluster_facts(address)
    assert joined.pid in drivers, f"the sweep's process {joined.pid} is not a driver of the cluster: {drivers}"
    assert cpus == [2.0], f"the cluster grew or lost its head: live nodes' CPUs {cpus}"
    import json

    execution = json.loads((tmp_path / "ray" / "sweep.json").read_text())["execution"]
    assert execution["ray_start"] == "joined"
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "ray" / "sweep.csv"), pd.read_csv(tmp_path / "local" / "sweep.csv"), check_exact=True
    )
