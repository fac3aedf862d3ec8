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
"""

from __future__ import annotations

from functools import partial
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

    def schedule(self, view: SchedulerView) -> IterationPlan:
        """Decodes first, then chunks for running, then for waiting requests, within the budget."""
        plan = IterationPlan()
        if view.decoding_count:
            preempt_until(view, plan, view.kv.try_decode_step)
        decodes = decoders_left(view, plan)
        plan.decode = decodes > 0
        budget = self._continue_prefills(view, plan, self.chunk_size - decodes * self.decode_tokens)
        # A decoder preempted for an older request's chunk gives its budget token back.
        still_decoding = decoders_left(view, plan)
        plan.decode = still_decoding > 0
        budget += (decodes - still_decoding) * self.decode_tokens
        room = self.max_running - (view.running_count - len(plan.preempt))
        if view.waiting_count and room > 0 and budget > 0:
            keep_free = watermark(view)
            admit_waiting(
                view,
                plan,
                room=room,
                token_budget=budget,
                chunked=True,
                keep_free_fraction=keep_free,
            )
        return plan

    def _continue_prefills(self, view: SchedulerView, plan: IterationPlan, budget: int) -> int:
        for rid in view.prefilling_ids():
            if budget <= 0:
                break
            if rid in plan.preempt:
                continue
            tokens = min(budget, view.tokens_to_prefill(rid))
            # A refused try_extend changes nothing, so preempt_until may ask it again.
            if view.kv.try_extend(rid, tokens) or preempt_until(
                view, plan, partial(view.kv.try_extend, rid, tokens), requester=rid
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
            return head_refused(view, budget, watermark(view), chunked=True)
        return True
