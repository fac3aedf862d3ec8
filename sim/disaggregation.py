"""Composition of a scenario's disaggregated deployment: pools, links, one run, one summary row.

:func:`simulate_disaggregated` sizes each pool (its GPU, TP degree and policy give its
KV blocks and cost model), builds the transfer model of the link and runs
:class:`sim.serving.disagg.DisaggEngine` on the scenario's request stream, the same
stream the colocated policies see. :func:`summarize_disaggregated` turns the records
into a ``summary.csv`` row labelled by ``disaggregation.name``, with the per-pool GPU
busy fractions and transfer-time percentiles filled in. :mod:`sim.runner` calls both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.config import DisaggregationConfig, PoolConfig
from sim.errors import UserError
from sim.hardware.all_reduce import AllReduceSpec
from sim.hardware.catalog import get_gpu
from sim.hardware.cost_model import load_cost_model
from sim.hardware.draft import draft_cost_models, draft_models, kv_with_draft
from sim.hardware.memory import KVBudget, kv_budget, kv_bytes_per_token
from sim.hardware.power import PowerModel
from sim.hardware.utilization import PassWork
from sim.metrics.energy import Pool
from sim.metrics.summary import percentile, summarize_run
from sim.resolve import ResolvedScenario, frontend_of, prefix_caching_on
from sim.serving.disagg import DisaggEngine, PoolSpec
from sim.serving.engine import ProgressCallback, SimOutput
from sim.serving.kv_link import TransferModel
from sim.serving.pricing import all_reduce_seconds
from sim.serving.setup import ReplicaSetup


@dataclass(frozen=True)
class ResolvedPool:
    """One pool with its derived values."""

    field: str  # "disaggregation.prefill" or "disaggregation.decode", for messages
    config: PoolConfig
    gpu: str
    kv: KVBudget
    spec: PoolSpec

    @property
    def num_gpus(self) -> int:
        """GPUs of the pool (replicas x TP)."""
        return self.config.replicas * self.config.tensor_parallel


def resolve_pool(resolved: ResolvedScenario, config: PoolConfig, field: str) -> ResolvedPool:
    """Size one pool: its KV budget, cost models and features; UserError naming the pool when it does not fit."""
    scenario, gpu = resolved.scenario, config.gpu or resolved.scenario.gpu
    policy, memory = config.policy, scenario.memory
    utilization = getattr(policy, "gpu_memory_utilization", None) or memory.gpu_memory_utilization
    engine_cpu = getattr(policy, "engine_cpu", None)
    cpu_overhead = scenario.cost.cpu_overhead and engine_cpu is None
    try:
        kv = kv_budget(
            resolved.model, get_gpu(gpu), config.tensor_parallel, gpu_memory_utilization=utilization,
            block_size=memory.block_size, activation_reserve_gb=memory.activation_reserve_gb,
            kv_blocks=memory.kv_blocks,
        )  # fmt: skip
        cost = load_cost_model(  # a MoE model's expert split applies to every pool's replicas too
            scenario.model, gpu, config.tensor_parallel, cpu_overhead=cpu_overhead,
            expert_parallel=scenario.expert_parallel, all_reduce=AllReduceSpec.of(policy),
        )  # fmt: skip
        drafts = draft_cost_models(
            [policy], resolved.model, gpu, config.tensor_parallel, cpu_overhead=scenario.cost.cpu_overhead
        )
        for draft in draft_models([policy], resolved.model).values():  # its weights and KV share the pool's GPUs
            kv = kv_with_draft(kv, draft, config.tensor_parallel)
    except UserError as exc:
        where = f"{field}.{exc.field}" if exc.field else field
        where = where.replace(f"{field}.policies[0]", f"{field}.policy")
        raise UserError(f"{where}: {str(exc).removeprefix(f'{exc.field}: ')}", field=where) from None
    replica = ReplicaSetup(
        cost_model=cost, kv_blocks=kv.num_blocks, block_size=kv.block_size, engine_cpu=engine_cpu,
        prefix_caching=prefix_caching_on(scenario, policy), draft_cost_model=drafts.get(policy.name),
        cuda_graphs=getattr(policy, "cuda_graphs", None),
    )  # fmt: skip
    return ResolvedPool(field, config, gpu, kv, PoolSpec(policy, replica, config.replicas))


def transfer_model(resolved: ResolvedScenario, config: DisaggregationConfig) -> TransferModel:
    """The KV transfer of this deployment: the larger per-GPU shard of the two pools over one GPU pair."""
    shard = max(
        kv_bytes_per_token(resolved.model, config.prefill.tensor_parallel),
        kv_bytes_per_token(resolved.model, config.decode.tensor_parallel),
    )
    link = config.link
    return TransferModel(
        shard, link.bytes_per_s, link.latency_s, resolved.model.num_layers, config.transfer == "layerwise"
    )


def check_pools_fit(resolved: ResolvedScenario, prefill: ResolvedPool, decode: ResolvedPool) -> None:
    """Every request's prompt fits a prefill replica and its whole KV a decode replica, or UserError."""
    from sim.checks import check_requests_fit
    from sim.policies import make_policy

    stream, skip = resolved.stream, resolved.over_length
    for pool, memory in ((prefill, "prompt"), (decode, make_policy(decode.config.policy).memory)):
        try:
            if memory == "prompt":
                _check_prompts_fit(stream.prompt_tokens, pool.kv, skip)
            else:
                check_requests_fit(stream, memory, pool.kv.num_blocks, pool.kv.block_size, skip)
        except UserError as exc:
            raise UserError(f"{pool.field} ({pool.num_gpus} GPUs of {pool.gpu}): {exc}", field=pool.field) from None


def _check_prompts_fit(prompt_tokens: np.ndarray, kv: KVBudget, skip: np.ndarray | None) -> None:
    tokens = np.where(skip, 0, prompt_tokens) if skip is not None else prompt_tokens
    worst = int(np.argmax(tokens)) if len(tokens) else 0
    need = -(-int(tokens[worst]) // kv.block_size) if len(tokens) else 0
    if need > kv.num_blocks:
        raise UserError(
            f"request {worst}'s prompt needs {need} KV blocks but a prefill replica has {kv.num_blocks}; "
            "raise the pool's tensor_parallel or pick a larger gpu"
        )


def simulate_disaggregated(
    resolved: ResolvedScenario, config: DisaggregationConfig, progress: ProgressCallback | None = None
) -> SimOutput:
    """Run the scenario's requests on the disaggregated deployment ``config``."""
    prefill = resolve_pool(resolved, config.prefill, "disaggregation.prefill")
    decode = resolve_pool(resolved, config.decode, "disaggregation.decode")
    if prefill.kv.block_size != decode.kv.block_size:  # pragma: no cover - one memory block for both
        raise UserError("both pools must use one KV block size", field="memory.block_size")
    check_pools_fit(resolved, prefill, decode)
    scenario = resolved.scenario
    engine = DisaggEngine(
        resolved.stream, prefill.spec, decode.spec, transfer_model(resolved, config),
        block_size=prefill.kv.block_size, router=scenario.router, client=scenario.client,
        admission=scenario.admission, seed=scenario.seed, progress=progress, refuse=resolved.over_length,
        frontend=frontend_of(scenario, config.prefill.policy),  # requests enter through the prefill pool's server
    )  # fmt: skip
    return engine.run()


def num_gpus(config: DisaggregationConfig) -> int:
    """GPUs of the whole disaggregated deployment."""
    return sum(pool.replicas * pool.tensor_parallel for pool in (config.prefill, config.decode))


def disaggregated_pools(resolved: ResolvedScenario, config: DisaggregationConfig) -> tuple[Pool, ...]:
    """The prefill and the decode pool, each with its GPU's pass work, power and price.

    The engine numbers the prefill replicas first (0..P-1), then the decode ones (P..P+D-1).
    """
    from sim.fleet import gpu_price

    pools, first = [], 0
    for pool in (config.prefill, config.decode):
        gpu = get_gpu(pool.gpu or resolved.scenario.gpu)
        pools.append(Pool(
            work=PassWork.of(resolved.model, gpu, pool.tensor_parallel), power=PowerModel.of(gpu),
            gpus_per_replica=pool.tensor_parallel, replicas=tuple(range(first, first + pool.replicas)),
            usd_per_gpu_hour=gpu_price(resolved.scenario, gpu),
        ))  # fmt: skip
        first += pool.replicas
    return tuple(pools)


def summarize_disaggregated(resolved: ResolvedScenario, config: DisaggregationConfig, out: SimOutput) -> dict[str, Any]:
    """The deployment's ``summary.csv`` row (MFU/MBU are NaN: the pools' GPUs differ; energy is per pool)."""
    from sim.fleet import mean_gpu_price

    scenario = resolved.scenario
    pools = disaggregated_pools(resolved, config)
    row = summarize_run(
        out.requests, out.iterations, scenario=scenario.name, policy=config.name, num_gpus=num_gpus(config),
        warmup_s=scenario.metrics.warmup_s, slo=scenario.slo, gpu_hour_usd=mean_gpu_price(pools),
        replicas=config.prefill.replicas + config.decode.replicas, itl=out.itl, pools=pools,
        input_price_ratio=scenario.input_price_ratio,
    )  # fmt: skip
    return row | pool_stats(out, config, float(row["duration_s"]), scenario.metrics.warmup_s)


def pool_stats(out: SimOutput, config: DisaggregationConfig, duration_s: float, warmup_s: float) -> dict[str, float]:
    """Per-pool GPU busy fractions and transfer-time percentiles (completed, post-warm-up requests)."""
    iterations, first_decode = out.iterations, config.prefill.replicas
    busy = iterations["duration_s"].to_numpy(dtype=float)
    in_decode = iterations["replica"].to_numpy() >= first_decode
    requests = out.requests
    measured = (requests["status"] == "completed").to_numpy() & (requests["arrival_s"] >= warmup_s).to_numpy()
    transfer = requests["kv_transfer_s"].to_numpy()[measured]
    return {
        "prefill_gpu_busy_frac": _busy(busy[~in_decode].sum(), duration_s, config.prefill.replicas),
        "decode_gpu_busy_frac": _busy(busy[in_decode].sum(), duration_s, config.decode.replicas),
        "kv_transfer_p50_s": percentile(transfer, 50),
        "kv_transfer_p99_s": percentile(transfer, 99),
    }


def _busy(busy_s: float, duration_s: float, replicas: int) -> float:
    return float(busy_s) / (duration_s * replicas) if duration_s > 0 else float("nan")


def facts(resolved: ResolvedScenario, config: DisaggregationConfig) -> dict[str, Any]:
    """Derived values of the deployment, for ``scenario.resolved.yaml``."""
    pools = {
        name: resolve_pool(resolved, pool, f"disaggregation.{name}")
        for name, pool in (("prefill", config.prefill), ("decode", config.decode))
    }
    model = transfer_model(resolved, config)
    return {
        "num_gpus": num_gpus(config),
        **{f"{n}_kv_blocks_per_replica": p.kv.num_blocks for n, p in pools.items()},
        **{f"{n}_cost_model": p.spec.replica.cost_model.label for n, p in pools.items()},  # type: ignore[attr-defined]
        "kv_bytes_per_token_per_gpu_pair": model.bytes_per_token,
        "link_gb_per_s": model.bytes_per_s / 1e9,
        "link_latency_us": model.latency_s * 1e6,
    }


def check_deployment(resolved: ResolvedScenario, config: DisaggregationConfig) -> None:
    """Both pools fit the model and every request, before anything is simulated (``validate`` and ``run``)."""
    check_pools_fit(
        resolved,
        resolve_pool(resolved, config.prefill, "disaggregation.prefill"),
        resolve_pool(resolved, config.decode, "disaggregation.decode"),
    )


def condense_disaggregated(
    resolved: ResolvedScenario, config: DisaggregationConfig, out: SimOutput, *, summary_only: bool
) -> tuple[dict[str, Any], Any, Any, int]:
    """(summary row, requests, kept iterations, k) as :func:`sim.runner._condense` keeps them.

    Per-pass MFU and MBU are NaN: the scenario's ``PassWork`` describes one GPU and TP degree,
    and the pools may use others. Each row's all-reduce time is priced by its own pool's cost model.
    """
    from sim.metrics.records import sample_every_kth, with_all_reduce_column

    row = summarize_disaggregated(resolved, config, out)
    price = _all_reduce_by_pool(resolved, config)
    if summary_only:
        empty = out.iterations.iloc[:0].copy()
        return row, out.requests.iloc[:0].copy(), with_all_reduce_column(empty.assign(mfu=np.nan, mbu=np.nan), price), 0
    iterations, every = sample_every_kth(out.iterations, resolved.scenario.metrics.max_iteration_rows)
    return row, out.requests, with_all_reduce_column(iterations.assign(mfu=np.nan, mbu=np.nan), price), every


def _all_reduce_by_pool(resolved: ResolvedScenario, config: DisaggregationConfig) -> Any:
    """All-reduce seconds of passes given in iteration-row order: prefill replicas come first, then decode ones."""
    prefill = resolve_pool(resolved, config.prefill, "disaggregation.prefill").spec.replica.cost_model
    decode = resolve_pool(resolved, config.decode, "disaggregation.decode").spec.replica.cost_model

    def price(tokens: np.ndarray, pieces: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        in_decode = replicas >= config.prefill.replicas
        return np.where(
            in_decode, all_reduce_seconds(decode, tokens, pieces), all_reduce_seconds(prefill, tokens, pieces)
        )

    return price
