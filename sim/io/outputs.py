"""Writing a RunData to disk: atomically, and never over files batchsim did not write.

Replacement rule: an output folder that already exists is replaced only when it is empty or
is a batchsim output folder: every entry is a regular file named in :data:`RESULT_FILES`
(the one allow-list; :data:`KNOWN_OUTPUTS` holds it and the capacity folder's) and
``scenario.resolved.yaml`` starts with a ``batchsim_version`` key. Anything else (a file, a path
under a file, an unwritable parent, a folder holding other files, the current folder or one
of its parents) is a :class:`~sim.errors.UserError` that names the path and the reason;
:func:`check_output_dir` applies the rule before a run spends time simulating.

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
Single files (``results/batching_speedup.*``) use :func:`atomic_file`: a temporary sibling
file, then ``os.replace``, which is atomic for files.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from sim.errors import UserError
from sim.io.parquet import PARQUET_FILES, require_pyarrow, wants_parquet, write_records_parquet
from sim.io.scenario import resolved_yaml
from sim.io.yaml_reader import first_key

if TYPE_CHECKING:
    from sim.result import RunData

CSV_FLOAT_FORMAT = "%.6g"  # six significant digits: byte-stable files, far finer than the model's accuracy

PLOTS = {
    "ttft_cdf.png": lambda r, p: p.latency_cdf(r.requests, metric="ttft_s", timeout_s=_timeout_s(r)),
    "e2e_cdf.png": lambda r, p: p.latency_cdf(r.requests, metric="e2e_s", timeout_s=_timeout_s(r)),
    "timeline.png": lambda r, p: p.timeline(r.iterations, requests=r.requests),
    "throughput.png": lambda r, p: p.throughput_over_time(r.requests),
}
RESOLVED_YAML = "scenario.resolved.yaml"
# Every file save_result may write: the only names a results folder may hold to be replaced.
TRACE_FILE = "trace.json"
BENCHMARK_FILE = "benchmark.json"
HTML_FILE = "report.html"
RESULT_FILES = frozenset(
    {"summary.csv", "summary.md", "requests.csv", "iterations.csv", RESOLVED_YAML}
    | {TRACE_FILE, BENCHMARK_FILE, HTML_FILE, *PLOTS} | PARQUET_FILES
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
        marker: a YAML file in it that must hold ``batchsim_version`` (None: names alone decide).
    """

    label: str
    files: frozenset[str]
    marker: str | None = None


RUN_OUTPUT = OutputKind("batchsim results folder", RESULT_FILES, RESOLVED_YAML)
CAPACITY_OUTPUT = OutputKind("batchsim capacity folder", frozenset({"capacity.csv", "capacity.md"}))
KNOWN_OUTPUTS = (RUN_OUTPUT, CAPACITY_OUTPUT)

# .NAME.tmp-PID@HOST-RANDOM[.ext] or .NAME.old-PID@HOST-RANDOM; .NAME.old-PID as batchsim 0.1.0 named it.
_SIBLING = (r"\.{name}\.(?:(?P<kind>tmp|old)-(?P<pid>\d+)@(?P<host>[0-9a-f]{{8}})-[a-z0-9_]+(?:\.[a-z]+)?"
            r"|old-(?P<legacy>\d+))")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


# --------------------------------------------------------------------------- checks
def check_output_dir(path: str | Path, kinds: Iterable[OutputKind] = (RUN_OUTPUT,)) -> None:
    """Raise UserError unless ``path`` can be created, or replaced under the rule above.

    Cheap and side-effect free (a probe folder is made and removed): call it before simulating.
    """
    target = Path(path).resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise UserError(f"output folder {path}: is the current folder or one of its parents; "
                        "batchsim replaces its output folder as a whole, so name a folder inside it")
    if target.exists() and not target.is_dir():
        raise UserError(f"output folder {path}: is a file, not a folder")
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"output folder {path}: {ancestor} is a file, not a folder")
    _check_writable(ancestor, target, path)
    reason = foreign_reason(target, tuple(kinds)) if target.is_dir() else None
    if reason:
        raise UserError(f"output folder {path}: {reason}; batchsim only replaces a folder it wrote "
                        "itself (or an empty one): choose another folder or move those files away")


def _check_writable(ancestor: Path, target: Path, shown: str | Path) -> None:
    if ancestor != target.parent:  # parents still to create: a probe would have to create them
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise UserError(f"output folder {shown}: cannot create it, {ancestor} is not writable")
        return
    try:  # a real probe: os.access ignores read-only mounts and answers yes to root
        os.rmdir(tempfile.mkdtemp(prefix=_tmp_prefix(target), dir=ancestor))
    except OSError as exc:
        raise UserError(f"output folder {shown}: cannot write in {ancestor} ({exc.strerror})") from None


def foreign_reason(folder: Path, kinds: tuple[OutputKind, ...] = KNOWN_OUTPUTS) -> str | None:
    """Why ``folder`` is not replaceable, or None when it is empty or of one of ``kinds``."""
    try:
        with os.scandir(folder) as scan:
            entries = sorted(scan, key=lambda e: e.name)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not entries:
        return None
    reasons = [_mismatch(folder, entries, kind) for kind in kinds]
    return None if None in reasons else reasons[0]


def _mismatch(folder: Path, entries: list[os.DirEntry], kind: OutputKind) -> str | None:
    foreign = [e.name for e in entries if e.name not in kind.files or not e.is_file(follow_symlinks=False)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return f"holds {shown}, not written by batchsim"
    if kind.marker and not _has_version(folder / kind.marker):
        return f"is not a {kind.label} (no {kind.marker} with batchsim_version)"
    return None


def _has_version(path: Path) -> bool:
    # batchsim writes batchsim_version as the first key; reading no further keeps any file here cheap to check.
    return first_key(path) == "batchsim_version"


# --------------------------------------------------------------------------- atomic replacement
@contextmanager
def atomic_folder(out_dir: Path, kinds: Iterable[OutputKind] = KNOWN_OUTPUTS) -> Iterator[Path]:
    """Yield a temporary folder that replaces ``out_dir`` only if the block succeeds.

    Raises:
        UserError: ``out_dir`` exists and is not empty nor of one of ``kinds`` (see module docstring).
    """
    kinds = tuple(kinds)
    target = Path(out_dir).resolve()
    check_output_dir(out_dir, kinds)
    target.parent.mkdir(parents=True, exist_ok=True)
    _recover_and_clean(target, kinds)
    check_output_dir(out_dir, kinds)  # a recovered folder must pass too
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(target), dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        _swap_into_place(tmp, target)
    finally:
        _remove(tmp)  # the failed attempt, or the previous folder after an exchange; no-op after a rename


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling path that replaces ``path`` (one file) if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover_and_clean(path, ())
    handle, name = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=path.suffix, dir=path.parent)
    os.close(handle)
    try:
        yield Path(name)
        os.chmod(name, 0o666 & ~_umask())
        os.replace(name, path)
    finally:
        _remove(Path(name))


def _swap_into_place(tmp: Path, target: Path) -> None:
    if not target.exists():  # rename also replaces an empty folder created meanwhile
        os.rename(tmp, target)
    elif not _exchange(tmp, target):
        old = target.with_name(f".{target.name}.old-{_owner()}-{secrets.token_hex(4)}")
        os.rename(target, old)
        try:
            os.rename(tmp, target)
        except OSError:
            os.rename(old, target)
            raise
        _remove(old)


def _recover_and_clean(target: Path, kinds: tuple[OutputKind, ...]) -> None:
    """Restore a previous result stranded by a kill mid-swap, then delete dead writers' leftovers."""
    stale = _stale_siblings(target)
    if kinds and not os.path.lexists(target):
        stranded = [p for kind, p in stale if kind == "old" and p.is_dir() and foreign_reason(p, kinds) is None]
        if stranded:
            newest = max(stranded, key=lambda p: p.stat().st_mtime)
            os.rename(newest, target)
            stale = [(kind, p) for kind, p in stale if p != newest]
    for _, leftover in stale:
        _remove(leftover)


def _stale_siblings(target: Path) -> list[tuple[str, Path]]:
    """(tmp|old, path) of siblings written for ``target`` by processes of this host that are gone.

    Rule: the writer's pid and host are in the name, and only a pid that no longer exists on
    this host counts as gone; a live pid (even a reused one) or another host keeps its folder,
    so a concurrent run's work in progress is never deleted.
    """
    pattern = re.compile(_SIBLING.format(name=re.escape(target.name)))
    found = []
    for entry in target.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and (match["host"] or _HOST) == _HOST and not _pid_alive(int(match["pid"] or match["legacy"])):
            found.append((match["kind"] or "old", entry))
    return found


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # Windows os.kill would terminate the process: assume alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: exists, owned by someone else
        return True
    return True


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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return mask


_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _owner() -> str:
    return f"{os.getpid()}@{_HOST}"  # read at each call: a forked worker has its own pid


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}.tmp-{_owner()}-"


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
        UserError: ``out_dir`` is a file, or a folder holding files batchsim did not write.
    """
    if wants_parquet(result.scenario, summary_only=result.summary_only):
        require_pyarrow()  # before the folder is touched: a missing pyarrow leaves nothing half-written
    with atomic_folder(out_dir, (RUN_OUTPUT,)) as tmp:
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

    client = result.scenario.client
    document = trace_events(result.requests, result.iterations, timeout_s=client.timeout_s if client else None)
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


def deployment_text(gpu: str, tensor_parallel: int, replicas: int) -> str:
    """``a100-80gb, TP 2 x 3 replicas``: the GPUs a scenario runs on, as the run header says it."""
    return f"{gpu}, TP {tensor_parallel} x {replicas} replica{'s' if replicas != 1 else ''}"


def _summary_md(result: RunData, render: Callable[[pd.DataFrame], str]) -> str:
    facts, scenario = result.facts, result.scenario
    head = f"# {scenario.name}\n\n"
    head += (f"{facts['requests']} requests, seed {result.seed}, {facts['model_hf_name']} on "
             f"{deployment_text(scenario.gpu, scenario.tensor_parallel, scenario.replicas)}, "
             f"KV cache {facts['kv_capacity_tokens_per_replica']} tokens per replica, cost model: "
             f"{facts['cost_model']}.\n\n")
    return head + render(result.summary) + "\n"


def write_plots(result: RunData, folder: Path) -> None:
    """The standard figures of a run: latency CDFs, batch/KV timeline, throughput over time."""
    from sim.report import plots

    for filename, make in PLOTS.items():
        plots.save_figure(make(result, plots), folder / filename)
