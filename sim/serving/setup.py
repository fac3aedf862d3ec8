"""The typed set-up of one engine run, and the one place that assembles a replica from it.

:class:`ReplicaSetup` says how one kind of replica is priced and sized and which features
it runs; :class:`EngineSetup` adds what stands between the clients and the replicas (how
many, the router, the front end, client behaviour). :func:`build_replicas` turns a policy
and a replica set-up into replica states and their cost models: the colocated engine
(:mod:`sim.serving.engine`) and each pool of a disaggregated one (:mod:`sim.serving.disagg`)
call it, so a feature that works on one works on the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.config import AdmissionConfig, ClientConfig, EngineCPUConfig, FrontendConfig
from sim.config.policy_base import CUDAGraphsConfig
from sim.errors import UserError
from sim.metrics.itl import ITLRecorder
from sim.metrics.records import RequestRecords
from sim.policies.base import Policy
from sim.serving.cuda_graphs import with_cuda_graphs
from sim.serving.memory_plan import MemoryPlan
from sim.serving.pipeline import PipelineSetup
from sim.serving.pool_state import PoolRole
from sim.serving.pricing import CostModelLike
from sim.serving.speculative import SpeculativeCostModel, SpeculativeDecode, make_speculation
from sim.serving.state import ReplicaState
from sim.workload.stream import RequestStream

DRAFTERS_ONE_TOKEN_AHEAD = ("eagle",)
"""Speculative methods whose drafter reads the target's hidden states one token ahead, so a prefix-cache
hit loses its last block (vLLM ``use_eagle()``: eagle, eagle3, mtp; ``find_longest_cache_hit``)."""


@dataclass(frozen=True)
class ReplicaSetup:
    """One kind of replica: its pricing, its KV capacity and the features it runs.

    Attributes:
        cost_model: prices each pass (without CPU time when ``engine_cpu`` is set).
        kv_blocks: KV capacity of each replica, in blocks.
        block_size: tokens per KV block.
        engine_cpu: the engine CPU-time model added to every pass (None: the cost model's only).
        prefix_caching: cache and share full prompt blocks (paged-memory policies only).
        draft_cost_model: the draft model's cost model (speculative method draft_model).
        merge_decode_steps: merge pure decode passes into one SimPy event where exact.
        cuda_graphs: the CUDA-graph sizes passes are priced at (None: every pass at its own size).
        pipeline: pipeline stages of each replica (None: one stage): ``kv_blocks`` is then split evenly
            over its virtual engines, and the cost model must give a breakdown.
        fast_path: run on the engine's fast path where it applies (:mod:`sim.serving.fast`; the same
            records either way); False: always the general path.
    """

    cost_model: CostModelLike
    kv_blocks: int
    block_size: int
    engine_cpu: EngineCPUConfig | None = None
    prefix_caching: bool = False
    draft_cost_model: CostModelLike | None = None
    merge_decode_steps: bool = True
    cuda_graphs: CUDAGraphsConfig | None = None
    pipeline: PipelineSetup | None = None
    fast_path: bool = True

    def __post_init__(self) -> None:
        for name in ("kv_blocks", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise UserError(f"{name} must be an integer >= 1, got {value!r}", field=name)
        if not callable(getattr(self.cost_model, "time_from_totals_s", None)):
            raise UserError(f"cost model {type(self.cost_model).__name__} has no time_from_totals_s(...) method")
        if self.pipeline is not None and not callable(getattr(self.cost_model, "breakdown_from_totals_s", None)):
            raise UserError(
                f"cost model {type(self.cost_model).__name__} has no breakdown_from_totals_s(...) method, which "
                "pipeline stages split a pass by"
            )
        if self.kv_blocks < self.virtual_engines:
            raise UserError(
                f"kv_blocks = {self.kv_blocks}: fewer than one block per virtual engine of the "
                f"{self.virtual_engines} pipeline stages",
                field="kv_blocks",
            )

    @property
    def virtual_engines(self) -> int:
        """Schedulers per replica: one per pipeline stage (vLLM V0), 1 without pipeline parallelism."""
        return 1 if self.pipeline is None else self.pipeline.stages

    @property
    def engine_kv_blocks(self) -> int:
        """KV blocks of each virtual engine: the replica's, split evenly (vLLM ``num_gpu_blocks //= pp``)."""
        return self.kv_blocks // self.virtual_engines


@dataclass(frozen=True)
class EngineSetup:
    """Everything a colocated run needs beyond the request stream and the policy.

    Attributes:
        replica: every replica's set-up.
        replicas: independent GPU workers behind the router.
        router: ``round_robin``, ``least_outstanding``, ``random`` or ``prefix_affinity``.
        router_load_cap: the ``prefix_affinity`` router's load cap (a multiple of the mean).
        client: client timeouts and retries (None: patient clients).
        admission: queue limit per replica (None: unbounded).
        frontend: the API front end every send passes before the router (None: none).
        refuse: requests the server refuses when sent (True: longer than max_model_len).
        seed: seeds the run's own random streams (router, speculative acceptance).
    """

    replica: ReplicaSetup
    replicas: int = 1
    router: str = "round_robin"
    router_load_cap: float = 1.5
    client: ClientConfig | None = None
    admission: AdmissionConfig | None = None
    frontend: FrontendConfig | None = None
    refuse: np.ndarray | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        value = self.replicas
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UserError(f"replicas must be an integer >= 1, got {value!r}", field="replicas")


def memory_plan(stream: RequestStream, policy: Policy, config: Any, setup: ReplicaSetup, *,
                whole_prompt: bool | None = None) -> MemoryPlan:  # fmt: skip
    """The memory model a policy runs: its discipline, prefix caching, and the drafter's block drop.

    ``whole_prompt`` overrides the policy's own choice (disaggregated pools grant whole prompts).
    """
    if policy.memory == "reserve":
        return MemoryPlan(reserve_tokens=stream.max_output_tokens)
    spec = getattr(config, "speculative", None)
    whole = getattr(policy, "allocates_whole_prompt", False) if whole_prompt is None else whole_prompt
    return MemoryPlan(
        whole_prompt=whole,
        prefix_caching=setup.prefix_caching,
        content=stream.content,
        drop_last_hit_block=setup.prefix_caching and spec is not None and spec.method in DRAFTERS_ONE_TOKEN_AHEAD,
    )


def lags_outputs(engine_cpu: EngineCPUConfig | None) -> bool:
    """Whether the engine schedules a step before it has the previous step's outputs: vLLM V1's async
    scheduling, which ``engine_cpu.overlap_step`` models (the next step is scheduled while the GPU runs)."""
    return engine_cpu is not None and engine_cpu.overlap_step


def build_replicas(
    stream: RequestStream,
    policy: Policy,
    config: Any,
    setup: ReplicaSetup,
    records: RequestRecords,
    itl: ITLRecorder,
    indices: range,
    *,
    seed: int,
    pool_role: Callable[[int], PoolRole] | None = None,
    whole_prompt: bool | None = None,
) -> list[tuple[ReplicaState, CostModelLike]]:
    """The replica states of one policy, each with the cost model its worker prices passes with.

    With pipeline stages every replica is ``setup.virtual_engines`` states in a row (its virtual
    engines, same index, ``setup.engine_kv_blocks`` blocks each).

    Args:
        stream, records, itl: the run's requests, their records and the inter-token gaps.
        policy, config: the policy and its config (``speculative`` decorates the decode step).
        setup: the replicas' set-up.
        indices: the replicas' global indices.
        seed: seeds the speculative acceptance stream.
        pool_role: a disaggregated pool's hooks for the replica of a given index (None: colocated).
        whole_prompt: override of the policy's whole-prompt allocation (pools).
    """
    plan = memory_plan(stream, policy, config, setup, whole_prompt=whole_prompt)
    # Graph padding prices the target's passes; speculation's verify and EAGLE draft steps replay graphs too.
    target = with_cuda_graphs(setup.cost_model, setup.cuda_graphs)
    spec = getattr(config, "speculative", None)
    speculation = None
    if spec is not None:
        if spec.method == "draft_model" and setup.draft_cost_model is None:
            raise UserError("speculative method draft_model needs a draft cost model", field="speculative.draft_model")
        speculation = make_speculation(spec, stream, seed, target, setup.draft_cost_model)
    built = []
    for index in (i for i in indices for _ in range(setup.virtual_engines)):
        decode = SpeculativeDecode(speculation) if speculation is not None else None
        role = pool_role(index) if pool_role is not None else None
        state = ReplicaState(
            index, records, stream.prompt_tokens, stream.output_tokens, plan, setup.engine_kv_blocks,
            setup.block_size, holds_slots=policy.holds_slots, lags_outputs=lags_outputs(setup.engine_cpu), itl=itl,
            speculation=decode, pool=role,
        )  # fmt: skip
        if role is not None:
            role.bind(state)
        cost = SpeculativeCostModel(target, decode) if decode is not None else target
        built.append((state, cost))
    return built
