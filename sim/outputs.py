"""Writing a RunResult to disk, atomically.

Everything goes into a temporary sibling folder that is renamed into place at the end,
so an interrupted or failed run never leaves a half-written results folder behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml

from sim.scenario_io import scenario_to_dict

if TYPE_CHECKING:
    from sim.runner import RunResult

CSV_FLOAT_FORMAT = "%.6g"  # six significant digits: byte-stable files, far finer than the model's accuracy


@contextmanager
def atomic_folder(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary folder that replaces ``out_dir`` only if the block succeeds."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def save_result(result: RunResult, out_dir: Path, *, plots: bool = True) -> Path:
    """Write summary, per-request/per-iteration CSVs, the resolved scenario and plots to ``out_dir``."""
    with atomic_folder(out_dir) as tmp:
        write_tables(result, tmp)
        if plots:
            write_plots(result, tmp)
    return out_dir


def write_tables(result: RunResult, folder: Path) -> None:
    """summary.csv/.md, requests.csv, iterations.csv (sampled if huge), scenario.resolved.yaml."""
    from sim.report.tables import summary_markdown

    result.summary.to_csv(folder / "summary.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    (folder / "summary.md").write_text(_summary_md(result, summary_markdown))
    result.requests.to_csv(folder / "requests.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    iterations, every = sample_iterations(result.iterations, result.scenario.metrics.max_iteration_rows)
    iterations.to_csv(folder / "iterations.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    (folder / "scenario.resolved.yaml").write_text(resolved_yaml(result, iterations_every=every))


def _summary_md(result: RunResult, render: Callable[[pd.DataFrame], str]) -> str:
    facts = result.facts
    head = f"# {result.scenario.name}\n\n"
    head += (f"{facts['requests']} requests, seed {result.seed}, {facts['model_hf_name']} on "
             f"{result.scenario.gpu} x{result.scenario.tensor_parallel} (replicas: {result.scenario.replicas}), "
             f"KV cache {facts['kv_capacity_tokens_per_replica']} tokens per replica, cost model: "
             f"{facts['cost_model']}.\n\n")
    return head + render(result.summary) + "\n"


def sample_iterations(iterations: pd.DataFrame, max_rows: int) -> tuple[pd.DataFrame, int]:
    """Every k-th row so at most ``max_rows`` remain; returns the rows and k (1 = all kept)."""
    every = max(1, -(-len(iterations) // max_rows))
    return (iterations.iloc[::every], every) if every > 1 else (iterations, 1)


def resolved_yaml(result: RunResult, *, iterations_every: int = 1) -> str:
    """The scenario with every default filled in, plus seed, version and derived facts."""
    from sim import __version__

    document: dict[str, Any] = {
        "batchsim_version": __version__,
        "seed": result.seed,
        "derived": dict(result.facts, iterations_csv_every=iterations_every),
        "scenario": scenario_to_dict(result.scenario),
    }
    return yaml.safe_dump(document, sort_keys=False)


PLOTS = {
    "ttft_cdf.png": lambda r, p: p.latency_cdf(r.requests, metric="ttft_s"),
    "e2e_cdf.png": lambda r, p: p.latency_cdf(r.requests, metric="e2e_s"),
    "timeline.png": lambda r, p: p.timeline(r.iterations),
    "throughput.png": lambda r, p: p.throughput_over_time(r.requests),
}


def write_plots(result: RunResult, folder: Path) -> None:
    """The standard figures of a run: latency CDFs, batch/KV timeline, throughput over time."""
    from sim.report import plots

    for filename, make in PLOTS.items():
        plots.save_figure(make(result, plots), folder / filename)
