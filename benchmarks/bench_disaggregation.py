"""Speed of a disaggregated run: 2 prefill + 2 decode replicas vs 4 colocated replicas, same requests.

Target (issue 14): the 2+2 disaggregated simulation of 100,000 requests takes at most 1.5x the
time of the colocated 4-replica simulation of the same requests. Both use calibrated
Llama-3-8B on A100-80GB and the paged (vLLM v0) policy; lengths are splitwise_conv's (drawn with
replacement, seeded) with Poisson arrivals at ``--rate`` req/s. Only ``simulate`` / the engine is
timed (no summaries, no files).

    python benchmarks/bench_disaggregation.py                  # 100k requests
    python benchmarks/bench_disaggregation.py --requests 20000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.config import PagedPolicyConfig  # noqa: E402
from sim.hardware.catalog import get_gpu, get_model  # noqa: E402
from sim.hardware.cost_model import load_cost_model  # noqa: E402
from sim.hardware.memory import kv_budget, kv_bytes_per_token  # noqa: E402
from sim.serving.disagg import DisaggEngine, PoolSpec  # noqa: E402
from sim.serving.engine import EngineSetup, ReplicaSetup, simulate  # noqa: E402
from sim.serving.kv_link import TransferModel  # noqa: E402
from sim.workload.stream import RequestStream  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "splitwise_conv.csv"


def _stream(n: int, rate: float, seed: int = 0) -> RequestStream:
    rng = np.random.default_rng(seed)
    trace = pd.read_csv(TRACE)
    rows = rng.integers(0, len(trace), n)
    prompt = np.minimum(trace["num_prefill_tokens"].to_numpy()[rows], 7000).astype(np.int64)
    output = trace["num_decode_tokens"].to_numpy()[rows].astype(np.int64)
    return RequestStream(np.cumsum(rng.exponential(1 / rate, n)), prompt, output, int(output.max()))


def main() -> None:
    """Time both runs and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=12.0, help="req/s (4 A100s serve ~16 of these)")
    args = parser.parse_args()
    model = get_model("llama-3-8b")
    kv = kv_budget(model, get_gpu("a100-80gb"), 1)
    cost = load_cost_model("llama-3-8b", "a100-80gb", 1)
    policy = PagedPolicyConfig(name="v0", kind="paged", max_batch_size=256, max_num_batched_tokens=8192)
    stream = _stream(args.requests, args.rate)
    started = time.perf_counter()
    replica = ReplicaSetup(cost, kv.num_blocks, 16)
    colocated = simulate(stream, policy, EngineSetup(replica, replicas=4, router="least_outstanding"))
    colocated_s = time.perf_counter() - started
    transfer = TransferModel(kv_bytes_per_token(model, 1), 25e9, 10e-6, model.num_layers, layerwise=True)
    pool = PoolSpec(policy, replica, 2)
    started = time.perf_counter()
    engine = DisaggEngine(stream, pool, pool, transfer, block_size=16, router="least_outstanding")
    disagg = engine.run()
    disagg_s = time.perf_counter() - started
    print(f"{args.requests:,} requests at {args.rate:g} req/s, Llama-3-8B / A100-80GB, paged policy")
    print(f"colocated 4 replicas: {colocated_s:.1f} s ({len(colocated.iterations):,} passes)")
    print(f"disaggregated 2+2:    {disagg_s:.1f} s ({len(disagg.iterations):,} passes)")
    print(f"ratio: {disagg_s / colocated_s:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
