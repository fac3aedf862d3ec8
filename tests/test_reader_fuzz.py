"""Fuzz of every data-file reader through the CLI: exit 0, or exit 2 with one short line (issue 25).

Each test takes a small well-formed file (a few rows copied from ``../shared``; skipped, saying
why, where that is absent), damages it the ways real files get damaged (a column deleted, a cell
replaced by text, a huge number, NaN or infinity, a sign flipped, the file emptied, a byte-order
mark, random bytes, a line cut short, a header without rows, a line with a field too many) and
runs ``sim.cli.main`` on it. Whatever the damage, the command must either succeed (exit 0) or
exit 2 with exactly one ``error:`` line of at most 500 characters on stderr, write nothing, never
raise, and keep the process's peak memory within :data:`MEMORY_LIMIT_BYTES` of where it was when
the fuzz began (the peak resident size only grows, so one example that blew up would show).

Readers: Mooncake JSONL and CSV traces (``run``), Vidur profiles (``calibrate``), validation
folders (``validate-real``). The example counts are fixed (``derandomize``: the same examples
every run) so the whole file takes well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.calibration.profiles import ATTENTION_FILE, CPU_FILE, mlp_file
from sim.cli import main

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
SPLITWISE = SHARED / "traces" / "splitwise_conv.csv"
PROFILES = SHARED / "profiles"
VALIDATION = SHARED / "validation" / "vllm-0.6.0-burst"
RUN_FILE = "a100x1_llama-3-8b-instruct_tp1_len2000__N10.csv"

MAX_LINE_CHARS = 500
MEMORY_LIMIT_BYTES = 512 * 2**20
"""Growth of the peak resident size allowed over the whole fuzz, on inputs of a few KB: far above any
real need (tens of MB), far below a blow-up. (tracemalloc would measure each example, at 5x the time.)"""
_FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(examples: int) -> settings:
    """Fixed, reproducible examples: CI time stays the same from run to run."""
    return settings(_FUZZ, max_examples=examples)


def _needs(path: Path) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not path.exists(), reason=f"{path} not found (../shared next to the repository)")


# --------------------------------------------------------------------------- the property
def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def assert_clean(argv: list[str], written: Path) -> int:
    """Run the CLI; exit 0, or exit 2 with one bounded line and ``written`` absent; bounded memory."""
    err = io.StringIO()
    peak_before = _peak_rss_bytes()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)  # anything but a UserError propagates and fails the test with its traceback
    text = err.getvalue()
    assert code in (0, 2), f"exit {code}: {text}"
    assert "Traceback" not in text, text
    # The process's high-water mark before this example, not at import: a test run earlier in the same
    # worker (the suite runs on xdist workers) may have raised it; what this example adds is what counts.
    grown = _peak_rss_bytes() - peak_before
    assert grown <= MEMORY_LIMIT_BYTES, f"peak memory grew by {grown / 2**20:.0f} MiB"
    if code == 2:
        lines = text.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), text[:2000]
        assert len(lines[0]) <= MAX_LINE_CHARS, f"{len(lines[0])} characters: {lines[0][:200]}..."
        assert not written.exists(), f"{written} written on exit 2"
    return code


# --------------------------------------------------------------------------- damage
HUGE = ["1" + "0" * 30, "9" * 400, "1e308", "1e400", "-1e400", str(2**63), str(2**64), str(2**53 + 1)]
ODD = ["nan", "NaN", "inf", "-inf", "", " ", "NA", "null", "true", "0", "-1", "0.5", "1,5", '"', "\x00"]
CELLS = st.sampled_from(HUGE + ODD) | st.text(max_size=12) | st.integers(-(10**6), 10**6).map(str)


def _damage_bytes(data: st.DataObject, body: bytes) -> bytes | None:
    """A file-level damage of ``body``, or None to damage its content instead."""
    kind = data.draw(st.sampled_from(["content", "content", "content", "empty", "bom", "random", "truncate", "noise"]))
    if kind == "empty":
        return b""
    if kind == "bom":
        return b"\xef\xbb\xbf" + body
    if kind == "random":
        return data.draw(st.binary(max_size=300))
    if kind == "truncate":
        return body[: data.draw(st.integers(0, len(body)))]
    if kind == "noise":
        at = data.draw(st.integers(0, len(body)))
        return body[:at] + data.draw(st.binary(min_size=1, max_size=8)) + body[at:]
    return None


def damage_csv(data: st.DataObject, body: bytes, columns: list[str]) -> bytes:
    """``body`` (a CSV) damaged once; cells are picked among ``columns`` (those the reader uses) half the time."""
    damaged = _damage_bytes(data, body)
    if damaged is not None:
        return damaged
    lines = body.decode().splitlines()
    header = lines[0].split(",")
    kind = data.draw(st.sampled_from(["cell", "cell", "cell", "drop_column", "header_only", "extra_field", "sign"]))
    if kind == "header_only":
        return (lines[0] + "\n").encode()
    if kind == "extra_field":
        row = data.draw(st.integers(1, len(lines) - 1))
        lines[row] += "," + data.draw(CELLS)
        return ("\n".join(lines) + "\n").encode()
    used = [header.index(c) for c in columns if c in header]
    column = data.draw(st.sampled_from(used) | st.integers(0, len(header) - 1))
    if kind == "drop_column":
        rows = [line.split(",") for line in lines]
        return ("\n".join(",".join(r[:column] + r[column + 1 :]) for r in rows) + "\n").encode()
    row = data.draw(st.integers(1, len(lines) - 1))
    cells = lines[row].split(",")
    if column < len(cells):
        cells[column] = ("-" + cells[column]) if kind == "sign" else data.draw(CELLS)
    lines[row] = ",".join(cells)
    return ("\n".join(lines) + "\n").encode()


JSON_VALUES = (
    st.sampled_from([2**63, 2**64, 10**30, 2**53 + 1, -1, 0, 1.5, float("nan"), float("inf"), True, None, "7", []])
    | st.integers()
    | st.floats()
    | st.lists(st.integers(-(2**70), 2**70), max_size=4)
    | st.text(max_size=8)
)


def damage_jsonl(data: st.DataObject, body: bytes) -> bytes:
    """``body`` (JSON lines) damaged once: a field's value replaced or deleted, or the bytes themselves."""
    damaged = _damage_bytes(data, body)
    if damaged is not None:
        return damaged
    rows = [json.loads(line) for line in body.decode().splitlines()]
    row = rows[data.draw(st.integers(0, len(rows) - 1))]
    field = data.draw(st.sampled_from(sorted(row)))
    kind = data.draw(st.sampled_from(["value", "value", "delete", "digits", "hash_entry"]))
    if kind == "delete":
        del row[field]
    elif kind == "hash_entry" and row["hash_ids"]:
        row["hash_ids"][data.draw(st.integers(0, len(row["hash_ids"]) - 1))] = data.draw(JSON_VALUES)
    elif kind == "digits":  # written as text: json.dumps refuses integers of > 4300 digits
        row[field] = "@DIGITS@"
    else:
        row[field] = data.draw(JSON_VALUES)
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    return text.replace('"@DIGITS@"', "1" + "0" * data.draw(st.sampled_from([400, 5000]))).encode()


# --------------------------------------------------------------------------- traces (run)
def _scenario(folder: Path, arrival: dict, **workload: object) -> Path:
    data = {
        "name": "fuzz",
        "model": "llama-3-8b",
        "workload": {"arrival": arrival, **workload},
        "policies": [{"name": "paged", "kind": "paged", "max_batch_size": 8}],
    }
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run_argv(scenario: Path, out: Path) -> list[str]:
    return ["run", str(scenario), "--out", str(out), "--no-plots", "--quiet", "--summary-only"]


@pytest.fixture(scope="module")
def mooncake_seed() -> bytes:
    return b"".join(MOONCAKE.read_bytes().splitlines(keepends=True)[:4])


@_needs(MOONCAKE)
@fuzz(200)
@given(data=st.data())
def test_mooncake_reader(mooncake_seed: bytes, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "trace.jsonl").write_bytes(damage_jsonl(data, mooncake_seed))
        # Clipped prompts keep the four seed requests within Llama-3-8B's 8k window.
        arrival = {"kind": "trace", "path": "trace.jsonl", "format": "mooncake", "max_prompt_tokens": 2048}
        assert_clean(_run_argv(_scenario(folder, arrival), folder / "out"), folder / "out")


@pytest.fixture(scope="module")
def csv_seed() -> bytes:
    return b"".join(SPLITWISE.read_bytes().splitlines(keepends=True)[:6])


TRACE_COLUMNS = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]


@_needs(SPLITWISE)
@fuzz(200)
@given(data=st.data(), as_lengths=st.booleans())
def test_csv_trace_reader(csv_seed: bytes, data: st.DataObject, as_lengths: bool) -> None:
    """A CSV trace read as the arrival trace, or as an empirical length distribution (its other reader)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "trace.csv").write_bytes(damage_csv(data, csv_seed, TRACE_COLUMNS))
        if as_lengths:
            lengths = {"kind": "empirical", "path": "trace.csv", "max": 4096}
            scenario = _scenario(
                folder,
                {"kind": "poisson", "rate": 2.0},
                requests=4,
                prompt_tokens={**lengths, "column": "num_prefill_tokens"},
                output_tokens={**lengths, "column": "num_decode_tokens"},
            )
        else:
            scenario = _scenario(folder, {"kind": "trace", "path": "trace.csv"})
        assert_clean(_run_argv(scenario, folder / "out"), folder / "out")


# --------------------------------------------------------------------------- profiles (calibrate)
PROFILE_COLUMNS = {
    mlp_file("phi-2"): ["num_tokens", "num_tensor_parallel_workers", "time_stats.emb.median",
                        "time_stats.mlp_up_proj.median"],
    ATTENTION_FILE: ["is_prefill", "batch_size", "prefill_chunk_size", "kv_cache_size", "time_stats.attn_decode.median",
                     "time_stats.attn_prefill.median", "time_stats.attn_input_reshape.median"],
    CPU_FILE: ["model_name", "tensor_parallel_degree", "batch_size", "schedule_median", "sampler_e2e_median"],
}  # fmt: skip


@pytest.fixture(scope="module")
def profile_seed() -> dict[str, bytes]:
    """The phi-2 TP1 profiles, thinned to a few dozen rows each."""
    mlp = pd.read_csv(PROFILES / mlp_file("phi-2"))
    tables = {
        mlp_file("phi-2"): mlp[mlp["num_tensor_parallel_workers"] == 1].iloc[::16],
        ATTENTION_FILE: pd.read_csv(PROFILES / ATTENTION_FILE).iloc[::150],
        CPU_FILE: pd.read_csv(PROFILES / CPU_FILE),
    }
    return {rel: frame.to_csv(index=False).encode() for rel, frame in tables.items()}


@_needs(PROFILES / ATTENTION_FILE)
@fuzz(80)
@given(data=st.data())
def test_profile_readers(profile_seed: dict[str, bytes], data: st.DataObject) -> None:
    target = data.draw(st.sampled_from(sorted(profile_seed)))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "profiles"
        for rel, body in profile_seed.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(damage_csv(data, body, PROFILE_COLUMNS[rel]) if rel == target else body)
        out = Path(tmp) / "out" / "phi-2.yaml"
        argv = ["calibrate", "--profiles", str(root), "--model", "phi-2", "--out", str(out)]
        if assert_clean(argv, out.parent) == 0:
            assert out.is_file()


def test_the_profile_seed_calibrates(profile_seed: dict[str, bytes], tmp_path: Path) -> None:
    """The undamaged seed is accepted: what the fuzz sees refused is the damage."""
    if not (PROFILES / ATTENTION_FILE).is_file():
        pytest.skip(f"{PROFILES} not found")
    for rel, body in profile_seed.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(body)
    out = tmp_path / "phi-2.yaml"
    assert assert_clean(["calibrate", "--profiles", str(tmp_path), "--model", "phi-2", "--out", str(out)], out) == 0


# --------------------------------------------------------------------------- validation folders (validate-real)
SUMMARY_USED = ["gpu", "num_gpus", "tensor_parallel", "model_id", "max_model_len", "num_prompts", "duration",
                "total_output_tokens", "median_tpot_ms", "requests_file"]  # fmt: skip
REQUEST_USED = ["request_idx", "input_len", "output_len", "ttft_s"]
FILE_NAMES = st.sampled_from(["run.csv", "run 1.csv", "ünï.csv", ".hidden.csv", "a;b.csv", "x" * 200 + ".csv"])


@pytest.fixture(scope="module")
def validation_seed() -> tuple[bytes, bytes]:
    """(summary.csv with the 10-request run only, that run's request file)."""
    summary = pd.read_csv(VALIDATION / "summary.csv")
    summary = summary[summary["requests_file"] == RUN_FILE]
    return summary.to_csv(index=False).encode(), (VALIDATION / RUN_FILE).read_bytes()


@_needs(VALIDATION / RUN_FILE)
@fuzz(100)
@given(data=st.data(), name=FILE_NAMES, damage_summary=st.booleans())
def test_validation_folder_readers(
    validation_seed: tuple[bytes, bytes], data: st.DataObject, name: str, damage_summary: bool
) -> None:
    summary, requests = validation_seed
    summary = summary.replace(RUN_FILE.encode(), name.encode())
    if damage_summary:
        summary = damage_csv(data, summary, SUMMARY_USED)
    else:
        requests = damage_csv(data, requests, REQUEST_USED)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "set"
        folder.mkdir()
        (folder / "summary.csv").write_bytes(summary)
        (folder / name).write_bytes(requests)
        out = Path(tmp) / "out"
        assert_clean(["validate-real", str(folder), "--out", str(out), "--quiet"], out)


# --------------------------------------------------------------------------- the damage itself
@pytest.mark.parametrize("damage", [damage_csv, damage_jsonl], ids=["csv", "jsonl"])
def test_the_damage_changes_the_file(damage: Callable[..., bytes]) -> None:
    """Guard against a fuzz that fuzzes nothing: most damaged files differ from their seed."""
    seed = b'{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n' * 3
    if damage is damage_csv:
        seed = b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n1.0,20,6\n2.0,30,7\n"
    changed = []

    @settings(max_examples=50, derandomize=True, database=None)
    @given(data=st.data())
    def collect(data: st.DataObject) -> None:
        args = (data, seed, ["num_prefill_tokens"]) if damage is damage_csv else (data, seed)
        changed.append(damage(*args) != seed)

    collect()
    assert sum(changed) >= 0.8 * len(changed)
