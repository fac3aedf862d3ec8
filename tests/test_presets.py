"""Engine presets: every preset validates, fills documented defaults, and loses to explicit fields."""

from __future__ import annotations

import pytest

import sim
from sim.errors import UserError
from sim.presets import PRESETS

WORKLOAD = {
    "requests": 5,
    "arrival": {"kind": "burst"},
    "prompt_tokens": {"kind": "fixed", "value": 8},
    "output_tokens": {"kind": "fixed", "value": 4},
}


def _scenario(policy: dict, **top) -> sim.Scenario:
    return sim.Scenario(name="p", model="llama-3-8b", workload=WORKLOAD, policies=[policy], **top)


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_every_preset_validates_and_runs(preset: str, gpu: str) -> None:
    scenario = _scenario({"name": "x", "preset": preset}, gpu=gpu)
    policy = scenario.policies[0]
    assert policy.preset == preset
    assert policy.kind == PRESETS[preset].fields(sim.presets.DeploymentFacts(gpu, 80.0, 8192))["kind"]
    result = sim.run(scenario)
    assert int(result.summary["completed"].iloc[0]) == 5


def test_an_explicit_field_beats_the_preset() -> None:
    policy = _scenario({"name": "x", "preset": "vllm-0.6", "max_batch_size": 1024, "num_scheduler_steps": 10})
    config = policy.policies[0]
    assert (config.max_batch_size, config.num_scheduler_steps) == (1024, 10)
    assert config.gpu_memory_utilization == 0.9 and config.engine_cpu is not None  # the rest from the preset


def test_vllm_v0_token_budget_follows_the_context_length() -> None:
    assert _scenario({"name": "x", "preset": "vllm-0.6"}, max_model_len=2000).policies[0].max_num_batched_tokens == 2048
    assert _scenario({"name": "x", "preset": "vllm-0.6"}).policies[0].max_num_batched_tokens == 8192


def test_vllm_v1_budget_depends_on_the_gpu() -> None:
    a100 = _scenario({"name": "x", "preset": "vllm-v1"}, gpu="a100-80gb").policies[0]
    h100 = _scenario({"name": "x", "preset": "vllm-v1"}, gpu="h100-sxm").policies[0]
    assert (a100.chunk_size, a100.max_batch_size) == (2048, 256)
    assert (h100.chunk_size, h100.max_batch_size) == (8192, 1024)
    assert a100.kind == "chunked_prefill" and a100.allocate == "chunk" and a100.engine_cpu.overlap_step


def test_a_preset_survives_a_round_trip() -> None:
    scenario = _scenario({"name": "x", "preset": "sarathi", "chunk_size": 256})
    again = scenario.replace(**{"seed": 3})
    assert again.policies[0] == scenario.policies[0]
    assert again.policies[0].chunk_size == 256 and again.policies[0].allocate == "prompt"


def test_unknown_preset_and_contradicting_kind_are_clear_errors() -> None:
    with pytest.raises(UserError, match="did you mean 'vllm-v1'"):
        _scenario({"name": "x", "preset": "vllm-v2"})
    with pytest.raises(UserError, match="preset vllm-v1 is kind 'chunked_prefill'"):
        _scenario({"name": "x", "preset": "vllm-v1", "kind": "paged"})


def test_a_policys_memory_share_sizes_its_kv_cache() -> None:
    from sim.resolve import resolve

    scenario = _scenario({"name": "x", "preset": "vllm-0.6", "gpu_memory_utilization": 0.95})
    resolved = resolve(scenario)
    assert resolved.kv_for(scenario.policies[0]).num_blocks > resolved.kv.num_blocks  # scenario default 0.9
