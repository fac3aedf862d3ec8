"""Sweep speed-up from parallel workers: 4 policies x 10 rates x 3 seeds of the quickstart scenario.

Each measurement runs in a fresh Python process (as ``python -m sim sweep`` would),
calling :func:`sim.sweeps.sweep` — the function the CLI uses — with ``--workers 1`` and
``--workers 2``; the best of ``--repeat`` runs is kept, since other processes on a
shared machine only ever add time. Prints the figures, whether the tables are
identical to the last digit, and the verdict against the 1.7x target.

Usage: ``python benchmarks/bench_sweep.py [--requests N] [--repeat K] [--ray]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "quickstart.yaml"
RATES_RPS = [float(r) for r in range(1, 11)]
SEEDS = 3
TARGET_SPEEDUP = 1.7


def measure(workers: int, backend: str, requests: int | None, out: Path) -> dict[str, float]:
    """Time one sweep in this process and save its table to ``out``."""
    sys.path.insert(0, str(REPO))
    from sim.io.scenario import load_scenario
    from sim.sweeps import sweep

    overrides = {"workload.requests": requests} if requests else {}
    scenario = load_scenario(SCENARIO, overrides)
    started = time.perf_counter()
    table = sweep(
        scenario, {"workload.arrival.rate": RATES_RPS}, SEEDS, workers=workers, backend=backend
    )
    wall_s = time.perf_counter() - started
    table.to_pickle(out)
    errors = table.loc[table["error"] != "", "error"]
    first_error = errors.iloc[0] if len(errors) else ""
    return {"wall_s": wall_s, "runs": len(table), "failed": len(errors), "first_error": first_error}


def run_child(workers: int, backend: str, requests: int | None, out: Path) -> dict[str, float]:
    """Run :func:`measure` in a fresh interpreter and return its figures."""
    command = [
        sys.executable,
        __file__,
        "--child",
        str(workers),
        "--backend",
        backend,
        "--table",
        str(out),
    ]
    if requests:
        command += ["--requests", str(requests)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--ray", action="store_true", help="also time the ray backend with 2 CPUs")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="local", help=argparse.SUPPRESS)
    parser.add_argument("--table", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.backend, args.requests, Path(args.table))))
        return 0
    return compare(args)


def compare(args: argparse.Namespace) -> int:
    """Time every configuration, check every table agrees, print the figures."""
    configs = [("local", 1), ("local", 2)] + ([("ray", 2)] if args.ray else [])
    requests = args.requests or "scenario default (600)"
    print(
        f"sweep: {SCENARIO.name}, 4 policies x {len(RATES_RPS)} rates x {SEEDS} seeds "
        f"({len(RATES_RPS) * SEEDS} tasks), requests: {requests}, cores: {os.cpu_count()}, "
        f"best of {args.repeat}"
    )
    best: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tables = []
        for backend, workers in configs:
            best[(backend, workers)], paths = time_config(args, backend, workers, Path(tmp))
            tables += paths
        identical = all_identical(tables)
    speedup = best[("local", 1)] / best[("local", 2)]
    verdict = "meets" if speedup >= TARGET_SPEEDUP else "MISSES"
    print(f"speed-up workers 2 vs 1: {speedup:.2f}x ({verdict} the {TARGET_SPEEDUP}x target)")
    print(f"every table identical to the last digit: {identical}")
    return 0 if identical and all(t < float("inf") for t in best.values()) else 1


def time_config(
    args: argparse.Namespace, backend: str, workers: int, tmp: Path
) -> tuple[float, list[Path]]:
    """Best wall time of ``args.repeat`` clean runs (no failed point) and their saved tables."""
    paths = [tmp / f"{backend}{workers}-{i}.pkl" for i in range(args.repeat)]
    runs = [run_child(workers, backend, args.requests, path) for path in paths]
    clean = [r["wall_s"] for r in runs if r["failed"] == 0]
    best = min(clean, default=float("inf"))
    walls = ", ".join(f"{r['wall_s']:.2f}" + ("!" if r["failed"] else "") for r in runs)
    print(f"  {backend:5s} workers={workers}: best {best:.2f} s  (runs: {walls} s)")
    for r in runs:
        if r["failed"]:
            print(f"    ! {r['failed']} of {r['runs']} rows failed: {r['first_error']}")
    return best, [p for p, r in zip(paths, runs, strict=True) if r["failed"] == 0]


def all_identical(paths: list[Path]) -> bool:
    """Whether every saved table equals the first, value for value."""
    import pandas as pd

    tables = [pd.read_pickle(p) for p in paths]
    return bool(tables) and all(t.equals(tables[0]) for t in tables)


if __name__ == "__main__":
    raise SystemExit(main())
