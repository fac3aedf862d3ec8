"""sim.io.csv_writer.write_csv writes the bytes pandas' to_csv(index=False, float_format=...) writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.io import csv_writer
from sim.io.csv_writer import write_csv

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, 1e-5, 123456.5, 999999.5, 0.1 + 0.2, 1e16, 2.5e-7]),
)
TEXT = st.text(alphabet=st.sampled_from(list('ab ,"\n\r%;x')), max_size=6)


@st.composite
def frames(draw) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    rows = draw(st.integers(0, 40))
    column_kinds = ["float", "int16", "int32", "int64", "bool", "text", "category", "int-category", "float-category"]
    kinds = draw(st.lists(st.sampled_from(column_kinds), min_size=1, max_size=6))
    data: dict[str, object] = {}
    for i, kind in enumerate(kinds):
        name = draw(st.sampled_from([f"c{i}", f"c,{i}", f'q"{i}', f"s {i}"]))
        if kind == "float":
            data[name] = np.array(draw(st.lists(FLOATS, min_size=rows, max_size=rows)), dtype=np.float64)
        elif kind.endswith("-category"):
            label = st.integers(-5, 5) if kind == "int-category" else st.sampled_from([0.5, 1e-7, 3.0])
            values = draw(st.lists(st.one_of(label, st.none()), min_size=rows, max_size=rows))
            data[name] = pd.Series(values, dtype="category")
        elif kind.startswith("int"):
            info = np.iinfo(kind)
            values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=rows, max_size=rows))
            data[name] = np.array(values, dtype=kind)
        elif kind == "bool":
            data[name] = np.array(draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), dtype=bool)
        else:
            values = draw(st.lists(st.one_of(TEXT, st.none()), min_size=rows, max_size=rows))
            series = pd.Series(values, dtype="str" if kind == "text" else "category")
            data[name] = series
    frame = pd.DataFrame({name: pd.Series(column) for name, column in data.items()})
    frame.columns = list(data)  # duplicates drawn above collapse in the dict: names stay unique
    return frame


def _both(frame: pd.DataFrame, folder: Path, float_format: str) -> tuple[bytes, bytes]:
    frame.to_csv(folder / "pandas.csv", index=False, float_format=float_format)
    write_csv(frame, folder / "ours.csv", float_format)
    return (folder / "pandas.csv").read_bytes(), (folder / "ours.csv").read_bytes()


@pytest.mark.slow
@settings(max_examples=examples(1.5), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=frames(), float_format=st.sampled_from(["%.6g", "%.7f", "%.3e"]))
def test_same_bytes_as_pandas(frame: pd.DataFrame, float_format: str, tmp_path: Path) -> None:
    expected, ours = _both(frame, tmp_path, float_format)
    assert ours == expected


def test_chunks_join_seamlessly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows across chunk edges (and a NaN in only some chunks) come out as one table."""
    monkeypatch.setattr(csv_writer, "CHUNK_ROWS", 7)
    values = np.linspace(0, 3, 50)
    values[23] = np.nan
    frame = pd.DataFrame({"x": values, "n": np.arange(50), "p": pd.Categorical(["a", "b,"] * 25)})
    expected, ours = _both(frame, tmp_path, "%.6g")
    assert ours == expected
    assert ours.count(b"\n") == 51


def test_run_tables_match_pandas(tmp_path: Path) -> None:
    """The real tables of a run (categoricals, int16/int32, NaN latencies of timed-out requests)."""
    import sim
    from sim.io.scenario import load_scenario

    result = sim.run(load_scenario("scenarios/overload.yaml", {"workload.requests": 150}))
    assert (result.requests["status"] == "timed_out").any()  # so the NaN latencies are there
    for frame in (result.summary, result.requests, result.iterations):
        expected, ours = _both(frame, tmp_path, "%.6g")
        assert ours == expected
