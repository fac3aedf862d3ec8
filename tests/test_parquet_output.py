"""``metrics.format: parquet`` / ``run --format parquet``: the same records as the CSVs, as Parquet.

The Parquet files must read back as exactly the in-memory ``result.requests`` and
``result.iterations`` (values, columns, dtypes, categories), and so, written with the CSVs'
float format, as the CSV files byte for byte; ``summary.csv`` must not depend on the format;
without pyarrow, asking for Parquet is one exit-2 error naming ``metrics.format`` that writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
import sim.runner
from sim.cli import main
from sim.errors import UserError
from sim.io.outputs import CSV_FLOAT_FORMAT
from sim.io.parquet import PARQUET_FILES, write_frame

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the optional [parquet] extra (in the test extra)")

REPO = Path(__file__).resolve().parents[1]
QUICK_FILE = REPO / "scenarios" / "quickstart.yaml"
QUICK = [str(QUICK_FILE), "--set", "workload.requests=60", "--quiet", "--no-plots"]
TABLES = ("requests", "iterations")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same quickstart run written once per format through the CLI."""
    root = tmp_path_factory.mktemp("formats")
    out = {}
    for fmt in ("csv", "parquet"):
        out[fmt] = root / fmt
        assert main(["run", *QUICK, "--format", fmt, "--out", str(out[fmt])]) == 0
    return out


@pytest.fixture(scope="module")
def result() -> sim.RunResult:
    """The run the CLI fixture wrote, in memory (same scenario, same seed)."""
    return sim.run(sim.load_scenario(QUICK_FILE, {"workload.requests": 60}), progress=False)


def _block_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pyarrow`` fail, as on a machine without the extra (None in sys.modules: ImportError)."""
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.setitem(sys.modules, name, None)


def test_parquet_run_writes_parquet_records_instead_of_csv(folders: dict[str, Path]) -> None:
    names = sorted(p.name for p in folders["parquet"].iterdir())
    assert names == ["iterations.parquet", "requests.parquet", "scenario.resolved.yaml", "summary.csv", "summary.md"]
    assert sorted(p.name for p in folders["csv"].iterdir()) == sorted(
        n.replace(".parquet", ".csv") for n in names)


@pytest.mark.parametrize("table", TABLES)
def test_parquet_reads_back_as_the_in_memory_records(folders: dict[str, Path], result: sim.RunResult,
                                                     table: str) -> None:
    back = pd.read_parquet(folders["parquet"] / f"{table}.parquet")
    # Exact: values (full float precision), column order, dtypes, categorical categories.
    pd.testing.assert_frame_equal(back, getattr(result, table), check_exact=True)


@pytest.mark.parametrize("table", TABLES)
def test_parquet_holds_the_csv_values(folders: dict[str, Path], table: str) -> None:
    back = pd.read_parquet(folders["parquet"] / f"{table}.parquet")
    # The CSV rounds floats to six significant digits: the Parquet, so rounded, is the CSV byte for byte.
    as_csv = back.to_csv(index=False, float_format=CSV_FLOAT_FORMAT)
    assert as_csv == (folders["csv"] / f"{table}.csv").read_text()


def test_summary_does_not_depend_on_the_format(folders: dict[str, Path]) -> None:
    for name in ("summary.csv", "summary.md"):
        assert (folders["parquet"] / name).read_bytes() == (folders["csv"] / name).read_bytes()


def test_the_resolved_scenario_records_the_format(folders: dict[str, Path]) -> None:
    for fmt, folder in folders.items():
        document = yaml.safe_load((folder / "scenario.resolved.yaml").read_text())
        assert document["scenario"]["metrics"]["format"] == fmt


def test_csv_is_the_default() -> None:
    assert sim.load_scenario(QUICK_FILE).metrics.format == "csv"


def _yaml_with_format(tmp_path: Path, fmt: str) -> Path:
    document = yaml.safe_load(QUICK_FILE.read_text())
    document["metrics"] = {"format": fmt}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_metrics_format_in_the_yaml_writes_parquet(tmp_path: Path, folders: dict[str, Path]) -> None:
    scenario = _yaml_with_format(tmp_path, "parquet")
    out = tmp_path / "out"
    assert main(["run", str(scenario), *QUICK[1:], "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= PARQUET_FILES and not (out / "requests.csv").exists()
    for table in TABLES:
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{table}.parquet"),
                                      pd.read_parquet(folders["parquet"] / f"{table}.parquet"))


def test_format_flag_overrides_the_yaml(tmp_path: Path) -> None:
    scenario = _yaml_with_format(tmp_path, "parquet")
    out = tmp_path / "out"
    assert main(["run", str(scenario), *QUICK[1:], "--format", "csv", "--out", str(out)]) == 0
    assert (out / "requests.csv").is_file() and not (out / "requests.parquet").exists()


def test_format_flag_wins_over_a_set_of_the_same_field(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["run", *QUICK, "--set", "metrics.format=csv", "--format", "parquet", "--out", str(out)]) == 0
    assert (out / "requests.parquet").is_file()


def test_an_unknown_format_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *QUICK, "--set", "metrics.format=feather", "--out", str(tmp_path / "o")]) == 2
    assert "metrics.format" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_switching_format_replaces_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["run", *QUICK, "--format", "parquet", "--out", str(out)]) == 0
    assert main(["run", *QUICK, "--format", "csv", "--out", str(out)]) == 0  # a folder of .parquet is batchsim's
    assert not (out / "requests.parquet").exists() and (out / "requests.csv").is_file()
    assert main(["run", *QUICK, "--format", "parquet", "--out", str(out)]) == 0
    assert not (out / "requests.csv").exists() and (out / "requests.parquet").is_file()


def test_summary_only_writes_no_records_in_either_format(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["run", *QUICK, "--format", "parquet", "--summary-only", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["scenario.resolved.yaml", "summary.csv", "summary.md"]


# --------------------------------------------------------------------------- without pyarrow
def test_missing_pyarrow_is_one_error_before_simulating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _block_pyarrow(monkeypatch)

    def no_simulation(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated although pyarrow is missing")

    monkeypatch.setattr(sim.runner, "run", no_simulation)
    out = tmp_path / "out"
    assert main(["run", *QUICK, "--format", "parquet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: metrics.format: 'parquet' needs pyarrow")
    assert "pip install 'batchsim[parquet]'" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no folder, no temporary sibling


def test_missing_pyarrow_on_save_leaves_the_previous_result(tmp_path: Path, result: sim.RunResult,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    result.save(out, plots=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    parquet = sim.RunResult(**{**vars(result), "scenario": result.scenario.replace(**{"metrics.format": "parquet"})})
    _block_pyarrow(monkeypatch)
    with pytest.raises(UserError) as caught:
        parquet.save(out, plots=False)
    assert caught.value.field == "metrics.format"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_csv_runs_need_no_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _block_pyarrow(monkeypatch)
    out = tmp_path / "out"
    assert main(["run", *QUICK, "--out", str(out)]) == 0
    assert (out / "requests.csv").is_file()
    assert main(["run", *QUICK, "--format", "parquet", "--summary-only", "--out", str(out)]) == 0  # no records


# --------------------------------------------------------------------------- the writer
def test_row_groups_keep_one_schema_and_every_category(tmp_path: Path, result: sim.RunResult) -> None:
    frame = result.requests
    path = tmp_path / "requests.parquet"
    write_frame(frame, path, rows_per_group=50)
    assert pq.ParquetFile(path).num_row_groups == -(-len(frame) // 50)
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, frame, check_exact=True)
    assert list(back["status"].cat.categories) == list(frame["status"].cat.categories)


def test_an_empty_frame_reads_back_with_its_columns(tmp_path: Path, result: sim.RunResult) -> None:
    path = tmp_path / "iterations.parquet"
    write_frame(result.iterations.iloc[:0], path)
    back = pd.read_parquet(path)
    assert list(back.columns) == list(result.iterations.columns) and back.empty
    # Kinds of dtype only: an empty dictionary column has no values to name its categories.
    assert list(back.dtypes.astype(str)) == list(result.iterations.dtypes.astype(str))
