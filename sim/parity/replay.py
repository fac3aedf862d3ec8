"""batchsim's side of a parity run: the matching preset's policy on a ReplicaState, step by step.

The requests a trace hands to the scheduler before step k are enqueued before batchsim's step
k too, so both sides see the same arrivals at the same steps whatever either one's step
durations: the comparison is of scheduling alone (pricing comes after, :mod:`sim.parity.diff`).
No SimPy: the policy plans, the state applies (``begin``) and credits (``end``), as the
engine's worker does for one pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.metrics.records import RequestRecords
from sim.parity.trace import Requests, ScheduleTrace, Step
from sim.policies import POLICIES, make_policy
from sim.policies.base import Policy
from sim.serving.memory_plan import MemoryPlan
from sim.serving.sequences import DECODE
from sim.serving.setup import lags_outputs
from sim.serving.state import ReplicaState
from sim.workload.content import PromptContent

EXTRA_STEPS = 10_000
"""Steps batchsim may run past the trace's last one before the replay gives up (a stuck policy)."""


def preset_policy_config(trace: ScheduleTrace) -> Any:
    """The policy config batchsim's preset resolves to for the trace's deployment and scheduler limits.

    Raises:
        UserError: an unknown preset, model or GPU (as for a scenario's policy entry).
    """
    from sim.hardware.catalog import get_gpu
    from sim.presets import DeploymentFacts, expand_preset

    dep, sched = trace.deployment, trace.scheduler
    facts = DeploymentFacts(dep["gpu"], float(get_gpu(dep["gpu"]).memory_gb), int(dep["max_model_len"]))
    entry = {
        "name": "parity",
        "preset": dep["preset"],
        "chunk_size": int(sched["max_num_batched_tokens"]),
        "max_batch_size": int(sched["max_num_seqs"]),
        "prefix_caching": bool(sched["enable_prefix_caching"]),
    }
    fields = expand_preset(entry, facts)
    if fields.get("engine_cpu") is not None:  # vLLM ran with async scheduling or not, whatever its default
        fields["engine_cpu"] = dict(fields["engine_cpu"], overlap_step=bool(sched.get("async_scheduling", False)))
    return POLICIES[fields["kind"]].config_class(**fields)


def block_content(requests: Requests, block_size: int) -> PromptContent | None:
    """The trace's block keys as batchsim's prompt content (one unit per block); None without keys."""
    if requests.block_keys is None:
        return None
    starts = np.cumsum([0] + [len(keys) for keys in requests.block_keys], dtype=np.int64)
    # Unit ids must be >= 0: shift every key by the smallest one (equal keys stay equal).
    flat = [key for keys in requests.block_keys for key in keys]
    low = min(flat, default=0)
    ids = np.asarray([key - low for key in flat], dtype=np.int64)
    content_tokens = np.asarray(
        [min(p, len(k) * block_size) for p, k in zip(requests.prompt_tokens, requests.block_keys, strict=True)],
        dtype=np.int64,
    )
    return PromptContent(block_size, ids, starts, content_tokens)


def replica_for(trace: ScheduleTrace, policy: Policy) -> ReplicaState:
    """An empty replica with the trace's KV blocks, block size, prefix caching, requests and scheduling
    (synchronous, or async: each step's outputs seen after the next step is scheduled)."""
    req, sched = trace.requests, trace.scheduler
    records = RequestRecords(len(req))
    records.arrival_s[:] = np.asarray(req.arrival_s, dtype=float)
    block_size = int(sched["block_size"])
    caching = bool(sched["enable_prefix_caching"])
    memory = MemoryPlan(
        whole_prompt=bool(getattr(policy, "allocates_whole_prompt", False)),
        prefix_caching=caching,
        content=block_content(req, block_size) if caching else None,
    )
    prompts = np.asarray(req.prompt_tokens, dtype=np.int64)
    outputs = np.asarray(req.output_tokens, dtype=np.int64)
    lagged = lags_outputs(preset_policy_config(trace).engine_cpu)
    return ReplicaState(0, records, prompts, outputs, memory, int(sched["num_blocks"]), block_size, lags_outputs=lagged)


def replay(trace: ScheduleTrace, policy: Policy | None = None, *, max_steps: int | None = None) -> list[Step]:
    """Run batchsim's scheduling on the trace's arrivals and return its steps.

    Args:
        trace: the recorded run (its requests, limits and per-step arrivals).
        policy: the policy to replay (default: the trace's preset as batchsim resolves it now).
        max_steps: stop after this many steps, finished or not (default: when every request is done).

    Raises:
        RuntimeError: without ``max_steps``, requests still unfinished ``EXTRA_STEPS`` after the trace's end.
    """
    policy = policy if policy is not None else make_policy(preset_policy_config(trace))
    state = replica_for(trace, policy)
    total, done = len(trace.requests), 0
    steps: list[Step] = []
    index = 0
    while (done < total or index < len(trace.steps)) and (max_steps is None or index < max_steps):
        if max_steps is None and index >= len(trace.steps) + EXTRA_STEPS:
            raise RuntimeError(f"batchsim did not finish {total - done} requests within {EXTRA_STEPS} extra steps")
        adds = trace.steps[index].add if index < len(trace.steps) else []
        for rid in adds:
            state.enqueue(rid, float(index))
        step, completed = _one_step(state, policy, float(index))
        step.add = list(adds)
        steps.append(step)
        done += completed
        index += 1
    return steps


def _one_step(state: ReplicaState, policy: Policy, now: float) -> tuple[Step, int]:
    """Plan, apply and credit one pass at ``now``; return what it did and how many requests it completed."""
    plan = policy.schedule(state.view(now))
    while state.runs_nothing(plan) and state.flush_outputs(plan, now):  # vLLM waits for the batch in flight
        plan = policy.schedule(state.view(now))  # and decides again
    step = Step(preempt=list(plan.preempt))
    if state.runs_nothing(plan):
        return step, 0
    preempted = set(plan.preempt)
    decoding = [rid for rid in _running_in_order(state) if rid not in preempted and state.is_decoding(rid)]
    joiners = [rid for rid, _ in plan.prefill if rid not in state.running]
    state.begin(plan, now)
    step.run = [(rid, 1) for rid in decoding] if plan.decode else []
    step.run += [(rid, tokens) for rid, tokens in plan.prefill]
    pieces = dict(plan.prefill)
    for rid in joiners:
        hit = state.running[rid].computed_tokens - pieces[rid]
        if hit:
            step.hit.append((rid, hit))
    step.kv = state.blocks.used_blocks
    completed = state.end(plan, now + 1.0)
    return step, len(completed)


def _running_in_order(state: ReplicaState) -> list[int]:
    """Running requests, earliest arrival first (the order batchsim keeps its batch in)."""
    return [rid for rid, seq in sorted(state.running.items(), key=lambda item: item[1].key) if seq.phase == DECODE]
