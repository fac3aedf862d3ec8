"""Measured vs simulated: replay every case of a validation folder, the table, its Markdown, writing it.

:func:`validate_folder` replays every case (:func:`sim.validation.folder.load_cases`) and
returns one *long* table, one row per case and metric, with the stable columns
:data:`TABLE_COLUMNS`:

``run, gpu, model, n, cost_model, metric, unit, measured, simulated, error_pct, shape, load_frac,
saturated, preset``

(``error_pct`` = 100 (simulated - measured) / measured; per-request rows, metric names with
``_req_``, hold 0 and the statistic of the per-request residuals instead, error_pct NaN;
``load_frac`` = the replay's offered load / the policy's simulated capacity, for a replay as a
closed loop the client's requested rate / capacity; ``saturated`` = load_frac >= 0.9).
:func:`report_markdown` renders one section per shape (:mod:`sim.validation.tables`);
:func:`write_validation` writes ``<folder>.csv`` and ``<folder>.md`` atomically;
``python -m sim report`` calls :func:`report_validation` for every folder of ``../shared/validation``.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import UserError
from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_file
from sim.io.safe_paths import check_target
from sim.validation.cases import POLICY_NAME, SATURATED, Case
from sim.validation.folder import load_cases
from sim.validation.spans import engine_intake_s
from sim.validation.tables import report_markdown

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SET = "vllm-0.6.0-burst"
DATA_ROOT = REPO_ROOT.parent / "shared" / "validation"
"""Where ``python -m sim report`` looks for validation folders (``../shared`` next to the repository)."""
DEFAULT_DATA_DIR = DATA_ROOT / DEFAULT_SET
DOCS_FILE = REPO_ROOT / "docs" / "validation.md"
DOCS_BLOCKS: dict[str, str] = {"validation": DEFAULT_SET, "validation-v1": "vllm-0.11-h100"}
"""Generated block of docs/validation.md -> the results/validation/ table it copies."""
TABLE_COLUMNS: tuple[str, ...] = (
    "run", "gpu", "model", "n", "cost_model", "metric", "unit", "measured", "simulated", "error_pct",
    "shape", "load_frac", "saturated", "preset",
)  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """What one replay gave: its requests, how its GPU time was priced, its load."""

    requests: pd.DataFrame
    cost_model: str
    load_frac: float


# --------------------------------------------------------------------------- the table
def validate_folder(folder: str | Path, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Replay every case of ``folder``; the long measured-vs-simulated table.

    Raises:
        UserError: the folder is missing, corrupt or in no known shape, or a case's server has no
            batchsim counterpart (checked for every case before the first simulation).
    """
    return validate_cases(load_cases(folder), log)


validate_set = validate_folder
"""The former name of :func:`validate_folder` (a folder used to hold bursts only)."""


def validate_cases(cases: list[Case], log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """:func:`validate_folder` on cases already loaded."""
    for case in cases:
        case.check()
    rows: list[dict[str, Any]] = []
    for case in cases:
        outcome = replay_case(case)
        rows += comparison_rows(case, outcome)
        if log:
            log(f"replayed {case.name}: {case.n} requests, load {outcome.load_frac:.2f}")
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def replay_case(case: Case) -> Outcome:
    """Simulate one case with its server's settings (:meth:`Case.scenario_dict`)."""
    from sim.config import Scenario
    from sim.runner import run

    with tempfile.TemporaryDirectory(prefix="batchsim-replay-") as folder:
        scenario = Scenario(**case.scenario_dict(Path(folder)))
        result = run(scenario)
        load = float(result.summary["load_frac"].iloc[0])
        if math.isnan(load) and case.requested_rps:
            load = case.requested_rps / _capacity(scenario)
    requests = result.requests[result.requests["policy"] == POLICY_NAME]
    if case.measured_at_engine:  # the engine's own queue clock starts when its loop takes the request in
        every = result.facts.get("iterations_every", {}).get(POLICY_NAME, 1)
        assert every == 1, f"{case.name}: the replay kept every {every}th pass; the intake times need them all"
        passes = result.iterations[result.iterations["policy"] == POLICY_NAME]
        requests = requests.assign(engine_intake_s=engine_intake_s(requests["arrival_s"], passes))
    return Outcome(requests, str(result.facts["cost_model"]), load)


def _capacity(scenario: Any) -> float:
    from sim.resolve import resolve
    from sim.saturation import capacity_rps

    resolved = resolve(scenario)
    return capacity_rps(resolved, resolved.scenario.policies[0])


def comparison_rows(case: Case, outcome: Outcome) -> list[dict[str, Any]]:
    """One row of :data:`TABLE_COLUMNS` per metric of ``case``."""
    head = {
        "run": case.name, "gpu": case.flags.gpu, "model": case.flags.model_id, "n": case.n,
        "cost_model": outcome.cost_model,
    }  # fmt: skip
    tail = {"shape": case.shape, "load_frac": outcome.load_frac, "saturated": outcome.load_frac >= SATURATED,
            "preset": case.preset}  # fmt: skip
    return [
        {**head, "metric": r.metric, "unit": r.unit, "measured": r.measured, "simulated": r.simulated,
         "error_pct": r.error_pct, **tail}
        for r in case.compare(outcome.requests)
    ]  # fmt: skip


# --------------------------------------------------------------------------- writing
def write_validation(table: pd.DataFrame, markdown: str, out_dir: Path, set_name: str) -> tuple[Path, Path]:
    """``out_dir/<set>.csv`` and ``.md``, each replaced atomically."""
    csv_path, md_path = out_dir / f"{set_name}.csv", out_dir / f"{set_name}.md"
    with atomic_file(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)
    with atomic_file(md_path) as tmp:
        tmp.write_text(markdown)
    return csv_path, md_path


def run_validation(folder: Path, out_dir: Path, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Replay ``folder`` and write its table into ``out_dir`` (named after the folder); nothing on error."""
    folder = Path(folder)
    set_name = folder.resolve().name
    for suffix in (".csv", ".md"):  # both targets, before the replay: a bad --out must not cost one
        check_target(Path(out_dir) / f"{set_name}{suffix}", field="out")
    cases = load_cases(folder)
    table = validate_cases(cases, log=log)
    write_validation(table, report_markdown(table, cases, set_name), out_dir, set_name)
    return table


def report_validation(out_dir: Path, log: Callable[[str], None] = print, data_dir: Path | None = None) -> None:
    """``python -m sim report``: ``out_dir/validation/<folder>.{md,csv}`` for every folder of ``data_dir``
    (default ``../shared/validation``), or say why not."""
    root = Path(data_dir) if data_dir is not None else DATA_ROOT
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not folders:
        log(f"skipped validation: no validation folders at {root} (../shared next to the repository)")
        return
    for folder in folders:
        run_validation(folder, out_dir / "validation")
        log(f"wrote {out_dir / 'validation' / folder.name}.md")


# --------------------------------------------------------------------------- docs
def tables_only(markdown: str) -> str:
    """The Markdown tables of ``markdown``, one blank line between two tables."""
    blocks, current = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append("\n".join(current))
            current = []
    if current:
        blocks.append("\n".join(current))
    return "\n\n".join(blocks)


def render_docs(text: str, table_md: str, block: str = "validation") -> str:
    """``text`` with its ``<!-- BEGIN block -->`` block replaced by ``table_md``."""
    pattern = re.compile(rf"(<!-- BEGIN {re.escape(block)} -->\n)(?:.*?\n)?(<!-- END {re.escape(block)} -->)", re.S)
    if not pattern.search(text):
        raise UserError(f"no '<!-- BEGIN {block} -->' ... '<!-- END {block} -->' block")
    return pattern.sub(lambda m: m.group(1) + table_md + "\n" + m.group(2), text)


def refresh_docs(results_md: Path, docs: Path = DOCS_FILE, *, block: str = "validation", check: bool = False) -> bool:
    """Copy the tables of ``results_md`` into the docs block; True if the docs were already current.

    With ``check`` nothing is written (``python -m sim.validation.docs --check``).
    """
    current = docs.read_text()
    fresh = render_docs(current, tables_only(results_md.read_text()), block)
    if fresh != current and not check:
        with atomic_file(docs) as tmp:
            tmp.write_text(fresh)
    return fresh == current
