"""Trace lookup, validation (each kind of corruption), Azure conversion and fetching (offline)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pandas as pd
import pytest

from sim.errors import UserError
from sim.workload import traces
from sim.workload.traces import (
    TRACE_NAMES,
    convert_azure_trace,
    fetch_trace,
    load_trace,
    resolve_trace_path,
)

DATA = Path(__file__).resolve().parent / "data"
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.fixture(autouse=True)
def _isolated_trace_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the user's real cache or an ambient BATCHSIM_TRACE_DIR."""
    monkeypatch.delenv("BATCHSIM_TRACE_DIR", raising=False)
    monkeypatch.setenv("BATCHSIM_CACHE", str(tmp_path / "cache"))


def _write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + body)
    return path


# --------------------------------------------------------------------------- loading
def test_load_trace_reads_columns_and_types() -> None:
    frame = load_trace(str(DATA / "tiny_trace.csv"))
    assert list(frame.columns) == ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
    assert frame["num_prefill_tokens"].dtype == np.int64
    assert frame["arrived_at"].tolist() == [10.0, 10.5, 12.0, 12.0, 15.25]
    assert frame["num_decode_tokens"].tolist() == [20, 5, 300, 1, 64]


def test_lengths_only_trace_loads_without_arrivals() -> None:
    frame = load_trace(str(DATA / "lengths_only.csv"))
    assert list(frame.columns) == ["num_prefill_tokens", "num_decode_tokens"]
    assert len(frame) == 4


# (body, line, column, a fragment of the value/explanation)
CORRUPT = {
    "non-numeric token": ("0.0,10,5\n1.0,ten,5\n", 3, "num_prefill_tokens", "'ten'"),
    "empty token cell": ("0.0,10,5\n1.0,10,\n", 3, "num_decode_tokens", "empty cell"),
    "negative tokens": ("0.0,10,5\n1.0,10,5\n2.0,-4,5\n", 4, "num_prefill_tokens", "'-4'"),
    "zero tokens": ("0.0,10,0\n", 2, "num_decode_tokens", ">= 1"),
    "fractional tokens": ("0.0,10.5,3\n", 2, "num_prefill_tokens", "whole number"),
    "unsorted arrival": ("0.0,10,5\n2.0,10,5\n1.5,10,5\n", 4, "arrived_at", "sorted"),
    "nan arrival": ("0.0,10,5\nnan,10,5\n", 3, "arrived_at", "not a finite number"),
    "empty arrival": ("0.0,10,5\n,10,5\n", 3, "arrived_at", "empty cell"),
    "text arrival": ("0.0,10,5\nsoon,10,5\n", 3, "arrived_at", "'soon'"),
    "blank line inside": ("0.0,10,5\n\n1.0,10,5\n", 3, "arrived_at", "empty cell"),
}


@pytest.mark.parametrize("case", CORRUPT.values(), ids=list(CORRUPT))
def test_corrupt_rows_name_file_line_column_and_value(tmp_path: Path, case: tuple[str, int, str, str]) -> None:
    body, line, column, fragment = case
    path = _write(tmp_path, body)
    with pytest.raises(UserError) as err:
        load_trace(str(path))
    message = str(err.value)
    assert str(path) in message
    assert f"line {line}," in message
    assert f"column '{column}'" in message
    assert fragment in message


def test_a_cell_pandas_reads_as_missing_is_quoted_as_written(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"line 3, column 'num_decode_tokens': value 'NA' is not"):
        load_trace(str(_write(tmp_path, "0.0,10,5\n1.0,10,NA\n")))


def test_a_long_cell_is_cut_short_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        load_trace(str(_write(tmp_path, "0.0,10,5\n1.0," + "x" * 100_000 + ",5\n")))
    message = str(err.value)
    assert "line 3" in message and "xxx…" in message and len(message) < 400


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "0.0,10,5\n1.5,3,4\n").encode())
    frame = load_trace(str(path))
    assert frame["arrived_at"].tolist() == [0.0, 1.5] and frame["num_prefill_tokens"].tolist() == [10, 3]


def test_one_field_too_many_is_refused_not_shifted(tmp_path: Path) -> None:
    # pandas alone would read the first field as an index and every value under the wrong name.
    with pytest.raises(UserError, match="more fields than the header"):
        load_trace(str(_write(tmp_path, "0,0.0,10,5\n1,1.0,10,5\n")))


@pytest.mark.parametrize("count", [2**53 + 2, 10**30])
def test_token_counts_beyond_exact_floats_are_refused(tmp_path: Path, count: int) -> None:
    with pytest.raises(UserError, match=r"line 2, column 'num_prefill_tokens'.*2\*\*53"):
        load_trace(str(_write(tmp_path, f"0.0,{count},5\n")))


def test_missing_column_is_named_with_a_hint(tmp_path: Path) -> None:
    path = _write(tmp_path, "0.0,10,5\n", header="arrived_at,num_prefill_tokens,num_decode\n")
    with pytest.raises(UserError, match=r"no column 'num_decode_tokens'.*did you mean 'num_decode'"):
        load_trace(str(path))


@pytest.mark.parametrize("text", ["", HEADER, "a,b\n1,2,3,4\n1\n"])
def test_unreadable_or_empty_csv_is_a_user_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UserError, match="bad.csv"):
        load_trace(str(path))


def test_trailing_blank_lines_are_harmless(tmp_path: Path) -> None:
    assert len(load_trace(str(_write(tmp_path, "0.0,10,5\n1.0,3,4\n\n\n")))) == 2


# --------------------------------------------------------------------------- locating
def test_missing_file_is_a_user_error_with_a_name_hint() -> None:
    with pytest.raises(UserError, match=r"not found.*did you mean 'azure-conv-2023'"):
        resolve_trace_path("azure-conv-2024")


def test_relative_path_prefers_the_scenario_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario_dir, cwd = tmp_path / "scenarios", tmp_path / "cwd"
    for folder in (scenario_dir, cwd):
        folder.mkdir()
        (folder / "t.csv").write_text(HEADER + "0,1,1\n")
    monkeypatch.chdir(cwd)
    assert resolve_trace_path("t.csv", base_dir=str(scenario_dir)) == scenario_dir / "t.csv"
    assert resolve_trace_path("t.csv").resolve() == (cwd / "t.csv").resolve()
    (scenario_dir / "t.csv").unlink()
    assert resolve_trace_path("t.csv", base_dir=str(scenario_dir)).resolve() == (cwd / "t.csv").resolve()


def test_registered_name_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = TRACE_NAMES["azure-code-2023"]  # not in ../shared, so only our folders count
    cache = tmp_path / "cache" / "traces"
    cache.mkdir(parents=True)
    shutil.copy(DATA / "tiny_trace.csv", cache / info.file)
    assert resolve_trace_path("azure-code-2023") == cache / info.file
    override = tmp_path / "mine"
    override.mkdir()
    shutil.copy(DATA / "tiny_trace.csv", override / info.file)
    monkeypatch.setenv("BATCHSIM_TRACE_DIR", str(override))
    assert resolve_trace_path("azure-code-2023") == override / info.file


def test_missing_registered_trace_says_how_to_fetch_it() -> None:
    with pytest.raises(UserError, match=r"python -m sim traces fetch azure-code-2023"):
        resolve_trace_path("azure-code-2023")


# --------------------------------------------------------------------------- converting
def test_convert_azure_trace(tmp_path: Path) -> None:
    dst = tmp_path / "out" / "conv.csv"
    assert convert_azure_trace(DATA / "azure_llm_sample.csv", dst) == 4
    frame = load_trace(str(dst))  # the output is a valid batchsim trace
    # Rows sorted by time (the fixture's last row is out of order), seconds from the first.
    np.testing.assert_allclose(frame["arrived_at"], [0.0, 4.314579, 4.41941, 4.541877], atol=1e-7)
    assert frame["num_prefill_tokens"].tolist() == [374, 396, 91, 879]
    assert frame["num_decode_tokens"].tolist() == [44, 109, 1, 55]  # 0 generated -> 1
    assert sorted(p.name for p in dst.parent.iterdir()) == ["conv.csv"]  # no temp files left


def test_convert_azure_trace_bad_timestamp(tmp_path: Path) -> None:
    src = tmp_path / "raw.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\nyesterday,2,2\n")
    with pytest.raises(UserError, match=r"line 3, column 'TIMESTAMP'.*'yesterday'"):
        convert_azure_trace(src, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


def test_convert_azure_trace_negative_tokens(tmp_path: Path) -> None:
    src = tmp_path / "raw.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-1,1\n")
    with pytest.raises(UserError, match=r"line 2, column 'ContextTokens'"):
        convert_azure_trace(src, tmp_path / "out.csv")


# --------------------------------------------------------------------------- fetching (offline)
def test_fetch_trace_downloads_and_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requested = []

    def fake_urlopen(url: str, timeout: float) -> io.BytesIO:
        requested.append(url)
        return io.BytesIO((DATA / "azure_llm_sample.csv").read_bytes())

    monkeypatch.setattr(traces, "urlopen", fake_urlopen)
    path = fetch_trace("azure-conv-2023", cache_dir=tmp_path)
    assert requested == [TRACE_NAMES["azure-conv-2023"].url]
    assert path == tmp_path / "splitwise_conv.csv"
    assert len(load_trace(str(path))) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["splitwise_conv.csv"]


def test_fetch_trace_network_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, timeout: float) -> io.BytesIO:
        raise URLError("no route to host")

    monkeypatch.setattr(traces, "urlopen", offline)
    with pytest.raises(UserError, match=r"could not download trace 'azure-conv-2023'.*no route"):
        fetch_trace("azure-conv-2023", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing partial left behind


def test_fetch_trace_rejects_a_corrupt_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traces, "urlopen", lambda url, timeout: io.BytesIO(b"<html>rate limited</html>"))
    with pytest.raises(UserError):
        fetch_trace("arxiv-summarization", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fetch_unknown_trace_name() -> None:
    with pytest.raises(UserError, match=r"unknown trace 'azure-conv'.*did you mean"):
        fetch_trace("azure-conv")


# --------------------------------------------------------------------------- the real trace
def test_real_splitwise_conv_trace() -> None:
    if not (SHARED_TRACES / "splitwise_conv.csv").is_file():
        pytest.skip(f"{SHARED_TRACES / 'splitwise_conv.csv'} absent (shared data not mounted)")
    path = resolve_trace_path("azure-conv-2023")
    assert path.resolve() == (SHARED_TRACES / "splitwise_conv.csv").resolve()
    frame = load_trace("azure-conv-2023")
    assert len(frame) == 19_366
    assert frame["arrived_at"].is_monotonic_increasing and frame["arrived_at"].iloc[0] == 0.0
    raw = pd.read_csv(path)
    np.testing.assert_array_equal(frame["num_decode_tokens"], raw["num_decode_tokens"])
