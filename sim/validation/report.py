"""Measured vs simulated: the validation table, its Markdown, and writing it.

:func:`validate_set` replays every run of a validation folder and returns one *long*
table, one row per run and metric, with the stable columns :data:`TABLE_COLUMNS`:

``run, gpu, model, n, cost_model, metric, unit, measured, simulated, error_pct``

(``error_pct`` = 100 (simulated - measured) / measured; ``metric`` one of
:data:`~sim.validation.metrics.METRICS`). :func:`table_markdown` renders it wide, one row
per run, each cell ``measured / simulated (error)``; docs/validation.md embeds exactly
that table (:func:`refresh_docs`). :func:`write_validation` writes ``<set>.csv`` and
``<set>.md`` atomically; ``python -m sim report`` calls :func:`report_validation`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import UserError
from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_file
from sim.io.safe_paths import check_target
from sim.validation.data import RealRun, load_validation_set
from sim.validation.metrics import METRICS
from sim.validation.replay import catalog_names, measured_metrics, replay_run, simulated_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SET = "vllm-0.6.0-burst"
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "validation" / DEFAULT_SET
"""Where ``python -m sim report`` looks for the real runs (``../shared`` next to the repository)."""
DOCS_FILE = REPO_ROOT / "docs" / "validation.md"
DOCS_BLOCK = "validation"
TABLE_COLUMNS: tuple[str, ...] = (
    "run", "gpu", "model", "n", "cost_model", "metric", "unit", "measured", "simulated", "error_pct",
)  # fmt: skip
LABELS: dict[str, tuple[str, str, str]] = {
    "ttft_p50_ms": ("median TTFT (ms)", "ms", "{:.0f}"),
    "tpot_p50_ms": ("median TPOT (ms)", "ms/token", "{:.1f}"),
    "e2e_p50_ms": ("median E2E (ms)", "ms", "{:.0f}"),
    "output_tps": ("output tok/s", "tokens/s", "{:.0f}"),
    "duration_s": ("duration (s)", "s", "{:.2f}"),
}
"""Metric -> (column title, unit, number format)."""


# --------------------------------------------------------------------------- the table
def validate_set(folder: str | Path, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Replay every run of ``folder``; the long measured-vs-simulated table.

    Raises:
        UserError: the folder is missing or corrupt, or a run's model or GPU has no batchsim
            counterpart (checked for every run before the first simulation).
    """
    return validate_runs(load_validation_set(folder), log)


def validate_runs(runs: list[RealRun], log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """:func:`validate_set` on runs already loaded."""
    for run in runs:
        catalog_names(run)
    rows: list[dict[str, Any]] = []
    for run in runs:
        replay = replay_run(run)
        rows += comparison_rows(run, measured_metrics(run), simulated_metrics(replay), replay.cost_model)
        if log:
            log(f"replayed {run.name}: {run.num_requests} requests")
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def comparison_rows(
    run: RealRun, measured: dict[str, float], simulated: dict[str, float], cost_model: str
) -> list[dict[str, Any]]:
    """One row per metric of :data:`TABLE_COLUMNS` for ``run``."""
    head = {"run": run.name, "gpu": run.summary["gpu"], "model": run.summary["model_id"],
            "n": run.num_requests, "cost_model": cost_model}
    return [
        {**head, "metric": m, "unit": LABELS[m][1], "measured": measured[m], "simulated": simulated[m],
         "error_pct": 100.0 * (simulated[m] - measured[m]) / measured[m]}
        for m in METRICS
    ]


def table_markdown(table: pd.DataFrame) -> str:
    """The wide Markdown table: one row per run, cells ``measured / simulated (error)``."""
    header = ["GPU", "model", "N", *(LABELS[m][0] for m in METRICS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (1 + len(METRICS))]
    for _, rows in table.groupby("run", sort=False):
        first = rows.iloc[0]
        by_metric = rows.set_index("metric")
        cells = [str(first["gpu"]), str(first["model"]).split("/")[-1], str(first["n"])]
        cells += [_cell(m, by_metric.loc[m]) for m in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(metric: str, row: pd.Series) -> str:
    fmt = LABELS[metric][2]
    return f"{fmt.format(row['measured'])} / {fmt.format(row['simulated'])} ({row['error_pct']:+.1f}%)"


def report_markdown(table: pd.DataFrame, runs: list[RealRun], set_name: str) -> str:
    """The whole ``<set>.md``: what was compared, the table, the sources of the measurements."""
    lines = [
        f"# Real runs vs batchsim: {set_name}",
        "",
        "Each cell: measured (vLLM's benchmark_serving) / simulated (batchsim replay) (error). Medians as "
        "benchmark_serving computes them: TTFT over requests with text, TPOT over requests with > 1 output "
        "token, E2E over all; output tok/s = client output tokens / duration. Method: docs/validation.md; "
        "regenerate with `python -m sim validate-real DIR` or `python -m sim report`.",
        "",
        table_markdown(table),
        "",
    ]
    lines += [_largest_errors(table), ""]
    lines += ["Cost model (GPU time) per run: " + "; ".join(
        f"{run}: {cm}" for run, cm in table.groupby("run", sort=False)["cost_model"].first().items()) + ".", ""]
    lines += ["Measurements (not copied here; read from the validation folder):", ""]
    lines += [f"- {r.name}: {r.summary.get('source_repo', '?')}, `{r.summary.get('source_path', '?')}` at "
              f"{str(r.summary.get('source_commit', '?'))[:7]}" for r in runs]
    return "\n".join(lines) + "\n"


def _largest_errors(table: pd.DataFrame) -> str:
    parts = []
    for gpu, rows in table.groupby("gpu", sort=False):
        worst = rows.loc[rows["error_pct"].abs().idxmax()]
        parts.append(f"{gpu} {worst['error_pct']:+.1f}% ({LABELS[worst['metric']][0]}, {worst['run']})")
    return "Largest error per GPU: " + "; ".join(parts) + "."


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
    runs = load_validation_set(folder)
    table = validate_runs(runs, log=log)
    write_validation(table, report_markdown(table, runs, set_name), out_dir, set_name)
    return table


def report_validation(out_dir: Path, log: Callable[[str], None] = print, data_dir: Path | None = None) -> None:
    """``python -m sim report``: write ``out_dir/validation/<set>.{md,csv}``, or say why not."""
    data_dir = Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
    if not (data_dir / "summary.csv").is_file():
        log(f"skipped validation: real runs not found at {data_dir} (../shared next to the repository)")
        return
    run_validation(data_dir, out_dir / "validation")
    log(f"wrote {out_dir / 'validation' / data_dir.name}.md")


# --------------------------------------------------------------------------- docs
def render_docs(text: str, table_md: str) -> str:
    """``text`` with its ``<!-- BEGIN validation -->`` block replaced by ``table_md``."""
    pattern = re.compile(rf"(<!-- BEGIN {DOCS_BLOCK} -->\n)(?:.*?\n)?(<!-- END {DOCS_BLOCK} -->)", re.S)
    if not pattern.search(text):
        raise UserError(f"no '<!-- BEGIN {DOCS_BLOCK} -->' ... '<!-- END {DOCS_BLOCK} -->' block")
    return pattern.sub(lambda m: m.group(1) + table_md + "\n" + m.group(2), text)


def refresh_docs(results_md: Path, docs: Path = DOCS_FILE, *, check: bool = False) -> bool:
    """Copy the table of ``results_md`` into the docs block; True if the docs were already current.

    With ``check`` nothing is written (``python -m sim.validation.docs --check``).
    """
    table_md = "\n".join(line for line in results_md.read_text().splitlines() if line.startswith("|"))
    current = docs.read_text()
    fresh = render_docs(current, table_md)
    if fresh != current and not check:
        with atomic_file(docs) as tmp:
            tmp.write_text(fresh)
    return fresh == current
