"""The engine's entry point: one policy on one request stream, simulated with SimPy.

``simulate`` wires the parts for one run: per replica a block allocator, a replica
state and a worker process; one router; the clients (arrivals, admission, retries,
deadlines). Then it runs the event loop to exhaustion and returns the request and
iteration tables. Semantics, metric definitions and modelling assumptions are in
``docs/engine.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.checks import check_requests_fit
from sim.config import AdmissionConfig, ClientConfig, EngineCPUConfig, FrontendConfig
from sim.errors import UserError
from sim.metrics.itl import ITLRecorder, empty_itl_frame
from sim.metrics.records import IterationRecords, RequestRecords
from sim.policies import make_policy
from sim.policies.base import Policy
from sim.serving.clients import Clients
from sim.serving.kv_cache import BlockAllocator
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.serving.prefix_state import prefix_state
from sim.serving.router import make_router
from sim.serving.speculative import SpeculativeCostModel, SpeculativeReplicaState, make_speculation
from sim.serving.state import ReplicaState
from sim.serving.worker import CostModelLike, Worker
from sim.workload.stream import RequestStream

ProgressCallback = Callable[[float, int], None]
PROGRESS_EVERY_ITERATIONS = 4096


def passed_progress_mark(passes_before: int, passes_now: int) -> bool:
    """Whether the pass count went past a multiple of ``PROGRESS_EVERY_ITERATIONS`` (time to report)."""
    return passes_before // PROGRESS_EVERY_ITERATIONS != passes_now // PROGRESS_EVERY_ITERATIONS


@dataclass(frozen=True)
class SimOutput:
    """Records of one simulated run.

    Attributes:
        requests: one row per request, in request-id order (columns
            ``sim.metrics.records.REQUEST_COLUMNS``).
        iterations: one row per forward pass, all of them, by start time (columns
            ``sim.metrics.records.ITERATION_COLUMNS``).
        itl: inter-token gaps between consecutive stream events of a request, weighted
            (columns ``sim.metrics.itl.ITL_COLUMNS``: gap_s, count); statistics with
            ``sim.metrics.itl.itl_stats(itl["gap_s"], itl["count"])``.
    """

    requests: pd.DataFrame
    iterations: pd.DataFrame
    itl: pd.DataFrame = field(default_factory=empty_itl_frame)


def simulate(
    stream: RequestStream,
    policy: Any,
    cost_model: CostModelLike,
    *,
    kv_blocks: int,
    block_size: int,
    replicas: int = 1,
    router: str = "round_robin",
    client: ClientConfig | None = None,
    admission: AdmissionConfig | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    refuse: np.ndarray | None = None,
    engine_cpu: EngineCPUConfig | None = None,
    frontend: FrontendConfig | None = None,
    draft_cost_model: CostModelLike | None = None,
    merge_decode_steps: bool = True,
    prefix_caching: bool = False,
    router_load_cap: float = 1.5,
) -> SimOutput:
    """Simulate serving ``stream`` under one batching policy.

    Args:
        stream: the requests (send times or closed-loop clients, lengths).
        policy: a policy config from :mod:`sim.config` (``StaticPolicyConfig``, ...).
        cost_model: prices each forward pass (``time_from_totals_s``).
        kv_blocks: KV capacity of each replica, in blocks.
        block_size: tokens per KV block.
        replicas: independent GPU workers behind the router.
        router: ``round_robin``, ``least_outstanding`` or ``random``.
        client: client timeouts and retries (None: patient clients).
        admission: queue limit per replica (None: unbounded).
        seed: seeds the ``"router"`` stream (random router).
        progress: called as ``progress(sim_time_s, finished_requests)`` every few
            thousand forward passes and once at the end.
        refuse: requests the server refuses when they are sent (True: rejected, e.g. longer
            than max_model_len, HTTP 400); they never reach a replica and are not retried.
        frontend: the API front end every send passes before the router (None: none).
        engine_cpu: the engine CPU-time model added to every pass (a policy's
            ``engine_cpu``); then ``cost_model`` should price GPU time only
            (``load_cost_model(..., cpu_overhead=False)``). None: the cost model's time only.
        prefix_caching: cache and share full prompt blocks (paged-memory policies only; ignored
            for reserve-memory ones, which never share KV).
        router_load_cap: the ``prefix_affinity`` router's load cap (a multiple of the mean).

    Returns:
        SimOutput with the requests and iterations tables.

    Raises:
        UserError: bad sizes, unknown router or policy, or a request that could never
            fit in one replica's KV cache.
    """
    engine = Engine(
        stream,
        policy,
        cost_model,
        kv_blocks=kv_blocks,
        block_size=block_size,
        replicas=replicas,
        router=router,
        client=client,
        admission=admission,
        seed=seed,
        progress=progress,
        refuse=refuse,
        frontend=frontend,
        engine_cpu=engine_cpu,
        draft_cost_model=draft_cost_model,
        merge_decode_steps=merge_decode_steps,
        prefix_caching=prefix_caching,
        router_load_cap=router_load_cap,
    )
    return engine.run()


class Engine:
    """One run's wiring (the composition root); ``run()`` may be called once.

    Same arguments as :func:`simulate`, plus ``audit_every`` (check replica invariants
    every this many passes per replica). After ``run()`` the records and replica states
    stay readable, which tests use (e.g. ``records.generated_tokens``).
    """

    def __init__(
        self,
        stream: RequestStream,
        policy: Any,
        cost_model: CostModelLike,
        *,
        kv_blocks: int,
        block_size: int,
        replicas: int = 1,
        router: str = "round_robin",
        client: ClientConfig | None = None,
        admission: AdmissionConfig | None = None,
        seed: int = 0,
        progress: ProgressCallback | None = None,
        audit_every: int = 4096,
        refuse: np.ndarray | None = None,
        engine_cpu: EngineCPUConfig | None = None,
        frontend: FrontendConfig | None = None,
        draft_cost_model: CostModelLike | None = None,
        merge_decode_steps: bool = True,
        prefix_caching: bool = False,
        router_load_cap: float = 1.5,
    ) -> None:
        _check_sizes(kv_blocks, block_size, replicas, cost_model)
        self.policy: Policy = make_policy(policy)
        check_requests_fit(stream, self.policy.memory, kv_blocks, block_size, refuse)
        self.stream = stream
        self.env = simpy.Environment()
        self.records = RequestRecords(len(stream))
        self.iterations = IterationRecords()
        self.itl = ITLRecorder()
        self.kv_blocks = kv_blocks
        reserve = stream.max_output_tokens if self.policy.memory == "reserve" else None
        caching = prefix_caching and self.policy.memory == "paged"
        state_class, cost_models = _speculative_parts(policy, stream, seed, cost_model, draft_cost_model)
        if caching and state_class is not ReplicaState:
            raise UserError(
                f"policy '{policy.name}': speculative decoding and prefix caching cannot be combined yet; "
                "turn one of them off (memory.prefix_caching / the policy's prefix_caching, or speculative)",
                field="speculative",
            )
        self.states = [
            (prefix_state(stream, self.records) if caching else state_class)(
                i,
                self.records,
                stream.prompt_tokens,
                stream.output_tokens,
                (PrefixCacheAllocator if caching else BlockAllocator)(kv_blocks, block_size),
                reserve_output_tokens=reserve,
                holds_slots=self.policy.holds_slots,
                whole_prompt=getattr(self.policy, "allocates_whole_prompt", False),
                itl=self.itl,
            )
            for i in range(replicas)
        ]
        self.clients = Clients(
            self.env,
            stream,
            self.records,
            self.states,
            self._wake,
            make_router(router, self.states, seed, load_cap=router_load_cap),
            client,
            admission,
            refuse=refuse,
            frontend=frontend,
        )
        self.workers = [
            Worker(
                self.env,
                state,
                self.policy,
                cost_models(state),
                self.iterations,
                on_completed=self.clients.completed,
                on_iteration=self._tick,
                audit_every=audit_every,
                engine_cpu=engine_cpu,
                merge_decode_steps=merge_decode_steps,
                completions_inert=self.clients.completions_inert,
            )
            for state in self.states
        ]
        self._progress = progress
        self._passes = 0

    def run(self) -> SimOutput:
        """Run the event loop until every request has ended; return the records."""
        run_to_end(self.env, self.workers, self.clients, self._check_finished, self._progress)
        requests = self.records.to_frame(self.stream.prompt_tokens, self.stream.output_tokens)
        return SimOutput(requests, self.iterations.to_frame(self.kv_blocks), self.itl.to_frame())

    def _wake(self, replica: int) -> None:
        self.workers[replica].wake()

    def _tick(self, passes: int) -> None:
        before = self._passes
        self._passes += passes
        if self._progress is not None and passed_progress_mark(before, self._passes):
            self._progress(self.env.now, self.clients.finished)

    def _check_finished(self) -> None:
        unfinished = self.records.unfinished()
        if len(unfinished):
            raise RuntimeError(
                f"{len(unfinished)} requests never ended (first: {unfinished[:5].tolist()})"
            )
        if self.clients.finished != len(self.stream):
            raise RuntimeError(
                f"{self.clients.finished} request endings for {len(self.stream)} requests"
            )
        for state in self.states:
            state.audit()
            if state.running_count or state.blocks.used_blocks:
                raise RuntimeError(
                    f"replica {state.index} still holds requests or KV after the run"
                )


def _speculative_parts(
    policy: Any, stream: RequestStream, seed: int, cost_model: CostModelLike, draft: CostModelLike | None
) -> tuple[Callable[..., ReplicaState], Callable[[ReplicaState], CostModelLike]]:
    """The replica-state class and per-replica cost model: plain ones, or speculative ones when
    the policy sets ``speculative`` (then a replica's cost adds its drafting)."""
    config = getattr(policy, "speculative", None)
    if config is None:
        return ReplicaState, lambda state: cost_model
    if config.method == "draft_model" and draft is None:
        raise UserError("speculative method draft_model needs a draft cost model", field="speculative.draft_model")
    speculation = make_speculation(config, stream, seed, cost_model, draft)

    def state_class(*args: Any, **kwargs: Any) -> ReplicaState:
        return SpeculativeReplicaState(*args, speculation=speculation, **kwargs)

    def cost_models(state: ReplicaState) -> CostModelLike:
        assert isinstance(state, SpeculativeReplicaState)
        return SpeculativeCostModel(cost_model, state)

    return state_class, cost_models


def run_to_end(
    env: simpy.Environment,
    workers: Sequence[Worker],
    clients: Clients,
    check_finished: Callable[[], None],
    progress: ProgressCallback | None,
) -> None:
    """Start every worker and the clients, run until no event is left, check that every
    request ended, and report the final progress (one engine lifecycle, every composition)."""
    for worker in workers:
        env.process(worker.run())
    clients.start()
    env.run()
    check_finished()
    if progress is not None:
        progress(env.now, clients.finished)


def _check_sizes(kv_blocks: int, block_size: int, replicas: int, cost_model: Any) -> None:
    for name, value in (
        ("kv_blocks", kv_blocks),
        ("block_size", block_size),
        ("replicas", replicas),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UserError(f"{name} must be an integer >= 1, got {value!r}", field=name)
    if not callable(getattr(cost_model, "time_from_totals_s", None)):
        raise UserError(
            f"cost model {type(cost_model).__name__} has no time_from_totals_s(...) method"
        )
