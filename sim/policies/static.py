"""Static (request-level) batching, as in FasterTransformer or a plain HF ``generate`` loop.

A batch of up to ``max_batch_size`` waiting requests is prefilled together and then
decodes until its LAST sequence finishes; finished sequences keep their slot and their
KV (``pad_finished`` charges them as still decoding, padding) and nothing joins until
the batch is done. KV for prompt + max output tokens is reserved per slot, so the batch
is also limited by memory. With ``max_wait_s`` > 0 an idle worker waits for the batch
to fill, up to that long after the oldest request joined the queue.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sim.config.base import MAX_DURATION_S, Float
from sim.config.policy_base import PolicyConfigBase
from sim.policies.base import IterationPlan, Policy, SchedulerView, admit_waiting


class StaticPolicyConfig(PolicyConfigBase):
    """Request-level batching: a batch runs until its longest sequence ends; nothing joins meanwhile."""

    kind: Literal["static"] = "static"
    max_wait_s: Float = Field(
        0.0, ge=0, le=MAX_DURATION_S, description="Wait up to this long for a batch to fill before starting it."
    )
    pad_finished: bool = Field(
        True, description="Finished sequences keep costing compute (padding) until the batch ends."
    )



class StaticPolicy(Policy):
    """Request-level batching.

    Args:
        config: the static policy config (max_batch_size, max_wait_s, pad_finished).
    """

    config_class = StaticPolicyConfig
    memory = "reserve"
    steady_decode = True  # a running batch decodes until it is done; nothing joins it
    holds_slots = True
    speculates = False  # batched generate() drafts for one sequence only (HF assisted generation: batch size 1)
    pool_roles = frozenset()  # a batch admits no one until it ends: it cannot take requests one by one

    def __init__(self, config: StaticPolicyConfig) -> None:
        self.max_batch_size = config.max_batch_size
        self.max_wait_s = config.max_wait_s
        self.pad_finished = config.pad_finished

    def schedule(self, view: SchedulerView) -> IterationPlan:
        """Continue the running batch, or form a new one when it is full or waited long enough."""
        if view.running_count:
            return IterationPlan(decode=True, charge_idle_slots=self.pad_finished)
        if not view.waiting_count:
            return IterationPlan()
        plan = IterationPlan()
        admit_waiting(view, plan, room=self.max_batch_size)
        # Full: no further request could join (slots or KV exhausted), so waiting gains nothing.
        full = len(plan.prefill) == self.max_batch_size or len(plan.prefill) < view.waiting_count
        deadline_s = view.oldest_waiting_since_s() + self.max_wait_s
        if full or view.now_s >= deadline_s:
            return plan
        return IterationPlan(wake_at_s=deadline_s)

    def decode_only(self, view: SchedulerView) -> bool:
        """A running batch with members still decoding: nothing else can happen."""
        return view.running_count > 0 and view.decoding_count > 0
