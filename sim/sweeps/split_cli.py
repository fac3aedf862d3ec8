"""``python -m sim capacity FILE --split-gpus N``: the split search's command-line side (print, write)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.config import Scenario


def run_split_search(args: argparse.Namespace, scenario: Scenario, seeds: list[int], out: Path) -> int:
    """Search every prefill:decode split of ``args.split_gpus`` GPUs; print it, write split.csv/.md."""
    from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_folder, write_marker
    from sim.sweeps.cli_common import parse_slo_options, sigterm_as_interrupt
    from sim.sweeps.slo_capacity import CapacitySpec
    from sim.sweeps.split import split_markdown, split_search

    slo = parse_slo_options(args.slo)
    criterion = CapacitySpec.build(scenario, slo, args.attainment, args.tolerance, args.rate_low,
                                   args.rate_high, seeds).criterion()  # fmt: skip
    try:
        with sigterm_as_interrupt() as seen:
            table = split_search(
                scenario, slo, args.split_gpus, attainment=args.attainment, rate_low=args.rate_low,
                rate_high=args.rate_high, tolerance=args.tolerance, seeds=seeds, workers=args.workers,
                backend=args.backend, address=args.address, progress=not args.quiet,
            )  # fmt: skip
    except KeyboardInterrupt as stop:
        print("terminated" if seen.was_terminated(stop) else "interrupted", file=sys.stderr)
        return seen.exit_code(stop)
    text = split_markdown(table, scenario.name, criterion)
    with atomic_folder(out) as tmp:
        table.to_csv(tmp / "split.csv", index=False, float_format=CSV_FLOAT_FORMAT)
        (tmp / "split.md").write_text(text)
        write_marker(tmp, "capacity --split-gpus", scenario=scenario.name)
    if not args.quiet:
        print(text, end="")
        print(f"wrote {out}/ (split.csv, split.md)")
    return 0
