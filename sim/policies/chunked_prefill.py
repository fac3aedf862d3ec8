"""Chunked prefill with stall-free batching, as in Sarathi-Serve (Agrawal et al., OSDI 2024).

Every iteration has a budget of ``chunk_size`` tokens. All decoding requests go first
(one token each); the rest of the budget goes to prefill chunks, first to requests
part-way through their prompt (oldest first), then to waiting requests in FIFO order
(admitted while their chunk fits and vLLM's 1% watermark of blocks stays free).
Memory is paged, with the same recompute preemption as ``paged``: when a decode step or
a running request's chunk needs blocks and none are free, the most recently arrived
running request is preempted. At most ``min(max_batch_size, chunk_size)`` requests run,
so the decodes alone never exceed the budget (vLLM also requires the token budget to be
at least the sequence limit; admission in budget order keeps this anyway).

``scheduling: vllm-v1`` (the vllm-0.11 and vllm-0.15 presets) follows vLLM V1's
``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py`` at v0.11.0 and v0.15.1), where
the step-by-step parity harness (:mod:`sim.parity`) found the Sarathi rules above differ:

* no admission watermark: ``KVCacheManager.allocate_slots`` refuses only when the blocks
  needed exceed ``block_pool.get_num_free_blocks()`` (``vllm/v1/core/kv_cache_manager.py``);
* no waiting request starts in a step that preempted (``if not preempted_reqs:`` before the
  WAITING loop);
* the victim is the request scheduled most recently (``self.running.pop()``: the running
  list is in the order requests were started or resumed, a resumed one going to its end),
  not the latest arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from itertools import count
from typing import Literal

from pydantic import Field

from sim.config.base import MAX_TOKENS, Int
from sim.config.policy_base import PolicyConfigBase
from sim.policies.base import (
    IterationPlan,
    Policy,
    SchedulerView,
    admit_waiting,
    decoders_left,
    head_refused,
    preempt_until,
    watermark,
)


class ChunkedPrefillPolicyConfig(PolicyConfigBase):
    """Sarathi-Serve: a per-iteration token budget; decodes first, prefills chunked into the rest; paged KV."""

    kind: Literal["chunked_prefill"] = "chunked_prefill"
    max_batch_size: Int = Field(256, ge=1, le=1_000_000, description="Most sequences in one iteration.")
    chunk_size: Int = Field(
        512, ge=1, le=MAX_TOKENS, description="Token budget of every iteration (decodes + prefill chunks)."
    )
    allocate: Literal["chunk", "prompt"] = Field(
        "chunk",
        description="KV allocation of a prefill: 'chunk' as each chunk is computed (vLLM v1), 'prompt' the "
        "whole prompt's blocks at admission (Sarathi-Serve, vLLM v0 chunked prefill).",
    )
    scheduling: Literal["sarathi", "vllm-v1"] = Field(
        "sarathi",
        description="Admission and preemption rules: 'sarathi' keeps vLLM v0's 1% watermark free at admission and "
        "preempts the latest arrival; 'vllm-v1' as vLLM V1's scheduler: no watermark, no admission in a step that "
        "preempted, the most recently started or resumed request preempted first.",
    )


class ChunkedPrefillPolicy(Policy):
    """Sarathi-Serve-style token-budget scheduling on paged memory.

    Args:
        config: the chunked-prefill policy config (max_batch_size, chunk_size).
    """

    config_class = ChunkedPrefillPolicyConfig
    memory = "paged"
    steady_decode = True  # the budget left by the same decodes is the same; fewer free blocks admit no one new

    def __init__(self, config: ChunkedPrefillPolicyConfig) -> None:
        self.chunk_size = config.chunk_size
        # A speculative decode verifies gamma + 1 tokens, and counts them in the budget (as vLLM v1 does).
        spec = getattr(config, "speculative", None)
        self.decode_tokens = 1 if spec is None else spec.num_speculative_tokens + 1
        self.max_running = min(config.max_batch_size, max(1, config.chunk_size // self.decode_tokens))
        # Sarathi-Serve and vLLM v0 chunked prefill reserve the whole prompt at admission; vLLM v1
        # allocates per computed chunk (the engine's allocator does either; the policy only says which).
        self.allocates_whole_prompt = config.allocate == "prompt"
        self.v1 = config.scheduling == "vllm-v1"
        # vLLM V1's running list order: when each running request was last started or resumed (the
        # replica state keeps arrival order). One policy serves every replica; request ids are global.
        self._started: dict[int, int] = {}
        self._ticks = count()

    def schedule(self, view: SchedulerView) -> IterationPlan:
        """Decodes first, then chunks for running, then for waiting requests, within the budget."""
        plan = IterationPlan()
        order = partial(self._victims, view) if self.v1 else None  # built only if someone must be preempted
        if view.decoding_count:
            preempt_until(view, plan, view.kv.try_decode_step, order=order)
        decodes = decoders_left(view, plan)
        plan.decode = decodes > 0
        budget = self._continue_prefills(view, plan, self.chunk_size - decodes * self.decode_tokens, order)
        # A decoder preempted for an older request's chunk gives its budget token back.
        still_decoding = decoders_left(view, plan)
        plan.decode = still_decoding > 0
        budget += (decodes - still_decoding) * self.decode_tokens
        room = self.max_running - (view.running_count - len(plan.preempt))
        blocked = self.v1 and bool(plan.preempt)  # V1: `if not preempted_reqs:` guards the WAITING loop
        if view.waiting_count and room > 0 and budget > 0 and not blocked:
            joined = len(plan.prefill)
            admit_waiting(
                view,
                plan,
                room=room,
                token_budget=budget,
                chunked=True,
                keep_free_fraction=self._watermark(view),
            )
            if self.v1:
                self._record_starts(view, plan.prefill[joined:])
        if self.v1 and plan.preempt:
            for rid in plan.preempt:
                self._started.pop(rid, None)
        return plan

    def _watermark(self, view: SchedulerView) -> float:
        """V0's 1% admission watermark; none in V1 (``allocate_slots`` at v0.11.0 checks free blocks only)."""
        return 0.0 if self.v1 else watermark(view)

    def _record_starts(self, view: SchedulerView, joiners: list[tuple[int, int]]) -> None:
        """Remember the order requests start in; forget those that left once they outnumber the running ones."""
        started = self._started
        started.update((rid, next(self._ticks)) for rid, _ in joiners)
        if len(started) > 2 * (view.running_count + len(joiners)) + 64:
            running = set(view.running_newest_first()) | {rid for rid, _ in joiners}
            self._started = {rid: tick for rid, tick in started.items() if rid in running}

    def _victims(self, view: SchedulerView) -> list[int]:
        """Running requests, the most recently started or resumed first (V1's ``self.running.pop()`` order).

        Requests this policy never started (none in a plain run) count as the oldest.
        """
        started = self._started
        return sorted(view.running_newest_first(), key=lambda rid: started.get(rid, -1), reverse=True)

    def _continue_prefills(
        self,
        view: SchedulerView,
        plan: IterationPlan,
        budget: int,
        order: Callable[[], Iterable[int]] | None = None,
    ) -> int:
        for rid in view.prefilling_ids():
            if budget <= 0:
                break
            if rid in plan.preempt:
                continue
            tokens = min(budget, view.tokens_to_prefill(rid))
            # A refused try_extend changes nothing, so preempt_until may ask it again.
            if view.kv.try_extend(rid, tokens) or preempt_until(
                view, plan, partial(view.kv.try_extend, rid, tokens), requester=rid, order=order
            ):
                plan.prefill.append((rid, tokens))
                budget -= tokens
        return budget

    def decode_only(self, view: SchedulerView) -> bool:
        """Decodes alone: no prefill under way, the step's blocks free, and no waiting request
        admitted in the budget the decodes leave."""
        if not view.decoding_count or view.prefilling_ids() or not view.kv.try_decode_step():
            return False
        budget = self.chunk_size - view.decoding_count * self.decode_tokens
        room = self.max_running - view.running_count
        if view.waiting_count and room > 0 and budget > 0:
            return head_refused(view, budget, self._watermark(view), chunked=True)
        return True
