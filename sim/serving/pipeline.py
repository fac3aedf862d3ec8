"""Pipeline parallelism inside one replica: virtual engines, stages, and micro-batches between them.

A replica of P pipeline stages runs as vLLM V0 runs it (``vllm/engine/llm_engine.py``): P *virtual
engines*, each a scheduler with its own queue, running batch and 1/P of the KV blocks
(``Scheduler.__init__``: ``num_gpu_blocks //= pipeline_parallel_size``), each stepping on its own, so
up to P micro-batches are in the pipeline at once. A new request goes to the virtual engine with the
fewest unfinished requests, the first on ties (``_add_processed_request``: ``costs.index(min(costs))``
over ``get_num_unfinished_seq_groups``); it stays there, preempted or not, until it ends. Here each
virtual engine is a :class:`~sim.serving.state.ReplicaState` with its own worker and
:class:`PipelineReplica` is what the router and the clients see of the P of them.

A virtual engine's pass goes through the stages in order. A stage serves one micro-batch at a time
(a capacity-1 SimPy resource, first come first served); between stages the activations are handed on
(the transfer model's ``seconds(tokens)``), which holds neither stage. A stage's time is its share of
the pass (:meth:`PipelineSetup.stage_times`): the per-layer terms of the cost model's breakdown
(linear layers, attention, the all-reduces at TP > 1) by the stage's share of the layers, the LM head
on the last stage, and the engine's host time (the cost model's CPU overhead, or a policy's
``engine_cpu`` model) on the first, whose worker prepares the inputs. The gaps a stage waits between
micro-batches are the pipeline's bubbles; each stage pass is one iteration row (``stage``,
``virtual_engine`` columns). vLLM V1 keeps one scheduler over all the KV blocks and up to P batches in
flight (``EngineCore.batch_queue``, ``max_concurrent_batches``); batchsim models V0's split.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import simpy

from sim.serving.cuda_graphs import pass_breakdown
from sim.serving.state import CostTotals, ReplicaState

LAYERED_COMPONENTS = ("linear", "attention_prefill", "attention_decode", "all_reduce")
"""Cost-model terms every layer pays its share of (the rest: the LM head, on the last stage, and host time)."""


class ActivationLink(Protocol):
    """How long a micro-batch's activations take from one stage to the next."""

    def seconds(self, tokens: int) -> float:
        """Seconds to hand ``tokens`` tokens' activations on."""
        ...


@dataclass(frozen=True)
class PipelineSetup:
    """How one replica is cut into pipeline stages.

    Attributes:
        layer_shares: per stage, first stage first, its share of the model's layers (they add up to 1).
        transfer: the activation hand-off between consecutive stages.
    """

    layer_shares: tuple[float, ...]
    transfer: ActivationLink

    def __post_init__(self) -> None:
        if len(self.layer_shares) < 2 or min(self.layer_shares) <= 0:
            raise ValueError(f"a pipeline needs >= 2 stages with layers, got shares {self.layer_shares!r}")

    @classmethod
    def of(cls, layers: Sequence[int], transfer: ActivationLink) -> PipelineSetup:
        """The setup of stages holding ``layers`` layers each."""
        total = sum(layers)
        return cls(tuple(count / total for count in layers), transfer)

    @property
    def stages(self) -> int:
        """Pipeline stages (and virtual engines) per replica."""
        return len(self.layer_shares)

    def stage_times(self, parts: Mapping[str, float], pass_s: float) -> list[float]:
        """Each stage's time of a pass that takes ``pass_s`` on one GPU group, from its cost breakdown.

        Args:
            parts: seconds per cost-model component (``breakdown_from_totals_s``).
            pass_s: the whole pass's time as the engine charges it (host time included).
        """
        layered = sum(parts.get(name, 0.0) for name in LAYERED_COMPONENTS)
        head = parts.get("lm_head", 0.0)
        times = [share * layered for share in self.layer_shares]
        times[0] += max(0.0, pass_s - layered - head)  # host time: CPU overhead, engine CPU model
        times[-1] += head
        return times


class PipelineReplica:
    """One pipeline-parallel replica as the router and the clients see it: its virtual engines.

    Args:
        engines: the replica's virtual engines (same ``index``, 1/P of the KV blocks each).
    """

    def __init__(self, engines: Sequence[ReplicaState]) -> None:
        self.engines = list(engines)
        self.index = self.engines[0].index
        # prefix_affinity reads the request lengths off a replica.
        self._prompt, self._output = self.engines[0]._prompt, self.engines[0]._output
        self._engine_of: dict[int, int] = {}
        self.last_engine = 0
        """The virtual engine the last request sent here went to (the one to wake)."""

    @property
    def waiting_count(self) -> int:
        """Queued requests over all virtual engines (what admission control counts)."""
        return sum(engine.waiting_count for engine in self.engines)

    @property
    def outstanding_tokens(self) -> int:
        """Tokens still to compute or generate over all virtual engines (least_outstanding routing)."""
        return sum(engine.outstanding_tokens for engine in self.engines)

    def enqueue(self, rid: int, now_s: float) -> None:
        """Queue ``rid`` on the virtual engine with the fewest unfinished requests (vLLM V0)."""
        costs = [engine.waiting_count + engine.running_count for engine in self.engines]
        chosen = costs.index(min(costs))
        self._engine_of[rid] = self.last_engine = chosen
        self.engines[chosen].enqueue(rid, now_s)

    def abandon(self, rid: int, now_s: float) -> None:
        """The client gave up on ``rid``: its virtual engine drops or cancels it."""
        self.engines[self._engine_of[rid]].abandon(rid, now_s)

    def cached_prefix_blocks(self, rid: int) -> int:
        """Leading blocks of ``rid``'s prompt that some virtual engine caches now."""
        return max(engine.cached_prefix_blocks(rid) for engine in self.engines)


StageRecorder = Callable[..., None]
"""``record(stage, virtual_engine, replica, start_s, duration_s, batch_size, prefill_tokens, decode_tokens,
kv_blocks_used, prefill_attn_work, decode_kv_tokens, prefill_context_tokens)``: one stage pass."""


class Stages:
    """The stages of one replica, shared by its virtual engines' workers.

    Args:
        env: the SimPy environment.
        setup: the stages' layer shares and the hand-off between them.
        cost_model: gives each pass's breakdown (:func:`~sim.serving.cuda_graphs.pass_breakdown`).
        record: writes one iteration row per stage pass.
        replica: the replica's index (the rows' ``replica``).
    """

    def __init__(
        self, env: simpy.Environment, setup: PipelineSetup, cost_model: Any, record: StageRecorder, replica: int
    ) -> None:
        breakdown = pass_breakdown(cost_model)
        if breakdown is None:
            raise TypeError(f"pipeline stages need a cost model with a breakdown, got {type(cost_model).__name__}")
        self._env, self._setup, self._record, self._replica = env, setup, record, replica
        self._breakdown = breakdown
        self._resources = [simpy.Resource(env, capacity=1) for _ in range(setup.stages)]

    def for_engine(self, virtual_engine: int) -> Callable[..., Generator[simpy.Event, Any, None]]:
        """The pass runner of one virtual engine's worker: ``run(totals, pass_s, kv_blocks_used, context)``."""

        def run(totals: CostTotals, pass_s: float, kv_blocks_used: int, context_tokens: int):  # noqa: ANN202
            return self.run_pass(virtual_engine, totals, pass_s, kv_blocks_used, context_tokens)

        return run

    def run_pass(
        self, virtual_engine: int, totals: CostTotals, pass_s: float, kv_blocks_used: int, context_tokens: int
    ) -> Generator[simpy.Event, Any, None]:
        """Take one micro-batch through every stage in order; it ends when the last stage is done."""
        env, setup = self._env, self._setup
        prefill, pieces, work, decodes, kv_tokens = totals
        times = setup.stage_times(self._breakdown(*totals), pass_s)
        hop_s = setup.transfer.seconds(prefill + decodes)
        last = len(times) - 1
        for stage, stage_s in enumerate(times):
            with self._resources[stage].request() as turn:
                yield turn
                start_s = env.now
                yield env.timeout(stage_s)
            self._record(
                stage, virtual_engine, self._replica, start_s, stage_s, pieces + decodes, prefill, decodes,
                kv_blocks_used, work, kv_tokens, context_tokens,
            )  # fmt: skip
            if stage < last:
                yield env.timeout(hop_s)
