"""Refresh the generated tables of docs/validation.md from results/validation/.

Each block ``<!-- BEGIN <name> -->`` ... ``<!-- END <name> -->`` of
:data:`~sim.validation.report.DOCS_BLOCKS` holds the tables of one
``results/validation/<folder>.md`` (which ``python -m sim report`` regenerates).
``--check`` exits 1 when the docs are stale, writing nothing.

    python -m sim.validation.docs [--check]
"""

from __future__ import annotations

import sys

from sim.validation.report import DOCS_BLOCKS, DOCS_FILE, REPO_ROOT, refresh_docs

RESULTS = REPO_ROOT / "results" / "validation"


def main(argv: list[str]) -> int:
    """Refresh (or with ``--check`` only compare) the docs blocks; exit code 1 when one was stale."""
    check = "--check" in argv
    stale = [
        block
        for block, folder in DOCS_BLOCKS.items()
        if not refresh_docs(RESULTS / f"{folder}.md", DOCS_FILE, block=block, check=check)
    ]
    for block in stale:
        print(f"{DOCS_FILE.name}: block {block} {'is stale' if check else 'updated'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
