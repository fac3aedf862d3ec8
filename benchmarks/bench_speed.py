"""Simulator speed (issue 17): per policy, merged vs unmerged, against the bare SimPy floor.

Every figure that depends on this noisy machine is also given as a ratio to something
measured in the same process: the bare SimPy timeout rate (a process doing nothing but
``yield env.timeout(1)``) and the same run with ``merge_decode_steps`` off.

    python benchmarks/bench_speed.py                      # 100k requests per policy
    python benchmarks/bench_speed.py --requests 1000000 --policies continuous
    python benchmarks/bench_speed.py --process            # also whole-process times (CLI)
    python benchmarks/bench_speed.py --general            # the fast path against the general one
    python benchmarks/bench_speed.py --replicas 64        # 64 replicas, each at the same load

Targets: 1M splitwise requests at 80% load under continuous batching <= 20 s and <= 1 GB;
100k <= 2 s; every policy within 1.5x of continuous; simulated iterations per second
>= 30% of the bare SimPy timeout rate; a 1000-request run as a whole process <= 0.6 s;
``python -m sim --help`` <= 0.3 s.

The floor is re-measured right before each policy (a shared machine's load drifts); with
``--repeat N`` each run is the fastest of N. ``--cpu-time`` times the runs and the floor by this
process's CPU time instead of the wall clock: on a machine shared with other jobs, waiting for a
core then counts for nothing (pauses of the whole process still do).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import simpy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import cost_model_and_kv, make_stream  # noqa: E402

from sim.config import (  # noqa: E402
    ChunkedPrefillPolicyConfig,
    ContinuousPolicyConfig,
    PagedPolicyConfig,
    StaticPolicyConfig,
)
from sim.serving.engine import Engine, EngineSetup, ReplicaSetup  # noqa: E402

POLICIES = {
    "continuous": ContinuousPolicyConfig(name="continuous", max_batch_size=256),
    "static": StaticPolicyConfig(name="static", max_batch_size=64),
    "paged": PagedPolicyConfig(name="paged", max_batch_size=256),
    "chunked_prefill": ChunkedPrefillPolicyConfig(name="chunked_prefill", chunk_size=512),
}


Clock = Callable[[], float]


def simpy_floor(events: int = 1_000_000, clock: Clock = time.perf_counter) -> float:
    """Bare SimPy timeouts per second on this machine, now (timed by ``clock``)."""

    def loop(env: simpy.Environment):  # type: ignore[no-untyped-def]
        for _ in range(events):
            yield env.timeout(1.0)

    env = simpy.Environment()
    env.process(loop(env))
    started = clock()
    env.run()
    return events / (clock() - started)


def timed_run(  # type: ignore[no-untyped-def]
    stream, policy, cost, kv_blocks: int, merge: bool, repeat: int = 1, fast: bool = True, replicas: int = 1,
    clock: Clock = time.perf_counter,
) -> dict:  # fmt: skip
    """One simulation (the fastest of ``repeat``, against noise): wall time, passes and SimPy pass events."""
    best: dict = {}
    for _ in range(repeat):
        started = clock()
        replica = ReplicaSetup(cost, kv_blocks, 16, merge_decode_steps=merge, fast_path=fast)
        engine = Engine(stream, policy, EngineSetup(replica, replicas=replicas, router="least_outstanding"))
        out = engine.run()
        wall_s = clock() - started
        if not best or wall_s < best["wall_s"]:
            events = sum(w.pass_events for w in engine.workers)
            best = {"wall_s": wall_s, "passes": len(out.iterations), "events": events, "path": engine.path}
        del engine, out
    return best


def process_s(args: list[str], repeat: int = 5) -> float:
    """Fastest whole-process wall time of ``python <args>`` over ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, *args], check=True, cwd=ROOT, capture_output=True)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--probe", type=int, default=5_000)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--no-off", action="store_true", help="skip the unmerged comparison runs")
    parser.add_argument("--general", action="store_true", help="also run each policy on the general path")
    parser.add_argument("--replicas", type=int, default=1, help="replicas, each at --load (the rate scales)")
    parser.add_argument("--process", action="store_true", help="also time python -m sim as whole processes")
    parser.add_argument("--repeat", type=int, default=1, help="runs per policy; the fastest counts (noisy machines)")
    parser.add_argument("--cpu-time", action="store_true", help="time by this process's CPU time (shared machines)")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter

    cost, kv_blocks, label = cost_model_and_kv()
    probe = Engine(
        make_stream(args.probe, None, 0),
        POLICIES["continuous"],
        EngineSetup(ReplicaSetup(cost, kv_blocks, 16)),
    )
    rate = args.load * args.probe / probe.run().requests["completion_s"].max()
    rate *= args.replicas
    stream = make_stream(args.requests, rate, 0)
    load = f"{args.load:.0%} of continuous capacity on {args.replicas} replica(s) ({rate:.2f} req/s)"
    timed_by = "CPU time" if args.cpu_time else "wall clock"
    print(f"cost model: {label}; {args.requests:,} requests at {load}; timed by {timed_by}")
    floor = simpy_floor(clock=clock)
    print(f"bare SimPy floor: {floor:,.0f} timeouts/s")
    base_s = None
    for name in args.policies:
        floor = simpy_floor(300_000, clock)  # again right before each policy: the machine's load drifts
        on = timed_run(stream, POLICIES[name], cost, kv_blocks, merge=True, repeat=args.repeat, replicas=args.replicas,
                       clock=clock)  # fmt: skip
        rate_on = on["passes"] / on["wall_s"]
        base_s = base_s or on["wall_s"]
        line = (
            f"{name:16s} {on['path']} path {on['wall_s']:6.2f} s ({on['wall_s'] / base_s:.2f}x continuous), "
            f"{on['passes']:,} passes, {1e6 * on['wall_s'] / on['passes']:.2f} us per pass, "
            f"{on['events'] / on['passes']:.3f} SimPy events per pass, {rate_on:,.0f} passes/s = "
            f"{rate_on / floor:.1%} of the SimPy floor ({floor:,.0f}/s just before)"
        )
        if not args.no_off:
            off = timed_run(stream, POLICIES[name], cost, kv_blocks, merge=False, repeat=args.repeat, clock=clock)
            line += f"; merging off {off['wall_s']:.2f} s (x{off['wall_s'] / on['wall_s']:.2f})"
        if args.general:
            general = timed_run(stream, POLICIES[name], cost, kv_blocks, merge=True, repeat=args.repeat, fast=False,
                                replicas=args.replicas, clock=clock)  # fmt: skip
            line += f"; general path {general['wall_s']:.2f} s (fast path x{general['wall_s'] / on['wall_s']:.2f})"
        print(line, flush=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_mib:,.0f} MiB")
    if args.process:
        run_s = process_s(["-m", "sim", "run", "--set", "workload.requests=1000", "--no-plots", "--quiet",
                           "--out", "/tmp/bench_speed_run"])  # fmt: skip
        help_s = process_s(["-m", "sim", "--help"])
        bare_s = process_s(["-c", "pass"])
        imports_s = process_s(["-c", "import sim.cli, sim.runner, sim.io.outputs, sim.report.tables"])
        print(
            f"whole process: 1000-request quickstart run {run_s:.2f} s, --help {help_s:.2f} s, "
            f"bare python {bare_s:.2f} s, the run's imports alone {imports_s:.2f} s "
            f"(so {run_s - imports_s:.2f} s simulating and writing, {run_s / imports_s:.2f}x the imports)"
        )


if __name__ == "__main__":
    main()
