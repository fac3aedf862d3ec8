"""Refresh the generated table of docs/validation.md from results/validation/.

The block between ``<!-- BEGIN validation -->`` and ``<!-- END validation -->`` is the
table of ``results/validation/vllm-0.6.0-burst.md`` (which ``python -m sim report``
regenerates). ``--check`` exits 1 when the docs are stale, writing nothing.

    python -m sim.validation.docs [--check]
"""

from __future__ import annotations

import sys

from sim.validation.report import DEFAULT_SET, DOCS_FILE, REPO_ROOT, refresh_docs

RESULTS_MD = REPO_ROOT / "results" / "validation" / f"{DEFAULT_SET}.md"


def main(argv: list[str]) -> int:
    """Refresh (or with ``--check`` only compare) the docs block; exit code 1 when it was stale."""
    check = "--check" in argv
    current = refresh_docs(RESULTS_MD, DOCS_FILE, check=check)
    if not current:
        print(f"{DOCS_FILE.name} {'is stale' if check else 'updated'} from {RESULTS_MD.relative_to(REPO_ROOT)}")
    return 1 if check and not current else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
