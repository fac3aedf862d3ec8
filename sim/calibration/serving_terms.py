"""Which serving-stack terms a folder of real runs can fit, and where each search starts.

The terms are mechanisms of vLLM's code (``sim/vllm_defaults.py`` cites each):

- ``per_request_ms``: the OpenAI server's event-loop time per request (HTTP, JSON, tokenization); one term for
  every engine generation, since V0 and V1 serve through the same FastAPI loop (docs/validation.md: 3.1 vs
  3.5 ms fitted on either folder alone). Fitted only where a run measured at the client sends two requests
  closer together than the presets' loop time (:func:`queues_at_the_loop`: a burst, a concurrency cap, dense
  arrivals). Otherwise no request waits for the loop, and the loop time and the latency outside it each add
  once to every request: the runs identify only their sum. A fit of both then wanders along that ridge, and the
  shared loop time it picks carries to the other generation (docs/validation.md, "Calibrating a version the
  presets never saw": a 0.11 folder of constant-rate stages fitted 7.2 ms against 3.1, and took the 0.6
  bursts' TTFT error from 5% to 40%).
- ``<gen>.latency_ms``: the time outside the engine and that loop (the hop to the engine process,
  detokenization, streaming), per generation: V1's path is longer. Fitted from client-side runs of that
  generation.
- ``<gen>.<cpu term>``: the engine's CPU time, per generation: V1's per pass and per running request per step
  (:data:`CPU_TERMS`), V0's per pass and per sequence per pass (with multi-step, the medians identify only the
  CPU time amortized per decode step).
- ``step_scale.<gpu>``: a factor on every GPU term of the cost model of that GPU, one per GPU in the data: what a
  GPU without profiles (an L40S, an MI300X) needs, and what corrects a transferred model.

:func:`default_terms` picks those the cases identify; :func:`script_terms` are the five of
``scripts/fit_serving.py`` (the presets' own fit on ../shared/validation).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.calibration.serving_fit import Term
from sim.io.serving_calibration import GENERATIONS
from sim.validation.cases import Case

CPU_TERMS: dict[str, tuple[str, ...]] = {"v1": ("pass_ms", "step_us_per_seq"), "v0": ("pass_ms", "pass_us_per_seq")}
"""Generation -> the engine CPU terms a fit frees."""
STEP: dict[str, float] = {
    "per_request_ms": 1.0, "latency_ms": 5.0, "pass_ms": 0.2, "step_us_per_seq": 10.0, "pass_us_per_seq": 5.0,
    "step_ms": 0.5, "step_scale": 0.1,
}  # fmt: skip
"""A term's scale (its first Nelder-Mead step; least squares differentiates over a twentieth of it)."""
UPPER: dict[str, float] = {
    "per_request_ms": 100.0, "latency_ms": 2000.0, "pass_ms": 50.0, "step_us_per_seq": 2000.0,
    "pass_us_per_seq": 2000.0, "step_ms": 100.0, "step_scale": 10.0,
}  # fmt: skip


def preset_value(generation: str, block: str, name: str) -> float:
    """The vllm presets' value of one term of ``generation`` (``sim.vllm_defaults``)."""
    from sim import vllm_defaults as d

    blocks = {
        "v0": {"frontend": d.V0_FRONTEND, "engine_cpu": d.VLLM_06_CPU},
        "v1": {"frontend": d.V1_FRONTEND, "engine_cpu": d.VLLM_V1_CPU},
    }
    return float(blocks[generation][block][name])


def generation_of(case: Case) -> str:
    """The engine generation of a case's preset (``v0``/``v1``)."""
    from sim.presets import PRESETS

    generation = PRESETS[case.preset].generation
    assert generation is not None, f"preset {case.preset} has no serving terms"
    return generation


def gpu_of(case: Case) -> str:
    """The catalog GPU of a case's server."""
    from sim.validation.server import catalog_names

    return catalog_names(case.flags, case.name)[1]


def default_terms(cases: Sequence[Case]) -> list[Term]:
    """The terms ``cases`` identify (see module), each starting at the presets' value."""
    generations = sorted({generation_of(c) for c in cases})
    client = [c for c in cases if not c.measured_at_engine]
    terms = []
    loop_ms = {c.name: preset_value(generation_of(c), "frontend", "per_request_ms") for c in client}
    if any(queues_at_the_loop(c, loop_ms[c.name] / 1e3) for c in client):
        start = loop_ms[client[0].name]
        targets = tuple(("serving", g, "frontend", "per_request_ms") for g in GENERATIONS)
        terms.append(Term("per_request_ms", targets, start, STEP["per_request_ms"], UPPER["per_request_ms"]))
    for generation in generations:
        if any(generation_of(c) == generation for c in client):
            terms.append(_term(generation, "frontend", "latency_ms"))
        terms += [_term(generation, "engine_cpu", name) for name in CPU_TERMS[generation]]
    for gpu in sorted({gpu_of(c) for c in cases}):
        terms.append(Term(f"step_scale.{gpu}", (("step_scale", gpu),), 1.0, STEP["step_scale"], UPPER["step_scale"]))
    return terms


def queues_at_the_loop(case: Case, loop_s: float) -> bool:
    """Whether ``case`` sends two requests less than ``loop_s`` apart, so that one waits while the API loop parses
    the other: all at once (a burst, the first wave of a concurrency cap or a closed loop), or a trace's or a
    constant rate's sends that close together."""
    with tempfile.TemporaryDirectory(prefix="batchsim-sends-") as tmp:
        arrival = case.workload(Path(tmp))["arrival"]
        if arrival["kind"] == "constant":
            return 1.0 / float(arrival["rate"]) < loop_s
        if arrival["kind"] == "trace":
            from sim.io.csv_reader import read_csv
            from sim.workload.traces import ARRIVAL_COLUMN

            sends = np.sort(read_csv(Path(arrival["path"]))[ARRIVAL_COLUMN].to_numpy(dtype=float))
            return bool(np.any(np.diff(sends) < loop_s))
    return True  # a closed loop starts its clients together; any other kind: let the data decide


def _term(generation: str, block: str, name: str) -> Term:
    target = ("serving", generation, block, name)
    return Term(f"{generation}.{name}", (target,), preset_value(generation, block, name), STEP[name], UPPER[name])


def script_terms() -> list[Term]:
    """``scripts/fit_serving.py``'s five terms: the shared loop time, each generation's latency and V1's CPU terms,
    starting where wave 2 left them (a few ms of latency; V1 CPU costs vLLM's V1 blog reports as small)."""
    loop = tuple(("serving", g, "frontend", "per_request_ms") for g in GENERATIONS)
    return [
        Term("per_request_ms", loop, 2.5, 1.0, UPPER["per_request_ms"]),
        Term("v0_latency_ms", (("serving", "v0", "frontend", "latency_ms"),), 3.0, 5.0, UPPER["latency_ms"]),
        Term("v1_latency_ms", (("serving", "v1", "frontend", "latency_ms"),), 10.0, 10.0, UPPER["latency_ms"]),
        Term("v1_pass_ms", (("serving", "v1", "engine_cpu", "pass_ms"),), 0.2, 0.2, UPPER["pass_ms"]),
        Term("v1_step_us_per_seq", (("serving", "v1", "engine_cpu", "step_us_per_seq"),), 20.0, 10.0,
             UPPER["step_us_per_seq"]),
    ]  # fmt: skip
