"""Request traces: the registered public traces, finding them, loading and validating them.

A batchsim trace is a CSV with ``arrived_at`` (seconds, ascending; optional for
length-only traces), ``num_prefill_tokens`` and ``num_decode_tokens`` (whole numbers
>= 1) — the format of the Splitwise conversation trace as published in Vidur's
repository. Scenarios name a trace by path (relative to the scenario file) or by a
registered name from :data:`TRACE_NAMES`; registered traces are looked up in
``$BATCHSIM_TRACE_DIR``, then ``../shared/traces`` next to the repository, then the
download cache (``python -m sim traces fetch NAME`` fills it).

Every problem with a trace is a :class:`~sim.errors.UserError` naming the file, the
line (as a text editor counts it: the header is line 1), the column and the value.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.error import URLError
from urllib.request import urlopen

import numpy as np
import pandas as pd

from sim.errors import MissingDataError, UserError, did_you_mean
from sim.io.csv_reader import cell_text, number_column, read_csv, require_columns, where

ARRIVAL_COLUMN = "arrived_at"
PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"
_DOWNLOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TraceInfo:
    """A public trace batchsim knows by name.

    Attributes:
        file: file name in the trace folders (and in the download cache).
        description: one line for ``python -m sim list``/``traces`` output.
        url: where ``fetch_trace`` downloads it from; None if it cannot be fetched.
        source_format: ``"azure"`` (AzurePublicDataset columns, converted on fetch)
            or ``"batchsim"`` (already in this module's format).
        has_arrivals: whether the trace has arrival times (else lengths only).
        license: licence of the data, to credit it.
    """

    file: str
    description: str
    url: str | None
    source_format: Literal["azure", "batchsim"]
    has_arrivals: bool
    license: str

    def __str__(self) -> str:
        kind = "arrivals + lengths" if self.has_arrivals else "lengths only"
        return f"{self.description} ({kind}; {self.license}; file {self.file})"


_AZURE_DATA = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data"

TRACE_NAMES: dict[str, TraceInfo] = {
    "azure-conv-2023": TraceInfo(
        file="splitwise_conv.csv",
        description="Azure LLM inference trace 2023, conversation service (Splitwise, ISCA'24): "
        "19,366 requests over 58 minutes",
        url=f"{_AZURE_DATA}/AzureLLMInferenceTrace_conv.csv",
        source_format="azure",
        has_arrivals=True,
        license="CC-BY, Microsoft AzurePublicDataset",
    ),
    "azure-code-2023": TraceInfo(
        file="splitwise_code.csv",
        description="Azure LLM inference trace 2023, coding service (Splitwise, ISCA'24)",
        url=f"{_AZURE_DATA}/AzureLLMInferenceTrace_code.csv",
        source_format="azure",
        has_arrivals=True,
        license="CC-BY, Microsoft AzurePublicDataset",
    ),
    "arxiv-summarization": TraceInfo(
        file="arxiv_summarization_lengths.csv",
        description="arXiv long-document summarization: 28,257 (prompt, output) token counts, Llama-2 tokenizer",
        url="https://raw.githubusercontent.com/microsoft/vidur/main/data/processed_traces/"
        "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        source_format="batchsim",
        has_arrivals=False,
        license="MIT, Microsoft Vidur",
    ),
}


# --------------------------------------------------------------------------- locating
def default_cache_dir() -> Path:
    """Download cache for traces: ``$BATCHSIM_CACHE/traces``, else ``~/.cache/batchsim/traces``."""
    root = os.environ.get("BATCHSIM_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "batchsim"
    return base / "traces"


def trace_search_dirs() -> list[Path]:
    """Folders searched, in order, for a registered trace's file."""
    dirs = []
    if os.environ.get("BATCHSIM_TRACE_DIR"):
        dirs.append(Path(os.environ["BATCHSIM_TRACE_DIR"]).expanduser())
    # sim/workload/traces.py -> parents[2] is the repository root; shared/ sits next to it.
    dirs.append(Path(__file__).resolve().parents[3] / "shared" / "traces")
    dirs.append(default_cache_dir())
    return dirs


def resolve_trace_path(path_or_name: str, base_dir: str | None = None) -> Path:
    """Find a trace file from a path or a registered trace name.

    Args:
        path_or_name: a registered name (see :data:`TRACE_NAMES`), or a CSV path; a
            relative path is tried against ``base_dir`` and then the working directory.
        base_dir: folder of the scenario file, if any.

    Raises:
        UserError: no such file, saying where it looked and how to get it.
    """
    if path_or_name in TRACE_NAMES:
        return _find_registered(path_or_name)
    path = Path(path_or_name).expanduser()
    bases = [] if path.is_absolute() else [Path(b) for b in (base_dir, os.getcwd()) if b]
    candidates = [b / path for b in bases] or [path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise MissingDataError(
        f"trace file not found: '{path_or_name}' (looked for {looked}); give a CSV path "
        f"relative to the scenario file or a registered trace name "
        f"({', '.join(TRACE_NAMES)}){did_you_mean(path_or_name, TRACE_NAMES)}"
    )


def local_trace_path(name: str) -> Path | None:
    """Where registered trace ``name`` is on this machine (first search folder holding it), or None."""
    info = TRACE_NAMES[name]
    return next((folder / info.file for folder in trace_search_dirs() if (folder / info.file).is_file()), None)


def _find_registered(name: str) -> Path:
    info = TRACE_NAMES[name]
    found = local_trace_path(name)
    if found is not None:
        return found
    dirs = trace_search_dirs()
    how = f"download it with `python -m sim traces fetch {name}`" if info.url else f"copy {info.file} into one of them"
    raise MissingDataError(
        f"trace '{name}' ({info.file}) not found in {', '.join(map(str, dirs))}; {how}, "
        f"or set BATCHSIM_TRACE_DIR to a folder that holds it"
    )


# --------------------------------------------------------------------------- loading
def load_trace(path_or_name: str, base_dir: str | None = None) -> pd.DataFrame:
    """Read and validate a batchsim trace.

    Args:
        path_or_name: CSV path or registered trace name (see :func:`resolve_trace_path`).
        base_dir: folder of the scenario file, if any.

    Returns:
        A frame with ``arrived_at`` (float seconds, ascending; only if the file has it),
        ``num_prefill_tokens`` and ``num_decode_tokens`` (int64 >= 1); other columns dropped.

    Raises:
        UserError: missing file or column, unreadable CSV, a non-numeric or empty cell,
            a token count that is not a whole number >= 1, or arrivals out of order.
    """
    path = resolve_trace_path(path_or_name, base_dir)
    frame = read_csv(path)
    columns: dict[str, np.ndarray] = {}
    if ARRIVAL_COLUMN in frame.columns:
        columns[ARRIVAL_COLUMN] = _arrival_column(frame, path)
    for column in (PROMPT_COLUMN, OUTPUT_COLUMN):
        columns[column] = token_column(frame, column, path)
    return pd.DataFrame(columns)


def load_token_column(path_or_name: str, column: str, base_dir: str | None = None) -> np.ndarray:
    """Read one column of token counts (int64 >= 1) from a CSV, validated like a trace."""
    path = resolve_trace_path(path_or_name, base_dir)
    return token_column(read_csv(path), column, path)


def token_column(frame: pd.DataFrame, column: str, path: Path, min_tokens: int = 1) -> np.ndarray:
    """Validated whole-number column of ``frame`` as int64 (UserError names line and value)."""
    return number_column(frame, column, path, minimum=min_tokens, whole=True).astype(np.int64)


def _arrival_column(frame: pd.DataFrame, path: Path) -> np.ndarray:
    values = number_column(frame, ARRIVAL_COLUMN, path)
    backwards = np.flatnonzero(np.diff(values) < 0)
    if backwards.size:
        row = int(backwards[0]) + 1
        raise UserError(
            f"{where(path, row, ARRIVAL_COLUMN)}: {values[row]:g} is earlier than the row before "
            f"({values[row - 1]:g}); arrival times must be sorted ascending"
        )
    return values


# --------------------------------------------------------------------------- converting
def convert_azure_trace(src: Path, dst: Path) -> int:
    """Convert an AzurePublicDataset LLM trace to a batchsim trace.

    The source has ``TIMESTAMP`` (e.g. ``2023-11-16 18:15:46.6805900``),
    ``ContextTokens`` and ``GeneratedTokens``. Rows are ordered by time;
    ``arrived_at`` is seconds since the first request. A count of 0 tokens becomes 1:
    the request still arrived and was served, and the simulator needs >= 1.

    Args:
        src: the downloaded Azure CSV.
        dst: where to write the batchsim CSV: a new path or a regular file, replaced atomically
            (:func:`sim.io.safe_write.atomic_file`; a FIFO, a device or a folder is refused).

    Returns:
        The number of requests written.

    Raises:
        UserError: a missing column, an unparseable timestamp, a bad token count, a ``dst`` that
            is not a new path or a regular file, or a failed write (a full disk).
    """
    src, dst = Path(src), Path(dst)
    frame = read_csv(src)
    stamps_ns = _timestamps_ns(frame, src)
    order = np.argsort(stamps_ns, kind="stable")
    prompt = np.maximum(token_column(frame, "ContextTokens", src, min_tokens=0), 1)
    output = np.maximum(token_column(frame, "GeneratedTokens", src, min_tokens=0), 1)
    converted = pd.DataFrame(
        {
            ARRIVAL_COLUMN: (stamps_ns[order] - stamps_ns[order[0]]) / 1e9,
            PROMPT_COLUMN: prompt[order],
            OUTPUT_COLUMN: output[order],
        }
    )
    _write_atomically(converted, dst)
    return len(converted)


def _timestamps_ns(frame: pd.DataFrame, path: Path) -> np.ndarray:
    require_columns(frame, ["TIMESTAMP"], path)
    raw = frame["TIMESTAMP"]
    stamps = pd.to_datetime(raw.astype("string"), format="ISO8601", errors="coerce")
    bad = stamps.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise UserError(
            f"{where(path, row, 'TIMESTAMP')}: {cell_text(frame, row, 'TIMESTAMP', path)} is not a timestamp "
            f"like 2023-11-16 18:15:46.6805900"
        )
    return stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)


def _write_atomically(frame: pd.DataFrame, dst: Path) -> None:
    from sim.io.safe_write import atomic_file

    with atomic_file(dst, field="dst") as tmp:
        frame.to_csv(tmp, index=False, float_format="%.7f")  # 7 decimals: the source's 100 ns resolution


# --------------------------------------------------------------------------- fetching
def fetch_trace(name: str, cache_dir: Path | None = None) -> Path:
    """Download a registered public trace into the cache and convert it to batchsim format.

    Args:
        name: a key of :data:`TRACE_NAMES`, e.g. ``"azure-conv-2023"``.
        cache_dir: target folder (default :func:`default_cache_dir`).

    Returns:
        Path of the converted trace. It is written atomically, so an interrupted or
        failed fetch leaves no partial file behind.

    Raises:
        UserError: unknown name, a trace without a public URL, a network failure, or a
            download that is not a valid trace.
    """
    if name not in TRACE_NAMES:
        raise UserError(
            f"unknown trace '{name}'{did_you_mean(name, TRACE_NAMES)}; registered traces: {', '.join(TRACE_NAMES)}"
        )
    info = TRACE_NAMES[name]
    if info.url is None:
        raise UserError(f"trace '{name}' has no public download URL; copy {info.file} by hand")
    from sim.io.safe_paths import check_target
    from sim.io.safe_write import atomic_file

    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dst = folder / info.file
    check_target(dst, field="cache-dir")  # before downloading: a cache under a file, a FIFO named like the trace
    with tempfile.TemporaryDirectory(prefix="batchsim-fetch-") as tmp:
        raw = Path(tmp) / "download.csv"
        _download(info.url, raw, name)
        if info.source_format == "azure":
            convert_azure_trace(raw, dst)
        else:
            load_trace(str(raw))  # validate before it replaces anything
            with atomic_file(dst, field="cache-dir") as written:
                shutil.copyfile(raw, written)
    return dst


def _download(url: str, dst: Path, name: str) -> None:
    try:
        with urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response, open(dst, "wb") as out:
            shutil.copyfileobj(response, out)
    except (URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise UserError(
            f"could not download trace '{name}' from {url}: {reason}; check the network "
            f"connection (or proxy settings) and retry"
        ) from None
