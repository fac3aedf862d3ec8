"""The README's generated blocks (field reference, sample and speedup tables) are current,
and its two set-up commands are the ones CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_generated_blocks_are_current() -> None:
    proc = subprocess.run([sys.executable, "scripts/update_readme.py", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    test_command = 'python -m pip install -e ".[test]" && python -m pytest'
    assert test_command in readme
    assert test_command in (REPO / ".ci" / "run").read_text()
    assert 'python -m pip install -e . && python -m sim run' in readme
