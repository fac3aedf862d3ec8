"""Everything derived from a scenario before any simulation: hardware, KV budget, cost model, requests.

:func:`resolve` is the first half of a run (:func:`sim.runner.run` simulates on what it
returns); capacity searches, size estimates and the disaggregated engine use it alone.
Derived values live in :class:`ResolvedScenario` and are never written back into the scenario.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.checks import check_arrival_span, check_context_window
from sim.config import Scenario
from sim.errors import UserError
from sim.hardware.all_reduce import AllReduceSpec
from sim.hardware.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from sim.hardware.cost_model import CostModel, load_cost_model
from sim.hardware.draft import DraftModel, draft_cost_models, draft_models, kv_with_draft
from sim.hardware.memory import KVBudget, kv_budget
from sim.hardware.pipeline import ActivationTransfer, check_pipeline_parallel, stage_layers
from sim.hardware.utilization import PassWork
from sim.policies.table import POLICIES
from sim.serving.pipeline import PipelineSetup
from sim.serving.setup import EngineSetup, ReplicaSetup
from sim.workload.source import build_request_stream
from sim.workload.stream import RequestStream


@dataclass(frozen=True)
class ResolvedScenario:
    """Everything derived from a scenario before simulating: never written back into it."""

    scenario: Scenario
    model: ModelSpec
    gpu: GPUSpec
    kv: KVBudget
    cost_model: CostModel
    stream: RequestStream
    max_model_len: int = 0
    over_length: np.ndarray | None = None
    """Requests longer than ``max_model_len``, refused when sent (``over_length: reject``); None: none."""
    gpu_cost_model: CostModel | None = None
    """The cost model without CPU time, for policies with their own ``engine_cpu`` model."""
    draft_cost_models: dict[str, CostModel] = field(default_factory=dict)
    """Draft model cost models of policies with speculative decoding by a draft model, by policy name."""
    draft_models: dict[str, DraftModel] = field(default_factory=dict)
    """The draft models themselves, by policy name: their weights and KV share the target's memory."""
    _priced: dict[tuple[bool, AllReduceSpec], CostModel] = field(default_factory=dict, compare=False, repr=False)
    """Cost models with a policy's all-reduce settings, by (GPU time only, settings): built once per run."""

    def kv_for(self, policy: Any) -> KVBudget:
        """The KV budget of one policy: the scenario's, unless it sets its own gpu_memory_utilization,
        less its draft model's weights and KV cache if it drafts with one.

        Raises:
            UserError: naming ``policies[i].speculative.draft_model``, when the draft model does not fit.
        """
        utilization = getattr(policy, "gpu_memory_utilization", None)
        kv = self.kv
        if utilization is not None and not self.kv.pinned:
            kv = _kv_budget(self.scenario, self.model, self.gpu, utilization)
        draft = self.draft_models.get(policy.name)
        return kv if draft is None else kv_with_draft(kv, draft, self.scenario.tensor_parallel)

    def replica_setup(self, policy: Any) -> ReplicaSetup:
        """How a replica of ``policy`` is priced and sized and which features it runs."""
        scenario, kv, engine_cpu = self.scenario, self.kv_for(policy), getattr(policy, "engine_cpu", None)
        return ReplicaSetup(
            cost_model=self.policy_cost_model(policy),
            kv_blocks=kv.num_blocks,
            block_size=kv.block_size,
            engine_cpu=engine_cpu,
            prefix_caching=prefix_caching_on(scenario, policy),
            draft_cost_model=self.draft_cost_models.get(policy.name),
            merge_decode_steps=scenario.engine.merge_decode_steps,
            fast_path=scenario.engine.fast_path,
            cuda_graphs=getattr(policy, "cuda_graphs", None),
            pipeline=self.pipeline,
        )

    @property
    def pipeline(self) -> PipelineSetup | None:
        """The replicas' pipeline stages: layers per stage and the activation hand-off (None: one stage)."""
        stages = self.scenario.pipeline_parallel
        if stages == 1:
            return None
        layers = stage_layers(self.model.num_layers, stages)
        return PipelineSetup.of(layers, ActivationTransfer.of(self.model, self.gpu))

    def engine_setup(self, policy: Any) -> EngineSetup:
        """Everything :func:`sim.serving.engine.simulate` needs beyond the stream and the policy."""
        scenario = self.scenario
        return EngineSetup(
            replica=self.replica_setup(policy),
            replicas=scenario.replicas,
            router=scenario.router,
            router_load_cap=scenario.router_load_cap,
            client=scenario.client,
            admission=scenario.admission,
            frontend=frontend_of(scenario, policy),
            refuse=self.over_length,
            seed=scenario.seed,
        )

    def policy_cost_model(self, policy: Any) -> CostModel:
        """The cost model ``policy`` runs on: GPU time alone when it has its own ``engine_cpu`` model, with its
        ``all_reduce`` settings."""
        gpu_only = getattr(policy, "engine_cpu", None) is not None
        key = (gpu_only, AllReduceSpec.of(policy))
        if key not in self._priced:
            base = self.cost_model
            if gpu_only:  # its own CPU model: the GPU time alone (resolve loads it for such policies)
                assert self.gpu_cost_model is not None, "a policy with engine_cpu needs the GPU-only cost model"
                base = self.gpu_cost_model
            self._priced[key] = base.with_all_reduce(key[1])
        return self._priced[key]

    @property
    def pass_work(self) -> PassWork:
        """FLOPs and HBM bytes per forward pass of this model on one replica (MFU and MBU)."""
        return PassWork.of(self.model, self.gpu, self.scenario.tensor_parallel, stages=self.scenario.pipeline_parallel)

    @property
    def num_gpus(self) -> int:
        """GPUs used by the whole deployment (replicas x pipeline stages x tensor parallel)."""
        return self.scenario.replicas * self.scenario.pipeline_parallel * self.scenario.tensor_parallel

    @property
    def workers(self) -> int:
        """GPU workers the summary averages busy time over: one per replica and pipeline stage."""
        return self.scenario.replicas * self.scenario.pipeline_parallel

    def facts(self) -> dict[str, Any]:
        """Derived values recorded next to the resolved scenario in the output folder."""
        return (
            {
                "model_hf_name": self.model.hf_name,
                "weights_gb_per_gpu": round(self.kv.weight_bytes_per_gpu / 1e9, 3),
                "kv_bytes_per_token": self.kv.bytes_per_token,
                "kv_blocks_per_replica": self.kv.num_blocks,
                "kv_capacity_tokens_per_replica": self.kv.capacity_tokens,
                "kv_blocks_pinned": self.kv.pinned,
                "cost_model": self.cost_model.label,
                "calibration": self.cost_model.source,
                "num_gpus": self.num_gpus,
                "requests": len(self.stream),
                "max_output_tokens": self.stream.max_output_tokens,
                "engine_path": self.engine_paths(),
            }
            | self._pipeline_facts()
            | self._scale_facts()
        )

    def engine_paths(self) -> dict[str, str]:
        """Per policy, the engine path its runs take: ``fast``, or ``general`` and why not the fast one."""
        from sim.policies.table import make_policy
        from sim.serving.fast.paths import fast_path_refusal

        paths = {}
        for policy in self.scenario.policies:
            why = fast_path_refusal(make_policy(policy), policy, self.engine_setup(policy))
            paths[policy.name] = "fast" if why is None else f"general: {why}"
        return paths

    def _scale_facts(self) -> dict[str, Any]:
        """The GPU time scale of a serving calibration (nothing when there is none)."""
        scale = self.cost_model.gpu_time_scale
        return {"step_scale": scale} if scale != 1.0 else {}

    def _pipeline_facts(self) -> dict[str, Any]:
        """Stage layers and each virtual engine's KV blocks (nothing without pipeline stages)."""
        stages = self.scenario.pipeline_parallel
        if stages == 1:
            return {}
        return {
            "pipeline_stage_layers": list(stage_layers(self.model.num_layers, stages)),
            "kv_blocks_per_virtual_engine": self.kv.num_blocks // stages,
        }


def frontend_of(scenario: Scenario, policy: Any) -> Any:
    """The API front end ``policy`` is served behind: the scenario's ``frontend`` block when it has one
    (the user's choice for every policy), else the policy's own (its preset's server), else none."""
    if scenario.frontend is not None:
        return scenario.frontend
    return getattr(policy, "frontend", None)


def prefix_caching_on(scenario: Scenario, policy: Any) -> bool:
    """Whether ``policy`` runs with prefix caching: its own setting, else memory.prefix_caching,
    and never for reserve-memory kinds (static, continuous)."""
    own = getattr(policy, "prefix_caching", None)
    return bool(scenario.memory.prefix_caching if own is None else own) and POLICIES[policy.kind].memory == "paged"


def resolve(scenario: Scenario) -> ResolvedScenario:
    """Look up hardware, size the KV cache, load the cost model and draw the request stream.

    Raises:
        UserError: unknown model/GPU, the model (or a policy's draft model beside it) does not fit, a
            workload file is missing or corrupt, or a request is longer than the context window
            (unless ``over_length: reject``).
            Whether each request fits the KV cache depends on the policy: :func:`check_servable`.
    """
    model = get_model(scenario.model)
    gpu = get_gpu(scenario.gpu)
    check_pipeline_parallel(model, scenario.pipeline_parallel)
    kv = _kv_budget(scenario, model, gpu, scenario.memory.gpu_memory_utilization)
    for policy in scenario.policies:  # a policy's own memory share must fit the model too
        share = getattr(policy, "gpu_memory_utilization", None)
        if share is not None:
            _kv_budget(scenario, model, gpu, share)
    scale = scenario.cost.step_scale  # the per-GPU correction of a serving calibration (1: none)
    cost_model = load_cost_model(
        scenario.model,
        scenario.gpu,
        scenario.tensor_parallel,
        cpu_overhead=scenario.cost.cpu_overhead,
        expert_parallel=scenario.expert_parallel,
    ).scaled(scale)
    gpu_cost_model = None
    if any(getattr(p, "engine_cpu", None) is not None for p in scenario.policies):
        gpu_cost_model = load_cost_model(
            scenario.model,
            scenario.gpu,
            scenario.tensor_parallel,
            cpu_overhead=False,
            expert_parallel=scenario.expert_parallel,
        ).scaled(scale)
    stream = build_request_stream(scenario.workload, scenario.seed, scenario.base_dir)
    check_arrival_span(stream)
    max_len, source = _context_window(scenario, model)
    over = check_context_window(stream, max_len, scenario.over_length, source)
    drafts = draft_cost_models(
        list(scenario.policies), model, scenario.gpu, scenario.tensor_parallel, cpu_overhead=scenario.cost.cpu_overhead
    )
    drafts = {name: draft.scaled(scale) for name, draft in drafts.items()}  # the same GPU runs the draft
    resolved = ResolvedScenario(
        scenario,
        model,
        gpu,
        kv,
        cost_model,
        stream,
        max_len,
        over if over.any() else None,
        gpu_cost_model,
        drafts,
        draft_models(list(scenario.policies), model),
    )
    for policy in scenario.policies:  # every draft model must fit beside the target, selected or not
        resolved.kv_for(policy)
    return resolved


def _kv_budget(scenario: Scenario, model: ModelSpec, gpu: GPUSpec, utilization: float) -> KVBudget:
    memory = scenario.memory
    return kv_budget(
        model,
        gpu,
        scenario.tensor_parallel,
        gpu_memory_utilization=utilization,
        block_size=memory.block_size,
        activation_reserve_gb=memory.activation_reserve_gb,
        kv_blocks=memory.kv_blocks,
        pipeline_parallel=scenario.pipeline_parallel,
    )


def _context_window(scenario: Scenario, model: ModelSpec) -> tuple[int, str]:
    if scenario.max_model_len is None:
        return model.max_positions, f"{model.name}'s context window"
    if scenario.max_model_len > model.max_positions:
        raise UserError(
            f"max_model_len = {scenario.max_model_len}: longer than {model.name}'s context window "
            f"({model.max_positions} positions)",
            field="max_model_len",
        )
    return scenario.max_model_len, "max_model_len"
