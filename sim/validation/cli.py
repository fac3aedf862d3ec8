"""``python -m sim validate-real DIR [--out FOLDER]``: replay real runs, compare, write the table.

Reads a validation folder (``summary.csv`` + per-run CSVs), replays every run in batchsim,
prints the measured-vs-simulated table and writes ``FOLDER/<DIR name>.{md,csv}``
(default ``results/validation/``). A missing folder, a corrupt CSV or an unknown model is
one ``error:`` line and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path("results") / "validation"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``validate-real`` on the ``python -m sim`` subcommands."""
    p = sub.add_parser("validate-real", help="replay real serving runs (a validation folder) and compare")
    p.add_argument("dir", help="validation folder: summary.csv and one request CSV per run")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"folder for <DIR name>.md/.csv (default: {DEFAULT_OUT})")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(handler=cmd_validate_real)


def cmd_validate_real(args: argparse.Namespace) -> int:
    """Replay, print the table, write the files."""
    from sim.validation.report import run_validation, table_markdown

    log = None if args.quiet else print
    out_dir = Path(args.out)
    table = run_validation(Path(args.dir), out_dir, log=log)
    if log:
        print(table_markdown(table))
        print(f"wrote {out_dir / Path(args.dir).resolve().name}.md and .csv")
    return 0
