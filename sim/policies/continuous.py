"""Continuous (iteration-level) batching, as in Orca (Yu et al., OSDI 2022).

After every iteration finished sequences leave and waiting requests join in FIFO order
while the batch has fewer than ``max_batch_size`` sequences and their KV reservation
(prompt + max output tokens, as Orca reserves) fits; the joiners' whole prompts are
prefilled in the same iteration as the running sequences' decode step.
"""

from __future__ import annotations

from typing import Literal

from sim.config.policy_base import PolicyConfigBase
from sim.policies.base import IterationPlan, Policy, SchedulerView, admit_waiting, head_refused


class ContinuousPolicyConfig(PolicyConfigBase):
    """Orca iteration-level batching: requests join and leave after every iteration; KV reserved for max output."""

    kind: Literal["continuous"] = "continuous"



class ContinuousPolicy(Policy):
    """Orca-style iteration-level scheduling with per-request KV reservation.

    Args:
        config: the continuous policy config (max_batch_size).
    """

    config_class = ContinuousPolicyConfig
    memory = "reserve"
    pool_roles = frozenset({"decode"})  # it prefills whole prompts beside decodes: no prefill-only pool
    steady_decode = True  # reserved KV does not change while decoding, so a joiner refused once stays refused

    def __init__(self, config: ContinuousPolicyConfig) -> None:
        self.max_batch_size = config.max_batch_size

    def schedule(self, view: SchedulerView) -> IterationPlan:
        """Decode every running sequence and let FIFO joiners prefill alongside."""
        plan = IterationPlan(decode=view.decoding_count > 0)
        room = self.max_batch_size - view.running_count
        if view.waiting_count and room > 0:
            admit_waiting(view, plan, room=room)
        return plan

    def decode_only(self, view: SchedulerView) -> bool:
        """Decoders and no joiner: an empty queue, a full batch, or a head whose reservation does not fit."""
        if not view.decoding_count:
            return False
        if not view.waiting_count or view.running_count >= self.max_batch_size:
            return True
        return head_refused(view)
