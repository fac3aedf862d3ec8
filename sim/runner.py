"""Composition root: scenario in, :class:`RunResult` out, no file I/O.

``run`` wires every component in one place: :func:`sim.resolve.resolve` (catalog -> KV
budget -> cost model -> request stream), then one simulation per policy on that same
stream -> summaries. The CLI,
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

from sim.checks import check_policies_fit, warmup_warning
from sim.config import DisaggregationConfig, Scenario
from sim.errors import UserError, did_you_mean
from sim.fleet import colocated_pools, mean_gpu_price
from sim.io.scenario import load_scenario
from sim.metrics.benchmark import benchmark_record
from sim.metrics.estimate import warn_if_large
from sim.metrics.records import sample_every_kth, with_all_reduce_column
from sim.metrics.summary import summarize_run
from sim.policy_run import simulate_policy
from sim.resolve import ResolvedScenario, resolve
from sim.result import RunData
from sim.saturation import load_fraction
from sim.uncertainty.intervals import workload_seed_free
from sim.uncertainty.replicates import check_replicates, replicate_seed
from sim.uncertainty.trust import PolicyEvidence, policy_evidence, with_trust_columns

ProgressFactory = Callable[[str, int], Callable[[float, int], None] | None]


class RunResult(RunData):
    """:class:`sim.result.RunData` with ``save`` (the files ``python -m sim run`` writes) and
    its terminal and notebook display."""

    def save(
        self, out_dir: str | Path, *, plots: bool = True, trace_events: bool = False, json: bool = False,
        html: bool = False,
    ) -> Path:
        """Write every output file into ``out_dir`` atomically (see :mod:`sim.io.outputs`); with
        ``trace_events`` also ``trace.json`` (Chrome/Perfetto trace of the run), with ``json``
        ``benchmark.json`` (vLLM benchmark_serving's result keys, per policy), with ``html``
        ``report.html`` (one self-contained interactive page, needs ``plotly``)."""
        from sim.io.outputs import save_result

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
        blocks = kv.num_blocks // resolved.scenario.pipeline_parallel  # each virtual engine's share
        check_policies_fit(resolved.stream, [policy], blocks, kv.block_size, resolved.over_length)


def run(
    scenario: Scenario | str | Path,
    policies: Sequence[str] | None = None,
    progress: bool | ProgressFactory = False,
    *,
    summary_only: bool = False,
    load_frac: bool = True,
    replicates: int = 1,
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
        load_frac: measure each policy's ``load_frac`` (a capacity replay: a second simulation);
            False leaves it NaN, for searches that read only latencies and costs.
        replicates: K seeds to run the scenario under (:mod:`sim.uncertainty.replicates`): replicate 0 is the
            scenario's seed and gives the records; with K > 1 every headline figure is the mean over the K
            replicates and its interval their spread (the other replicates keep only their summaries).

    Returns:
        RunResult with summary (its trust columns appended: :mod:`sim.uncertainty.trust`), per-request and
        (sampled) per-iteration tables.

    Raises:
        UserError: a bad scenario or policy name, an unservable request, or ``replicates`` outside 1..1000.
    """
    count = check_replicates(replicates)
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    selected = select_policies(scenario, policies)
    resolved = resolve(scenario)
    check_servable(resolved, selected)
    warn_if_large(resolved, [p for p in selected if not isinstance(p, DisaggregationConfig)], summary_only=summary_only)
    factory = _progress_factory(progress)
    started = time.perf_counter()
    fixed = workload_seed_free(resolved)
    per_policy = {
        p.name: _run_policy(resolved, p, factory, index=k, count=len(selected), summary_only=summary_only,
                            load_frac=load_frac, workload_fixed=fixed)
        for k, p in enumerate(selected, start=1)
    }  # fmt: skip
    others = [_replicate_summary(scenario, [p.name for p in selected], k, load_frac) for k in range(1, count)]
    runtime_s = time.perf_counter() - started
    result = _assemble(resolved, per_policy, runtime_s, summary_only=summary_only, replicates=others)
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


def _run_policy(
    resolved: ResolvedScenario,
    policy: Any,
    factory: Callable[..., Any] | None,
    *,
    index: int,
    count: int,
    summary_only: bool,
    load_frac: bool = True,
    workload_fixed: bool | None = None,
) -> _Kept:
    """Simulate one policy and condense its records, its summary row with ``load_frac`` (when measured), and
    (given ``workload_fixed``) what its trust columns need from its full records."""
    out = _simulate_policy(resolved, policy, factory, index=index, count=count)
    # its capacity replay, while the records live
    fraction = load_fraction(resolved, policy, out.requests) if load_frac else float("nan")
    kept = _condense(resolved, policy.name, out, summary_only=summary_only)
    kept.row["load_frac"] = fraction
    if workload_fixed is not None:
        kept.evidence[policy.name] = policy_evidence(resolved, policy, out, kept.row, workload_fixed)
    return kept


def _replicate_summary(scenario: Scenario, names: list[str], replicate: int, load_frac: bool) -> pd.DataFrame:
    """The summary rows of ``names`` under replicate ``replicate``'s seed (records dropped as they are summarized)."""
    other = scenario.replace(seed=replicate_seed(scenario.seed, replicate))
    resolved = resolve(other)
    selected = select_policies(other, names)
    rows = [_run_policy(resolved, p, None, index=k, count=len(selected), summary_only=True, load_frac=load_frac).row
            for k, p in enumerate(selected, start=1)]  # fmt: skip
    return pd.DataFrame(rows)


def _simulate_policy(
    resolved: ResolvedScenario, policy: Any, factory: Callable[..., Any] | None, *, index: int, count: int
) -> Any:
    callback = factory(policy.name, len(resolved.stream), index=index, count=count) if factory else None
    try:
        return simulate_policy(resolved, policy, callback)
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
    evidence: dict[str, PolicyEvidence] = field(default_factory=dict)  # its trust columns' inputs (replicate 0)


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
    pools = colocated_pools(resolved)
    row = summarize_run(
        out.requests,
        out.iterations,
        scenario=scenario.name,
        policy=name,
        num_gpus=resolved.num_gpus,
        warmup_s=scenario.metrics.warmup_s,
        slo=scenario.slo,
        gpu_hour_usd=mean_gpu_price(pools),
        replicas=resolved.workers,
        itl=out.itl,
        work=resolved.pass_work,
        pools=pools,
        input_price_ratio=scenario.input_price_ratio,
    )
    metrics = scenario.metrics
    benchmark = benchmark_record(
        row, out.requests, out.itl, percentiles=metrics.percentiles, warmup_s=metrics.warmup_s
    )
    cost = resolved.policy_cost_model(next(p for p in scenario.policies if p.name == name))

    def price(tokens: np.ndarray, pieces: np.ndarray, _replicas: np.ndarray) -> np.ndarray:
        return cost.all_reduce_s(tokens, pieces)  # every replica runs the same cost model

    shares = resolved.pipeline.layer_shares if resolved.pipeline is not None else None
    if summary_only:  # empty copies: a zero-row view would keep the full arrays alive
        empty = resolved.pass_work.add_columns(out.iterations.iloc[:0].copy())
        return _Kept(row, out.requests.iloc[:0].copy(), with_all_reduce_column(empty, price, shares), 0, benchmark)
    iterations, every = sample_every_kth(out.iterations, metrics.max_iteration_rows)
    # Per-pass MFU, MBU and all-reduce time only on the kept rows: the summary took its figures from all passes.
    kept = with_all_reduce_column(resolved.pass_work.add_columns(iterations), price, shares)
    return _Kept(row, out.requests, kept, every, benchmark)


def _assemble(
    resolved: ResolvedScenario, per_policy: dict[str, _Kept], runtime_s: float, *, summary_only: bool = False,
    replicates: list[pd.DataFrame] | None = None,
) -> RunResult:
    scenario = resolved.scenario
    summary = pd.DataFrame([kept.row for kept in per_policy.values()])
    evidence = {name: found for kept in per_policy.values() for name, found in kept.evidence.items()}
    if evidence:
        summary = with_trust_columns(summary, evidence, replicates or [])
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
