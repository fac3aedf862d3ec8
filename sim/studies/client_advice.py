"""The client-side advice, quantified: ``results/client_advice.{csv,md}``.

Six experiments on Llama-3-8B / one A100-80GB with chat-like lengths, one function each
returning a tidy DataFrame: (a) closed-loop concurrency (the client semaphore), (b) a
fixed 8 s retry of HTTP 429 vs exponential backoff, (c) 60 s vs 300 s timeouts with long
outputs, (d) TTFT vs E2E as the latency a streaming user perceives, (e) sorting an offline
job's prompts by length, (f) ``max_tokens`` 512 vs 4096 for the same real outputs.
:func:`advice_table` turns them into one row per experiment with a verdict computed from
the numbers; :func:`write_client_advice` is the only function here that writes files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.report.tables import markdown_table

SEED = 12
POLICY_NAMES: tuple[str, ...] = ("static", "continuous", "vllm-v0")
CONCURRENCY: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
CHAT_PROMPT = {"kind": "lognormal", "median": 300, "sigma": 0.8, "min": 16, "max": 2048}
CHAT_OUTPUT = {"kind": "lognormal", "median": 180, "sigma": 0.8, "min": 8, "max": 512}
LONG_OUTPUT = {"kind": "lognormal", "median": 1000, "sigma": 0.7, "min": 64, "max": 4096}
ADVICE_COLUMNS: tuple[str, ...] = (
    "experiment", "advice", "metric", "baseline", "baseline_value", "advised", "advised_value", "supported", "verdict",
)  # fmt: skip
"""Columns of ``client_advice.csv``, in order."""


# --------------------------------------------------------------------------- helpers
def policy_configs(max_batch_size: int = 256) -> list[dict[str, Any]]:
    """Static, Orca-style continuous and vLLM-v0 paged batching with one batch-size cap."""
    return [
        {"name": "static", "kind": "static", "max_batch_size": max_batch_size},
        {"name": "continuous", "kind": "continuous", "max_batch_size": max_batch_size},
        {"name": "vllm-v0", "kind": "paged", "max_batch_size": max_batch_size},
    ]


def chat_scenario(
    name: str, arrival: dict[str, Any], requests: int, *, policies: Iterable[str] = POLICY_NAMES, **fields: Any
) -> Scenario:
    """A Llama-3-8B / A100-80GB scenario with chat-like lengths.

    Args:
        name: scenario name.
        arrival: the ``workload.arrival`` block.
        requests: number of requests.
        policies: names out of :data:`POLICY_NAMES` to include.
        **fields: further top-level fields; a ``workload`` dict here updates the workload block.
    """
    workload = {"requests": requests, "arrival": arrival, "prompt_tokens": CHAT_PROMPT, "output_tokens": CHAT_OUTPUT}
    workload |= fields.pop("workload", {})
    chosen = [p for p in policy_configs() if p["name"] in set(policies)]
    return Scenario(
        name=name, seed=SEED, model="llama-3-8b", gpu="a100-80gb", workload=workload, policies=chosen, **fields
    )


def _run(scenario: Scenario, *, summary_only: bool = True) -> Any:
    from sim.runner import run

    return run(scenario, summary_only=summary_only)


def max_in_flight(requests: pd.DataFrame) -> int:
    """Most requests between first send and end at any instant (an end frees its slot before a send)."""
    ends = requests["completion_s"].to_numpy()
    starts = requests["arrival_s"].to_numpy()
    times = np.concatenate([ends, starts])
    deltas = np.concatenate([-np.ones(len(ends)), np.ones(len(starts))])
    order = np.lexsort((deltas, times))
    return int(np.cumsum(deltas[order]).max()) if len(times) else 0


def capacity_rps(policy: str = "vllm-v0", clients: int = 128, requests: int = 256) -> float:
    """Saturated throughput of ``policy`` on the chat workload (closed loop, ``clients`` clients)."""
    scenario = chat_scenario("capacity", {"kind": "closed_loop", "clients": clients}, requests, policies=[policy])
    return float(_run(scenario).summary["throughput_rps"].iloc[0])


# --------------------------------------------------------------------------- (a) concurrency
def concurrency_sweep(clients: Iterable[int] = CONCURRENCY, requests_per_client: int = 4) -> pd.DataFrame:
    """(a) Closed-loop clients 1..128 under each policy: throughput, latency and the knee.

    Returns:
        One row per (policy, clients): throughput, output tok/s, E2E p50/p99, TTFT p50, the
        largest number of requests in flight, and ``knee`` (True on each policy's knee row,
        see :func:`knees`).
    """
    rows = []
    for n in clients:
        arrival = {"kind": "closed_loop", "clients": n}
        scenario = chat_scenario(f"clients-{n}", arrival, max(64, requests_per_client * n))
        result = _run(scenario, summary_only=False)
        for policy, requests in result.requests.groupby("policy", sort=False):
            row = result.summary.set_index("policy").loc[policy]
            rows.append(_concurrency_row(str(policy), n, row, requests))
    table = pd.DataFrame(rows)
    table["knee"] = table["clients"] == table["policy"].map(knees(table))
    return table


def _concurrency_row(policy: str, clients: int, row: pd.Series, requests: pd.DataFrame) -> dict[str, Any]:
    return {
        "policy": policy, "clients": clients, "throughput_rps": row["throughput_rps"], "output_tps": row["output_tps"],
        "e2e_mean_s": row["e2e_mean_s"], "e2e_p50_s": row["e2e_p50_s"], "e2e_p99_s": row["e2e_p99_s"],
        "ttft_p50_s": row["ttft_p50_s"], "max_in_flight": max_in_flight(requests),
    }  # fmt: skip


def knees(table: pd.DataFrame) -> dict[str, int]:
    """Per policy, the clients maximizing Kleinrock's power, throughput / mean E2E.

    In a closed loop without think time, Little's law makes power = throughput^2 / clients:
    past its maximum, each extra client adds proportionally more latency than throughput.
    """
    power = table["throughput_rps"] / table["e2e_mean_s"]
    best = power.groupby(table["policy"], sort=False).idxmax()
    return {str(policy): int(table.loc[index, "clients"]) for policy, index in best.items()}


# --------------------------------------------------------------------------- (b) retries
RETRY_VARIANTS: dict[str, dict[str, Any] | None] = {
    "no retry": None,
    "fixed 8 s": {"backoff": "fixed", "backoff_s": 8.0},
    "exponential 1 s": {"backoff": "exponential", "backoff_s": 1.0},
    "exponential 8 s": {"backoff": "exponential", "backoff_s": 8.0},
}


def retry_backoff(
    capacity: float | None = None, *, peak_s: float = 60.0, max_queue: int = 16, max_retries: int = 4
) -> pd.DataFrame:
    """(b) A load spike at 2x capacity then a lull; 429 past ``max_queue``; retry rules compared.

    Returns:
        One row per retry variant (vLLM-v0): completed, rejected, timed out, retries,
        goodput (requests within a 60 s E2E per second), E2E p50/p99.
    """
    cap = capacity or capacity_rps()
    phases = [{"duration_s": peak_s, "rate": 2.0 * cap}, {"duration_s": 3 * peak_s, "rate": 0.25 * cap}]
    requests = int(peak_s * cap * (2.0 + 0.75))
    rows = []
    for variant, backoff in RETRY_VARIANTS.items():
        client = {"timeout_s": 120.0, "max_retries": max_retries if backoff else 0} | (backoff or {})
        scenario = chat_scenario(
            "retry", {"kind": "schedule", "phases": phases}, requests, policies=["vllm-v0"],
            client=client, admission={"max_queue": max_queue}, slo={"e2e_p99_s": 60.0},
        )  # fmt: skip
        row = _run(scenario).summary.iloc[0]
        rows.append({"variant": variant} | _pick(row, "completed", "rejected", "timed_out", "retries", "goodput_rps",
                                                 "e2e_p50_s", "e2e_p99_s", "requests"))  # fmt: skip
    return pd.DataFrame(rows)


def _pick(row: pd.Series, *columns: str) -> dict[str, Any]:
    return {c: row[c] for c in columns}


# --------------------------------------------------------------------------- (c) timeouts
def timeouts(timeouts_s: Iterable[float] = (60.0, 300.0), clients: int = 64, requests: int = 192) -> pd.DataFrame:
    """(c) Long outputs (median 1000, up to 4096 tokens), closed loop: completed vs timed out per timeout.

    Returns:
        One row per (policy, timeout_s): completed, timed_out, the completed fraction and
        the output tokens per second of completed requests only (useful work).
    """
    rows = []
    for timeout_s in timeouts_s:
        scenario = chat_scenario(
            f"timeout-{timeout_s:g}", {"kind": "closed_loop", "clients": clients}, requests,
            policies=["static", "vllm-v0"], workload={"output_tokens": LONG_OUTPUT}, client={"timeout_s": timeout_s},
        )  # fmt: skip
        result = _run(scenario, summary_only=False)
        for policy, req in result.requests.groupby("policy", sort=False):
            done = req["status"] == "completed"
            span_s = float(req["completion_s"].max() - req["arrival_s"].min())
            rows.append({
                "policy": policy, "timeout_s": timeout_s, "completed": int(done.sum()),
                "timed_out": int((req["status"] == "timed_out").sum()), "completed_frac": float(done.mean()),
                "useful_output_tps": float(req.loc[done, "output_tokens"].sum() / span_s),
            })  # fmt: skip
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- (d) streaming
def streaming_latency(capacity: float | None = None, load: float = 0.4, requests: int = 400) -> pd.DataFrame:
    """(d) Poisson chat traffic at ``load`` x vLLM-v0 capacity: TTFT (streamed) vs E2E (not) per policy."""
    rate = load * (capacity or capacity_rps())
    result = _run(chat_scenario("streaming", {"kind": "poisson", "rate": rate}, requests))
    table = result.summary[["policy", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s"]].copy()
    table["e2e_over_ttft_p50"] = table["e2e_p50_s"] / table["ttft_p50_s"]
    return table.reset_index(drop=True)


# --------------------------------------------------------------------------- (e) sorting
ORDERS: tuple[str, ...] = ("arrival", "prompt_ascending", "prompt_descending")


def prompt_sorting(requests: int = 512, max_batch_size: int = 32, orders: Iterable[str] = ORDERS) -> pd.DataFrame:
    """(e) An offline job (every request at t=0) sent in drawn or prompt-sorted order.

    Returns:
        One row per (policy, order): makespan, throughput, mean E2E and, for static
        batching, the padding waste of its batches (:func:`batch_padding`).
    """
    rows = []
    for order in orders:
        scenario = chat_scenario(
            f"sort-{order}", {"kind": "burst"}, requests, policies=["static", "continuous"],
            workload={"order": order},
        ).replace(**{"policies[static].max_batch_size": max_batch_size,
                     "policies[continuous].max_batch_size": max_batch_size})  # fmt: skip
        result = _run(scenario, summary_only=False)
        summary = result.summary.set_index("policy")
        for policy, req in result.requests.groupby("policy", sort=False):
            padding = batch_padding(req) if policy == "static" else {"prompt_pad_tokens": math.nan,
                                                                     "idle_slot_iterations": math.nan}
            rows.append({"policy": policy, "order": order} | _pick(summary.loc[policy], "duration_s", "throughput_rps",
                                                                   "e2e_mean_s") | padding)  # fmt: skip
    return pd.DataFrame(rows)


def batch_padding(requests: pd.DataFrame) -> dict[str, float]:
    """Padding waste of static batches (a batch = the requests prefilled in the same pass).

    Returns:
        ``prompt_pad_tokens``: sum over batches of (longest prompt - prompt), what a framework
        that pads prompts to the batch's longest computes in vain; ``idle_slot_iterations``:
        sum over batches of (longest output - output), decode steps a finished slot idles.
    """
    batches = requests.groupby("first_scheduled_s")
    prompt = batches["prompt_tokens"].transform("max") - requests["prompt_tokens"]
    output = batches["output_tokens"].transform("max") - requests["output_tokens"]
    return {"prompt_pad_tokens": float(prompt.sum()), "idle_slot_iterations": float(output.sum())}


# --------------------------------------------------------------------------- (f) max_tokens
def max_tokens_reservation(
    max_tokens: Iterable[int] = (512, 4096), clients: int = 256, requests: int = 768
) -> pd.DataFrame:
    """(f) The same real outputs (<= 512 tokens) sent with different ``max_tokens``.

    Returns:
        One row per (policy, max_output_tokens): peak and mean running sequences,
        throughput and E2E p50 under a saturating closed loop.
    """
    rows = []
    for limit in max_tokens:
        scenario = chat_scenario(
            f"max-tokens-{limit}", {"kind": "closed_loop", "clients": clients}, requests,
            workload={"max_output_tokens": limit},
        )  # fmt: skip
        result = _run(scenario, summary_only=False)
        summary = result.summary.set_index("policy")
        for policy, its in result.iterations.groupby("policy", sort=False):
            rows.append({"policy": policy, "max_output_tokens": limit, "peak_running": int(its["batch_size"].max())}
                        | _pick(summary.loc[policy], "mean_batch_size", "throughput_rps", "e2e_p50_s"))  # fmt: skip
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- verdicts
def run_all() -> dict[str, pd.DataFrame]:
    """Every experiment, keyed (a)..(f); the saturated capacity from (a) sets (b) and (d)'s load."""
    sweep = concurrency_sweep()
    cap = float(sweep.loc[sweep["policy"] == "vllm-v0", "throughput_rps"].max())
    return {
        "a": sweep, "b": retry_backoff(cap), "c": timeouts(), "d": streaming_latency(cap),
        "e": prompt_sorting(), "f": max_tokens_reservation(),
    }  # fmt: skip


def advice_table(results: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per experiment (columns :data:`ADVICE_COLUMNS`), each verdict computed from its table."""
    rows = [VERDICTS[key](results[key]) for key in sorted(results)]
    return pd.DataFrame(rows, columns=list(ADVICE_COLUMNS))


def _row(experiment: str, advice: str, metric: str, baseline: tuple[str, float], advised: tuple[str, float],
         supported: bool, verdict: str) -> dict[str, Any]:  # fmt: skip
    return dict(zip(ADVICE_COLUMNS, (experiment, advice, metric, *baseline, *advised, bool(supported), verdict),
                    strict=True))  # fmt: skip


def _change(new: float, old: float) -> float:
    return new / old - 1.0


def verdict_concurrency(table: pd.DataFrame) -> dict[str, Any]:
    """(a): where the knee is, and what going past it to the most clients buys (vLLM-v0)."""
    knee = knees(table)
    paged = table[table["policy"] == "vllm-v0"].set_index("clients")
    at, top, one = paged.loc[knee["vllm-v0"]], paged.iloc[-1], paged.iloc[0]
    gain, cost = _change(top["throughput_rps"], at["throughput_rps"]), _change(top["e2e_mean_s"], at["e2e_mean_s"])
    where = "/".join(str(knee[p]) for p in POLICY_NAMES if p in knee)
    text = (f"knee (max throughput/latency) at {where} clients for {'/'.join(knee)}; from the knee to "
            f"{paged.index[-1]} clients vllm-v0 gains {gain:+.0%} throughput for {cost:+.0%} mean E2E")
    return _row("(a) concurrency", "bound concurrency with a semaphore", "vllm-v0 throughput (req/s)",
                (f"{paged.index[0]} client", one["throughput_rps"]), (f"{knee['vllm-v0']} clients (knee)",
                at["throughput_rps"]), cost > gain, text)  # fmt: skip


def verdict_retries(table: pd.DataFrame) -> dict[str, Any]:
    """(b): goodput and p99 E2E of the fixed 8 s retry against exponential backoff."""
    by = table.set_index("variant")
    fixed, exps = by.loc["fixed 8 s"], by[by.index.str.startswith("exponential")]
    best = exps["goodput_rps"].idxmax()
    parts = [f"{v}: {r.goodput_rps:.2f} req/s, p99 {r.e2e_p99_s:.0f} s, {r.rejected:.0f} rejected"
             for v, r in by.iterrows()]  # fmt: skip
    text = "goodput within 60 s E2E — " + "; ".join(parts)
    return _row("(b) retry 429", "retry a 429 after a fixed 8 s", "goodput (req/s, E2E <= 60 s)",
                (best, exps.loc[best, "goodput_rps"]), ("fixed 8 s", fixed["goodput_rps"]),
                fixed["goodput_rps"] >= exps["goodput_rps"].max(), text)  # fmt: skip


def _per_policy(table: pd.DataFrame, columns: str, values: str) -> pd.DataFrame:
    """``values`` by policy (rows, in the table's order) and ``columns``."""
    order = list(dict.fromkeys(table["policy"]))
    return table.pivot(index="policy", columns=columns, values=values).loc[order]


def verdict_timeouts(table: pd.DataFrame) -> dict[str, Any]:
    """(c): share of long-output requests each timeout abandons, per policy."""
    short, long = table["timeout_s"].min(), table["timeout_s"].max()
    frac = _per_policy(table, "timeout_s", "completed_frac")
    tps = _per_policy(table, "timeout_s", "useful_output_tps")
    parts = [f"{p}: {1 - frac.loc[p, short]:.0%} timed out at {short:g} s vs {1 - frac.loc[p, long]:.0%} at "
             f"{long:g} s, useful tok/s {_change(tps.loc[p, long], tps.loc[p, short]):+.0%}" for p in frac.index]
    worst = frac[short].idxmin()
    return _row("(c) timeouts", "longer timeouts for long outputs", f"{worst} completed fraction",
                (f"{short:g} s", frac.loc[worst, short]), (f"{long:g} s", frac.loc[worst, long]),
                bool((frac[long] > frac[short]).any()), "; ".join(parts))  # fmt: skip


def verdict_streaming(table: pd.DataFrame) -> dict[str, Any]:
    """(d): how much sooner a streaming user sees the answer start than its end."""
    by = table.set_index("policy")
    parts = [f"{p} {r.e2e_over_ttft_p50:.1f}x" for p, r in by.iterrows()]
    paged = by.loc["vllm-v0"]
    text = (f"streamed, vllm-v0 shows the first token after {paged.ttft_p50_s:.2f} s (p50) instead of the whole "
            f"answer after {paged.e2e_p50_s:.1f} s; E2E/TTFT p50: " + ", ".join(parts))
    return _row("(d) streaming", "stream, and judge latency by TTFT", "vllm-v0 perceived wait p50 (s)",
                ("E2E (no streaming)", paged.e2e_p50_s), ("TTFT (streaming)", paged.ttft_p50_s),
                paged.ttft_p50_s < paged.e2e_p50_s, text)  # fmt: skip


def verdict_sorting(table: pd.DataFrame) -> dict[str, Any]:
    """(e): static padding and makespan, continuous makespan and mean E2E, sorted vs drawn order."""
    by = table.set_index(["policy", "order"])
    st0, st1 = by.loc[("static", "arrival")], by.loc[("static", "prompt_ascending")]
    co0, co1 = by.loc[("continuous", "arrival")], by.loc[("continuous", "prompt_ascending")]
    text = (f"static: prompt padding {_change(st1.prompt_pad_tokens, st0.prompt_pad_tokens):+.0%}, idle slot-steps "
            f"{_change(st1.idle_slot_iterations, st0.idle_slot_iterations):+.0%} (outputs are unknown to the "
            f"client), makespan {_change(st1.duration_s, st0.duration_s):+.1%}; continuous: makespan "
            f"{_change(co1.duration_s, co0.duration_s):+.1%}, mean E2E {_change(co1.e2e_mean_s, co0.e2e_mean_s):+.1%}")
    return _row("(e) sort prompts", "sort an offline job's prompts by length", "static prompt padding (tokens)",
                ("arrival order", st0.prompt_pad_tokens), ("prompt_ascending", st1.prompt_pad_tokens),
                st1.prompt_pad_tokens < st0.prompt_pad_tokens, text)  # fmt: skip


def verdict_max_tokens(table: pd.DataFrame) -> dict[str, Any]:
    """(f): running sequences and throughput with max_tokens small vs large, per policy."""
    low, high = table["max_output_tokens"].min(), table["max_output_tokens"].max()
    peak = _per_policy(table, "max_output_tokens", "peak_running")
    tps = _per_policy(table, "max_output_tokens", "throughput_rps")
    parts = [f"{p}: peak running {peak.loc[p, low]} -> {peak.loc[p, high]}, throughput "
             f"{_change(tps.loc[p, high], tps.loc[p, low]):+.0%}" for p in peak.index]
    cont = peak.loc["continuous"]
    return _row("(f) max_tokens", f"don't set max_tokens too high ({low} vs {high})", "continuous peak running seqs",
                (f"max_tokens {high}", cont[high]), (f"max_tokens {low}", cont[low]), cont[low] > cont[high],
                "; ".join(parts))  # fmt: skip


VERDICTS = {
    "a": verdict_concurrency, "b": verdict_retries, "c": verdict_timeouts,
    "d": verdict_streaming, "e": verdict_sorting, "f": verdict_max_tokens,
}  # fmt: skip
"""Experiment key -> its verdict row builder."""

TITLES = {
    "a": "(a) Closed-loop concurrency (the client semaphore)",
    "b": "(b) HTTP 429: fixed 8 s retry vs exponential backoff (load spike at 2x capacity, max_queue 16)",
    "c": "(c) Timeouts with long outputs (closed loop, 64 clients)",
    "d": "(d) Perceived latency with streaming: TTFT vs E2E (Poisson at 0.4x vllm-v0 capacity)",
    "e": "(e) Sorting an offline job's prompts by length (all requests at t=0, batch 32)",
    "f": "(f) max_tokens 512 vs 4096 for the same outputs (<= 512 tokens; closed loop, 256 clients)",
}  # fmt: skip


# --------------------------------------------------------------------------- files
def client_advice_markdown(advice: pd.DataFrame, results: Mapping[str, pd.DataFrame]) -> str:
    """The verdict table, then every experiment's table, in Markdown."""
    lines = ["# Client-side advice, quantified\n",
             "Llama-3-8B on one A100-80GB, chat-like lengths unless stated; generated by "
             "`sim.studies.client_advice.write_client_advice`. Every verdict is computed from the tables below.\n",
             _frame_markdown(advice)]  # fmt: skip
    for key in sorted(results):
        lines += [f"## {TITLES.get(key, key)}\n", _frame_markdown(results[key])]
    return "\n".join(lines)


def _frame_markdown(frame: pd.DataFrame) -> str:
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in frame.columns]  # fmt: skip
    rows = [[_cell(v, num) for v, num in zip(row, numeric, strict=True)] for row in frame.itertuples(index=False)]
    return markdown_table(list(frame.columns), rows, numeric)


def _cell(value: Any, numeric: bool) -> str:
    if not numeric:
        return str(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.4g}"


def write_client_advice(out_dir: str | Path) -> pd.DataFrame:
    """Run every experiment and write ``client_advice.csv`` and ``client_advice.md`` into ``out_dir``.

    Returns:
        The verdict table (one row per experiment), as written to the CSV.
    """
    from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_file

    results = run_all()
    advice = advice_table(results)
    out = Path(out_dir)
    with atomic_file(out / "client_advice.csv") as tmp:
        advice.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)
    with atomic_file(out / "client_advice.md") as tmp:
        tmp.write_text(client_advice_markdown(advice, results))
    return advice
