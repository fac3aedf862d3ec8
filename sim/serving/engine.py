"""The engine's entry point: one policy on one request stream, simulated with SimPy.

``simulate`` wires the parts for one run: per replica a replica state with its memory
model and features (:func:`sim.serving.setup.build_replicas`) and a worker process; one
router; the clients (arrivals, admission, retries, deadlines). A pipeline-parallel replica is
its virtual engines, each with its own state and worker, sharing the replica's stages, behind
one :class:`~sim.serving.pipeline.PipelineReplica` the router and clients see. Then it runs the
event loop to exhaustion and returns the request and iteration tables. Semantics, metric
definitions and modelling assumptions are in ``docs/engine.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import simpy

from sim.checks import check_requests_fit
from sim.metrics.itl import ITLRecorder, empty_itl_frame
from sim.metrics.pass_runs import PassRuns
from sim.metrics.records import IterationRecords, RequestRecords
from sim.policies.base import Policy
from sim.policies.table import make_policy
from sim.serving.clients import Clients
from sim.serving.fast.fleet import Fleet
from sim.serving.fast.paths import build_kernels, fast_path_refusal
from sim.serving.pipeline import PipelineReplica, Stages
from sim.serving.router import make_router
from sim.serving.setup import EngineSetup, ReplicaSetup, build_replicas
from sim.serving.worker import Worker
from sim.workload.stream import RequestStream

__all__ = ["Engine", "EngineSetup", "ReplicaSetup", "SimOutput", "passed_progress_mark", "run_to_end", "simulate"]

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
    stream: RequestStream, policy: Any, setup: EngineSetup, *, progress: ProgressCallback | None = None
) -> SimOutput:
    """Simulate serving ``stream`` under one batching policy.

    Args:
        stream: the requests (send times or closed-loop clients, lengths).
        policy: a policy config from :mod:`sim.config` (``StaticPolicyConfig``, ...).
        setup: pricing, KV capacity, features, replicas, router and clients
            (:class:`~sim.serving.setup.EngineSetup`).
        progress: called as ``progress(sim_time_s, finished_requests)`` every few
            thousand forward passes and once at the end.

    Returns:
        SimOutput with the requests and iterations tables.

    Raises:
        UserError: bad sizes, unknown router or policy, or a request that could never
            fit in one replica's KV cache.
    """
    return Engine(stream, policy, setup, progress=progress).run()


class Engine:
    """One run's wiring (the composition root); ``run()`` may be called once.

    Same arguments as :func:`simulate`, plus ``audit_every`` (check replica invariants
    every this many passes per replica). After ``run()`` the records and replica states
    stay readable, which tests use (e.g. ``records.generated_tokens``).

    Attributes:
        path: ``fast`` or ``general``: which engine runs the replicas (:mod:`sim.serving.fast.paths`).
    """

    def __init__(
        self,
        stream: RequestStream,
        policy: Any,
        setup: EngineSetup,
        *,
        progress: ProgressCallback | None = None,
        audit_every: int = 4096,
    ) -> None:
        replica = setup.replica
        self.policy: Policy = make_policy(policy)
        self.kv_blocks = replica.engine_kv_blocks
        check_requests_fit(stream, self.policy.memory, self.kv_blocks, replica.block_size, setup.refuse)
        self.stream = stream
        self.setup = setup
        self.env = simpy.Environment()
        self.records = RequestRecords(len(stream))
        # The two paths fill these with their own objects, alike in what the rest of the engine reads (records,
        # routable replicas, worker counters): typed loosely here rather than by a protocol per attribute.
        self.iterations: Any = IterationRecords(pipeline=replica.pipeline is not None)
        self.states: list[Any] = []
        self.replicas: Sequence[Any] = []
        self.workers: list[Any] = []
        self.itl = ITLRecorder()
        self._progress = progress
        self._passes = 0
        self.path = "general" if fast_path_refusal(self.policy, policy, setup) else "fast"
        if self.path == "fast":
            self._build_fast(setup, audit_every)
        else:
            self._build_general(policy, setup, audit_every)

    def _clients(self) -> Clients:
        setup = self.setup
        return Clients(
            self.env,
            self.stream,
            self.records,
            self.replicas,
            self._wake,
            make_router(setup.router, self.replicas, setup.seed, load_cap=setup.router_load_cap),
            setup.client,
            setup.admission,
            refuse=setup.refuse,
            frontend=setup.frontend,
        )

    def _build_fast(self, setup: EngineSetup, audit_every: int) -> None:
        """Replicas as kernels driven by one fleet (:mod:`sim.serving.fast`), passes recorded as runs."""
        self.iterations = PassRuns(setup.replicas)
        self.states, pricer = build_kernels(self.stream, self.policy, setup.replica, self.records, self.itl,
                                           setup.replicas)  # fmt: skip
        self.replicas = self.states
        self.clients = self._clients()
        fleet = Fleet(
            self.env, self.iterations, on_completed=self.clients.completed,
            on_iteration=self._tick if self._progress is not None else None,
            inert=self.clients.completions_inert, audit_every=audit_every,
        )  # fmt: skip
        self.workers = [fleet.add(state, pricer) for state in self.states]

    def _build_general(self, policy: Any, setup: EngineSetup, audit_every: int) -> None:
        """Replica states and one SimPy worker process each (:mod:`sim.serving.worker`)."""
        replica = setup.replica
        built = build_replicas(
            self.stream, self.policy, policy, replica, self.records, self.itl, range(setup.replicas), seed=setup.seed
        )
        self.states = [state for state, _ in built]
        """Every scheduler's state: one per replica, or each replica's virtual engines in a row."""
        engines = replica.virtual_engines
        self.replicas = self.states if engines == 1 else self._pipeline_replicas(engines)
        self.clients = self._clients()
        self.workers = [
            Worker(
                self.env,
                state,
                self.policy,
                cost_model,
                self.iterations,
                on_completed=self.clients.completed,
                on_iteration=self._tick,
                audit_every=audit_every,
                engine_cpu=replica.engine_cpu,
                merge_decode_steps=replica.merge_decode_steps,
                completions_inert=self.clients.completions_inert,
                pipeline=runner,
            )
            for (state, cost_model), runner in zip(built, self._stage_runners(built, engines), strict=True)
        ]

    def _pipeline_replicas(self, engines: int) -> list[PipelineReplica]:
        """Each replica's virtual engines (consecutive states) behind one routable replica."""
        return [PipelineReplica(self.states[i : i + engines]) for i in range(0, len(self.states), engines)]

    def _stage_runners(self, built: list[tuple[Any, Any]], engines: int) -> list[Any]:
        """Per state, its worker's pass runner through its replica's shared stages (None without stages)."""
        pipeline = self.setup.replica.pipeline
        if pipeline is None:
            return [None] * len(built)
        runners = []
        for first in range(0, len(built), engines):
            state, cost_model = built[first]
            stages = Stages(self.env, pipeline, cost_model, self.iterations.append_stage, state.index)
            runners += [stages.for_engine(engine) for engine in range(engines)]
        return runners

    def run(self) -> SimOutput:
        """Run the event loop until every request has ended; return the records."""
        run_to_end(self.env, self.workers, self.clients, self._check_finished, self._progress)
        requests = self.records.to_frame(self.stream.prompt_tokens, self.stream.output_tokens)
        return SimOutput(requests, self.iterations.to_frame(self.kv_blocks), self.itl.to_frame())

    def _wake(self, replica: int) -> None:
        target = self.replicas[replica]
        if isinstance(target, PipelineReplica):  # the virtual engine the request went to
            self.workers[replica * len(target.engines) + target.last_engine].wake()
            return
        self.workers[replica].wake()

    def _tick(self, passes: int) -> None:
        before = self._passes
        self._passes += passes
        if self._progress is not None and passed_progress_mark(before, self._passes):
            self._progress(self.env.now, self.clients.finished)

    def _check_finished(self) -> None:
        unfinished = self.records.unfinished()
        if len(unfinished):
            raise RuntimeError(f"{len(unfinished)} requests never ended (first: {unfinished[:5].tolist()})")
        if self.clients.finished != len(self.stream):
            raise RuntimeError(f"{self.clients.finished} request endings for {len(self.stream)} requests")
        for state in self.states:
            state.audit()
            if state.running_count or state.blocks.used_blocks:
                raise RuntimeError(f"replica {state.index} still holds requests or KV after the run")


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
        worker.start()
    clients.start()
    env.run()
    check_finished()
    if progress is not None:
        progress(env.now, clients.finished)
