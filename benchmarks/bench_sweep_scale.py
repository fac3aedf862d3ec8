"""A 1,000-configuration sweep of 1,000-request runs on two local workers (issue 30's target: <= 2 minutes).

The configurations: the quickstart's continuous-batching policy alone, 10 arrival rates x 10 batch-size
limits x 10 output-length ceilings, one seed each, each run 1,000 requests. The sweep runs as a user runs
it, ``python -m sim sweep`` in a fresh process, so the time includes start-up, the workers' imports and
writing ``sweep.csv``. For scale: BLIS publishes 13 minutes for 1,000 configurations, Vidur-Search about an
hour per search.

    python benchmarks/bench_sweep_scale.py [--workers 2] [--points 1000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RATES = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5]
BATCH_LIMITS = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
OUTPUT_CEILINGS = [100, 150, 200, 250, 300, 350, 400, 450, 500, 550]
TARGET_S = 120.0


def one_policy_scenario(folder: Path) -> Path:
    """The quickstart with its continuous policy only, 1,000 requests."""
    scenario = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    scenario["policies"] = [p for p in scenario["policies"] if p["name"] == "continuous"]
    scenario["workload"]["requests"] = 1000
    path = folder / "one_policy.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--points", type=int, default=1000, choices=(10, 100, 1000), help="configurations")
    args = parser.parse_args()
    ceilings = OUTPUT_CEILINGS[: max(1, args.points // 100)]
    limits = BATCH_LIMITS[: max(1, min(10, args.points // 10))]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        command = [
            sys.executable, "-m", "sim", "sweep", str(one_policy_scenario(folder)),
            "--param", "workload.arrival.rate=" + ",".join(map(str, RATES)),
            "--param", "policies[continuous].max_batch_size=" + ",".join(map(str, limits)),
            "--param", "workload.output_tokens.high=" + ",".join(map(str, ceilings)),
            "--workers", str(args.workers), "--quiet", "--no-plots", "--out", str(folder / "sweep"),
        ]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, cwd=REPO, check=True)
        wall_s = time.perf_counter() - started
        rows = (folder / "sweep" / "sweep.csv").read_text().count("\n") - 1
    points = len(RATES) * len(limits) * len(ceilings)
    verdict = "meets" if points < 1000 or wall_s <= TARGET_S else "MISSES"
    per_point_ms = wall_s / points * 1000
    print(f"{points} configurations x 1,000 requests on {args.workers} workers: {wall_s:.1f} s ({rows} rows, "
          f"{per_point_ms:.0f} ms per configuration); {verdict} the {TARGET_S:.0f} s target")  # fmt: skip
    return 0 if rows == points else 1


if __name__ == "__main__":
    raise SystemExit(main())
