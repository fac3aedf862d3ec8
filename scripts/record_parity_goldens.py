"""Record the scheduler-parity golden traces of tests/data/parity/ with the installed vLLM.

Two kinds, each written as ``vllm-<version>-<name>.json``:

* ``small-*``: scenarios/parity/small.yaml's two policies, synchronous, and with the
  ``AsyncScheduler`` (``-async``) where the preset schedules asynchronously (vLLM 0.15);
* ``micro-*``: a few requests built so that one vLLM rule decides a step (what each checks is in
  :data:`MICRO`'s comments and in tests/test_parity.py).

vLLM is needed (``pip install 'batchsim[parity]'``, or the CPU-only install in docs/validation.md);
the tests replay the files without it. Run it once per supported version, then keep the files the
tests name::

    python scripts/record_parity_goldens.py --out tests/data/parity
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.parity.trace import Requests

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "parity" / "small.yaml"

DEPLOYMENT = {
    "preset": "vllm-0.11", "model": "llama-3-8b", "gpu": "a100-80gb", "tensor_parallel": 1, "max_model_len": 8192,
}  # fmt: skip
"""The micro traces' deployment (its cost model only sets the clock that times arrivals)."""


def _limits(num_blocks: int) -> dict[str, object]:
    return {
        "max_num_batched_tokens": 512, "max_num_seqs": 8, "block_size": 16, "num_blocks": num_blocks,
        "enable_prefix_caching": True, "async_scheduling": False,
    }  # fmt: skip


MICRO: dict[str, tuple[Requests, dict[str, object]]] = {
    # 13 blocks, all taken at step 0. Requests 2 and 3 end there and free their cached blocks
    # (request 2's [100, 101] first, tail first: 101 heads the free queue). At step 1 request 0's
    # decode needs a block: it takes the queue's head and evicts 101, before request 4, arriving
    # then with request 2's prefix, looks its hits up: one block, not two.
    "micro-eviction-before-lookup": (
        Requests(
            arrival_s=[0.0, 0.0, 0.0, 0.0, 1e-6],
            prompt_tokens=[64, 60, 32, 40, 48],
            output_tokens=[20, 20, 1, 1, 1],
            block_keys=[[200, 201, 202, 203], [210, 211, 212], [100, 101], [400, 401], [100, 101, 300]],
        ),
        _limits(13),
    ),
    # Two requests sharing two blocks arrive together: the first one's blocks are cached when it is
    # scheduled, so the second one, scheduled after it in the same step, hits them.
    "micro-same-step-hit": (
        Requests(arrival_s=[0.0, 0.0], prompt_tokens=[48, 40], output_tokens=[3, 3], block_keys=[[1, 2, 3], [1, 2]]),
        _limits(20),
    ),
    # Two requests decode until 8 blocks are full; the second one is preempted with 64 tokens (20 of
    # them its prompt) and resumes once the first one ends: it hits its blocks of generated tokens.
    "micro-generated-blocks": (
        Requests(arrival_s=[0.0, 0.0], prompt_tokens=[20, 20], output_tokens=[50, 100], block_keys=None),
        _limits(8),
    ),
}


def record_all(out: Path) -> list[Path]:
    """Record every golden with the installed vLLM into ``out``; return the files written."""
    from sim.cli import load_from_args
    from sim.parity.cli import installed_preset_overrides
    from sim.parity.inputs import cost_model_for, inputs_from_scenario
    from sim.parity.vllm_driver import import_vllm, record

    version = str(import_vllm().__version__)
    written = []
    overrides = installed_preset_overrides(str(SCENARIO), version)
    scenario = load_from_args(argparse.Namespace(file=str(SCENARIO), overrides=overrides, seed=None))
    for policy in scenario.policies:
        inputs = inputs_from_scenario(scenario, policy.name)
        lags = [False, True] if inputs.scheduler["async_scheduling"] else [False]
        for lag in lags:
            limits = dict(inputs.scheduler, async_scheduling=lag)
            trace = record(inputs.requests, inputs.deployment, limits, cost_model_for(inputs.deployment))
            written.append(out / f"vllm-{version}-small-{policy.name}{'-async' if lag else ''}.json")
            trace.write(written[-1])
    for name, (requests, limits) in MICRO.items():
        trace = record(requests, DEPLOYMENT, limits, cost_model_for(DEPLOYMENT))
        written.append(out / f"vllm-{version}-{name}.json")
        trace.write(written[-1])
    return written


def main() -> None:
    """Parse ``--out`` and record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the traces into")
    for path in record_all(Path(parser.parse_args().out)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
