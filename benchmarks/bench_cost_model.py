"""Speed of the cost model: microseconds per call on this machine.

    python benchmarks/bench_cost_model.py

Target: <= 20 us for ``iteration_time_s`` on a 256-sequence decode batch (the engine
calls the cost model once per simulated forward pass; it uses ``time_from_totals_s``
with running sums, which is cheaper still).
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # run from a checkout without installing
from sim.hardware import load_cost_model  # noqa: E402

TARGET_US = 20.0


def _us_per_call(fn, number: int = 20000, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    """Print microseconds per call for three batch shapes and three cost models."""
    rng = np.random.default_rng(0)
    decode = rng.integers(16, 4000, size=256)
    empty = np.zeros(0, dtype=np.int64)
    chunks, contexts = np.array([512, 200]), np.array([1024, 0])
    mixed_decode = rng.integers(16, 4000, size=64)
    totals = (712, 2, float(np.dot(chunks, contexts + chunks / 2)), 64, int(mixed_decode.sum()))
    for model, gpu, tp in (
        ("llama-2-7b", "a100-80gb", 1),
        ("llama-2-70b", "a100-80gb", 4),
        ("qwen2.5-7b", "h100-sxm", 2),
    ):
        cost = load_cost_model(model, gpu, tp)
        decode_us = _us_per_call(lambda cost=cost: cost.iteration_time_s(empty, empty, decode))
        mixed_us = _us_per_call(
            lambda cost=cost: cost.iteration_time_s(chunks, contexts, mixed_decode)
        )
        totals_us = _us_per_call(lambda cost=cost: cost.time_from_totals_s(*totals))
        verdict = "OK" if decode_us <= TARGET_US else "SLOW"
        print(
            f"{model} {gpu} TP{tp} [{cost.label}]: iteration_time_s 256-seq decode "
            f"{decode_us:.2f} us ({verdict}, target <= {TARGET_US:.0f} us); "
            f"mixed 2 prefill + 64 decode {mixed_us:.2f} us; "
            f"time_from_totals_s {totals_us:.2f} us"
        )


if __name__ == "__main__":
    main()
