"""Writing a RunData to disk: atomically, and never over files batchsim did not write.

Replacement rule, one for ``run``, ``sweep``, ``capacity`` and ``report``: an output folder
that already exists is replaced only when it is empty or batchsim wrote it, as one of the
:data:`KNOWN_OUTPUTS` (a run's, a sweep's or a capacity search's): every entry is a regular
file that kind writes, and its marker file (``scenario.resolved.yaml``, ``sweep.json``,
``batchsim.json``) holds a ``batchsim_version`` key. So any command may replace what any
other wrote, and nothing else. Also refused: the current folder, the home folder and the
batchsim repository or any of their parents, and every path :func:`~sim.io.safe_paths.check_target`
refuses (over-long names, symlink loops, a path under a file, an unwritable parent, ...).
:func:`check_output_dir` applies all of it before a command spends time simulating; an
``OSError`` while saving (a full disk) is one UserError after the clean-up below.

Save protocol, safe against SIGKILL at any instant:

1. Recover and clean up after killed runs: siblings ``.NAME.tmp-PID@HOST-*`` and
   ``.NAME.old-PID@HOST-*`` whose writer (PID on this HOST) is no longer alive are removed;
   but when NAME is missing and such an ``.old-`` folder is a batchsim folder, it is the
   previous result stranded by a kill mid-swap and is renamed back to NAME first.
   Folders of live processes (or of other hosts sharing the disk) are never touched.
2. Write everything into a fresh ``.NAME.tmp-PID@HOST-*`` sibling (same filesystem, so renames
   are atomic) and chmod it to ``0o777 & ~umask`` (``mkdtemp`` makes it 0700).
3. Swap it into place: on Linux ``renameat2(RENAME_EXCHANGE)`` exchanges the two folders in one
   step, then the previous one (now under the temporary name) is deleted. Elsewhere, or on a
   filesystem without exchange, NAME is renamed to ``.NAME.old-...``, the new folder renamed
   to NAME, and the old one deleted; a kill between those renames leaves only the complete old
   folder, which step 1 of the next save restores.

So a kill leaves NAME holding the complete previous or the complete new result, never a mix
(with the fallback, possibly for a moment as ``.NAME.old-*``), and the next save cleans up.
Single files (``results/batching_speedup.*``) use :func:`sim.io.safe_write.atomic_file`
(re-exported here): a temporary sibling file, then ``os.replace``, which is atomic for files.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from sim.errors import UserError
from sim.io.csv_writer import CSV_FLOAT_FORMAT  # noqa: F401 (re-exported: every table writer uses it)
from sim.io.parquet import PARQUET_FILES, require_pyarrow, wants_parquet, write_records_parquet
from sim.io.safe_paths import Target, check_target, shown
from sim.io.safe_write import atomic_file, make_folders, remove_folders, write_error  # noqa: F401 (re-exported)
from sim.io.scenario import resolved_yaml
from sim.io.siblings import current_umask, old_name, remove_path, stale_siblings, tmp_prefix
from sim.io.yaml_reader import first_key, read_text_file

if TYPE_CHECKING:
    from sim.result import RunData


PLOTS = {
    "ttft_cdf.png": lambda r, p: p.latency_cdf(r.requests, metric="ttft_s", timeout_s=_timeout_s(r), summary=r.summary),
    "e2e_cdf.png": lambda r, p: p.latency_cdf(r.requests, metric="e2e_s", timeout_s=_timeout_s(r), summary=r.summary),
    "timeline.png": lambda r, p: p.timeline(
        r.iterations, requests=r.requests, every=r.iterations_every, replicas=r.replicas_per_policy
    ),
    "throughput.png": lambda r, p: p.throughput_over_time(r.requests),
}
RESOLVED_YAML = "scenario.resolved.yaml"
# Every file save_result may write: the only names a results folder may hold to be replaced.
TRACE_FILE = "trace.json"
BENCHMARK_FILE = "benchmark.json"
HTML_FILE = "report.html"
RESULT_FILES = frozenset(
    {"summary.csv", "summary.md", "requests.csv", "iterations.csv", RESOLVED_YAML}
    | {TRACE_FILE, BENCHMARK_FILE, HTML_FILE, *PLOTS}
    | PARQUET_FILES
)


def _timeout_s(result: RunData) -> float | None:
    """The client timeout of the run's scenario (None: clients never give up)."""
    client = result.scenario.client
    return client.timeout_s if client else None


@dataclass(frozen=True)
class OutputKind:
    """One kind of folder batchsim writes, and so may replace.

    Attributes:
        label: how error messages call it.
        files: every name batchsim writes into it; any other entry makes the folder foreign.
        marker: a YAML (or JSON) file in it that must hold ``batchsim_version``.
    """

    label: str
    files: frozenset[str]
    marker: str


MARKER_FILE = "batchsim.json"
"""The marker of folders without a manifest of their own (capacity and split searches)."""
SWEEP_PLOT_METRICS = ("ttft_p99_s", "e2e_mean_s")
"""Summary columns a sweep plots against load, one ``latency_vs_load_<metric>.png`` each."""
RUN_OUTPUT = OutputKind("batchsim results folder", RESULT_FILES, RESOLVED_YAML)
SWEEP_OUTPUT = OutputKind(
    "batchsim sweep folder",
    frozenset({"sweep.csv", "sweep.json", "sweep.md"} | {f"latency_vs_load_{m}.png" for m in SWEEP_PLOT_METRICS}),
    "sweep.json",
)
CAPACITY_OUTPUT = OutputKind(
    "batchsim capacity folder",
    frozenset({"capacity.csv", "capacity.md", "split.csv", "split.md", MARKER_FILE}
              | {"cheapest.csv", "cheapest.md", "configs.csv", "frontier.png"}),  # capacity --cheapest
    MARKER_FILE,
)
KNOWN_OUTPUTS = (RUN_OUTPUT, SWEEP_OUTPUT, CAPACITY_OUTPUT)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


# --------------------------------------------------------------------------- checks
def check_output_dir(path: str | Path, kinds: Iterable[OutputKind] = KNOWN_OUTPUTS, *, field: str = "out") -> Target:
    """Raise UserError unless ``path`` can be created, or replaced under the rule above.

    Cheap and side-effect free (a probe folder is made and removed): call it before simulating.

    Returns:
        The checked folder; its ``missing`` parents are what a save would create.
    """
    checked = check_target(path, field=field, folder=True)  # names, lengths, loops, parents, permissions
    target = Path(path).resolve()
    for protected, what in _protected_folders():
        if target == protected or target in protected.parents:
            raise UserError(f"{shown(path)}: is {what} or one of its parents; batchsim replaces its output "
                            "folder as a whole, so name a folder inside it", field=field)  # fmt: skip
    if target.parent.is_dir():
        _probe_writable(target, path, field)
    reason = foreign_reason(target, tuple(kinds)) if target.is_dir() else None
    if reason:
        raise UserError(f"{shown(path)}: {reason}; batchsim only replaces a folder it wrote itself (or an "
                        "empty one): choose another folder or move those files away", field=field)  # fmt: skip
    return checked


def _protected_folders() -> list[tuple[Path, str]]:
    """Folders an output must never replace (nor any of their parents), with how errors name them."""
    folders = [
        (Path.cwd().resolve(), "the current folder"),
        (Path(__file__).resolve().parents[2], "the batchsim repository"),
    ]  # the folder holding sim/
    try:
        folders.append((Path.home().resolve(), "your home folder"))
    except (RuntimeError, KeyError):  # no HOME and no password entry: nothing to protect
        pass
    return folders


def _probe_writable(target: Path, shown_as: str | Path, field: str) -> None:
    try:  # a real probe: os.access ignores some mounts and answers yes to root
        os.rmdir(tempfile.mkdtemp(prefix=tmp_prefix(target), dir=target.parent))
    except OSError as exc:
        raise UserError(f"{shown(shown_as)}: cannot write in {shown(target.parent)} ({exc.strerror})",
                        field=field) from None  # fmt: skip


def foreign_reason(folder: Path, kinds: tuple[OutputKind, ...] = KNOWN_OUTPUTS) -> str | None:
    """Why ``folder`` is not replaceable, or None when it is empty or of one of ``kinds``."""
    try:
        with os.scandir(folder) as scan:
            entries = sorted(scan, key=lambda e: e.name)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not entries:
        return None
    if any(_is_of_kind(folder, entries, kind) for kind in kinds):
        return None
    unknown = [e.name for e in entries if not e.is_file(follow_symlinks=False) or not _known(e.name, kinds)]
    if unknown:
        return f"holds {_listed(unknown)}, not written by batchsim"
    for kind in kinds:
        if all(e.name in kind.files for e in entries):
            return f"is not a {kind.label} (no {kind.marker} with batchsim_version)"
    return f"mixes the files of several kinds of batchsim output ({_listed([e.name for e in entries])})"


def _is_of_kind(folder: Path, entries: list[os.DirEntry], kind: OutputKind) -> bool:
    names_fit = all(e.name in kind.files and e.is_file(follow_symlinks=False) for e in entries)
    return names_fit and _has_version(folder / kind.marker)


def _known(name: str, kinds: tuple[OutputKind, ...]) -> bool:
    return any(name in kind.files for kind in kinds)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _has_version(path: Path) -> bool:
    if path.suffix == ".json":  # a sweep's or a capacity search's marker (batchsim_version may come later)
        try:
            document = json.loads(read_text_file(path, what="marker file"))
        except (UserError, ValueError):
            return False
        return isinstance(document, dict) and "batchsim_version" in document
    # batchsim writes batchsim_version as the first key; reading no further keeps any file here cheap to check.
    return first_key(path) == "batchsim_version"


def write_marker(folder: Path, command: str, **facts: object) -> None:
    """``batchsim.json``: marks ``folder`` as written by ``command`` (see :data:`CAPACITY_OUTPUT`)."""
    from sim.version import __version__

    document = {"batchsim_version": __version__, "command": command, **facts}
    (folder / MARKER_FILE).write_text(json.dumps(document, indent=1, sort_keys=True, default=str) + "\n")


# --------------------------------------------------------------------------- atomic replacement
@contextmanager
def atomic_folder(out_dir: Path, kinds: Iterable[OutputKind] = KNOWN_OUTPUTS, *, field: str = "out") -> Iterator[Path]:
    """Yield a temporary folder that replaces ``out_dir`` only if the block succeeds.

    Raises:
        UserError: ``out_dir`` is refused by :func:`check_output_dir`, or an ``OSError`` while
            writing or swapping (a full disk): nothing is left behind then, not even created parents.
    """
    kinds = tuple(kinds)
    missing = check_output_dir(out_dir, kinds, field=field).missing
    target = Path(out_dir).resolve()
    made: list[Path] = []
    tmp: Path | None = None
    try:
        made = make_folders(missing)
        _recover_and_clean(target, kinds)
        check_output_dir(out_dir, kinds, field=field)  # a recovered folder must pass too
        tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(target), dir=target.parent))
        yield tmp
        os.chmod(tmp, 0o777 & ~current_umask())
        _swap_into_place(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            remove_path(tmp)
        remove_folders(made)
        if isinstance(exc, OSError):
            raise write_error(exc, out_dir, field) from None
        raise
    remove_path(tmp)  # the previous folder after an exchange; no-op after a rename


def _swap_into_place(tmp: Path, target: Path) -> None:
    if not target.exists():  # rename also replaces an empty folder created meanwhile
        os.rename(tmp, target)
    elif not _exchange(tmp, target):
        old = old_name(target)
        os.rename(target, old)
        try:
            os.rename(tmp, target)
        except OSError:
            os.rename(old, target)
            raise
        remove_path(old)


def _recover_and_clean(target: Path, kinds: tuple[OutputKind, ...]) -> None:
    """Restore a previous result stranded by a kill mid-swap, then delete dead writers' leftovers."""
    stale = stale_siblings(target)
    if kinds and not os.path.lexists(target):
        stranded = [p for kind, p in stale if kind == "old" and p.is_dir() and foreign_reason(p, kinds) is None]
        if stranded:
            newest = max(stranded, key=lambda p: p.stat().st_mtime)
            os.rename(newest, target)
            stale = [(kind, p) for kind, p in stale if p != newest]
    for _, leftover in stale:
        remove_path(leftover)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # old kernel or filesystem without it
        return False
    raise OSError(code, os.strerror(code), str(b))


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, or a libc without it
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


# --------------------------------------------------------------------------- writing a result
def save_result(
    result: RunData,
    out_dir: Path,
    *,
    plots: bool = True,
    trace_events: bool = False,
    json: bool = False,
    html: bool = False,
) -> Path:
    """Write summary, per-request/per-iteration CSVs, the resolved scenario and plots to ``out_dir``
    (and ``trace.json`` with ``trace_events``, ``benchmark.json`` with ``json``, ``report.html`` with ``html``).

    Raises:
        UserError: ``out_dir`` is a file, or a folder holding files batchsim did not write, or the
            save failed (a full disk): then nothing of it is left behind.
    """
    if wants_parquet(result.scenario, summary_only=result.summary_only):
        require_pyarrow()  # before the folder is touched: a missing pyarrow leaves nothing half-written
    with atomic_folder(out_dir) as tmp:
        write_tables(result, tmp)
        if plots and not result.summary_only:
            write_plots(result, tmp)
        if trace_events and not result.summary_only:
            write_trace(result, tmp / TRACE_FILE)
        if json:
            write_benchmark_json(result, tmp / BENCHMARK_FILE)
        if html:
            from sim.report.html import write_html

            write_html(result, tmp / HTML_FILE)
    return out_dir


def write_benchmark_json(result: RunData, path: Path) -> None:
    """``benchmark.json``: per policy, vLLM benchmark_serving's result keys (:mod:`sim.metrics.benchmark`)."""
    import json

    from sim.version import __version__

    facts = result.facts
    document = {
        "backend": "batchsim",
        "batchsim_version": __version__,
        "scenario": result.scenario.name,
        "seed": result.seed,
        "model_id": facts.get("model_hf_name"),
        "gpu": result.scenario.gpu,
        "tensor_parallel": result.scenario.tensor_parallel,
        "replicas": result.scenario.replicas,
        "metric_percentiles": ",".join(f"{q:g}" for q in result.scenario.metrics.percentiles),
        "results": [{"policy": name, **record} for name, record in result.benchmark.items()],
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")


def write_trace(result: RunData, path: Path) -> None:
    """The run as a Chrome trace-event file (see :mod:`sim.report.trace_events`)."""
    import json

    from sim.report.trace_events import trace_events

    client, block = result.scenario.client, result.scenario.disaggregation
    document = trace_events(
        result.requests,
        result.iterations,
        timeout_s=client.timeout_s if client else None,
        prefill_replicas={block.name: block.prefill.replicas} if block is not None else None,
    )
    with path.open("w") as handle:
        json.dump(document, handle, separators=(",", ":"))


def write_tables(result: RunData, folder: Path) -> None:
    """summary.csv/.md, requests.csv, iterations.csv (sampled if huge; .parquet with metrics.format: parquet),
    scenario.resolved.yaml."""
    from sim.io.csv_writer import write_csv
    from sim.report.tables import summary_markdown

    write_csv(result.summary, folder / "summary.csv", CSV_FLOAT_FORMAT)
    (folder / "summary.md").write_text(_summary_md(result, summary_markdown))
    if wants_parquet(result.scenario, summary_only=result.summary_only):
        write_records_parquet(result, folder)
    elif not result.summary_only:  # --summary-only: the records were never kept
        write_csv(result.requests, folder / "requests.csv", CSV_FLOAT_FORMAT)
        # Already every k-th pass per policy, sampled in memory (k: facts["iterations_every"]).
        write_csv(result.iterations, folder / "iterations.csv", CSV_FLOAT_FORMAT)
    (folder / RESOLVED_YAML).write_text(resolved_yaml(result))


def deployment_text(gpu: str, tensor_parallel: int, replicas: int, pipeline_parallel: int = 1) -> str:
    """``a100-80gb, TP 2 x 3 replicas`` (``PP 2 x TP 2 x 1 replica`` with pipeline stages): the GPUs a
    scenario runs on, as the run header says it."""
    stages = f"PP {pipeline_parallel} x " if pipeline_parallel != 1 else ""
    return f"{gpu}, {stages}TP {tensor_parallel} x {replicas} replica{'s' if replicas != 1 else ''}"


def _summary_md(result: RunData, render: Callable[[pd.DataFrame], str]) -> str:
    facts, scenario = result.facts, result.scenario
    head = f"# {scenario.name}\n\n"
    head += (
        f"{facts['requests']} requests, seed {result.seed}, {facts['model_hf_name']} on "
        f"{deployment_text(scenario.gpu, scenario.tensor_parallel, scenario.replicas, scenario.pipeline_parallel)}, "
        f"KV cache {facts['kv_capacity_tokens_per_replica']} tokens per replica, cost model: "
        f"{facts['cost_model']}.\n\n"
    )
    from sim.report.tables import trust_notes

    return head + render(result.summary) + trust_notes(result.summary)



def write_plots(result: RunData, folder: Path) -> None:
    """The standard figures of a run: latency CDFs, batch/KV timeline, throughput over time."""
    from sim.report import plots

    for filename, make in PLOTS.items():
        plots.save_figure(make(result, plots), folder / filename)
