"""Prefix-caching overhead and the Mooncake run time: ``PYTHONPATH=. python benchmarks/bench_prefix.py``.

1. The 100k-request Splitwise workload of ``bench_engine.py`` (Poisson at 80 % of capacity,
   Llama-2-7B / A100-80GB) under paged (vLLM v0) scheduling, caching off and on, three
   interleaved runs each; prints the ratio of the median wall times. Target: on/off <= 1.10.
   Its prompts share nothing: requests get keys only when preempted, finished requests'
   blocks join the LRU as anonymous runs, the state's hooks go straight to the base class
   while nothing is keyed, and decode passes merge as with caching off
   (``sim.serving.prefix_state``); what remains is counting the evictions of each allocation
   and one free-list run per finished request. Three runs on two shared cores printed 0.90,
   1.03 and 1.06 (the machine's noise; callgrind counts about 4 % more instructions with
   caching on); it was ~1.25 when caching kept passes from merging.
2. ``scenarios/prefix/mooncake_conversation.yaml`` (12,031 requests), caching on, wall time.
   Target: under 30 s; measured 17-21 s.
"""

from __future__ import annotations

import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import cost_model_and_kv, make_stream  # noqa: E402

from sim.config import PagedPolicyConfig  # noqa: E402
from sim.serving.engine import EngineSetup, ReplicaSetup, simulate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _wall_s(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def main(requests: int = 100_000, load: float = 0.8, repeats: int = 3) -> None:
    """Print the on/off ratio of median wall times on Splitwise (``repeats`` runs each) and the Mooncake wall time."""
    cost, kv_blocks, label = cost_model_and_kv()
    policy = PagedPolicyConfig(name="paged")
    probe = simulate(make_stream(5_000, None, 0), policy, EngineSetup(ReplicaSetup(cost, kv_blocks, 16)))
    rate = load * 5_000 / probe.requests["completion_s"].max()
    stream = make_stream(requests, rate, 0)
    walls: dict[bool, list[float]] = {False: [], True: []}
    for caching in (False, True) * repeats:  # interleaved: the machine is shared
        replica = ReplicaSetup(cost, kv_blocks, 16, prefix_caching=caching)
        walls[caching].append(_wall_s(partial(simulate, stream, policy, EngineSetup(replica))))
    off, on = (statistics.median(walls[caching]) for caching in (False, True))
    print(f"{label}; splitwise {requests:,} requests at {rate:.2f} req/s, paged, median of {repeats}: "
          f"caching off {off:.1f} s, on {on:.1f} s, on/off {on / off:.3f}")  # fmt: skip
    from sim.runner import run

    scenario = ROOT / "scenarios" / "prefix" / "mooncake_conversation.yaml"
    try:
        wall = _wall_s(lambda: run(scenario, policies=["vllm-v1-cache"], summary_only=True))
    except Exception as exc:  # noqa: BLE001 - the trace lives in ../shared
        print(f"mooncake skipped: {exc}")
        return
    print(f"mooncake conversation (12,031 requests), vllm-v1 with caching: {wall:.1f} s")


if __name__ == "__main__":
    main()
