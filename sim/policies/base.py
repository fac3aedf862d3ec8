"""What a batching policy sees, what it returns, and the steps policies share.

A policy is a small state machine: ``schedule(view) -> IterationPlan``. The view is
read-only except for its KV ledger, which answers yes/no and remembers what this plan
has already been promised. The plan is declarative (vLLM v1's ``SchedulerOutput``):
which requests compute how many prompt tokens, whether the decoding requests take a
step, whom to preempt first. The engine owns time, memory and bookkeeping and applies
the plan; nothing here imports SimPy, so policies are tested with hand-built views.

There is no prefill or decode phase as such: a request has computed tokens out of a
target (prompt plus tokens generated so far); when they meet it emits a token and
then decodes one token per step. One token budget covers static, continuous and
chunked prefill.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

MemoryMode = Literal["reserve", "paged"]
VLLM_WATERMARK_FRACTION = 0.01


@dataclass(slots=True)
class IterationPlan:
    """The next forward pass of one replica.

    Attributes:
        prefill: (request id, tokens) pieces in order: waiting requests joining the batch
            (taken from the head of the queue, in queue order) and running requests
            continuing a chunked prefill.
        decode: every decoding request produces one token in this pass.
        preempt: running requests to preempt (recompute) before the pass, victims first.
        charge_idle_slots: finished sequences still holding a static-batch slot are charged
            as decoding at their final context (padding).
        wake_at_s: with nothing to run, ask again at this time even if nothing arrives.
        steps: decode passes run before the policy is asked again (vLLM multi-step
            scheduling; > 1 only for a pure decode plan whose KV was promised for all of
            them with ``kv.try_decode_steps``).
    """

    prefill: list[tuple[int, int]] = field(default_factory=list)
    decode: bool = False
    preempt: list[int] = field(default_factory=list)
    charge_idle_slots: bool = False
    wake_at_s: float | None = None
    steps: int = 1

    @property
    def has_work(self) -> bool:
        """Whether the plan runs a forward pass."""
        return bool(self.prefill) or self.decode


class KVLedgerView(Protocol):
    """Yes/no KV questions for one plan; every yes is remembered (see sim.serving.ledger)."""

    def try_admit(self, rid: int, tokens: int, keep_free_fraction: float = 0.0) -> bool: ...
    def try_extend(self, rid: int, tokens: int) -> bool: ...
    def try_decode_step(self) -> bool: ...
    def try_decode_steps(self, steps: int) -> bool: ...
    def release(self, rid: int) -> None: ...


class SchedulerView(Protocol):
    """A replica as a policy sees it at an iteration boundary (read-only but for ``kv``)."""

    @property
    def now_s(self) -> float:
        """Current simulated time."""
        ...

    @property
    def kv(self) -> KVLedgerView:
        """The KV ledger of this decision."""
        ...

    @property
    def waiting_count(self) -> int:
        """Requests in the queue."""
        ...

    @property
    def running_count(self) -> int:
        """Requests holding a batch slot (finished ones keeping a static-batch slot included)."""
        ...

    @property
    def decoding_count(self) -> int:
        """Running requests that decode in the next step."""
        ...

    def waiting_ids(self) -> Iterator[int]:
        """Queued request ids, head (next to run) first."""
        ...

    def oldest_waiting_since_s(self) -> float:
        """When the head of the queue joined it (inf if the queue is empty)."""
        ...

    def tokens_to_prefill(self, rid: int) -> int:
        """Tokens request ``rid`` must still compute before it emits its next token."""
        ...

    def prefilling_ids(self) -> list[int]:
        """Running requests part-way through a (chunked) prefill, oldest arrival first."""
        ...

    def running_newest_first(self) -> Iterator[int]:
        """Running request ids, most recently arrived first (preemption order)."""
        ...

    def is_decoding(self, rid: int) -> bool:
        """Whether running request ``rid`` decodes in the next step."""
        ...


class Policy(ABC):
    """A batching policy: decides what the next iteration runs, nothing else.

    Class attributes are the policy's traits, the one place they are stated (the engine, the
    feature table :mod:`sim.config.compat` and the size estimates read them): ``memory`` is
    "reserve" (KV for prompt + max output reserved at admission) or "paged" (blocks
    allocated as tokens are computed; prefix caching needs it); ``holds_slots`` keeps
    finished sequences in the batch, with their KV, until the whole batch is done (static);
    ``speculates``, ``multi_step`` and ``pool_roles`` say which features it runs;
    ``steady_decode`` is the promise described below.
    """

    config_class: ClassVar[type]
    """The pydantic config of this kind (its ``kind`` literal names the policy in scenarios)."""
    memory: ClassVar[MemoryMode] = "reserve"
    holds_slots: ClassVar[bool] = False
    speculates: ClassVar[bool] = True
    """Its decode steps may be decorated with speculative decoding."""
    multi_step: ClassVar[bool] = False
    """It plans blocks of decode passes (``num_scheduler_steps``)."""
    pool_roles: ClassVar[frozenset[str]] = frozenset({"prefill", "decode"})
    """The disaggregated pools it can run: 'prefill' needs a per-pass token budget and paged memory
    (only prefills run there), 'decode' taking requests one by one."""
    steady_decode: ClassVar[bool] = False
    """A promise that lets the engine merge decode passes: when this policy plans a pure decode
    pass (decode, no prefill, no preemption, one step), it plans the same pass again as long as
    no request arrives, leaves, times out or is preempted, the time alone does not matter and
    free KV blocks only shrink, provided the decode step's blocks fit."""

    def __init__(self, config: Any) -> None:  # noqa: B027 - a policy needing nothing from its config keeps it
        """Build the policy from its config (an instance of ``config_class``)."""

    @abstractmethod
    def schedule(self, view: SchedulerView) -> IterationPlan:
        """Plan the next forward pass (an empty plan means: wait for arrivals)."""

    def decode_only(self, view: SchedulerView) -> bool:
        """Whether ``schedule(view)`` would plan just a decode step of everyone decoding: no
        prefill, no preemption, one step (and for static batching, the same padding).

        A cheap check that lets the engine reuse its last pure decode plan instead of building
        one (when the queue is empty, or no waiting request can join). It may ask the ledger;
        after False the engine prepares a fresh view before scheduling. False is always safe.
        """
        return False


def admit_waiting(
    view: SchedulerView,
    plan: IterationPlan,
    *,
    room: int,
    token_budget: float = math.inf,
    chunked: bool = False,
    oversize_alone: bool = False,
    keep_free_fraction: float = 0.0,
) -> float:
    """Add queued requests to ``plan`` in FIFO order while they fit; return the budget left.

    Stops at the first request that does not fit (no overtaking), when ``room`` slots are
    used, or when the token budget is spent.

    Args:
        view: the replica.
        plan: the plan being built (appended to).
        room: most requests that may join.
        token_budget: most prompt tokens this pass may compute for joiners.
        chunked: a joiner may compute only part of its prompt (what the budget allows).
        oversize_alone: a prompt longer than the whole budget may still run if it is the
            only prefill of the pass (vLLM v0 without chunking).
        keep_free_fraction: share of the KV capacity that must stay free after each
            admission (vLLM's watermark against immediate preemption).
    """
    for rid in view.waiting_ids():
        if room <= 0 or token_budget <= 0:
            break
        tokens = view.tokens_to_prefill(rid)
        if chunked:
            tokens = min(tokens, int(token_budget))
        elif tokens > token_budget and not (oversize_alone and not plan.prefill):
            break
        if not view.kv.try_admit(rid, tokens, keep_free_fraction):
            break
        plan.prefill.append((rid, tokens))
        room -= 1
        token_budget -= tokens
    return token_budget


def head_refused(
    view: SchedulerView, token_budget: float = math.inf, keep_free_fraction: float = 0.0, *, chunked: bool = False
) -> bool:
    """Whether ``admit_waiting`` (same arguments; room and budget left, nothing planned yet)
    would admit no one: the queue is empty or its head is refused its KV."""
    head = next(view.waiting_ids(), None)
    if head is None:
        return True
    tokens = view.tokens_to_prefill(head)
    if chunked:
        tokens = min(tokens, int(token_budget))
    return not view.kv.try_admit(head, tokens, keep_free_fraction)


def watermark(view: SchedulerView) -> float:
    """vLLM v0's admission watermark: keep 1% of the KV blocks free when admitting a request
    (``BlockSpaceManager(watermark=0.01)``), so that running requests can grow without an
    immediate preemption. An empty replica admits without it, so every request can start.
    """
    return VLLM_WATERMARK_FRACTION if view.running_count else 0.0


def preempt_until(
    view: SchedulerView,
    plan: IterationPlan,
    fits: Callable[[], bool],
    requester: int | None = None,
    order: Callable[[], Iterable[int]] | None = None,
) -> bool:
    """Preempt running requests, most recently arrived first, until ``fits()`` says yes.

    Victims are appended to ``plan.preempt`` and released in the ledger. If the victim
    is the ``requester`` itself, stop: it has been preempted and gets nothing.
    ``order``, if given, returns the preemption order instead (running ids, first victim first);
    it is called only when someone must go.

    Returns:
        Whether ``fits()`` finally said yes (False: no victim left, or the requester went).
    """
    if fits():
        return True
    chosen = set(plan.preempt)
    ranked = view.running_newest_first() if order is None else order()
    victims: Iterable[int] = (rid for rid in ranked if rid not in chosen)
    for victim in victims:
        view.kv.release(victim)
        plan.preempt.append(victim)
        if victim == requester:
            return False
        if fits():
            return True
    return False


def decoders_left(view: SchedulerView, plan: IterationPlan) -> int:
    """Decoding requests that remain after this plan's preemptions."""
    if not plan.preempt:  # the common case: no generator to run
        return view.decoding_count
    return view.decoding_count - sum(1 for rid in plan.preempt if view.is_decoding(rid))
