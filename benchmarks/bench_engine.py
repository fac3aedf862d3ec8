"""Engine speed and memory at scale: continuous batching of splitwise_conv requests on Llama-2-7B.

Targets (issue 3): 100,000 requests in <= 30 s wall; 1,000,000 requests in <= 5 min with
peak memory <= 2 GB. Lengths are drawn (with replacement, seeded) from
``../shared/traces/splitwise_conv.csv``; arrivals are Poisson at ``--load`` x the
continuous-batching capacity, which is measured first on a burst of ``--probe``
requests (throughput at saturation) and printed.

    python benchmarks/bench_engine.py                       # 100k requests
    python benchmarks/bench_engine.py --requests 1000000    # 1M requests
    python benchmarks/bench_engine.py --profile             # cProfile top functions
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.config import ContinuousPolicyConfig  # noqa: E402
from sim.serving.engine import EngineSetup, ReplicaSetup, simulate  # noqa: E402
from sim.workload.stream import RequestStream  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "splitwise_conv.csv"
FALLBACK_KV_BLOCKS = 7335  # what sim.hardware.memory sizes for Llama-2-7B on A100-80GB at 0.9


class FakeLlama7B:
    """Stand-in of similar magnitude when the calibrated model is missing: 12 ms + 0.1 ms/token."""

    label = "fake 12 ms + 0.1 ms/token"

    def time_from_totals_s(
        self,
        num_prefill_tokens,
        num_prefill_seqs,
        prefill_attn_work,
        num_decode_seqs,
        decode_kv_tokens,
    ) -> float:
        return 0.012 + 1e-4 * (num_prefill_tokens + num_decode_seqs)


def cost_model_and_kv():
    """The calibrated Llama-2-7B / A100-80GB cost model and KV blocks, or the fallbacks."""
    try:
        from sim.hardware.catalog import get_gpu, get_model
        from sim.hardware.cost_model import load_cost_model
        from sim.hardware.memory import kv_budget

        cost = load_cost_model("llama-2-7b", "a100-80gb", 1)
        kv = kv_budget(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1)
        return cost, kv.num_blocks, f"calibrated: {cost.source}"
    except Exception as exc:  # noqa: BLE001 - any failure: fall back, and say so
        return (
            FakeLlama7B(),
            FALLBACK_KV_BLOCKS,
            f"{FakeLlama7B.label} (calibrated model unavailable: {exc})",
        )


def lengths(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, output) pairs resampled from the splitwise_conv trace."""
    if not TRACE.is_file():
        sys.exit(f"trace not found: {TRACE} (the shared data folder sits next to the repository)")
    trace = pd.read_csv(TRACE, usecols=["num_prefill_tokens", "num_decode_tokens"])
    pick = np.random.default_rng(np.random.SeedSequence([seed, 1])).integers(0, len(trace), n)
    return trace["num_prefill_tokens"].to_numpy()[pick], trace["num_decode_tokens"].to_numpy()[pick]


def make_stream(n: int, rate: float | None, seed: int) -> RequestStream:
    """Poisson arrivals at ``rate`` (None: all at t=0) with trace lengths."""
    prompt, output = lengths(n, seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    arrival = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1.0 / rate, n))
    return RequestStream(
        arrival, prompt.astype(np.int64), output.astype(np.int64), int(output.max())
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument(
        "--load", type=float, default=0.8, help="arrival rate as a fraction of capacity"
    )
    parser.add_argument(
        "--probe", type=int, default=5_000, help="burst size of the capacity measurement"
    )
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the main run (slower)")
    parser.add_argument(
        "--tracemalloc", action="store_true", help="trace Python allocations (much slower)"
    )
    args = parser.parse_args()

    cost, kv_blocks, cost_label = cost_model_and_kv()
    policy = ContinuousPolicyConfig(name="continuous", max_batch_size=args.max_batch_size)
    run = EngineSetup(ReplicaSetup(cost, kv_blocks, 16))
    print(
        f"cost model: {cost_label}; KV {kv_blocks} blocks of 16; "
        f"continuous max_batch_size {args.max_batch_size}"
    )

    started = time.perf_counter()
    probe = simulate(make_stream(args.probe, None, args.seed), policy, run)
    capacity_rps = args.probe / probe.requests["completion_s"].max()
    rate = args.load * capacity_rps
    print(
        f"capacity (burst of {args.probe:,}): {capacity_rps:.3f} req/s, measured in "
        f"{time.perf_counter() - started:.1f} s -> Poisson rate {rate:.3f} req/s ({args.load:.0%})"
    )

    stream = make_stream(args.requests, rate, args.seed)
    if args.tracemalloc:
        tracemalloc.start()
    profiler = cProfile.Profile() if args.profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    out = simulate(stream, policy, run)
    if profiler:
        profiler.disable()
    wall_s = time.perf_counter() - started
    report(out, wall_s, args.requests)
    if args.tracemalloc:
        _, peak = tracemalloc.get_traced_memory()
        print(f"tracemalloc peak (Python allocations during the run): {peak / 2**20:,.0f} MiB")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def report(out, wall_s: float, n: int) -> None:
    """Print the run's speed, memory and a few results."""
    req, it = out.requests, out.iterations
    done = req["status"] == "completed"
    span_s = req["completion_s"].max()
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(
        f"requests {n:,}: wall {wall_s:.1f} s, {len(it):,} iterations "
        f"({wall_s / len(it) * 1e6:.1f} us each), "
        f"peak RSS {peak_rss_mib:,.0f} MiB"
    )
    busy = it["duration_s"].sum() / span_s
    print(
        f"  simulated {span_s:,.0f} s; completed {done.sum():,}; "
        f"throughput {done.sum() / span_s:.3f} req/s; "
        f"mean batch {it['batch_size'].mean():.1f}; GPU busy {busy:.1%}"
    )
    tables_mib = (req.memory_usage().sum() / 2**20, it.memory_usage().sum() / 2**20)
    print(
        f"  TTFT p50 {req['ttft_s'].median():.3f} s, "
        f"TPOT p50 {req['tpot_s'].median() * 1e3:.1f} ms, "
        f"E2E mean {req['e2e_s'].mean():.2f} s; tables: {tables_mib[0]:,.0f} MiB requests, "
        f"{tables_mib[1]:,.0f} MiB iterations"
    )


if __name__ == "__main__":
    main()
