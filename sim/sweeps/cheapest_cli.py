"""``python -m sim capacity FILE --cheapest``: the cheapest-fleet search's command-line side.

Writes ``cheapest.csv`` (every fleet simulated, with ``meets``, ``frontier`` and ``cheapest``),
``configs.csv`` (the smallest meeting fleet of each GPU x TP x policy, or why none),
``cheapest.md`` (the answer, the frontier and both tables) and ``frontier.png`` (rent per hour
against TTFT p99 for every fleet simulated, the frontier drawn through the meeting ones).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas and matplotlib only when a search runs: `capacity --help` stays cheap
    import pandas as pd
    from matplotlib.figure import Figure

    from sim.config import Scenario
    from sim.sweeps.cheapest import CheapestReport

SHOWN = {
    "fleet": "fleet", "policy": "policy", "num_gpus": "GPUs", "fleet_usd_per_hour": "USD/hour",
    "usd_per_mtok": "USD per Mtok", "joules_per_token": "J/token", "ttft_p99_s": "TTFT p99 (ms)",
    "tpot_p99_s": "TPOT p99 (ms)", "slo_attainment": "SLO attained (%)", "meets": "meets SLO",
}  # fmt: skip
"""Columns of the fleet tables of ``cheapest.md``, with their headers."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--cheapest`` options of ``capacity``."""
    parser.add_argument(
        "--cheapest",
        action="store_true",
        help="the cheapest fleet (GPU type x TP x replicas) serving the scenario's requests "
        "within the SLO, and the cost-vs-latency frontier (writes cheapest.csv/.md, frontier.png)",
    )
    parser.add_argument(
        "--gpus",
        default=None,
        metavar="G1,G2",
        help="--cheapest: GPU types to try (default: every catalog GPU with a price)",
    )
    parser.add_argument("--tp", default="1,2,4", metavar="1,2,4", help="--cheapest: tensor-parallel degrees")
    parser.add_argument("--max-gpus", type=int, default=64, metavar="N", help="--cheapest: largest fleet run")
    parser.add_argument(
        "--cost-span",
        type=float,
        default=4.0,
        metavar="X",
        help="--cheapest: run no fleet renting for over X times the cheapest meeting one found so far "
        "(the frontier is complete up to X; default 4, 0 = no limit)",
    )
    parser.add_argument("--policy", action="append", default=None, metavar="NAME",
                        help="--cheapest: a policy to size (repeatable; default: every policy)")  # fmt: skip


def run_cheapest(args: argparse.Namespace, scenario: Scenario, seeds: list[int], out: Path) -> int:
    """Search, print the answer and the frontier, write the four files."""
    from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_folder, write_marker
    from sim.sweeps.cheapest import cheapest_fleet
    from sim.sweeps.cli_common import parse_slo_options, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt() as seen:
            report = cheapest_fleet(
                scenario, parse_slo_options(args.slo), gpus=_names(args.gpus), tensor_parallel=_degrees(args.tp),
                policies=args.policy, max_gpus=args.max_gpus, cost_span=args.cost_span, attainment=args.attainment,
                seeds=seeds,
                workers=args.workers, backend=args.backend, address=args.address, progress=not args.quiet,
            )  # fmt: skip
    except KeyboardInterrupt as stop:
        print("terminated" if seen.was_terminated(stop) else "interrupted", file=sys.stderr)
        return seen.exit_code(stop)
    text = cheapest_markdown(report, scenario.name)
    with atomic_folder(out) as tmp:
        report.runs.to_csv(tmp / "cheapest.csv", index=False, float_format=CSV_FLOAT_FORMAT)
        report.configs.to_csv(tmp / "configs.csv", index=False, float_format=CSV_FLOAT_FORMAT)
        (tmp / "cheapest.md").write_text(text)
        from sim.report.plots import save_figure

        save_figure(frontier_figure(report, scenario.name), tmp / "frontier.png")
        write_marker(tmp, "capacity --cheapest", scenario=scenario.name)
    if not args.quiet:
        print(answer_line(report))
        print(_table(report.frontier), end="")
        print(f"{len(report.runs)} fleets simulated in {report.elapsed_s:.0f} s; "
              f"wrote {out}/ (cheapest.csv, configs.csv, cheapest.md, frontier.png)")  # fmt: skip
    return 0


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _degrees(text: str) -> list[int]:
    from sim.errors import UserError

    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--tp {text[:80]!r}: expected comma-separated integers, e.g. 1,2,4", field="tp") from None


def answer_line(report: CheapestReport) -> str:
    """The answer in one sentence (or that no fleet met the SLO)."""
    best = report.best
    if best is None:
        return f"No fleet tried meets the SLO ({report.criterion}); see configs.csv for why."
    return (
        f"Cheapest within the SLO ({report.criterion}): {best['fleet']} running {best['policy']}, "
        f"{int(best['num_gpus'])} GPU{'s' if best['num_gpus'] > 1 else ''} at ${best['fleet_usd_per_hour']:.2f}/hour "
        f"(${best['usd_per_mtok']:.3f} per million output tokens, {best['joules_per_token']:.3f} J/token; "
        f"TTFT p99 {1e3 * best['ttft_p99_s']:.0f} ms, TPOT p99 {1e3 * best['tpot_p99_s']:.1f} ms)."
    )


def cheapest_markdown(report: CheapestReport, name: str) -> str:
    """``cheapest.md``: the answer, the frontier, the smallest fleet per configuration, every fleet run."""
    configs = report.configs.copy()
    lines = [
        f"# {name}: the cheapest fleet within the SLO",
        "",
        f"SLO: {report.criterion}. {len(report.runs)} fleets simulated in {report.elapsed_s:.0f} s "
        "(`python -m sim capacity --cheapest`; method: docs/cost.md).",
        "",
        f"**{answer_line(report)}**",
        "",
        f"Prices (USD per GPU-hour): {_prices(report)}; the catalog's unless the scenario's `gpu_hour_usd` "
        "names the GPU (a single number prices the scenario's own GPU only). Sources: docs/cost.md.",
        "",
        "## Frontier: rent vs TTFT p99 (fleets no other meeting fleet beats on both)",
        "",
        _table(report.frontier).rstrip("\n"),
        "",
        "## Smallest meeting fleet per configuration",
        "",
        _frame(configs).rstrip("\n"),
        "",
        "## Every fleet simulated",
        "",
        _table(report.runs).rstrip("\n"),
        "",
    ]
    return "\n".join(lines)


def _prices(report: CheapestReport) -> str:
    runs = report.runs[report.runs["num_gpus"] > 0]
    per_gpu = (runs["fleet_usd_per_hour"] / runs["num_gpus"]).groupby(runs["gpu"], sort=False).first()
    return ", ".join(f"{gpu} {usd:.2f}" for gpu, usd in per_gpu.items()) or "-"


def _table(runs: pd.DataFrame) -> str:
    shown = runs[[c for c in SHOWN if c in runs.columns]].copy()
    for column in ("ttft_p99_s", "tpot_p99_s"):
        shown[column] = shown[column] * 1e3
    shown["slo_attainment"] = shown["slo_attainment"] * 100
    return _frame(shown.rename(columns=SHOWN))


def _frame(frame: pd.DataFrame) -> str:
    from sim.report.tables import frame_markdown

    return frame_markdown(frame)


def frontier_figure(report: CheapestReport, name: str) -> Figure:
    """Rent per hour against TTFT p99 of every fleet: meeting ones filled, failing ones hollow, one
    colour per GPU type, the frontier as a step line and the cheapest fleet circled."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    runs = report.runs[report.runs["ttft_p99_s"].notna() & report.runs["fleet_usd_per_hour"].notna()]
    colours = {gpu: f"C{i}" for i, gpu in enumerate(dict.fromkeys(runs["gpu"]))}
    markers = {tp: m for tp, m in zip(sorted(runs["tensor_parallel"].unique()), "os^Dvp*", strict=False)}
    for (gpu, tp), group in runs.groupby(["gpu", "tensor_parallel"], sort=False):
        for met, part in group.groupby("meets"):
            ax.scatter(part["fleet_usd_per_hour"], part["ttft_p99_s"] * 1e3, marker=markers[tp], s=36,
                       facecolors=colours[gpu] if met else "none", edgecolors=colours[gpu],
                       label=f"{gpu} TP{tp}" if met or not group["meets"].any() else None)  # fmt: skip
    frontier = report.frontier
    if len(frontier):
        ax.step(frontier["fleet_usd_per_hour"], frontier["ttft_p99_s"] * 1e3, where="post", color="black",
                linewidth=1, label="frontier (meets the SLO)")  # fmt: skip
        best = report.best
        assert best is not None
        ax.scatter([best["fleet_usd_per_hour"]], [best["ttft_p99_s"] * 1e3], s=180, facecolors="none",
                   edgecolors="black", linewidths=1.5, label=f"cheapest: {best['fleet']}")  # fmt: skip
    ttft_bound = report.slo.get("ttft_p99_s")
    if ttft_bound is not None:
        ax.axhline(ttft_bound * 1e3, color="grey", linestyle=":", linewidth=1, label="TTFT bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("fleet rent (USD/hour)")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_title(f"{name}: cost vs latency (hollow: misses the SLO)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
