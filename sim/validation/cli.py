"""``python -m sim validate-real DIR [--out FOLDER]``: replay real runs, compare, write the report.

Reads a validation folder in any of its shapes (bursts, constant-rate stages, per-request
traces: :mod:`sim.validation.folder`), replays every run or stage in batchsim, prints the
measured-vs-simulated tables and writes ``FOLDER/<DIR name>.{md,csv}`` (default
``results/validation/``). A missing folder, a folder in no known shape, a corrupt CSV or an
unknown model is one ``error:`` line and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path("results") / "validation"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``validate-real`` on the ``python -m sim`` subcommands."""
    p = sub.add_parser("validate-real", help="replay real serving runs (a validation folder) and compare")
    p.add_argument("dir", help="validation folder: bursts (summary.csv + request CSVs), stage CSVs, request traces")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"folder for <DIR name>.md/.csv (default: {DEFAULT_OUT})")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(handler=cmd_validate_real)


def cmd_validate_real(args: argparse.Namespace) -> int:
    """Replay, write the files, print the tables."""
    from sim.validation.report import run_validation, tables_only

    log = None if args.quiet else print
    out_dir = Path(args.out)
    run_validation(Path(args.dir), out_dir, log=log)
    if log:
        markdown = out_dir / f"{Path(args.dir).resolve().name}.md"
        print(tables_only(markdown.read_text()))
        print(f"wrote {markdown} and .csv")
    return 0
