"""Peak memory and wall time of the whole ``python -m sim run`` path, one child process per run.

Unlike ``bench_engine.py`` (the bare engine), this measures what a user of the CLI pays:
resolving the scenario, simulating, summarizing, keeping the records, writing
``summary.csv``, ``requests.csv``, ``iterations.csv``, the resolved YAML and the plots.
Each run is a fresh child process; its peak RSS is that child's own ``ru_maxrss``
(``os.wait4``, so one large run does not inflate the next one's number, as
``RUSAGE_CHILDREN`` would). The scenario is self-contained (no ``../shared`` data): the
quickstart's lengths (prompts 128-512, outputs 20-500 tokens), Poisson arrivals at
5 req/s, one continuous-batching policy with max batch 64 on Llama-2-7B / A100-80GB
(about 9 forward passes per request).

Modes: ``full`` is ``python -m sim run FILE --out DIR --quiet`` (through ``sim.cli.main``);
``summary`` is ``run(scenario, summary_only=True)`` + ``RunResult.save(plots=False)``
(what ``--summary-only`` does), skipped on a checkout whose ``run`` lacks the keyword;
``cli`` is the user's own command, ``python -m sim run SCENARIO --policy P --set
workload.requests=N`` as a separate interpreter (``--scenario``, default the quickstart: Poisson
at 3 req/s, continuous max batch 16, about 24 passes a request), the run the README quotes.
Every line also prints what :func:`sim.metrics.estimate.estimate_run` of the measured
checkout predicts for that run, so a refit of its constants can be checked in one command.

    python benchmarks/bench_cli_memory.py --modes cli --requests 20000 50000 100000 200000
    python benchmarks/bench_cli_memory.py                                # 200k and 1M requests
    python benchmarks/bench_cli_memory.py --requests 200000 --modes full
    python benchmarks/bench_cli_memory.py --root /tmp/before             # measure another checkout
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

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """\
name: bench_cli_memory
seed: 7
model: llama-2-7b
gpu: a100-80gb
workload:
  requests: {requests}
  arrival: {{kind: poisson, rate: {rate}}}
  prompt_tokens: {{kind: uniform, low: 128, high: 512}}
  output_tokens: {{kind: uniform, low: 20, high: 500}}
policies:
  - {{name: continuous, kind: continuous, max_batch_size: 64}}
slo: {{ttft_p99_s: 2.0, tpot_p99_s: 0.1}}
"""

# Runs in the child, with the measured checkout first on sys.path.
CHILD = """\
import time
started = time.perf_counter()
import inspect, json, sys
root, scenario_file, out_dir, mode, plots = sys.argv[1:6]
sys.path.insert(0, root)
import pandas as pd
from sim.runner import run
from sim.io.scenario import load_scenario
if mode == "full":
    from sim.cli import main
    code = main(["run", scenario_file, "--out", out_dir, "--quiet", *([] if plots == "1" else ["--no-plots"])])
    if code:
        sys.exit(code)
elif "summary_only" not in inspect.signature(run).parameters:
    print(json.dumps({"skipped": "run() has no summary_only keyword in this checkout"}))
    sys.exit(0)
else:
    run(load_scenario(scenario_file), summary_only=True).save(out_dir, plots=False)
report = {"wall_s": time.perf_counter() - started}  # the estimate below is not timed
report["iterations"] = int(pd.read_csv(out_dir + "/summary.csv")["iterations"].sum())
try:
    from sim.metrics.estimate import estimate_run
    memory_bytes, seconds = estimate_run(load_scenario(scenario_file), summary_only=mode != "full")
    report |= {"estimate_mib": memory_bytes / 2**20, "estimate_s": seconds}
except ImportError:
    pass
print(json.dumps(report))
"""

# Runs in a second child after a ``cli`` measurement: the estimate for the same command line.
ESTIMATE = """\
import json, sys
root, scenario_file, policy, requests = sys.argv[1:5]
sys.path.insert(0, root)
from sim.io.scenario import load_scenario
from sim.metrics.estimate import estimate_run
scenario = load_scenario(scenario_file, {"workload.requests": int(requests)})
memory_bytes, seconds = estimate_run(scenario, [p for p in scenario.policies if p.name == policy])
print(json.dumps({"estimate_mib": memory_bytes / 2**20, "estimate_s": seconds}))
"""


def measure(root: Path, requests: int, rate: float, mode: str, plots: bool) -> dict:
    """Run one child; return its peak RSS (MiB), wall time (s, start-up to files written) and more."""
    with tempfile.TemporaryDirectory(prefix="bench_cli_memory-") as tmp:
        scenario_file = Path(tmp) / "scenario.yaml"
        scenario_file.write_text(SCENARIO.format(requests=requests, rate=rate))
        argv = [sys.executable, "-c", CHILD, str(root), str(scenario_file), f"{tmp}/out", mode, "1" if plots else "0"]
        child = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, text=True)
        output = child.stdout.read() if child.stdout else ""
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not the max over all
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"child failed ({os.waitstatus_to_exitcode(status)}) for {requests} requests, mode {mode}")
    report = json.loads(output.strip().splitlines()[-1])
    return report | {"peak_mib": usage.ru_maxrss / 1024}  # Linux: KiB


def measure_cli(root: Path, scenario: Path, policy: str, requests: int, plots: bool) -> dict:
    """Run ``python -m sim run`` as the user does; return its peak RSS (MiB), wall time and passes."""
    import pandas as pd  # here, not at the top: the other modes' children import their own

    with tempfile.TemporaryDirectory(prefix="bench_cli_memory-") as tmp:
        argv = [
            sys.executable,
            "-m",
            "sim",
            "run",
            str(scenario),
            "--policy",
            policy,
            "--set",
            f"workload.requests={requests}",
            "--out",
            f"{tmp}/out",
            "--quiet",
        ]
        argv += [] if plots else ["--no-plots"]
        env = os.environ | {"PYTHONPATH": str(root)}  # the measured checkout's sim, not an installed one
        started = time.perf_counter()
        child = subprocess.Popen(argv, cwd=root, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall_s = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"python -m sim run failed ({os.waitstatus_to_exitcode(status)}) for {requests} requests")
        iterations = int(pd.read_csv(Path(tmp) / "out" / "summary.csv")["iterations"].sum())
    estimate = subprocess.run(
        [sys.executable, "-c", ESTIMATE, str(root), str(scenario), policy, str(requests)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    report = {"wall_s": wall_s, "iterations": iterations, "peak_mib": usage.ru_maxrss / 1024}
    if estimate.returncode == 0:
        report |= json.loads(estimate.stdout.strip().splitlines()[-1])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--modes", nargs="+", choices=["full", "summary", "cli"], default=["full", "summary"])
    parser.add_argument(
        "--scenario",
        type=Path,
        default=ROOT / "scenarios" / "quickstart.yaml",
        help="scenario of the cli mode (default: the quickstart)",
    )
    parser.add_argument("--policy", default="continuous", help="the one policy the cli mode runs")
    parser.add_argument("--rate", type=float, default=5.0, help="Poisson arrival rate, req/s")
    parser.add_argument("--no-plots", action="store_true", help="full mode without the PNG plots")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    args = parser.parse_args()
    print(f"checkout {args.root}; plots: {not args.no_plots}")
    if {"full", "summary"} & set(args.modes):
        print(f"full/summary: continuous max batch 64, Poisson {args.rate} req/s")
    if "cli" in args.modes:
        print(f"cli: python -m sim run {args.scenario} --policy {args.policy} --set workload.requests=N")
    for requests in args.requests:
        for mode in args.modes:
            if mode == "cli":
                got = measure_cli(
                    args.root.resolve(), args.scenario.resolve(), args.policy, requests, plots=not args.no_plots
                )
            else:
                got = measure(args.root.resolve(), requests, args.rate, mode, plots=not args.no_plots)
            if "skipped" in got:
                print(f"{requests:>9,} requests  {mode:<7}  skipped: {got['skipped']}")
                continue
            line = (
                f"{requests:>9,} requests  {mode:<7}  {got['iterations']:>11,} iterations  "
                f"peak RSS {got['peak_mib']:>6,.0f} MiB  wall {got['wall_s']:>6.1f} s"
            )
            if "estimate_mib" in got:
                line += f"  (estimate {got['estimate_mib']:,.0f} MiB, {got['estimate_s']:.0f} s)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
