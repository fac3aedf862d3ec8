"""Sweep speed-up from parallel workers, and Ray's fixed start-up cost: 4 policies x 10 rates x 3 seeds.

Each measurement runs in a fresh Python process (as ``python -m sim sweep`` would),
calling :func:`sim.sweeps.sweep` — the function the CLI uses — with ``--workers 1`` and
``--workers 2``; the best of ``--repeat`` runs is kept, since other processes on a
shared machine only ever add time. Prints the figures, whether the tables are
identical to the last digit, and the verdict against the 1.8x target.

With ``--ray``, each Ray process runs the sweep twice: the first starts a local Ray
(its start-up, ``ray.init`` plus warm workers, is printed apart), the second reuses it,
as a second sweep in a notebook does. The workers 2 vs 1 ratio is given with and
without the start-up. With ``--address``, a head is started with
``ray start --head --num-cpus 2 --block`` and a fresh process joins it with
``address=``, which pays no local start-up; that head alone is stopped afterwards
(not ``ray stop``, which would stop every Ray on the machine).

Usage: ``python benchmarks/bench_sweep.py [--requests N] [--repeat K] [--ray] [--address]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "quickstart.yaml"
RATES_RPS = [float(r) for r in range(1, 11)]
SEEDS = 3
TARGET_SPEEDUP = 1.8
HEAD_START_TIMEOUT_S = 120.0
# Ray >= 2.5x enables token auth for `ray start`; the shared token file (~/.ray/auth_token)
# is rewritten by every head started on the machine, so a loopback benchmark head opts out.
HEAD_ENV = {"RAY_AUTH_MODE": "disabled"}


# --------------------------------------------------------------------------- child process
def measure(workers: int, backend: str, requests: int | None, out: Path, address: str | None) -> dict[str, Any]:
    """Time one sweep in this process (two on the ray backend: cold, then reusing its Ray)."""
    sys.path.insert(0, str(REPO))
    from sim.io.scenario import load_scenario

    overrides = {"workload.requests": requests} if requests else {}
    scenario = load_scenario(SCENARIO, overrides)
    figures = _one_sweep(scenario, workers, backend, address, out)
    if backend == "ray":
        again = _one_sweep(scenario, workers, backend, address, out.with_suffix(".again.pkl"))
        figures["again"] = again
    return figures


def _one_sweep(scenario: Any, workers: int, backend: str, address: str | None, out: Path) -> dict[str, Any]:
    from sim.sweeps import sweep

    started = time.perf_counter()
    table = sweep(
        scenario, {"workload.arrival.rate": RATES_RPS}, SEEDS, workers=workers, backend=backend, address=address
    )
    wall_s = time.perf_counter() - started
    table.to_pickle(out)
    errors = table.loc[table["error"] != "", "error"]
    execution = table.attrs.get("execution", {})
    return {
        "wall_s": wall_s, "runs": len(table), "failed": len(errors),
        "first_error": errors.iloc[0] if len(errors) else "", "table": str(out),
        "startup_s": execution.get("ray_startup_s", 0.0), "init_s": execution.get("ray_init_s", 0.0),
        "start": execution.get("ray_start", ""),
    }  # fmt: skip


def run_child(
    workers: int, backend: str, requests: int | None, out: Path, address: str | None = None
) -> dict[str, Any]:
    """Run :func:`measure` in a fresh interpreter and return its figures."""
    command = [sys.executable, __file__, "--child", str(workers), "--backend", backend, "--table", str(out)]
    if requests:
        command += ["--requests", str(requests)]
    if address:
        command += ["--join", address]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address:
        env.update(HEAD_ENV)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- parent
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="override workload.requests (default: the scenario's)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per configuration; the best is kept"
    )
    parser.add_argument("--ray", action="store_true", help="also time the ray backend (1 and 2 CPUs)")
    parser.add_argument(
        "--address", action="store_true", help="also time joining a running head (ray start --head --num-cpus 2)"
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="local", help=argparse.SUPPRESS)
    parser.add_argument("--table", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--join", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.backend, args.requests, Path(args.table), args.join)))
        return 0
    return compare(args)


def compare(args: argparse.Namespace) -> int:
    """Time every configuration, check every table agrees, print the figures."""
    requests = args.requests or "scenario default (600)"
    print(
        f"sweep: {SCENARIO.name}, 4 policies x {len(RATES_RPS)} rates x {SEEDS} seeds "
        f"({len(RATES_RPS) * SEEDS} tasks), requests: {requests}, cores: {os.cpu_count()}, "
        f"best of {args.repeat}"
    )
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        local = {w: time_config(args, "local", w, folder) for w in (1, 2)}
        tables = [p for runs in local.values() for p in _tables(runs)]
        report_speedup("local (process pool)", _best(local[1], "wall_s"), _best(local[2], "wall_s"))
        if args.ray:
            ray = {w: time_config(args, "ray", w, folder) for w in (1, 2)}
            tables += [p for runs in ray.values() for p in _tables(runs)]
            ok &= report_ray(ray)
        if args.address:
            joined = time_joined(args, folder)
            tables += _tables(joined)
        identical = all_identical(tables)
    print(f"every table identical to the last digit: {identical}")
    return 0 if identical and ok and all(_clean(r) for runs in local.values() for r in runs) else 1


def time_config(args: argparse.Namespace, backend: str, workers: int, tmp: Path) -> list[dict[str, Any]]:
    """``args.repeat`` fresh-process runs of one configuration; prints their walls."""
    runs = [run_child(workers, backend, args.requests, tmp / f"{backend}{workers}-{i}.pkl") for i in range(args.repeat)]
    walls = ", ".join(f"{r['wall_s']:.2f}" + ("!" if r["failed"] else "") for r in runs)
    print(f"  {backend:5s} workers={workers}: best {_best(runs, 'wall_s'):.2f} s  (runs: {walls} s)")
    if backend == "ray":
        again = ", ".join(f"{r['again']['wall_s']:.2f}" for r in runs)
        startups = ", ".join(f"{r['startup_s']:.2f} (ray.init {r['init_s']:.2f})" for r in runs)
        reused_s = max(r["again"]["startup_s"] for r in runs)
        print(f"        start-up: {startups} s; second sweep in the same process: {again} s "
              f"(start-up {reused_s:.3f} s, {runs[0]['again']['start']})")  # fmt: skip
    for r in runs:
        if r["failed"]:
            print(f"    ! {r['failed']} of {r['runs']} rows failed: {r['first_error']}")
    return runs


def report_speedup(label: str, one_s: float, two_s: float, note: str = "") -> float:
    """Print the workers 2 vs 1 ratio and the verdict against the target."""
    speedup = one_s / two_s
    verdict = "meets" if speedup >= TARGET_SPEEDUP else "MISSES"
    print(f"speed-up workers 2 vs 1, {label}: {speedup:.2f}x ({verdict} the {TARGET_SPEEDUP}x target){note}")
    return speedup


def report_ray(ray: dict[int, list[dict[str, Any]]]) -> bool:
    """Ray's ratios (cold, and on the reused Ray) and its start-up; False if a run failed or was not reused."""
    report_speedup("ray, cold start", _best(ray[1], "wall_s"), _best(ray[2], "wall_s"), " (start-up included)")
    warm = {w: min(r["again"]["wall_s"] for r in ray[w]) for w in (1, 2)}
    report_speedup("ray, Ray reused", warm[1], warm[2])
    startups = [r["startup_s"] for runs in ray.values() for r in runs]
    print(f"ray start-up (local Ray, cold): best {min(startups):.2f} s, worst {max(startups):.2f} s; "
          f"reused: {max(r['again']['startup_s'] for runs in ray.values() for r in runs):.3f} s")  # fmt: skip
    reused = all(r["again"]["start"] == "reused" for runs in ray.values() for r in runs)
    return reused and all(_clean(r) for runs in ray.values() for r in runs)


def time_joined(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """A fresh process joining a running 2-CPU head with ``address=``: no local Ray start-up."""
    if shutil.which("ray") is None:
        print("  --address: the `ray` command is not installed; skipped")
        return []
    with ray_head(tmp / "head.log") as address:
        runs = [run_child(2, "ray", args.requests, tmp / f"joined-{i}.pkl", address) for i in range(args.repeat)]
    walls = ", ".join(f"{r['wall_s']:.2f}" for r in runs)
    joins = ", ".join(f"{r['startup_s']:.2f}" for r in runs)
    print(f"  ray   --address (head: 2 CPUs): best {_best(runs, 'wall_s'):.2f} s  (runs: {walls} s); "
          f"join + warm workers: {joins} s; second sweep {min(r['again']['wall_s'] for r in runs):.2f} s")  # fmt: skip
    return runs


@contextmanager
def ray_head(log: Path) -> Iterator[str]:
    """``ray start --head --num-cpus 2 --block`` on free ports; yields its address, stops only it."""
    port = _free_port()
    command = ["ray", "start", "--head", "--num-cpus", "2", "--port", str(port), "--include-dashboard=false",
               "--disable-usage-stats", "--block"]  # fmt: skip
    with open(log, "w") as sink:
        head = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **HEAD_ENV}
        )
    address = f"127.0.0.1:{port}"
    try:
        _wait_for_port(port, head)
        time.sleep(2.0)  # the GCS accepts connections a little before the raylet is registered
        yield address
    finally:
        head.send_signal(signal.SIGTERM)  # --block: ray start stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, head: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited with {head.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"ray start --head did not listen on {port} within {HEAD_START_TIMEOUT_S:g} s")


def _clean(run: dict[str, Any]) -> bool:
    return run["failed"] == 0 and run.get("again", {"failed": 0})["failed"] == 0


def _best(runs: list[dict[str, Any]], key: str) -> float:
    """Best figure of the clean runs (no failed point), inf when there is none."""
    return min((r[key] for r in runs if _clean(r)), default=float("inf"))


def _tables(runs: list[dict[str, Any]]) -> list[Path]:
    paths = [Path(r["table"]) for r in runs if _clean(r)]
    return paths + [Path(r["again"]["table"]) for r in runs if "again" in r and _clean(r)]


def all_identical(paths: list[Path]) -> bool:
    """Whether every saved table equals the first, value for value."""
    import pandas as pd

    tables = [pd.read_pickle(p) for p in paths]
    return bool(tables) and all(t.equals(tables[0]) for t in tables)


if __name__ == "__main__":
    raise SystemExit(main())
