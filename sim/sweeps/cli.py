"""``python -m sim sweep`` and ``python -m sim capacity``: thin wrappers over :mod:`sim.sweeps`.

Both parse their options, validate everything (every sweep point's scenario too, and
the output folder) before running anything, call :func:`sim.sweeps.sweep` /
:func:`sim.sweeps.slo_capacity`, then print and write. User mistakes are :class:`UserError`
(exit 2). SIGTERM stops them as Ctrl-C does, cleanly (exit 143 instead of 130).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sim.errors import UserError
from sim.sweeps.backends import BACKENDS

# Defined in cli_common (split_cli needs them too and must not import this module back);
# re-exported so ``from sim.sweeps.cli import ...`` keeps working.
from sim.sweeps.cli_common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    StopSignal,
    Terminated,
    parse_slo_options,
    sigterm_as_interrupt,
)

__all__ = [
    "EXIT_INTERRUPTED", "EXIT_TERMINATED", "StopSignal", "Terminated", "add_parsers", "cmd_capacity", "cmd_sweep",
    "parse_slo_options", "sigterm_as_interrupt",
]  # fmt: skip


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the ``sweep`` and ``capacity`` subcommands."""
    _add_sweep(sub)
    _add_capacity(sub)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="scenario YAML")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field of the base scenario by dotted path (repeatable)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="N|S1,S2",
        help="seeds per point: a count (3 = seeds 0,1,2) or a list (default: the scenario's seed)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="processes, or CPUs of a local Ray (default 0: every core); capped, with a note, at the runs "
        "that can go at once and at the CPUs",
    )
    p.add_argument(
        "--backend", choices=BACKENDS, default="local", help="where runs execute (default: local)"
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join, e.g. 'auto' (ray backend; default: start a local Ray)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table; errors only")


def _load(args: argparse.Namespace) -> tuple[Any, list[int]]:
    from sim.io.scenario import load_scenario, parse_set_options
    from sim.sweeps.grid import parse_seeds_option

    scenario = load_scenario(args.file, parse_set_options(args.overrides))
    seeds = parse_seeds_option(args.seeds) if args.seeds is not None else [scenario.seed]
    return scenario, seeds


# --------------------------------------------------------------------------- sweep
def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run every combination of parameters x seeds; tidy sweep.csv and plots"
    )
    _common(p)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="PATH=V1,V2,...",
        required=True,
        help="a swept field and its values, e.g. workload.arrival.rate=1,2,4 (repeatable)",
    )
    p.add_argument("--out", default=None, help="output folder (default: results/<name>-sweep/)")
    p.add_argument(
        "--resume", action="store_true", help="skip the points already finished in OUT/sweep.csv"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the latency-vs-load PNGs")
    p.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run the sweep, print the mean-over-seeds table and failures, write sweep.csv/.md and plots.

    Returns 1 when some runs failed (they are listed), else 0.
    """
    from sim.io.safe_write import write_text
    from sim.sweeps.grid import parse_param_options
    from sim.sweeps.outputs import (
        failures,
        means_table,
        sweep_markdown,
        sweep_means,
        write_sweep_plots,
    )
    from sim.sweeps.runner import sweep

    scenario, seeds = _load(args)
    params = parse_param_options(args.param)
    out = Path(args.out) if args.out else Path("results") / f"{scenario.name}-sweep"
    try:
        with sigterm_as_interrupt() as seen:
            table = sweep(
                scenario,
                params,
                seeds,
                workers=args.workers,
                backend=args.backend,
                address=args.address,
                out=out,
                resume=args.resume,
                progress=not args.quiet,
            )
    except KeyboardInterrupt as stop:
        how = "terminated" if seen.was_terminated(stop) else "interrupted"
        print(
            f"{how}: finished points are saved in {out / 'sweep.csv'}; "
            f"run the same command with --resume to complete the rest",
            file=sys.stderr,
        )
        return seen.exit_code(stop)
    write_text(out / "sweep.md", sweep_markdown(table, list(params), f"{scenario.name} sweep"))
    plots = [] if args.no_plots else write_sweep_plots(table, list(params), out)
    failed = failures(table, list(params))
    if not args.quiet and len(failed) < table["point"].nunique() * len(seeds):
        print(means_table(sweep_means(table, list(params)), list(params)), end="")
        print(f"wrote {out}/ (sweep.csv, sweep.md{', plots' if plots else ''})")
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    return 1 if failed else 0


# --------------------------------------------------------------------------- capacity
def _add_capacity(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity", help="per policy, the highest arrival rate that meets a latency SLO"
    )
    _common(p)
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="BOUND=SECONDS",
        required=True,
        help="a latency bound: ttft_p99_s, tpot_p99_s or e2e_p99_s (repeatable)",
    )
    p.add_argument(
        "--attainment",
        type=float,
        default=None,
        help="meet the SLO when this fraction of requests meets every bound (default: p99 bounds)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="relative tolerance of the rate (default 0.02)",
    )
    p.add_argument(
        "--rate-low", type=float, default=None, help="a rate expected to meet the SLO (req/s)"
    )
    p.add_argument(
        "--rate-high", type=float, default=None, help="a rate expected to fail it (req/s)"
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="PATH=V1,V2,...",
        help="search every combination of these deployments, e.g. pipeline_parallel=1,2 (repeatable); one row "
        "per combination and policy",
    )
    p.add_argument(
        "--out", default=None, help="output folder (default: results/<name>-capacity/, with --cheapest -cheapest/)"
    )
    p.add_argument(
        "--split-gpus",
        type=int,
        default=None,
        metavar="N",
        help="search the prefill:decode split of N GPUs of the scenario's disaggregation block (writes split.csv/.md)",
    )
    from sim.sweeps.cheapest_cli import add_arguments

    add_arguments(p)
    p.set_defaults(handler=cmd_capacity)


def cmd_capacity(args: argparse.Namespace) -> int:
    """Search each policy's capacity, print the table, write capacity.csv/.md."""
    from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_folder, check_output_dir, write_marker
    from sim.sweeps.grid import parse_param_options
    from sim.sweeps.outputs import capacity_markdown, capacity_table
    from sim.sweeps.slo_capacity import capacity

    scenario, seeds = _load(args)
    suffix = "cheapest" if args.cheapest else "capacity"
    out = Path(args.out) if args.out else Path("results") / f"{scenario.name}-{suffix}"
    check_output_dir(out)  # a search can take minutes: say so before it starts, not after
    params = parse_param_options(args.param) if args.param else None
    if args.split_gpus is not None and args.cheapest:
        raise UserError("--split-gpus and --cheapest are two searches: give one", field="cheapest")
    if params and args.cheapest:
        raise UserError("--param and --cheapest: the cheapest-fleet search varies GPU type and TP itself; give one",
                        field="cheapest")  # fmt: skip
    if args.split_gpus is not None:
        if params:
            raise UserError("--param and --split-gpus: a split search varies the pools itself; give one of them",
                            field="param")  # fmt: skip
        from sim.sweeps.split_cli import run_split_search

        return run_split_search(args, scenario, seeds, out)
    if args.cheapest:
        from sim.sweeps.cheapest_cli import run_cheapest

        return run_cheapest(args, scenario, seeds, out)
    try:
        with sigterm_as_interrupt() as seen:
            report = capacity(
                scenario,
                parse_slo_options(args.slo),
                attainment=args.attainment,
                rate_low=args.rate_low,
                rate_high=args.rate_high,
                tolerance=args.tolerance,
                seeds=seeds,
                workers=args.workers,
                backend=args.backend,
                address=args.address,
                progress=not args.quiet,
                params=params,
            )
    except KeyboardInterrupt as stop:
        print("terminated" if seen.was_terminated(stop) else "interrupted", file=sys.stderr)
        return seen.exit_code(stop)
    grid = list(params or ())
    with atomic_folder(out) as tmp:
        report.to_csv(tmp / "capacity.csv", index=False, float_format=CSV_FLOAT_FORMAT)
        (tmp / "capacity.md").write_text(capacity_markdown(report, scenario.name, grid))
        write_marker(tmp, "capacity", scenario=scenario.name)
    if not args.quiet:
        print(
            f"{scenario.name}: {report['criterion'].iloc[0]}; tolerance {args.tolerance:.1%}, "
            f"{len(seeds)} seed(s)"
        )
        print(capacity_table(report, grid), end="")
        print(f"wrote {out}/ (capacity.csv, capacity.md)")
    return 0
