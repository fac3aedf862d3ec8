"""Fit the serving-stack terms of the vLLM presets jointly on every folder of ../shared/validation.

The terms, each a mechanism (sim/vllm_defaults.py says which code it stands for):

* ``per_request_ms``: the API server's event-loop time per request (HTTP, JSON, validation,
  tokenization), one value for vLLM V0 and V1 servers: both are the same FastAPI loop. Bursts
  identify it: the first request reaches the engine only once the loop has parsed the whole burst.
* ``v0_latency_ms``, ``v1_latency_ms``: what a request spends outside the engine and outside that
  loop (the hop to the engine process, detokenization, streaming), which takes no capacity. V1 adds
  a process and an output processor on the way, so each generation has its own.
* ``v1_pass_ms``, ``v1_step_us_per_seq``: vLLM V1's CPU time per pass (input preparation, sampling)
  and per running request per scheduling step (``Scheduler.schedule``, ``update_from_output``). V0's
  CPU terms keep the fit of wave 2 (three A100 bursts, docs/validation.md).

The objective is the sum of squared log errors over every run's or unsaturated stage's TTFT, TPOT,
E2E and throughput figures (a stage the client held at its in-flight cap is not a latency
measurement of the server). ``--leave-one-out`` refits on each folder alone, with the terms that
folder cannot identify taken from the other generation, and reports the error on the left-out
folder: how far the terms carry to an engine version they were not fitted on.

    python scripts/fit_serving.py [--leave-one-out]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim import vllm_defaults  # noqa: E402
from sim.validation.report import validate_set  # noqa: E402

SHARED = ROOT.parent / "shared" / "validation"
FOLDERS = ("vllm-0.6.0-burst", "vllm-0.11-h100")
NAMES = ("per_request_ms", "v0_latency_ms", "v1_latency_ms", "v1_pass_ms", "v1_step_us_per_seq")
START = (2.5, 3.0, 10.0, 0.2, 20.0)
STEP = (1.0, 5.0, 10.0, 0.2, 10.0)
"""Where the search starts and its first step per term: wave 2's loop time, a few ms of latency, the V1 CPU
costs vLLM's V1 blog reports as small (a fraction of a ms per step)."""
FITTED_METRICS = {
    "ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tps",  # bursts
    "ttft_mean_ms", "e2e_mean_ms", "tpot_derived_ms", "req_per_s",  # stages and traces
}  # fmt: skip


def apply(terms: dict[str, float]) -> None:
    """Set the presets' serving-stack terms (in place: the presets read these dicts when they resolve)."""
    vllm_defaults.V0_FRONTEND.update(per_request_ms=terms["per_request_ms"], latency_ms=terms["v0_latency_ms"])
    vllm_defaults.V1_FRONTEND.update(per_request_ms=terms["per_request_ms"], latency_ms=terms["v1_latency_ms"])
    vllm_defaults.VLLM_V1_CPU.update(pass_ms=terms["v1_pass_ms"], step_us_per_seq=terms["v1_step_us_per_seq"])


def residuals(folders: tuple[str, ...]) -> pd.DataFrame:
    """Every fitted figure of ``folders`` under the terms applied now (unsaturated stages only)."""
    tables = []
    for folder in folders:
        with contextlib.redirect_stdout(io.StringIO()):
            table = validate_set(SHARED / folder)
        tables.append(table.assign(folder=folder))
    table = pd.concat(tables, ignore_index=True)
    kept = table["metric"].isin(FITTED_METRICS) & ~table["saturated"].astype(bool)
    return table[kept & table["measured"].gt(0) & table["simulated"].gt(0)]


def loss(x: np.ndarray, free: list[str], fixed: dict[str, float], folders: tuple[str, ...]) -> float:
    if np.any(x < 0):
        return math.inf
    apply(fixed | dict(zip(free, x, strict=True)))
    table = residuals(folders)
    return float((np.log(table["simulated"] / table["measured"]) ** 2).sum())


def fit(free: list[str], folders: tuple[str, ...], fixed: dict[str, float] | None = None) -> dict[str, float]:
    """The terms ``free`` that minimise the loss on ``folders``; the others at ``fixed`` (else their start)."""
    starts, steps = dict(zip(NAMES, START, strict=True)), dict(zip(NAMES, STEP, strict=True))
    held = {name: starts[name] for name in NAMES if name not in free} | (fixed or {})
    start = np.array([starts[name] for name in free])
    simplex = np.vstack([start] + [start + np.eye(len(free))[i] * steps[name] for i, name in enumerate(free)])
    result = minimize(loss, start, args=(free, held, folders), method="Nelder-Mead",
                      options={"initial_simplex": simplex, "xatol": 0.05, "fatol": 1e-3, "maxfev": 150})  # fmt: skip
    return held | dict(zip(free, (round(float(v), 2) for v in result.x), strict=True))


def summary(folders: tuple[str, ...]) -> pd.DataFrame:
    """Median |error| per folder and metric under the terms applied now."""
    table = residuals(folders)
    table = table.assign(abs_error=table["error_pct"].abs())
    return table.pivot_table(index="folder", columns="metric", values="abs_error", aggfunc="median").round(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-one-out", action="store_true", help="also fit on each folder alone")
    args = parser.parse_args()
    joint = fit(list(NAMES), FOLDERS)
    apply(joint)
    print("joint fit:", joint)
    print(summary(FOLDERS).to_string())
    if not args.leave_one_out:
        return
    v0_only = fit(["per_request_ms", "v0_latency_ms"], (FOLDERS[0],))
    # What the V0 folder cannot say about V1: the same latency, and V0's CPU terms run every pass.
    carried = v0_only | {"v1_latency_ms": v0_only["v0_latency_ms"],
                         "v1_pass_ms": vllm_defaults.VLLM_06_CPU["pass_ms"] + vllm_defaults.VLLM_06_CPU["step_ms"],
                         "v1_step_us_per_seq": vllm_defaults.VLLM_06_CPU["step_us_per_seq"]
                         + vllm_defaults.VLLM_06_CPU["pass_us_per_seq"]}  # fmt: skip
    apply(carried)
    print("fitted on the 0.6 folder alone:", carried)
    print(summary((FOLDERS[1],)).to_string())
    v1_only = fit(["per_request_ms", "v1_latency_ms", "v1_pass_ms", "v1_step_us_per_seq"], (FOLDERS[1],))
    carried = v1_only | {"v0_latency_ms": v1_only["v1_latency_ms"]}
    apply(carried)
    print("fitted on the 0.11 folder alone:", carried)
    print(summary((FOLDERS[0],)).to_string())


if __name__ == "__main__":
    main()
