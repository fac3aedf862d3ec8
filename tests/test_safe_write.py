"""Files batchsim writes are only ever new paths or regular files, replaced atomically; a bad path or a
failed write (a full disk) is one error line, exit 2, and nothing left behind. Inputs that are not
regular files are named for what they are and never read.

Devices are only ever reached through a symlink to ``os.devnull`` in a temporary folder, which the
code under test must refuse; no test writes to a real device.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main
from sim.errors import UserError
from sim.io.safe_write import atomic_file, write_text

REPO = Path(__file__).resolve().parents[1]
AZURE = REPO / "tests" / "data" / "azure_llm_sample.csv"
WRITABLE = ("missing", "regular", "link to a file")
REFUSED = ("fifo", "link to /dev/null", "folder", "dangling link", "symlink loop", "under a fifo")


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder`` (hidden ones too): its type, and a file's bytes or a link's target."""
    found: dict[str, tuple] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                found[str(path.relative_to(folder))] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                found[str(path.relative_to(folder))] = ("file", path.read_bytes(), stat.S_IMODE(mode))
            else:
                found[str(path.relative_to(folder))] = (stat.S_IFMT(mode),)
    return found


def make_target(folder: Path, kind: str) -> Path:
    """``folder/target.csv`` as ``kind``; regular files hold b'old'."""
    path = folder / "target.csv"
    if kind == "regular":
        path.write_bytes(b"old")
    elif kind == "link to a file":
        (folder / "real.csv").write_bytes(b"old")
        path.symlink_to("real.csv")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/null":
        path.symlink_to(os.devnull)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(folder / "nowhere")
    elif kind == "symlink loop":
        path.symlink_to(path.name)
    elif kind == "under a fifo":
        os.mkfifo(folder / "pipe")
        path = folder / "pipe" / "target.csv"
    return path


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def full_disk(*args: object, **kwargs: object) -> None:
    """A writer that gets part of its data out, then finds the disk full."""
    path = next(a for a in (*args, *kwargs.values()) if isinstance(a, (str, Path)))
    Path(path).write_bytes(b"partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# --------------------------------------------------------------------------- the helper itself
@given(
    kind=st.sampled_from(WRITABLE + REFUSED),
    outcome=st.sampled_from(["ok", "disk full", "bug in the writer"]),
    missing_parents=st.integers(0, 2),
)
def test_atomic_file_writes_a_new_or_regular_file_whole_or_changes_nothing(
    kind: str, outcome: str, missing_parents: int
) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        target = make_target(folder, kind)
        if kind == "missing":
            target = folder.joinpath(*["sub"] * missing_parents, "target.csv")
        before = snapshot(folder)
        try:
            with atomic_file(target) as tmp:
                tmp.write_bytes(b"partial")
                if outcome == "disk full":
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if outcome == "bug in the writer":
                    raise ZeroDivisionError
                tmp.write_bytes(b"new")
        except UserError as exc:
            assert kind in REFUSED or outcome == "disk full"
            assert "target.csv" in str(exc) or "pipe" in str(exc)
        except ZeroDivisionError:
            assert kind in WRITABLE and outcome == "bug in the writer"  # a bug stays a bug
        else:
            assert kind in WRITABLE and outcome == "ok"
            assert target.read_bytes() == b"new"
            after = snapshot(folder)
            changed = {k for k in after if before.get(k) != after[k]}
            relative = target.relative_to(folder)
            assert changed <= {"real.csv", str(relative), *map(str, relative.parents)}
            assert not [k for k in after if Path(k).name.startswith(".")]  # no temporary file left
            return
        assert snapshot(folder) == before  # a FIFO is still a FIFO, a link still the same link


def test_replaced_file_keeps_its_mode_and_a_link_keeps_pointing(tmp_path: Path) -> None:
    real = tmp_path / "real.csv"
    real.write_text("old")
    real.chmod(0o640)
    (tmp_path / "link.csv").symlink_to(real.name)

    write_text(tmp_path / "link.csv", "new")

    assert os.readlink(tmp_path / "link.csv") == real.name
    assert real.read_text() == "new" and stat.S_IMODE(real.stat().st_mode) == 0o640


@pytest.mark.parametrize("size", [255, 300])
def test_name_length_is_checked_and_the_longest_allowed_name_is_written(tmp_path: Path, size: int) -> None:
    target = tmp_path / "new" / ("n" * (size - 4) + ".csv")
    if size > 255:
        with pytest.raises(UserError, match=f"{size} bytes, over the 255-byte limit"):
            write_text(target, "x")
        assert list(tmp_path.iterdir()) == []  # the missing parent was not created
    else:
        write_text(target, "x")  # the temporary sibling's name is shortened to fit
        assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_a_path_over_the_system_limit_is_refused_before_any_folder_is_made(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 200] * 21, "x.csv")  # 4200+ bytes: over Linux and macOS PATH_MAX

    with pytest.raises(UserError, match="the path is .* bytes, over the"):
        write_text(deep, "x")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- traces convert
@pytest.mark.parametrize("kind", REFUSED)
def test_convert_refuses_a_dst_that_is_not_a_file_and_leaves_it_alone(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = make_target(tmp_path, kind)
    before = snapshot(tmp_path)

    assert main(["traces", "convert", str(AZURE), str(dst)]) == 2

    assert one_error_line(capsys.readouterr().err).startswith("error: dst: ")
    assert snapshot(tmp_path) == before


def test_convert_creates_a_missing_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "a" / "b" / "trace.csv"

    assert main(["traces", "convert", str(AZURE), str(dst)]) == 0

    assert len(pd.read_csv(dst)) == 4 and sorted(p.name for p in dst.parent.iterdir()) == ["trace.csv"]


def test_convert_on_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda self, *a, **k: full_disk(*a, **k))

    assert main(["traces", "convert", str(AZURE), str(tmp_path / "new" / "trace.csv")]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "trace.csv" in line and os.strerror(errno.ENOSPC) in line and "disk is full" in line
    assert list(tmp_path.iterdir()) == []  # neither the temporary file nor the folder made for it


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink loop"])
def test_convert_names_what_a_bad_src_is(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_target(tmp_path, kind)
    with no_blocking_reads():
        assert main(["traces", "convert", str(src), str(tmp_path / "out.csv")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert {"folder": "is a folder", "fifo": "FIFO", "symlink loop": "symlink loop"}[kind] in line
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(
    "argv",
    [["calibrate", "--profiles", "{tmp}/none", "--model", "llama-2-7b", "--out", "{target}"],
     ["validate-real", "{tmp}/none", "--out", "{target}"]],
)  # fmt: skip
def test_calibrate_and_validate_real_refuse_a_fifo_before_reading_anything(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    target = make_target(tmp_path, "fifo")
    before = snapshot(tmp_path)

    assert main([arg.format(tmp=tmp_path, target=target) for arg in argv]) == 2

    assert "is a FIFO (named pipe)" in one_error_line(capsys.readouterr().err)  # not the missing input
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------- scenario files
@contextmanager
def no_blocking_reads(seconds: int = 10) -> Iterator[None]:
    """Fail instead of hanging if the code opens a FIFO that nobody writes to."""

    def timed_out(*_: object) -> None:
        raise AssertionError("the code under test opened a FIFO or device and waited on it")

    previous = signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("kind", "says"),
    [("folder", "is a folder, not a file"), ("fifo", "is a FIFO (named pipe), not a regular file"),
     ("missing", "scenario file not found")],
)  # fmt: skip
def test_scenario_path_is_named_for_what_it_is(
    tmp_path: Path, kind: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_target(tmp_path, kind)
    with no_blocking_reads():
        assert main(["validate", str(path)]) == 2
    assert says in one_error_line(capsys.readouterr().err)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this platform")
def test_dev_zero_as_a_scenario_is_a_device_not_a_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    with no_blocking_reads():  # reading it would never end: it must only be stat'ed
        assert main(["validate", "/dev/zero"]) == 2
    assert "is a character device, not a regular file" in one_error_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- report arguments
@pytest.fixture
def no_report_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.studies import regenerate

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("report started working although an argument is wrong")

    monkeypatch.setattr("sim.runner.run", refuse)
    monkeypatch.setattr(regenerate, "EXTRA_REPORTS", {"any": refuse})
    monkeypatch.setattr(regenerate, "write_speedup_map", refuse)


@pytest.mark.parametrize("scenarios", ["typo", "a-file.yaml"])
def test_report_with_a_bad_scenarios_folder_exits_2_and_writes_nothing(
    tmp_path: Path, scenarios: str, no_report_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file.yaml").write_text("name: x\n")
    before = snapshot(tmp_path)

    code = main(["report", "--scenarios", str(tmp_path / scenarios), "--out", str(tmp_path / "results"), "--quiet"])

    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: scenarios") and scenarios in line
    assert snapshot(tmp_path) == before


def test_report_with_an_out_under_a_file_exits_2_and_writes_nothing(
    tmp_path: Path, no_report_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)

    code = main(["report", "--scenarios", str(tmp_path / "scenarios"), "--out", str(tmp_path / "notes.txt" / "r")])

    assert code == 2
    assert "is a file, not a folder" in one_error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before
