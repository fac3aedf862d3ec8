"""Engine presets: every preset validates, resolves to vLLM's documented defaults on each GPU, cites a
file and tag for each of them, and loses to explicit fields.

The expected values below are written from vLLM's source at each tag (docs/presets.md cites the
lines), not produced by sim.presets.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import sim
from sim.config import Scenario
from sim.errors import UserError
from sim.presets import PRESETS, DeploymentFacts, preset_lines

WORKLOAD = {
    "requests": 5,
    "arrival": {"kind": "burst"},
    "prompt_tokens": {"kind": "fixed", "value": 8},
    "output_tokens": {"kind": "fixed", "value": 4},
}
GPUS = ("a100-80gb", "h100-sxm", "l40s")


def _scenario(policy: dict, model: str = "llama-3-8b", **top) -> sim.Scenario:
    return sim.Scenario(name="p", model=model, workload=WORKLOAD, policies=[policy], **top)


def _resolved(preset: str, gpu: str, **fields) -> sim.config.PolicyConfigBase:
    return _scenario({"name": "x", "preset": preset, **fields}, gpu=gpu).policies[0]


# V0 (0.6.0 model_runner._BATCH_SIZES_TO_CAPTURE; 0.9.2 VllmConfig._set_cudagraph_sizes without V1): 1, 2, 4
# and multiples of 8 up to the first size >= max_num_seqs (256).
V0_GRAPHS = [1, 2, 4, *range(8, 257, 8)]
# 0.11.0: [1, 2, 4] + multiples of 8 up to min(2 x max_num_seqs, 512) = 512 for 256 and 1024 sequences.
V0110_GRAPHS = [1, 2, 4, *range(8, 513, 8)]
# 0.15.1: multiples of 8 below 256, of 16 from 256 up to min(2 x max_num_seqs, 512, max_num_batched_tokens) = 512.
V0151_GRAPHS = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]

V0 = {"kind": "paged", "max_num_batched_tokens": 8192, "max_batch_size": 256, "prefix_caching": False,
      "gpu_memory_utilization": 0.9, "num_scheduler_steps": 1, "overlap": False,
      "graphs": V0_GRAPHS, "batches": "decode"}  # fmt: skip
V1_SMALL = {"kind": "chunked_prefill", "chunk_size": 2048, "max_batch_size": 256, "allocate": "chunk",
            "prefix_caching": True, "gpu_memory_utilization": 0.9, "batches": "all"}  # fmt: skip
V1_LARGE = {**V1_SMALL, "chunk_size": 8192, "max_batch_size": 1024}  # >= 70 GiB and not an A100

EXPECTED = {  # (preset, gpu) -> defaults for Llama-3-8B (max_model_len 8192)
    **{("vllm-0.6", gpu): V0 for gpu in GPUS},
    **{("vllm-0.9", gpu): V0 for gpu in GPUS},
    ("vllm-0.11", "a100-80gb"): {**V1_SMALL, "overlap": False, "graphs": V0110_GRAPHS},
    ("vllm-0.11", "h100-sxm"): {**V1_LARGE, "overlap": False, "graphs": V0110_GRAPHS},
    ("vllm-0.11", "l40s"): {**V1_SMALL, "overlap": False, "graphs": V0110_GRAPHS},  # 45 GiB < 70
    ("vllm-0.15", "a100-80gb"): {**V1_SMALL, "overlap": True, "graphs": V0151_GRAPHS},
    ("vllm-0.15", "h100-sxm"): {**V1_LARGE, "overlap": True, "graphs": V0151_GRAPHS},
    ("vllm-0.15", "l40s"): {**V1_SMALL, "overlap": True, "graphs": V0151_GRAPHS},
}
EXPECTED.update({("vllm-v1", gpu): EXPECTED[("vllm-0.15", gpu)] for gpu in GPUS})  # the current V1 line


@pytest.mark.parametrize(("preset", "gpu"), sorted(EXPECTED))
def test_every_vllm_preset_resolves_to_the_documented_defaults(preset: str, gpu: str) -> None:
    policy = _resolved(preset, gpu)
    expected = dict(EXPECTED[(preset, gpu)])
    assert policy.engine_cpu.overlap_step is expected.pop("overlap")
    assert policy.cuda_graphs.capture_sizes == expected.pop("graphs")
    assert policy.cuda_graphs.batches == expected.pop("batches")
    assert {key: getattr(policy, key) for key in expected} == expected


def test_the_entrys_own_fields_change_what_vllm_derives_from_them() -> None:
    # The 0.11 H100 sample's server: --max-num-seqs=128, so graphs up to min(2 x 128, 512) = 256.
    policy = _resolved("vllm-0.11", "h100-sxm", max_batch_size=128)
    assert (policy.chunk_size, policy.max_batch_size) == (8192, 128)
    assert policy.cuda_graphs.capture_sizes == [1, 2, 4, *range(8, 257, 8)]
    # 0.15.1: a token budget below the sequence cap caps both the sequences and the graphs.
    policy = _resolved("vllm-0.15", "a100-80gb", chunk_size=200)
    assert policy.max_batch_size == 200 and policy.cuda_graphs.capture_sizes[-1] == 200
    # 0.15.1: EAGLE's 4 draft tokens make a decode 5 tokens per sequence: graphs up to 16 x 5 x 2 = 160.
    eagle = {"method": "eagle", "num_speculative_tokens": 4}
    policy = _resolved("vllm-0.15", "h100-sxm", max_batch_size=16, speculative=eagle)
    assert policy.cuda_graphs.capture_sizes == [1, 2, 4, *range(8, 161, 8)]
    assert policy.engine_cpu.overlap_step  # EAGLE keeps async scheduling
    assert _resolved("vllm-0.15", "h100-sxm", max_batch_size=16).cuda_graphs.capture_sizes == [1, 2, 4, 8, 16, 24, 32]
    # V0: the graphs cover max_num_seqs (1024 -> up to 1024).
    assert _resolved("vllm-0.6", "a100-80gb", max_batch_size=1024).cuda_graphs.capture_sizes[-1] == 1024


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_vllm_015_async_scheduling_is_off_with_non_eagle_speculation(method: str) -> None:
    spec = {"method": method, "num_speculative_tokens": 4}
    if method == "draft_model":
        spec["draft_model"] = "llama-3-8b"
    assert not _resolved("vllm-0.15", "h100-sxm", speculative=spec).engine_cpu.overlap_step


def test_v0_turns_chunked_prefill_on_only_beyond_32k_context_and_honours_the_kind() -> None:
    long = {"gpu": "a100-80gb", "max_model_len": 40000}
    v06 = _scenario({"name": "x", "preset": "vllm-0.6"}, model="llama-3.1-8b", **long).policies[0]
    v09 = _scenario({"name": "x", "preset": "vllm-0.9"}, model="llama-3.1-8b", **long).policies[0]
    assert (v06.kind, v06.chunk_size, v06.allocate) == ("chunked_prefill", 512, "prompt")  # 0.6.0 SchedulerConfig
    assert (v09.kind, v09.chunk_size) == ("chunked_prefill", 2048)  # 0.9.2 DEFAULT_MAX_NUM_BATCHED_TOKENS
    unchunked = _scenario({"name": "x", "preset": "vllm-0.6", "kind": "paged"}, model="llama-3.1-8b", **long)
    assert (unchunked.policies[0].kind, unchunked.policies[0].max_num_batched_tokens) == ("paged", 40000)
    # 0.6.0 keeps chunking off when prefix caching is on; 0.9.2 no longer does.
    cached = {"name": "x", "prefix_caching": True}
    assert _scenario({**cached, "preset": "vllm-0.6"}, model="llama-3.1-8b", **long).policies[0].kind == "paged"
    assert _scenario({**cached, "preset": "vllm-0.9"}, model="llama-3.1-8b", **long).policies[0].kind == (
        "chunked_prefill"
    )


def test_v1_no_chunked_prefill_is_refused_with_the_versions_reason() -> None:
    with pytest.raises(UserError, match=r"vLLM 0\.11\.0 ignores --no-enable-chunked-prefill"):
        _resolved("vllm-0.11", "h100-sxm", kind="paged")
    with pytest.raises(UserError, match=r"vLLM 0\.15\.1 honours --no-enable-chunked-prefill.*no batchsim kind"):
        _resolved("vllm-v1", "h100-sxm", kind="paged")


SOURCE = re.compile(r"vllm-project/vllm vllm/\S+\.py at v\d+\.\d+\.\d+: \S")


@pytest.mark.parametrize("preset", ["vllm-0.6", "vllm-0.9", "vllm-0.11", "vllm-0.15", "vllm-v1"])
def test_a_vllm_presets_sources_name_a_file_and_tag_for_each_default(preset: str) -> None:
    entry = PRESETS[preset]
    deployments = [DeploymentFacts(gpu, memory, 8192) for gpu, memory in (("a100-80gb", 79.15), ("l40s", 44.99))]
    deployments.append(DeploymentFacts("h100-sxm", 79.11, 65536))  # long context: V0's chunked fields too
    for facts in deployments:
        for field in entry.fields(facts, {}):
            assert SOURCE.search(entry.sources.get(field, "")), (preset, field)


def test_list_presets_prints_every_preset_on_three_gpus_with_its_sources() -> None:
    proc = subprocess.run([sys.executable, "-m", "sim", "list", "presets"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == preset_lines()
    lines = preset_lines()
    assert any(re.match(r"vllm-v1\s+alias of vllm-0\.15$", line) for line in lines)
    for name in ("vllm-0.6", "vllm-0.9", "vllm-0.11", "vllm-0.15"):
        block = lines[next(i for i, line in enumerate(lines) if line.startswith(f"{name} ")) :]
        block = block[: next(i for i, line in enumerate(block[1:], 1) if not line.startswith(" "))]
        for gpu in GPUS:
            assert sum(line.split()[0] == f"{gpu}:" for line in block) == 1, (name, gpu)
        assert any("max_batch_size=" in line and "cuda_graphs=[1,2,4," in line for line in block)
        assert sum(bool(SOURCE.search(line)) for line in block) >= 6


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_every_preset_validates_and_runs(preset: str, gpu: str) -> None:
    scenario = _scenario({"name": "x", "preset": preset}, gpu=gpu)
    policy = scenario.policies[0]
    assert policy.preset == preset
    result = sim.run(scenario)
    assert int(result.summary["completed"].iloc[0]) == 5


def test_an_explicit_field_beats_the_preset() -> None:
    policy = _scenario({"name": "x", "preset": "vllm-0.6", "max_batch_size": 1024, "num_scheduler_steps": 10})
    config = policy.policies[0]
    assert (config.max_batch_size, config.num_scheduler_steps) == (1024, 10)
    assert config.gpu_memory_utilization == 0.9 and config.engine_cpu is not None  # the rest from the preset
    own = {"capture_sizes": [1, 8], "batches": "decode"}
    assert _resolved("vllm-0.15", "h100-sxm", cuda_graphs=own).cuda_graphs.capture_sizes == [1, 8]


def test_vllm_v0_token_budget_follows_the_context_length() -> None:
    assert _scenario({"name": "x", "preset": "vllm-0.6"}, max_model_len=2000).policies[0].max_num_batched_tokens == 2048
    assert _scenario({"name": "x", "preset": "vllm-0.6"}).policies[0].max_num_batched_tokens == 8192


def test_a_preset_survives_a_round_trip() -> None:
    scenario = _scenario({"name": "x", "preset": "sarathi", "chunk_size": 256})
    again = scenario.replace(**{"seed": 3})
    assert again.policies[0] == scenario.policies[0]
    assert again.policies[0].chunk_size == 256 and again.policies[0].allocate == "prompt"
    v1 = _scenario({"name": "x", "preset": "vllm-0.11"}, gpu="h100-sxm")
    assert v1.replace(**{"seed": 3}).policies[0] == v1.policies[0]


def test_unknown_preset_and_contradicting_kind_are_clear_errors() -> None:
    with pytest.raises(UserError, match="did you mean 'vllm-v1'"):
        _scenario({"name": "x", "preset": "vllm-v2"})
    with pytest.raises(UserError, match="preset vllm-v1 is kind 'chunked_prefill'"):
        _scenario({"name": "x", "preset": "vllm-v1", "kind": "static"})


def test_a_policys_memory_share_sizes_its_kv_cache() -> None:
    from sim.resolve import resolve

    scenario = _scenario({"name": "x", "preset": "vllm-0.6", "gpu_memory_utilization": 0.95})
    resolved = resolve(scenario)
    assert resolved.kv_for(scenario.policies[0]).num_blocks > resolved.kv.num_blocks  # scenario default 0.9


@pytest.mark.parametrize(
    ("preset", "per_request_ms", "latency_ms"),
    [("vllm-0.6", 3.1, 3.2), ("vllm-0.9", 3.1, 3.2), ("vllm-0.11", 3.1, 16.0), ("vllm-0.15", 3.1, 16.0)],
)
def test_a_vllm_preset_serves_behind_its_versions_front_end(preset: str, per_request_ms: float, latency_ms: float):
    """docs/validation.md: the API server's loop time is one fitted value for V0 and V1 servers; the latency
    outside it is V0's or V1's (V1 adds the EngineCore process hop and the output processor); warm servers."""
    policy = Scenario.from_data({
        "name": "fe", "model": "llama-3-8b", "gpu": "h100-sxm",
        "workload": {"requests": 2, "arrival": {"kind": "burst"}, "prompt_tokens": {"kind": "fixed", "value": 8},
                     "output_tokens": {"kind": "fixed", "value": 2}},
        "policies": [{"name": "p", "preset": preset}],
    }).policies[0]  # fmt: skip
    assert (policy.frontend.per_request_ms, policy.frontend.latency_ms) == (per_request_ms, latency_ms)
    assert policy.frontend.startup_ms == 0.0
