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


def _readme_row(readme: str, first_cell: str) -> list[str]:
    line = next(line for line in readme.splitlines() if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _mape_range(values: list[str]) -> str:
    """``"1.5–2.6%"`` for MAPEs written as ``"2.6%"``, ``"1.5%"``, ...; one value when they agree."""
    numbers = sorted(float(v.rstrip("%")) for v in values)
    low, high = f"{numbers[0]:.1f}", f"{numbers[-1]:.1f}"
    return f"{low}%" if low == high else f"{low}–{high}%"


def test_h100_and_a40_calibration_figures_are_those_of_the_fit_reports() -> None:
    """The README's H100/A40 table (hand-written: its last column comes from docs/cost_model.md) against
    results/calibration/: how many calibrations, the held-out linear and all-reduce MAPE ranges of their
    fit reports, and the leave-one-model-out range of transfer_loo_<gpu>.md."""
    sys.path.insert(0, str(REPO / "scripts"))
    from update_readme import _table_after, fit_errors

    readme = (REPO / "README.md").read_text()
    folder = REPO / "results" / "calibration"
    for label, gpu in (("H100-SXM", "h100-sxm"), ("A40", "a40")):
        row = _readme_row(readme, label)
        reports = [fit_errors(p.read_text()) for p in sorted(folder.glob(f"*_{gpu}_tp*_fit.md"))]
        assert row[1] == str(len(reports)), label
        assert row[2] == _mape_range([r["linear"][0] for r in reports]), label
        reduces = [r["all_reduce"][0] for r in reports if "all_reduce" in r]
        assert row[3] == (_mape_range(reduces) if reduces else "PCIe roofline (not measured)"), label
        loo = _table_after((folder / f"transfer_loo_{gpu}.md").read_text(), "| held-out model").splitlines()[2:]
        assert row[4] == _mape_range([line.split("|")[3].strip() for line in loo]), label


def test_every_committed_fit_report_meets_its_targets() -> None:
    """The README says all MAPE targets are met: no fit report may say otherwise."""
    sys.path.insert(0, str(REPO / "scripts"))
    from update_readme import _table_after

    for path in sorted((REPO / "results" / "calibration").glob("*_fit.md")):
        rows = _table_after(path.read_text(), "# Fit report").splitlines()[2:]
        assert all(row.strip("|").split("|")[5].strip() in ("yes", "—") for row in rows), path.name
