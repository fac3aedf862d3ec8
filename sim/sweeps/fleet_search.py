"""Fleet-size searches of a cheapest-fleet question, free of any simulation.

For one GPU type, tensor-parallel degree and policy, the fewest replicas that serve a fixed
workload within the SLO. The search assumes the SLO is monotone in the replica count (more
replicas never make a fixed request stream slower) and prunes with it:

* one replica first; if it fails, its run says how much GPU work the stream needs: W
  replica-seconds of passes. Spread over the stream's arrival span S, at least ceil(W / S)
  replicas are needed (more replicas only batch less, so W can only grow); the search jumps
  there, then grows by half until a fleet meets the SLO, then bisects between the largest
  failing and the smallest meeting count;
* a fleet that fails while its GPUs are mostly idle (busy under ``LIGHT_LOAD``) fails for a
  reason more replicas cannot remove (a TPOT or TTFT floor of one request alone): the
  configuration is given up at once;
* counts above the GPU budget are never run.

A disaggregated deployment is searched over (prefill replicas p, decode replicas d): for
p = 1, 2, ... the fewest d that meets (bisected below the previous p's answer, since more
prefill replicas never need more decode ones), stopping once p + 1 cannot beat the best p + d.

Each search is a generator: it yields the size to run next and is sent back a :class:`Probe`
of that run, so one driver advances many searches in lock-step and tests drive it with plain
functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial

GROWTH = 1.5
"""Factor the replica count grows by while no fleet has met the SLO."""

LIGHT_LOAD = 0.15
"""A fleet failing with its GPUs busier than this may be fixed by more replicas; below, it cannot."""

Size = tuple[int, ...]
"""(replicas,) of a colocated fleet, (prefill replicas, decode replicas) of a disaggregated one."""


@dataclass(frozen=True)
class Probe:
    """What one run tells a search.

    Attributes:
        meets: the run met the SLO (every seed).
        busy: GPU busy fraction of the run (``gpu_busy_frac``).
        work_s: replica-seconds of passes (busy fraction x run window x replicas).
    """

    meets: bool
    busy: float
    work_s: float


@dataclass(frozen=True)
class FleetOutcome:
    """Where a search ended: the smallest meeting size, or None and why."""

    size: Size | None
    note: str = ""


Search = Generator[Size, Probe, FleetOutcome]


def search_replicas(span_s: float, cap: int) -> Search:
    """Fewest replicas (at most ``cap``) meeting the SLO, for a stream arriving over ``span_s`` seconds."""
    if cap < 1:
        return FleetOutcome(None, "the GPU budget does not hold one replica")
    outcome = yield from _fewest(_colocated, cap, span_s)
    return outcome


def search_split(span_s: float, cap: int) -> Search:
    """Fewest prefill + decode replicas (together at most ``cap``) meeting the SLO."""
    best: Size | None = None
    notes: list[str] = []
    decode_cap = cap - 1
    for prefill in range(1, cap):
        if best is not None and prefill + 1 >= sum(best):
            break  # every later split has at least prefill + 1 replicas
        outcome = yield from _fewest(partial(_split, prefill), min(decode_cap, cap - prefill), span_s)
        if outcome.size is None:
            notes.append(f"{prefill} prefill: {outcome.note}")
            continue
        decode = outcome.size[1]
        if best is None or prefill + decode < sum(best):
            best = (prefill, decode)
        decode_cap = decode  # more prefill replicas never need more decode ones
    return FleetOutcome(best, "" if best else "; ".join(notes[-1:]) or "no split fits the GPU budget")


def _fewest(make: Callable[[int], Size], cap: int, span_s: float) -> Generator[Size, Probe, FleetOutcome]:
    """Smallest n in 1..cap with make(n) meeting the SLO: jump, grow, then bisect."""
    if cap < 1:
        return FleetOutcome(None, "no room in the GPU budget")
    probe = yield make(1)
    if probe.meets:
        return FleetOutcome(make(1))
    low, high = 1, None
    count = min(cap, max(2, _work_bound(probe, span_s)))
    while high is None:
        if _hopeless(probe):
            return FleetOutcome(None, f"fails the SLO with its GPUs {probe.busy:.0%} busy: more replicas cannot help")
        if low >= cap:
            return FleetOutcome(None, f"fails the SLO at the GPU budget ({cap} replicas)")
        probe = yield make(count)
        if probe.meets:
            high = count
        else:
            low, count = count, min(cap, max(count + 1, math.ceil(count * GROWTH)))
    while high - low > 1:
        middle = (low + high) // 2
        probe = yield make(middle)
        low, high = (low, middle) if probe.meets else (middle, high)
    return FleetOutcome(make(high))


def _colocated(replicas: int) -> Size:
    return (replicas,)


def _split(prefill: int, decode: int) -> Size:
    return (prefill, decode)


def _work_bound(probe: Probe, span_s: float) -> int:
    """ceil(W / S): replicas the stream's GPU work needs at least to keep up with its arrivals."""
    if not (span_s > 0) or not (probe.work_s > 0):
        return 2
    return math.ceil(probe.work_s / span_s)


def _hopeless(probe: Probe) -> bool:
    return not probe.meets and probe.busy < LIGHT_LOAD
