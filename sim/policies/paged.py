"""Paged attention with prefill-first scheduling and recompute preemption (vLLM v0).

KV is allocated in blocks of ``block_size`` tokens as tokens are computed. An iteration
is a prefill iteration if any waiting request can start: FIFO waiting requests join
while their prompt blocks fit (leaving vLLM's 1% watermark of blocks free), the batch
stays within ``max_batch_size`` and their prompts within ``max_num_batched_tokens`` (a
single longer prompt still runs alone).
Otherwise every running request decodes; when the step needs a block and none is free,
the most recently arrived running request is preempted (its blocks freed, back to the
head of the queue, prompt plus generated tokens re-prefilled later), repeatedly, until
the step fits (vLLM's recompute preemption).

With ``num_scheduler_steps`` = K > 1 (vLLM 0.6 multi-step scheduling) a decode plan is
a block of K decode passes: preemption goes on until K steps of KV growth fit (vLLM's
lookahead slots), and the policy is not asked again before the block ends.
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
    head_refused,
    preempt_until,
    watermark,
)


class PagedPolicyConfig(PolicyConfigBase):
    """vLLM v0 (prefill-first, no chunking): paged KV allocated as tokens grow, preemption by recompute."""

    kind: Literal["paged"] = "paged"
    max_batch_size: Int = Field(
        256, ge=1, le=1_000_000, description="Most sequences in one iteration (vLLM max_num_seqs)."
    )
    max_num_batched_tokens: Int = Field(4096, ge=1, le=MAX_TOKENS, description="Token budget of one prefill iteration.")



class PagedPolicy(Policy):
    """vLLM v0-style paged scheduling.

    Args:
        config: the paged policy config (max_batch_size, max_num_batched_tokens,
            num_scheduler_steps).
    """

    config_class = PagedPolicyConfig
    memory = "paged"
    multi_step = True  # num_scheduler_steps: vLLM 0.6 multi-step scheduling of its v0 engine
    steady_decode = True  # fewer free blocks cannot let a refused prefill in; a fitting decode step needs no victim

    def __init__(self, config: PagedPolicyConfig) -> None:
        self.max_batch_size = config.max_batch_size
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.num_scheduler_steps = config.num_scheduler_steps

    def schedule(self, view: SchedulerView) -> IterationPlan:
        """A prefill iteration if a waiting request fits, else a decode step with preemptions."""
        plan = IterationPlan()
        room = self.max_batch_size - view.running_count
        if view.waiting_count and room > 0:
            budget = self.max_num_batched_tokens
            keep_free = watermark(view)
            admit_waiting(
                view,
                plan,
                room=room,
                token_budget=budget,
                oversize_alone=True,
                keep_free_fraction=keep_free,
            )
            if plan.prefill:
                return plan
        if view.decoding_count:
            steps = self.num_scheduler_steps
            if steps == 1:
                preempt_until(view, plan, view.kv.try_decode_step)
            else:
                preempt_until(view, plan, partial(view.kv.try_decode_steps, steps))
                plan.steps = steps
            plan.decode = True
        return plan

    def decode_only(self, view: SchedulerView) -> bool:
        """Single-step decoding when no waiting request fits and the step's blocks are free."""
        if self.num_scheduler_steps != 1 or not view.decoding_count:
            return False
        room = self.max_batch_size - view.running_count
        if view.waiting_count and room > 0 and self.max_num_batched_tokens > 0:
            if not head_refused(view, keep_free_fraction=watermark(view)):
                return False
        return view.kv.try_decode_step()
