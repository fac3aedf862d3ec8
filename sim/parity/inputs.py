"""What a parity run feeds both schedulers, taken from a scenario with one vLLM-preset policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.errors import UserError
from sim.parity.trace import Requests


@dataclass
class ParityInputs:
    """The request stream, the deployment and the scheduler limits of one parity run."""

    requests: Requests
    deployment: dict[str, Any]
    scheduler: dict[str, Any]


def inputs_from_scenario(scenario: Any, policy_name: str | None = None) -> ParityInputs:
    """The stream, deployment and scheduler limits of ``scenario``'s policy (the only one, or ``policy_name``).

    Raises:
        UserError: no such policy, or one without a vLLM V1 preset of kind chunked_prefill (the
            kind vLLM's V1 scheduler is compared with), or a multi-replica scenario.
    """
    from sim.resolve import prefix_caching_on, resolve

    policy = _pick_policy(scenario, policy_name)
    if scenario.replicas != 1:
        raise UserError(f"replicas = {scenario.replicas}: a parity run compares one scheduler; set 1", "replicas")
    resolved = resolve(scenario)
    stream, kv = resolved.stream, resolved.kv_for(policy)
    content = stream.content
    keys = None
    if content is not None:
        keys = [[int(k) for k in content.block_keys(r, kv.block_size)] for r in range(len(stream))]
    requests = Requests(
        [float(a) for a in stream.arrival_s],
        [int(p) for p in stream.prompt_tokens],
        [int(o) for o in stream.output_tokens],
        keys,
    )
    deployment = {
        "preset": policy.preset,
        "model": scenario.model,
        "gpu": scenario.gpu,
        "tensor_parallel": scenario.tensor_parallel,
        "max_model_len": int(resolved.max_model_len),
    }
    limits = {
        "max_num_batched_tokens": int(policy.chunk_size),
        "max_num_seqs": int(policy.max_batch_size),
        "block_size": int(kv.block_size),
        "num_blocks": int(kv.num_blocks),
        "enable_prefix_caching": bool(prefix_caching_on(scenario, policy)),
        # The preset's async scheduling (vllm-0.15: on) is its engine CPU model's overlap_step.
        "async_scheduling": bool(getattr(getattr(policy, "engine_cpu", None), "overlap_step", False)),
    }
    return ParityInputs(requests, deployment, limits)


def _pick_policy(scenario: Any, name: str | None) -> Any:
    policies = list(scenario.policies)
    if name is not None:
        chosen = [p for p in policies if p.name == name]
        if not chosen:
            names = ", ".join(p.name for p in policies)
            raise UserError(f"--policy = {name!r}: no such policy in the scenario; allowed: {names}", "policy")
        policy = chosen[0]
    elif len(policies) == 1:
        policy = policies[0]
    else:
        raise UserError(f"the scenario has {len(policies)} policies: name one with --policy", "policy")
    if policy.kind != "chunked_prefill" or not str(policy.preset or "").startswith("vllm-"):
        raise UserError(
            f"policies[{policy.name}]: preset = {policy.preset!r}, kind = {policy.kind!r}: a parity run needs a "
            "vLLM V1 preset (vllm-0.11, vllm-0.15, vllm-v1), whose kind is chunked_prefill",
            "policy",
        )
    return policy


def cost_model_for(deployment: dict[str, Any]) -> Any:
    """batchsim's GPU cost model for the deployment (no CPU time: the same for both schedules)."""
    from sim.hardware.cost_model import load_cost_model

    return load_cost_model(
        str(deployment["model"]), str(deployment["gpu"]), int(deployment["tensor_parallel"]), cpu_overhead=False
    )
