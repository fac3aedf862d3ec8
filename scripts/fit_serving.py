"""Fit the serving-stack terms of the vLLM presets jointly on every folder of ../shared/validation.

The machinery is the library's (:mod:`sim.calibration.serving_fit`, the same as ``python -m sim
calibrate-serving``); this script picks the presets' five terms (:func:`sim.calibration.serving_terms.script_terms`):

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
E2E and throughput figures (a stage at or above 0.9 of capacity is not a latency measurement of the
server), minimised by Nelder-Mead. ``--leave-one-out`` refits on each folder alone, with the terms that
folder cannot identify taken from the other generation, and reports the error on the left-out
folder: how far the terms carry to an engine version they were not fitted on. ``--calibration-check`` asks
what ``python -m sim calibrate-serving`` adds for a version the presets never saw: presets fitted on the 0.6
folder alone (V1's terms carried from V0's) predict the 0.11 folder, then the command's own machinery
(:func:`sim.calibration.serving_terms.default_terms`, least squares, leave-one-run-out) calibrates from the 0.11
folder starting there. Copy the fitted values into ``sim/vllm_defaults.py`` (V0_FRONTEND, V1_FRONTEND,
VLLM_V1_CPU).

    python scripts/fit_serving.py [--leave-one-out] [--calibration-check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim import vllm_defaults  # noqa: E402
from sim.calibration import serving_fit as sf  # noqa: E402
from sim.calibration.serving_terms import script_terms  # noqa: E402
from sim.validation.folder import load_cases  # noqa: E402

SHARED = ROOT.parent / "shared" / "validation"
FOLDERS = ("vllm-0.6.0-burst", "vllm-0.11-h100")
MAX_EVALUATIONS = 150


def unsaturated_cases(folders: tuple[str, ...]) -> dict[str, list]:
    """Folder -> its cases below 0.9 of capacity under the presets."""
    return {folder: sf.unsaturated(load_cases(SHARED / folder))[0] for folder in folders}


def fit(names: list[str], cases: list, fixed: dict[str, float] | None = None) -> dict[str, float]:
    """The terms ``names`` that minimise the loss on ``cases``; the other terms at ``fixed`` (else their start)."""
    terms = script_terms()
    held = {t.name: t.start for t in terms} | (fixed or {})
    free = [t for t in terms if t.name in names]
    others = [t for t in terms if t.name not in names]
    base = sf.calibration_with(others, [held[t.name] for t in others])
    found = sf.fit(free, cases, method="nelder-mead", max_evaluations=MAX_EVALUATIONS, base=base)
    return held | {t.name: round(v, 2) for t, v in zip(free, found.values, strict=True)}


def summary(values: dict[str, float], by_folder: dict[str, list]) -> pd.DataFrame:
    """Median |error| per folder and metric under ``values``."""
    terms = script_terms()
    calibration = sf.calibration_with(terms, [values[t.name] for t in terms])
    rows = []
    for folder, cases in by_folder.items():
        table = sf.residual_table(cases, calibration)
        rows.append(table.assign(folder=folder, abs_error=100 * (table["simulated"] / table["measured"] - 1).abs()))
    table = pd.concat(rows, ignore_index=True)
    return table.pivot_table(index="folder", columns="metric", values="abs_error", aggfunc="median").round(1)


def carried_from_v0(v0_only: dict[str, float]) -> dict[str, float]:
    """Terms fitted on the 0.6 folder alone, with what that folder cannot say about V1 carried over: the same
    latency, and V0's CPU terms paid every pass."""
    cpu = vllm_defaults.VLLM_06_CPU
    return v0_only | {"v1_latency_ms": v0_only["v0_latency_ms"], "v1_pass_ms": cpu["pass_ms"] + cpu["step_ms"],
                      "v1_step_us_per_seq": cpu["step_us_per_seq"] + cpu["pass_us_per_seq"]}  # fmt: skip


def calibration_check(v0_only: dict[str, float], cases: list, other: list) -> pd.DataFrame:
    """Median |error| (%) of presets fitted on the 0.6 folder alone and of ``calibrate-serving``'s fit from there
    on the 0.11 ``cases``: on ``cases`` (the presets, the fit in sample, its leave-one-run-out prediction), and on
    the 0.6 folder's ``other`` cases (the presets in sample, then with the calibration's shared terms)."""
    from sim.calibration.serving_terms import default_terms

    carried = carried_from_v0(v0_only)
    starts = {"per_request_ms": carried["per_request_ms"], "v1.latency_ms": carried["v1_latency_ms"],
              "v1.pass_ms": carried["v1_pass_ms"], "v1.step_us_per_seq": carried["v1_step_us_per_seq"]}  # fmt: skip
    terms = default_terms(cases)
    start = [starts.get(t.name, t.start) for t in terms]
    # The loop time and V0's latency as the 0.6 folder fitted them, whether or not the 0.11 runs free the loop time.
    shared = [t for t in script_terms() if t.name in ("per_request_ms", "v0_latency_ms")]
    base = sf.calibration_with(shared, [carried[t.name] for t in shared])
    presets = sf.calibration_with(terms, start, base)
    joint = sf.fit(terms, cases, start=start, base=base)
    print("calibrated from the 0.6-only presets:", joint.named())
    tables = {
        "0.11 folder, 0.6-only presets": _with_errors(sf.residual_table(cases, presets)),
        "0.11 folder, calibrated (fit)": _with_errors(joint.residuals),
        "0.11 folder, calibrated (leave-one-run-out)": sf.leave_one_out(terms, cases, joint),
        "0.6 folder, 0.6-only presets (in sample)": _with_errors(sf.residual_table(other, presets)),
        "0.6 folder, with the 0.11 calibration": _with_errors(sf.residual_table(other, joint.calibration)),
    }
    return pd.DataFrame({name: sf.median_abs_errors(table) for name, table in tables.items()}).T.round(2)


def _with_errors(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(error_pct=100 * (table["simulated"] / table["measured"] - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-one-out", action="store_true", help="also fit on each folder alone")
    parser.add_argument(
        "--calibration-check", action="store_true",
        help="presets fitted on the 0.6 folder alone vs calibrate-serving on the 0.11 folder",
    )  # fmt: skip
    args = parser.parse_args()
    by_folder = unsaturated_cases(FOLDERS)
    if args.calibration_check:
        v0_only = fit(["per_request_ms", "v0_latency_ms"], by_folder[FOLDERS[0]])
        print(calibration_check(v0_only, by_folder[FOLDERS[1]], by_folder[FOLDERS[0]]).to_string())
        return
    everything = [case for cases in by_folder.values() for case in cases]
    names = [t.name for t in script_terms()]
    joint = fit(names, everything)
    print("joint fit:", joint)
    print(summary(joint, by_folder).to_string())
    if not args.leave_one_out:
        return
    carried = carried_from_v0(fit(["per_request_ms", "v0_latency_ms"], by_folder[FOLDERS[0]]))
    print("fitted on the 0.6 folder alone:", carried)
    print(summary(carried, {FOLDERS[1]: by_folder[FOLDERS[1]]}).to_string())
    v1_only = fit(["per_request_ms", "v1_latency_ms", "v1_pass_ms", "v1_step_us_per_seq"], by_folder[FOLDERS[1]])
    carried = v1_only | {"v0_latency_ms": v1_only["v1_latency_ms"]}
    print("fitted on the 0.11 folder alone:", carried)
    print(summary(carried, {FOLDERS[0]: by_folder[FOLDERS[0]]}).to_string())


if __name__ == "__main__":
    main()
