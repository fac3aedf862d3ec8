"""``python -m sim calibrate`` on corrupt profiles: one ``error: profiles:`` line, exit code 2, nothing
written; and no calibration with an unusable fitted number is ever written (issue 25).

The profiles are a small copy of the A100 Llama-2-7B ones from ``../shared/profiles`` (every
25th attention row, every 8th TP1 linear-op row), built in ``tmp_path`` and then corrupted;
the tests skip, saying why, where the shared profiles are absent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from sim.calibration import calibrate_cli, fit_checks, fitting
from sim.calibration.profiles import ATTENTION_FILE, CPU_FILE, mlp_file
from sim.cli import main
from sim.errors import UserError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "profiles"
MLP_FILE = mlp_file("llama-2-7b")
DECODE_MS = "time_stats.attn_decode.median"
UP_MS = "time_stats.mlp_up_proj.median"

pytestmark = pytest.mark.skipif(
    not (SHARED / ATTENTION_FILE).is_file(), reason=f"Vidur profiles not found at {SHARED} (../shared next to the repo)"
)


@pytest.fixture(scope="module")
def small_profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    """The three A100 tables a Llama-2-7B TP1 calibration reads, thinned (a few hundred rows each)."""
    mlp = pd.read_csv(SHARED / MLP_FILE)
    return {
        ATTENTION_FILE: pd.read_csv(SHARED / ATTENTION_FILE).iloc[::25],
        MLP_FILE: mlp[mlp["num_tensor_parallel_workers"] == 1].iloc[::8],
        CPU_FILE: pd.read_csv(SHARED / CPU_FILE),
    }


def _profiles(root: Path, tables: dict[str, pd.DataFrame], edit: Callable[[dict[str, pd.DataFrame]], None]) -> Path:
    tables = {rel: frame.copy() for rel, frame in tables.items()}
    edit(tables)
    for rel, frame in tables.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(root / rel, index=False)
    return root


def _calibrate(root: Path, out: Path) -> int:
    return main(["calibrate", "--profiles", str(root), "--model", "llama-2-7b", "--tp", "1", "--out", str(out)])


def _set(rel: str, column: str, value: object, rows: slice = slice(None)) -> Callable[[dict], None]:
    def edit(tables: dict[str, pd.DataFrame]) -> None:
        frame = tables[rel]
        frame[column] = frame[column].astype(object)
        frame.iloc[rows, frame.columns.get_loc(column)] = value

    return edit


def _decode_rows_nan(tables: dict[str, pd.DataFrame]) -> None:
    frame = tables[ATTENTION_FILE]
    frame.loc[~frame["is_prefill"], DECODE_MS] = math.nan


# case -> (edit, fragments of the single error line)
CORRUPT = {
    # The four: NaN decode medians once wrote launch_ms 4.6e-310 and mape .nan with exit 0.
    "decode medians NaN": (_decode_rows_nan, [ATTENTION_FILE, DECODE_MS, "empty cell", "> 0"]),
    "non-numeric median": (_set(MLP_FILE, UP_MS, "fast", slice(3, 4)), [MLP_FILE, "line 5", UP_MS, "'fast'"]),
    "two rows": (lambda t: t.__setitem__(ATTENTION_FILE, t[ATTENTION_FILE].iloc[:2]), ["usable rows", "at least"]),
    "header-only CPU profile": (lambda t: t.__setitem__(CPU_FILE, t[CPU_FILE].iloc[:0]), [CPU_FILE, "no data rows"]),
    # The same classes elsewhere.
    "infinite median": (_set(MLP_FILE, UP_MS, math.inf, slice(0, 1)), [MLP_FILE, "line 2", "'inf'"]),
    "negative median": (_set(CPU_FILE, "sampler_e2e_median", -1.0, slice(20, 21)), [CPU_FILE, "line 22", "'-1.0'"]),
    "zero kernel time": (_set(MLP_FILE, "time_stats.emb.median", 0.0, slice(2, 3)), ["line 4", "> 0"]),
    "fractional token count": (_set(MLP_FILE, "num_tokens", 1.5, slice(0, 1)), ["num_tokens", "whole number"]),
    "not a flag": (_set(ATTENTION_FILE, "is_prefill", "maybe", slice(1, 2)), ["is_prefill", "'maybe'", "true or"]),
    "missing column": (lambda t: t[MLP_FILE].pop(UP_MS), ["no column", UP_MS]),
    "no catalog model": (_set(CPU_FILE, "model_name", "acme/Giant"), [CPU_FILE, "no rows of a catalog model"]),
}


@pytest.mark.parametrize("case", CORRUPT, ids=list(CORRUPT))
def test_a_corrupt_profile_is_one_error_line_and_writes_nothing(
    tmp_path: Path, small_profiles: dict[str, pd.DataFrame], capsys: pytest.CaptureFixture[str], case: str
) -> None:
    edit, fragments = CORRUPT[case]
    out = tmp_path / "out" / "cal.yaml"
    code = _calibrate(_profiles(tmp_path / "p", small_profiles, edit), out)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: profiles: ") and err.count("\n") == 1 and len(err) < 500, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from: {err}"
    assert not out.exists() and not out.parent.exists()


def test_the_same_small_profiles_unchanged_calibrate(
    tmp_path: Path, small_profiles: dict[str, pd.DataFrame], capsys: pytest.CaptureFixture[str]
) -> None:
    """The control of the test above: it is the corruption that is refused, not the thinned files."""
    out = tmp_path / "cal.yaml"
    assert _calibrate(_profiles(tmp_path / "p", small_profiles, lambda t: None), out) == 0, capsys.readouterr().err
    assert out.is_file()


BAD_FITS = {
    "NaN coefficient": {"launch_ms": math.nan, "per_seq_ms": 1e-5, "per_kv_token_ms": 1e-6},
    "subnormal coefficient": {"launch_ms": 4.6e-310, "per_seq_ms": 1e-5, "per_kv_token_ms": 1e-6},
    "all terms zero": {"launch_ms": 0.0, "per_seq_ms": 0.0, "per_kv_token_ms": 0.0},
    "negative coefficient": {"launch_ms": -0.01, "per_seq_ms": 1e-5, "per_kv_token_ms": 1e-6},
}


@pytest.mark.parametrize("case", BAD_FITS, ids=list(BAD_FITS))
def test_an_unusable_fit_from_valid_profiles_writes_nothing(
    tmp_path: Path,
    small_profiles: dict[str, pd.DataFrame],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    """The second net: a fit gone wrong on rows that passed every input check is refused too."""
    monkeypatch.setattr(fitting, "fit_decode", lambda decode: dict(BAD_FITS[case]))
    out = tmp_path / "cal.yaml"
    assert _calibrate(_profiles(tmp_path / "p", small_profiles, lambda t: None), out) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profiles: calibration of llama-2-7b") and err.count("\n") == 1, err
    assert "attention.decode" in err and "nothing was written" in err
    assert not out.exists()


def _valid_file() -> dict:
    return {
        "linear": {"tokens": [1, 2, 4], "ms": [0.5, 0.6, 0.9]},
        "attention": {"decode": {"launch_ms": 0.02, "per_seq_ms": 0.0, "per_kv_token_ms": 1e-6}},
        "fit_error": {"linear": {"mape": 0.01, "worst": 0.1, "rows": 3}},
        "leave_one_model_out": {"m": {"mape": 0.04, "worst": 0.2, "rows": 10, "bias": -0.01}},
    }


@pytest.mark.parametrize(
    ("where", "value", "reason"),
    [
        (("linear", "ms", 1), 0.0, "> 0 ms"),
        (("linear", "ms", 2), math.inf, "finite"),
        (("fit_error", "linear", "mape"), math.nan, "finite"),
        (("fit_error", "linear", "rows"), 0, ">= 1"),
        (("fit_error", "linear", "worst"), -0.1, ">= 0"),
        (("attention", "decode", "per_kv_token_ms"), 1e-320, "subnormal"),
    ],
)
def test_check_fitted_names_the_number(where: tuple, value: float, reason: str) -> None:
    data = _valid_file()
    fit_checks.check_fitted(data, "f")  # the valid file passes, negative bias and a zero term included
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(UserError, match=reason) as info:
        fit_checks.check_fitted(data, "f")
    assert ".".join(str(k) for k in where if not isinstance(k, int)) in str(info.value)


def test_calibrate_all_writes_nothing_when_a_later_fit_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--all`` fits every file first: a refusal on the second GPU leaves the first GPU's files unwritten."""
    first = tmp_path / "a.yaml"

    def fit_gpu(profiles: object, gpu: str) -> list:
        if gpu == "a100-80gb":
            return [(first, _valid_file(), None)]
        raise UserError("corrupt h100 profile", field="profiles")

    monkeypatch.setattr(calibrate_cli, "_fit_gpu", fit_gpu)
    assert main(["calibrate", "--all", "--profiles", str(tmp_path)]) == 2
    assert "corrupt h100 profile" in capsys.readouterr().err
    assert not first.exists()
