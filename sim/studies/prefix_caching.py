"""``results/prefix_caching.md`` and ``.png``: prefix caching on the Mooncake conversation trace.

:func:`write_prefix_report` runs ``scenarios/prefix/mooncake_conversation.yaml`` on the
first :data:`REPORT_REQUESTS` requests of the trace (its first ~10 minutes) with caching
off and on, under round robin and prefix-affinity routing, then sweeps ``memory.kv_blocks``
over :data:`KV_SIZES` for the hit-rate-vs-cache-size curve, drawn against the reuse bound of
an unbounded cache computed from the hash ids. Both rules keep the report under a minute on
two cores (about 30 s).
Skipped, with one logged line, when the trace is not on this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from sim.errors import MissingDataError
from sim.io.outputs import atomic_file

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "prefix" / "mooncake_conversation.yaml"
REPORT_REQUESTS = 2000
ROUTERS = ("round_robin", "prefix_affinity")
# KV blocks per replica swept (>= 512: the longest clipped request's blocks). Sizes under 4,000 are
# left out: there the cache thrashes (preemption recompute) and 600 and 1,500 blocks took 80 of the
# report's 110 s on two cores, for hit rates within 0.003 of 4,000's (0.0975 vs 0.1002). 100,000
# blocks (1.6M tokens, beyond an A100's memory) shows the curve nearing the unbounded-cache bound.
KV_SIZES = (4_000, 10_000, 25_000, 100_000)
TABLE_COLUMNS = {
    "policy": "policy", "router": "router", "prefix_hit_rate": "hit rate", "prefill_tokens_computed": "prefill tokens",
    "ttft_p50_s": "TTFT p50 (s)", "ttft_p99_s": "TTFT p99 (s)", "e2e_mean_s": "E2E mean (s)",
    "gpu_busy_frac": "GPU busy", "replica_busy_imbalance": "busy max/mean",
}  # fmt: skip


def write_prefix_report(out_dir: Path, plots: bool, log: Callable[[str], None] = print) -> None:
    """Run the prefix-caching scenarios and write ``prefix_caching.md`` (and ``.png``) into ``out_dir``."""
    from sim.io.scenario import load_scenario

    scenario = load_scenario(SCENARIO).replace(**{"workload.arrival.limit": REPORT_REQUESTS})
    try:
        runs = {router: _run(scenario.replace(router=router)) for router in ROUTERS}
    except MissingDataError as exc:
        log(f"skipped prefix caching report: {exc}")
        return
    summary = pd.concat([r.summary.assign(router=name) for name, r in runs.items()], ignore_index=True)
    sweep = _size_sweep(scenario)
    bound = _reuse_bound(runs["round_robin"])
    with atomic_file(out_dir / "prefix_caching.md") as tmp:
        tmp.write_text(_markdown(summary, runs, sweep, bound))
    if plots:
        from sim.report.plots import save_figure

        with atomic_file(out_dir / "prefix_caching.png") as tmp:
            save_figure(_figure(sweep, bound), tmp)
    log(f"wrote {out_dir / 'prefix_caching.md'}")


def _run(scenario: Any) -> Any:
    from sim.runner import run

    return run(scenario)


def _size_sweep(scenario: object) -> pd.DataFrame:
    """Hit rate of the caching policy with prefix-affinity routing per replica KV size."""
    from sim.runner import run

    rows = []
    for blocks in KV_SIZES:
        sized = scenario.replace(**{"memory.kv_blocks": blocks, "router": "prefix_affinity"})  # type: ignore[attr-defined]
        result = run(sized, policies=["vllm-v1-cache"], summary_only=True)
        rows.append({"kv_blocks": blocks, "prefix_hit_rate": float(result.summary["prefix_hit_rate"].iloc[0])})
    return pd.DataFrame(rows)


def _reuse_bound(result: object) -> float:
    """Hit rate of an unbounded cache serving the requests one after another (from the hash ids)."""
    from sim.resolve import resolve
    from sim.workload.content import reuse_bound_tokens

    resolved = resolve(result.scenario)  # type: ignore[attr-defined]
    stream = resolved.stream
    assert stream.content is not None
    tokens = reuse_bound_tokens(stream.content, stream.prompt_tokens, resolved.kv.block_size)
    return tokens / float(stream.prompt_tokens.sum())


def _per_replica(runs: dict[str, object]) -> pd.DataFrame:
    frames = []
    for router, result in runs.items():
        requests = result.requests  # type: ignore[attr-defined]
        on = requests[requests["policy"] == "vllm-v1-cache"]
        grouped = on.groupby("replica")[["cached_prompt_tokens", "prompt_tokens"]].sum()
        frames.append(pd.DataFrame({
            "router": router, "replica": grouped.index,
            "hit rate": (grouped["cached_prompt_tokens"] / grouped["prompt_tokens"]).round(3),
            "requests": on.groupby("replica").size().to_numpy(),
        }))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def _markdown(summary: pd.DataFrame, runs: dict[str, object], sweep: pd.DataFrame, bound: float) -> str:
    table = summary[list(TABLE_COLUMNS)].rename(columns=TABLE_COLUMNS)
    ttft = summary.pivot(index="router", columns="policy", values="ttft_p50_s").round(3)
    lines = [
        "# Prefix caching on the Mooncake conversation trace",
        "",
        f"First {REPORT_REQUESTS} requests of `conversation_trace.jsonl` (Mooncake FAST'25, Apache-2.0), "
        "Llama-3-8B on 4 x A100-80GB replicas, vLLM v1 preset (chunked prefill); prompts keep their first "
        "7,168 tokens (the 8k window), outputs at most 1,024. Regenerated by `python -m sim report`.",
        "",
        _md(table),
        "",
        "TTFT p50 (s), cache off vs on, by router:",
        "",
        _md(ttft.reset_index()),
        "",
        "Per-replica hit rates with caching on:",
        "",
        _md(_per_replica(runs)),
        "",
        "Hit rate against KV blocks per replica (prefix affinity); unbounded-cache reuse bound from the "
        f"hash ids: {bound:.3f}. Sizes under 4,000 blocks are not swept (to keep the report under a minute): "
        "there the cache thrashes and the hit rate stays at 4,000's (0.0975 at 600 and 1,500 blocks vs "
        "0.1002 at 4,000 when last measured); 100,000 blocks (1.6M tokens) is beyond an A100's memory and "
        "shows the approach to the bound.",
        "",
        _md(sweep),
        "",
    ]
    return "\n".join(lines)


def _md(frame: pd.DataFrame) -> str:
    from sim.report.tables import frame_markdown

    return frame_markdown(frame)


def _figure(sweep: pd.DataFrame, bound: float) -> Figure:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot(sweep["kv_blocks"] * 16 / 1000, sweep["prefix_hit_rate"], marker="o", label="measured (LRU)")
    ax.axhline(bound, linestyle="--", color="grey", label="unbounded cache (hash ids)")
    ax.set_xscale("log")
    ax.set_xlabel("KV cache per replica (thousand tokens)")
    ax.set_ylabel("prefix hit rate (cached / prompt tokens)")
    ax.set_title("Mooncake conversation trace, Llama-3-8B")
    ax.legend()
    return fig
