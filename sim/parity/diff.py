"""Comparing two schedules step by step, and their latencies priced by one cost model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.parity.pricing import Latencies, price
from sim.parity.trace import Requests, Step

ASPECTS = ("batch", "preempt", "hit", "kv")
"""What a step is compared on: the batch (requests and token counts, order aside), the
preempted requests, the prefix-cache hits of requests started or resumed, the KV blocks held."""


def step_aspects(step: Step) -> dict[str, object]:
    """A step's comparable parts (order-free where the order carries no meaning)."""
    return {
        "batch": sorted(step.run),
        "preempt": sorted(step.preempt),
        "hit": sorted(step.hit),
        "kv": step.kv,
    }


@dataclass
class Divergence:
    """The first step where the schedules differ, and how."""

    step: int
    aspects: list[str]
    reference: dict[str, object]
    candidate: dict[str, object]


@dataclass
class Comparison:
    """How far a candidate schedule (batchsim) follows a reference one (vLLM).

    Attributes:
        steps: the longer schedule's length (a step one side lacks disagrees).
        agree: per aspect, the share of steps on which both agree.
        identical: the share of steps identical in every aspect.
        first: the first diverging step (None: identical schedules).
        percentiles: per metric (ttft, tpot) and percentile, (reference s, candidate s, relative difference).
    """

    steps: int
    agree: dict[str, float]
    identical: float
    first: Divergence | None
    percentiles: dict[str, dict[str, tuple[float, float, float]]] = field(default_factory=dict)
    makespan_s: tuple[float, float] = (0.0, 0.0)


def first_divergence(reference: list[Step], candidate: list[Step]) -> Divergence | None:
    """The first step where the two schedules differ in any aspect (None: none)."""
    for index in range(max(len(reference), len(candidate))):
        ref = step_aspects(reference[index]) if index < len(reference) else {}
        can = step_aspects(candidate[index]) if index < len(candidate) else {}
        differ = [a for a in ASPECTS if ref.get(a) != can.get(a)]
        if differ:
            return Divergence(index, differ, ref, can)
    return None


def compare(reference: list[Step], candidate: list[Step], requests: Requests, cost_model: object) -> Comparison:
    """Step agreement and priced latency percentiles of ``candidate`` against ``reference``."""
    total = max(len(reference), len(candidate), 1)
    counts = dict.fromkeys(ASPECTS, 0)
    identical = 0
    for ref_step, can_step in zip(reference, candidate, strict=False):
        ref, can = step_aspects(ref_step), step_aspects(can_step)
        same = [a for a in ASPECTS if ref[a] == can[a]]
        for aspect in same:
            counts[aspect] += 1
        identical += len(same) == len(ASPECTS)
    ref_lat, can_lat = price(reference, requests, cost_model), price(candidate, requests, cost_model)
    return Comparison(
        steps=total,
        agree={a: counts[a] / total for a in ASPECTS},
        identical=identical / total,
        first=first_divergence(reference, candidate),
        percentiles=_percentiles(ref_lat, can_lat),
        makespan_s=(ref_lat.makespan_s, can_lat.makespan_s),
    )


def _percentiles(ref: Latencies, can: Latencies) -> dict[str, dict[str, tuple[float, float, float]]]:
    table: dict[str, dict[str, tuple[float, float, float]]] = {}
    for metric in ("ttft_s", "tpot_s"):
        a, b = getattr(ref, metric), getattr(can, metric)
        a, b = a[~np.isnan(a)], b[~np.isnan(b)]
        row = {}
        for name, q in (("mean", None), ("p50", 50), ("p90", 90), ("p99", 99)):
            x = float(a.mean() if q is None else np.percentile(a, q)) if len(a) else float("nan")
            y = float(b.mean() if q is None else np.percentile(b, q)) if len(b) else float("nan")
            row[name] = (x, y, (y - x) / x if x else float("nan"))
        table[metric] = row
    return table
