"""``run``, ``sweep`` and ``capacity`` share one rule for their output folders: the path is checked
completely before anything is simulated, a folder is replaced only when it is empty or batchsim
wrote it (whichever command did), and a failed save (a full disk) is one line with nothing left.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from test_safe_write import one_error_line, snapshot

from sim.cli import main
from sim.io.outputs import CAPACITY_OUTPUT, KNOWN_OUTPUTS, MARKER_FILE, foreign_reason
from sim.io.siblings import NAME_LIMIT

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "scenarios" / "quickstart.yaml"
RUN = ["run", str(QUICK), "--set", "workload.requests=30", "--policy", "static", "--no-plots", "--quiet"]
SWEEP = ["sweep", str(QUICK), "--set", "workload.requests=20", "--param", "workload.arrival.rate=1,2",
         "--workers", "1", "--no-plots", "--quiet"]  # fmt: skip


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated although the output path is unusable")

    monkeypatch.setattr("sim.runner.run", refuse)


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# --------------------------------------------------------------------------- run --out, before simulating
def bad_out(tmp_path: Path, case: str) -> Path:
    if case == "long name under a missing parent":
        return tmp_path / "missing" / ("r" * (NAME_LIMIT + 45))
    if case == "long path":
        return tmp_path.joinpath(*["d" * 200] * 21)
    if case == "symlink loop":
        (tmp_path / "loop").symlink_to("loop")
        return tmp_path / "loop"
    if case == "under a symlink loop":
        (tmp_path / "loop").symlink_to("loop")
        return tmp_path / "loop" / "res"
    if case == "under a fifo":
        os.mkfifo(tmp_path / "pipe")
        return tmp_path / "pipe" / "res"
    raise ValueError(case)


@pytest.mark.parametrize(
    ("case", "says"),
    [("long name under a missing parent", "300 bytes, over the 255-byte limit"), ("long path", "the path is"),
     ("symlink loop", "symlink loop"), ("under a symlink loop", "symlink loop"),
     ("under a fifo", "is a FIFO (named pipe), not a folder")],
)  # fmt: skip
def test_run_checks_the_out_path_completely_before_simulating(
    tmp_path: Path, case: str, says: str, no_simulation: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = bad_out(tmp_path, case)
    before = snapshot(tmp_path)

    assert main([*RUN, "--out", str(out)]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: out: ") and says in line and len(line) < 400
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_failed_save_is_one_line_and_leaves_the_previous_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = tmp_path / "old"
    assert main([*RUN, "--out", str(previous)]) == 0
    before = snapshot(tmp_path)

    def fails_half_way(frame: object, path: Path, float_format: str) -> None:
        Path(path).write_bytes(b"policy,repl")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("sim.io.csv_writer.write_csv", fails_half_way)
    for out in (previous, tmp_path / "new" / "deeper" / "res"):
        assert main([*RUN, "--out", str(out)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("error: out: ") and os.strerror(code) in line and out.name in line
        assert snapshot(tmp_path) == before  # no temporary folder, no parent made for the new one


# --------------------------------------------------------------------------- sweep ownership
def test_sweep_refuses_a_folder_with_the_users_files(
    tmp_path: Path, no_simulation: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "sweep.md").write_text("my notes")  # a name the sweep writes, in a folder batchsim did not
    (out / "draft.txt").write_text("keep")
    before = snapshot(tmp_path)

    assert main([*SWEEP, "--out", str(out)]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "draft.txt" in line and "not written by batchsim" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", [SWEEP, ["capacity", str(QUICK), "--slo", "ttft_p99_s=1", "--quiet"]])
def test_sweep_and_capacity_refuse_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_simulation: None, command: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)  # empty: only the rule about the current folder can refuse it

    assert main([*command, "--out", "."]) == 2

    assert "is the current folder" in one_error_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_run_and_sweep_replace_each_others_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res"
    assert main([*RUN, "--out", str(out)]) == 0
    assert "summary.csv" in names(out)

    assert main([*SWEEP, "--out", str(out)]) == 0  # a run's folder is batchsim's: replaced as a whole
    assert names(out) == {"sweep.csv", "sweep.json", "sweep.md"}
    assert "batchsim_version" in json.loads((out / "sweep.json").read_text())

    assert main([*RUN, "--out", str(out)]) == 0  # and the sweep's is recognised in turn
    assert "summary.csv" in names(out) and "sweep.csv" not in names(out)
    assert capsys.readouterr().err == ""
    assert names(tmp_path) == {"res"}  # no temporary sibling left


def test_resume_needs_a_sweep_folder(tmp_path: Path, no_simulation: None, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res"
    out.mkdir()
    (out / "sweep.csv").write_text("rate,seed\n")
    (out / "sweep.json").write_text("{}")  # names a sweep writes, but no batchsim_version in the manifest
    before = snapshot(tmp_path)

    assert main([*SWEEP, "--out", str(out), "--resume"]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "not a batchsim sweep folder (no sweep.json with batchsim_version)" in line
    assert snapshot(tmp_path) == before


def test_a_full_disk_during_a_sweep_is_one_line_and_keeps_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)  # only the sweep's store flushes: its first point hits it

    assert main([*SWEEP, "--out", str(tmp_path / "res")]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "sweep.csv" in line and os.strerror(errno.ENOSPC) in line
    assert names(tmp_path / "res") == {"sweep.csv", "sweep.json"}  # resumable: --resume re-runs the rest


# --------------------------------------------------------------------------- the rule, on hand-made folders
def folder_with(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "f"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


VERSION = json.dumps({"batchsim_version": "0"})


@pytest.mark.parametrize(
    ("files", "reason"),
    [({}, None),
     ({"capacity.csv": "", "capacity.md": "", MARKER_FILE: VERSION}, None),
     ({"split.csv": "", "split.md": "", MARKER_FILE: VERSION}, None),
     ({"sweep.csv": "", "sweep.json": VERSION, "latency_vs_load_ttft_p99_s.png": ""}, None),
     ({"capacity.csv": "", "capacity.md": ""}, f"no {MARKER_FILE} with batchsim_version"),
     ({"sweep.csv": "", "summary.csv": "", "sweep.json": VERSION}, "mixes the files of several kinds"),
     ({"sweep.csv": "", "notes.txt": ""}, "holds notes.txt, not written by batchsim")],
)  # fmt: skip
def test_one_rule_recognises_every_kind_of_batchsim_folder(
    tmp_path: Path, files: dict[str, str], reason: str | None
) -> None:
    found = foreign_reason(folder_with(tmp_path, files), KNOWN_OUTPUTS)
    assert found is None if reason is None else reason in found
    assert CAPACITY_OUTPUT in KNOWN_OUTPUTS
