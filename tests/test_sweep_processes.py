"""Sweep processes end with the sweep: SIGTERM and SIGKILL leave no worker behind, SIGTERM
leaves a resumable sweep.csv, identical sweeps write identical files, and an unreachable Ray
address fails fast with one error line.

Children are found through /proc (psutil is not a dependency), so these tests need Linux.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

SCENARIO = {
    "name": "proc_sweep",
    "seed": 3,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 700,  # ~0.7 s per point: a sweep of 8 points outlives the kill by seconds
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 256},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 96},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 16},
    ],
}
RATES = "workload.arrival.rate=1,2,3,4,5,6,7,8"


# --------------------------------------------------------------------------- /proc helpers
def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state is [0], ppid [1]), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def children(pid: int) -> dict[int, str]:
    """Child pid -> its start time (to tell a reused pid apart), from a scan of /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and fields[1] == str(pid):
            found[int(entry.name)] = fields[19]
    return found


def alive(pid: int, start_time: str) -> bool:
    """The very process (same start time) still exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[19] == start_time and fields[0] != "Z"


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def rows_written(csv_path: Path) -> int:
    return csv_path.read_text().count("\n") - 1 if csv_path.exists() else 0


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "proc.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def sweep_command(scenario_file: Path, out: Path, *params: str) -> list[str]:
    args = [arg for param in params or (RATES,) for arg in ("--param", param)]
    return [sys.executable, "-m", "sim", "sweep", str(scenario_file), *args, "--workers", "2",
            "--out", str(out), "--no-plots", "--quiet"]  # fmt: skip


def start_and_wait_for_workers(command: list[str], out: Path) -> tuple[subprocess.Popen, dict[int, str]]:
    """Start a sweep; return once both workers run and one point is written."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: dict[int, str] = {}

    def ready() -> bool:
        workers.update(children(process.pid))
        return len(workers) >= 2 and rows_written(out / "sweep.csv") >= 2

    if not wait_until(ready, 60) or process.poll() is not None:
        process.kill()
        pytest.fail(f"the sweep did not get going: {process.communicate()}")
    return process, workers


@pytest.fixture(scope="module")
def uninterrupted(scenario_file: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    out = tmp_path_factory.mktemp("uninterrupted")
    done = subprocess.run(sweep_command(scenario_file, out), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return (out / "sweep.csv").read_bytes()


# --------------------------------------------------------------------------- tests
@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)])
def test_killed_sweep_leaves_no_process_behind(scenario_file: Path, tmp_path: Path, signum: int, code: int) -> None:
    process, workers = start_and_wait_for_workers(sweep_command(scenario_file, tmp_path), tmp_path)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == code, stderr
    assert wait_until(lambda: not any(alive(pid, t) for pid, t in workers.items()), 5), (
        f"still running after the sweep ended: {[p for p, t in workers.items() if alive(p, t)]}"
    )
    partial = pd.read_csv(tmp_path / "sweep.csv")
    assert partial.groupby(["point", "seed"]).size().eq(2).all() and 1 <= partial["point"].nunique() < 8


@pytest.mark.slow
def test_sigterm_then_resume_equals_an_uninterrupted_sweep(
    scenario_file: Path, tmp_path: Path, uninterrupted: bytes
) -> None:
    command = sweep_command(scenario_file, tmp_path)
    process, _ = start_and_wait_for_workers(command, tmp_path)
    process.terminate()
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143
    assert stderr.strip().splitlines() == [
        f"terminated: finished points are saved in {tmp_path / 'sweep.csv'}; "
        "run the same command with --resume to complete the rest"
    ]
    assert (tmp_path / "sweep.csv").read_bytes() != uninterrupted  # some points were left to do
    resumed = subprocess.run([*command, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "sweep.csv").read_bytes() == uninterrupted


@pytest.mark.slow
def test_identical_sweeps_write_identical_files_in_grid_order(scenario_file: Path, tmp_path: Path) -> None:
    # Point 0 is the slowest, so with two workers it finishes last: completion order is not grid order.
    params = ("workload.requests=1200,100,101,102,103,104",)
    files = []
    for name in ("first", "second"):
        done = subprocess.run(sweep_command(scenario_file, tmp_path / name, *params), cwd=REPO, capture_output=True)
        assert done.returncode == 0, done.stderr
        files.append((tmp_path / name / "sweep.csv").read_bytes())
    assert files[0] == files[1]
    table = pd.read_csv(tmp_path / "first" / "sweep.csv")
    assert table["point"].tolist() == [p for p in range(6) for _ in ("static", "continuous")]
    assert table["policy"].tolist() == ["static", "continuous"] * 6


@pytest.mark.slow
def test_killed_sweep_with_threads_leaves_no_process_behind(tmp_path: Path) -> None:
    # A process that runs threads (a notebook, a progress monitor) starts its workers with
    # spawn, not fork: they too must die with it, and so must multiprocessing's helper.
    script = textwrap.dedent(f"""
        import threading, time
        from sim.io.scenario import scenario_from_dict
        from sim.sweeps import sweep
        from test_sweep_processes import SCENARIO
        if __name__ == "__main__":
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
            sweep(scenario_from_dict(SCENARIO), {{"workload.arrival.rate": list(range(1, 40))}},
                  workers=2, out={str(tmp_path / "out")!r})
    """)
    (tmp_path / "threaded.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    process = subprocess.Popen([sys.executable, str(tmp_path / "threaded.py")], cwd=REPO, env=env,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    started: dict[int, str] = {}

    def working() -> bool:
        started.update(children(process.pid))
        return rows_written(tmp_path / "out" / "sweep.csv") >= 2

    try:  # out/, not tmp_path: a folder holding threaded.py is the user's, which a sweep refuses
        assert wait_until(working, 60) and len(started) >= 2, "the sweep did not get going"
        process.kill()
        process.wait(timeout=10)
        assert wait_until(lambda: not any(alive(pid, t) for pid, t in started.items()), 5), (
            f"still running after the sweep was killed: {[p for p, t in started.items() if alive(p, t)]}"
        )
    finally:
        process.kill()
        for pid, start_time in started.items():
            if alive(pid, start_time):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_without_pdeathsig_still_exits_with_its_parent(tmp_path: Path) -> None:
    # The polling fallback (non-Linux systems) on its own: a forked child, parent SIGKILLed.
    script = textwrap.dedent("""
        import os, sys, time
        import sim.sweeps.backends as backends
        backends._set_parent_death_signal = lambda: False
        backends._WATCH_INTERVAL_S = 0.05
        owner = os.getpid()
        child = os.fork()
        if child == 0:
            backends.exit_with_parent(owner)
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    start_time = _stat(child)[19]
    try:
        assert alive(child, start_time)  # the watch does not end a child whose parent lives
        parent.kill()
        parent.wait(timeout=10)
        assert wait_until(lambda: not alive(child, start_time), 3)
    finally:
        if alive(child, start_time):
            os.kill(child, signal.SIGKILL)


# --------------------------------------------------------------------------- ray
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")


def _run_cli(code: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    return done, time.monotonic() - started


@needs_ray
def test_unreachable_ray_address_is_one_error_line_within_the_timeout(scenario_file: Path, tmp_path: Path) -> None:
    from sim.sweeps.ray_backend import RAY_CONNECT_TIMEOUT_S

    out = tmp_path / "never"
    argv = ["sweep", str(scenario_file), "--param", "workload.requests=20", "--backend", "ray",
            "--address", "127.0.0.1:1", "--out", str(out)]  # fmt: skip
    done, took_s = _run_cli(f"import sys; from sim.cli import main; sys.exit(main({argv!r}))")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'127.0.0.1:1'" in lines[0], done.stderr
    assert not out.exists()
    assert took_s < RAY_CONNECT_TIMEOUT_S + 10  # the Python start-up and imports, plus the bound


@pytest.mark.slow
@needs_ray
def test_a_port_that_is_not_ray_fails_within_the_init_timeout(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "never"
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts TCP, never speaks Ray
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        argv = ["sweep", str(scenario_file), "--param", "workload.requests=20", "--backend", "ray",
                "--address", address, "--out", str(out), "--quiet"]  # fmt: skip
        code = (
            "import sys; import sim.sweeps.ray_backend as rb; rb.RAY_INIT_TIMEOUT_S = 3; "
            f"from sim.cli import main; sys.exit(main({argv!r}))"
        )
        done, took_s = _run_cli(code)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"'{address}'" in last and "Traceback" not in done.stderr
    assert not out.exists()
    assert took_s < 3 + 15
