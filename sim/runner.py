"""Composition root: scenario in, :class:`RunResult` out, no file I/O.

``run`` wires every component in one place: catalog -> KV budget -> cost model ->
request stream -> one simulation per policy on that same stream -> summaries. The CLI,
the notebooks and sweeps all call this function, so they cannot disagree.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.checks import check_arrival_span, check_context_window, check_policies_fit, warmup_warning
from sim.config import DisaggregationConfig, Scenario
from sim.config.policies import RESERVE_KINDS
from sim.errors import UserError, did_you_mean
from sim.hardware.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from sim.hardware.cost_model import CostModel, load_cost_model
from sim.hardware.draft import draft_cost_models
from sim.hardware.memory import KVBudget, kv_budget
from sim.hardware.utilization import PassWork
from sim.metrics.benchmark import benchmark_record
from sim.metrics.estimate import warn_if_large
from sim.metrics.records import sample_every_kth
from sim.metrics.summary import summarize_run
from sim.scenario_io import load_scenario
from sim.serving.engine import simulate
from sim.workload.source import build_request_stream
from sim.workload.stream import RequestStream

ProgressFactory = Callable[[str, int], Callable[[float, int], None] | None]


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

    def kv_for(self, policy: Any) -> KVBudget:
        """The KV budget of one policy: the scenario's, unless it sets its own gpu_memory_utilization."""
        utilization = getattr(policy, "gpu_memory_utilization", None)
        if utilization is None or self.kv.pinned:
            return self.kv
        return _kv_budget(self.scenario, self.model, self.gpu, utilization)

    def engine_kwargs(self, policy: Any) -> dict[str, Any]:
        """Everything :func:`sim.serving.engine.simulate` needs beyond the stream and the policy."""
        scenario, kv, engine_cpu = self.scenario, self.kv_for(policy), getattr(policy, "engine_cpu", None)
        return {
            "cost_model": self.gpu_cost_model if engine_cpu is not None else self.cost_model,
            "kv_blocks": kv.num_blocks,
            "block_size": kv.block_size,
            "replicas": scenario.replicas,
            "router": scenario.router,
            "client": scenario.client,
            "admission": scenario.admission,
            "seed": scenario.seed,
            "refuse": self.over_length,
            "engine_cpu": engine_cpu,
            "frontend": scenario.frontend,
            "draft_cost_model": self.draft_cost_models.get(policy.name),
            "merge_decode_steps": scenario.engine.merge_decode_steps,
            "prefix_caching": prefix_caching_on(scenario, policy),
            "router_load_cap": scenario.router_load_cap,
        }

    @property
    def pass_work(self) -> PassWork:
        """FLOPs and HBM bytes per forward pass of this model on one replica (MFU and MBU)."""
        return PassWork.of(self.model, self.gpu, self.scenario.tensor_parallel)

    @property
    def num_gpus(self) -> int:
        """GPUs used by the whole deployment (replicas x tensor parallel)."""
        return self.scenario.replicas * self.scenario.tensor_parallel

    def facts(self) -> dict[str, Any]:
        """Derived values recorded next to the resolved scenario in the output folder."""
        return {
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
        }


@dataclass
class RunResult:
    """Outcome of one scenario: one summary row per policy plus per-request and per-iteration records.

    Attributes:
        scenario: the validated scenario that was run.
        facts: derived values (KV capacity, calibration used, ...).
        summary: one row per policy; columns as ``summary.csv``.
        requests: one row per request per policy (categorical ``policy`` column first).
        iterations: per policy every k-th forward pass, k = ``facts["iterations_every"][policy]``
            (1 up to ``metrics.max_iteration_rows`` passes; the summary used all of them).
        runtime_s: wall-clock seconds the simulations and summaries took.
        summary_only: ``requests`` and ``iterations`` are empty (right columns, no rows):
            only the summary was kept, so no per-request/per-iteration files or plots.
        benchmark: per policy, its figures under vLLM benchmark_serving's result keys
            (:mod:`sim.metrics.benchmark`; written as ``benchmark.json`` by ``run --json``).
    """

    scenario: Scenario
    facts: dict[str, Any]
    summary: pd.DataFrame
    requests: pd.DataFrame
    iterations: pd.DataFrame
    runtime_s: float = 0.0
    seed: int = field(default=0)
    summary_only: bool = False
    benchmark: dict[str, dict[str, Any]] = field(default_factory=dict)

    def save(
        self, out_dir: str | Path, *, plots: bool = True, trace_events: bool = False, json: bool = False,
        html: bool = False,
    ) -> Path:
        """Write every output file into ``out_dir`` atomically (see :mod:`sim.outputs`); with
        ``trace_events`` also ``trace.json`` (Chrome/Perfetto trace of the run), with ``json``
        ``benchmark.json`` (vLLM benchmark_serving's result keys, per policy), with ``html``
        ``report.html`` (one self-contained interactive page, needs ``plotly``)."""
        from sim.outputs import save_result

        return save_result(self, Path(out_dir), plots=plots, trace_events=trace_events, json=json, html=html)

    def __repr__(self) -> str:
        from sim.report.tables import summary_text

        head = f"RunResult({self.scenario.name!r}, seed={self.seed}, {len(self.summary)} policies, "
        head += f"{self.facts.get('requests')} requests, {self.runtime_s:.1f}s)"
        return head + "\n" + summary_text(self.summary)

    def _repr_html_(self) -> str:
        shown = [
            "policy",
            "completed",
            "throughput_rps",
            "output_tps",
            "ttft_p50_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "e2e_mean_s",
            "e2e_p99_s",
            "gpu_busy_frac",
            "preemptions",
        ]
        title = f"<b>{self.scenario.name}</b> — seed {self.seed}, {self.facts.get('model_hf_name')}, "
        title += f"cost model: {self.facts.get('cost_model')}"
        table = self.summary[[c for c in shown if c in self.summary]].to_html(index=False, float_format="%.4g")
        return f"<div>{title}{table}</div>"


def prefix_caching_on(scenario: Scenario, policy: Any) -> bool:
    """Whether ``policy`` runs with prefix caching: its own setting, else memory.prefix_caching,
    and never for reserve-memory kinds (static, continuous)."""
    own = getattr(policy, "prefix_caching", None)
    return bool(scenario.memory.prefix_caching if own is None else own) and policy.kind not in RESERVE_KINDS


def resolve(scenario: Scenario) -> ResolvedScenario:
    """Look up hardware, size the KV cache, load the cost model and draw the request stream.

    Raises:
        UserError: unknown model/GPU, the model does not fit, a workload file is missing or corrupt,
            or a request is longer than the context window (unless ``over_length: reject``).
            Whether each request fits the KV cache depends on the policy: :func:`check_servable`.
    """
    model = get_model(scenario.model)
    gpu = get_gpu(scenario.gpu)
    kv = _kv_budget(scenario, model, gpu, scenario.memory.gpu_memory_utilization)
    for policy in scenario.policies:  # a policy's own memory share must fit the model too
        share = getattr(policy, "gpu_memory_utilization", None)
        if share is not None:
            _kv_budget(scenario, model, gpu, share)
    cost_model = load_cost_model(
        scenario.model,
        scenario.gpu,
        scenario.tensor_parallel,
        cpu_overhead=scenario.cost.cpu_overhead,
        expert_parallel=scenario.expert_parallel,
    )
    gpu_cost_model = None
    if any(getattr(p, "engine_cpu", None) is not None for p in scenario.policies):
        gpu_cost_model = load_cost_model(
            scenario.model,
            scenario.gpu,
            scenario.tensor_parallel,
            cpu_overhead=False,
            expert_parallel=scenario.expert_parallel,
        )
    stream = build_request_stream(scenario.workload, scenario.seed, scenario.base_dir)
    check_arrival_span(stream)
    max_len, source = _context_window(scenario, model)
    over = check_context_window(stream, max_len, scenario.over_length, source)
    drafts = draft_cost_models(
        list(scenario.policies), model, scenario.gpu, scenario.tensor_parallel, cpu_overhead=scenario.cost.cpu_overhead
    )
    return ResolvedScenario(
        scenario, model, gpu, kv, cost_model, stream, max_len, over if over.any() else None, gpu_cost_model, drafts
    )


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


def check_servable(resolved: ResolvedScenario, policies: Sequence[Any]) -> None:
    """Raise UserError unless every request fits one replica's KV cache under each of ``policies``
    (and, with a ``disaggregation`` block, each of its pools)."""
    block = resolved.scenario.disaggregation
    if block is not None:
        from sim.disaggregation import check_deployment

        check_deployment(resolved, block)
    for policy in policies:
        if isinstance(policy, DisaggregationConfig):
            continue
        kv = resolved.kv_for(policy)
        check_policies_fit(resolved.stream, [policy], kv.num_blocks, kv.block_size, resolved.over_length)


def run(
    scenario: Scenario | str | Path,
    policies: Sequence[str] | None = None,
    progress: bool | ProgressFactory = False,
    *,
    summary_only: bool = False,
) -> RunResult:
    """Simulate every policy of a scenario on one common request stream.

    Args:
        scenario: a Scenario, or a path to a scenario YAML file.
        policies: names of the policies to run (default: all, in scenario order).
        progress: True for a progress bar on stderr (only on a terminal, once a run lasts ~2 s),
            or a factory ``(policy_name, total_requests) -> callback`` for custom reporting;
            a factory that accepts the keywords ``index`` and ``count`` also gets the policy's
            1-based position among the ``count`` policies of the run.
        summary_only: keep only the summary rows (each computed from all the records of its
            policy, which are dropped before the next policy runs): memory for one policy's
            records instead of all of them. Warns (``warnings.warn``) when
            :func:`sim.metrics.estimate.estimate_run` expects a large run without it.

    Returns:
        RunResult with summary, per-request and (sampled) per-iteration tables.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    selected = select_policies(scenario, policies)
    resolved = resolve(scenario)
    check_servable(resolved, selected)
    warn_if_large(resolved, [p for p in selected if not isinstance(p, DisaggregationConfig)], summary_only=summary_only)
    factory = _progress_factory(progress)
    started = time.perf_counter()
    per_policy = {
        p.name: _condense(
            resolved,
            p.name,
            _simulate_policy(resolved, p, factory, index=k, count=len(selected)),
            summary_only=summary_only,
        )
        for k, p in enumerate(selected, start=1)
    }
    runtime_s = time.perf_counter() - started
    result = _assemble(resolved, per_policy, runtime_s, summary_only=summary_only)
    message = warmup_warning(scenario.metrics.warmup_s, result.summary)
    if message:
        warnings.warn(message, UserWarning, stacklevel=2)
    return result


def select_policies(scenario: Scenario, names: Sequence[str] | None) -> list[Any]:
    """The scenario's policy configs named in ``names`` (all when None); UserError for unknown names."""
    entries: list[Any] = list(scenario.policies)  # a disaggregated deployment is one more row, after the policies
    if scenario.disaggregation is not None:
        entries.append(scenario.disaggregation)
    if not names:
        return entries
    known = [p.name for p in entries]
    for name in names:
        if name not in known:
            raise UserError(
                f"--policy '{name}' is not in the scenario{did_you_mean(name, known)}; policies: {', '.join(known)}"
            )
    return [p for p in entries if p.name in names]


def _simulate_policy(
    resolved: ResolvedScenario, policy: Any, factory: Callable[..., Any] | None, *, index: int, count: int
) -> Any:
    callback = factory(policy.name, len(resolved.stream), index=index, count=count) if factory else None
    try:
        if isinstance(policy, DisaggregationConfig):
            from sim.disaggregation import simulate_disaggregated

            return simulate_disaggregated(resolved, policy, callback)
        return simulate(resolved.stream, policy, progress=callback, **resolved.engine_kwargs(policy))
    finally:
        close = getattr(callback, "close", None)
        if close:
            close()


@dataclass(frozen=True)
class _Kept:
    """What stays of one policy's run once its full records are dropped."""

    row: dict[str, Any]  # its summary.csv row, computed from all the records
    requests: pd.DataFrame  # all rows, or none (summary only)
    iterations: pd.DataFrame  # every ``every``-th row, or none (summary only)
    every: int  # 0 when summary only
    benchmark: dict[str, Any]  # benchmark_serving-style figures, computed from all the records


def _condense(resolved: ResolvedScenario, name: str, out: Any, *, summary_only: bool) -> _Kept:
    """Summarize one policy's full records, then keep only what the result holds."""
    gc.collect()  # the finished engine's SimPy processes form reference cycles: free them now
    scenario = resolved.scenario
    block = scenario.disaggregation
    if block is not None and name == block.name:
        from sim.disaggregation import condense_disaggregated

        row, requests, iterations, every = condense_disaggregated(resolved, block, out, summary_only=summary_only)
        metrics = scenario.metrics
        benchmark = benchmark_record(row, out.requests, out.itl, percentiles=metrics.percentiles,
                                     warmup_s=metrics.warmup_s)  # fmt: skip
        return _Kept(row, requests, iterations, every, benchmark)
    row = summarize_run(
        out.requests,
        out.iterations,
        scenario=scenario.name,
        policy=name,
        num_gpus=resolved.num_gpus,
        warmup_s=scenario.metrics.warmup_s,
        slo=scenario.slo,
        gpu_hour_usd=scenario.gpu_hour_usd,
        replicas=scenario.replicas,
        itl=out.itl,
        work=resolved.pass_work,
    )
    metrics = scenario.metrics
    benchmark = benchmark_record(
        row, out.requests, out.itl, percentiles=metrics.percentiles, warmup_s=metrics.warmup_s
    )
    if summary_only:  # empty copies: a zero-row view would keep the full arrays alive
        empty = resolved.pass_work.add_columns(out.iterations.iloc[:0].copy())
        return _Kept(row, out.requests.iloc[:0].copy(), empty, 0, benchmark)
    iterations, every = sample_every_kth(out.iterations, metrics.max_iteration_rows)
    # Per-pass MFU and MBU only on the kept rows: the summary took its figures from all passes.
    return _Kept(row, out.requests, resolved.pass_work.add_columns(iterations), every, benchmark)


def _assemble(
    resolved: ResolvedScenario, per_policy: dict[str, _Kept], runtime_s: float, *, summary_only: bool = False
) -> RunResult:
    scenario = resolved.scenario
    summary = pd.DataFrame([kept.row for kept in per_policy.values()])
    requests = _stack({n: k.requests for n, k in per_policy.items()})
    iterations = _stack({n: k.iterations for n, k in per_policy.items()})
    facts = resolved.facts()
    block = scenario.disaggregation
    if block is not None and block.name in per_policy:
        from sim.disaggregation import facts as disaggregation_facts

        facts["disaggregation"] = disaggregation_facts(resolved, block)
    if summary_only:
        facts["summary_only"] = True
    else:
        facts["iterations_every"] = {n: k.every for n, k in per_policy.items()}
    benchmark = {name: kept.benchmark for name, kept in per_policy.items()}
    return RunResult(
        scenario, facts, summary, requests, iterations, runtime_s, scenario.seed, summary_only=summary_only,
        benchmark=benchmark,
    )


def _stack(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The frames one after another, a categorical ``policy`` column (the dict's keys) first.

    One frame is returned without copying its columns; several are concatenated once.
    """
    names = list(frames)
    parts = []
    for code, frame in enumerate(frames.values()):
        part = frame.copy(deep=False)  # shares the columns
        part.insert(0, "policy", pd.Categorical.from_codes(np.full(len(frame), code, dtype=np.int32), names))
        parts.append(part)
    if len(parts) == 1:
        return parts[0]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _progress_factory(progress: bool | ProgressFactory) -> Callable[..., Any] | None:
    """A factory called as ``(name, total, index=k, count=n)``, adapting two-argument ones."""
    if progress is False or progress is None:
        return None
    if not callable(progress):
        from sim.progress import RunProgress

        return RunProgress()  # a fresh clock per run, for the run-wide ETA
    import inspect

    try:
        inspect.signature(progress).bind("policy", 0, index=1, count=1)
    except (TypeError, ValueError):  # takes only (policy_name, total_requests), or has no signature to read
        return lambda name, total, index, count: progress(name, total)
    return progress
