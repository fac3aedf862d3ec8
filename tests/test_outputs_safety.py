"""Output folders are never destructive: refused before simulating, replaced only when batchsim
wrote them, kill-safe while saving, umask-respecting; and the progress bar stays off redirected stderr.
"""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim.cli import main
from sim.io import outputs
from sim.io import siblings as sibling_names
from sim.progress import RunProgress

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "scenarios" / "quickstart.yaml"
FAST = ["--set", "workload.requests=30", "--no-plots", "--quiet"]


def cli_run(out: Path | str, *extra: str) -> int:
    return main(["run", str(QUICK), "--out", str(out), *FAST, *extra])


def quick_result(seed: int) -> sim.RunResult:
    return sim.run(sim.load_scenario(QUICK, {"workload.requests": 30, "seed": seed}))


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def siblings(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated although the output folder is unusable")

    monkeypatch.setattr("sim.runner.run", refuse)


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, bytes]]:
    """Complete result folders for seeds 1 (the 'old' result) and 2 (the 'new' one)."""
    base = tmp_path_factory.mktemp("refs")
    found = {seed: folder_bytes(quick_result(seed).save(base / str(seed), plots=False)) for seed in (1, 2)}
    assert found[1]["summary.csv"] != found[2]["summary.csv"]
    return found


# --------------------------------------------------------------------------- refusals, before simulating
def test_foreign_folder_refused_before_simulating(tmp_path: Path, no_simulation: None, capsys) -> None:
    out = tmp_path / "mydata"
    out.mkdir()
    (out / "notes.txt").write_text("my thesis")

    assert cli_run(out) == 2

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert out.name in lines[0] and "notes.txt" in lines[0]  # a long path is cut in its middle, never its end
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "my thesis"
    assert siblings(out) == []


def test_folder_with_a_lookalike_yaml_is_refused(tmp_path: Path, no_simulation: None, capsys) -> None:
    out = tmp_path / "lookalike"
    out.mkdir()
    (out / "summary.csv").write_text("mine\n")
    (out / "scenario.resolved.yaml").write_text("name: mine\n")  # known names, but not batchsim's

    assert cli_run(out) == 2
    assert "batchsim_version" in capsys.readouterr().err
    assert (out / "summary.csv").read_text() == "mine\n"


@pytest.mark.parametrize("below", ["", "sub"])
def test_file_or_path_under_a_file_refused(tmp_path: Path, no_simulation: None, below: str, capsys) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")

    assert cli_run(data / below if below else data) == 2

    assert "is a file" in capsys.readouterr().err
    assert data.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv"]


@pytest.mark.parametrize("out", [".", "..", "{top}"])
def test_current_folder_and_its_parents_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_simulation: None, out: str, capsys
) -> None:
    here = tmp_path / "top" / "here"
    here.mkdir(parents=True)  # empty: only the cwd rule can refuse it
    monkeypatch.chdir(here)

    assert cli_run(out.format(top=tmp_path / "top")) == 2

    assert "current folder" in capsys.readouterr().err
    assert here.is_dir() and not list(here.iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_parent_refused(tmp_path: Path, no_simulation: None, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        assert cli_run(locked / "out") == 2
    finally:
        locked.chmod(0o755)
    assert "cannot write" in capsys.readouterr().err


def test_report_refuses_a_foreign_folder_before_simulating(tmp_path: Path, no_simulation: None) -> None:
    from sim.studies.regenerate import regenerate_results

    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "q.yaml").write_text(QUICK.read_text())
    foreign = tmp_path / "results" / sim.load_scenario(QUICK).name
    foreign.mkdir(parents=True)
    (foreign / "keep.txt").write_text("keep")

    with pytest.raises(sim.UserError, match="keep.txt"):
        regenerate_results(scenarios, tmp_path / "results", plots=False, log=lambda _: None)
    assert (foreign / "keep.txt").read_text() == "keep"


# --------------------------------------------------------------------------- replacing what batchsim wrote
def test_previous_result_and_empty_folder_are_replaced(tmp_path: Path, refs: dict) -> None:
    out = tmp_path / "res"
    out.mkdir()  # empty: accepted
    assert cli_run(out, "--seed", "1") == 0
    assert folder_bytes(out) == refs[1]

    assert cli_run(out, "--seed", "2") == 0

    assert folder_bytes(out) == refs[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_folder_mode_follows_the_umask(tmp_path: Path) -> None:
    script = (
        "import os, sys; os.umask(0o022); from sim.cli import main; "
        f"sys.exit(main(['run', {str(QUICK)!r}, '--out', {str(tmp_path / 'res')!r}, *{FAST!r}]))"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120)

    assert stat.S_IMODE((tmp_path / "res").stat().st_mode) == 0o755  # mkdtemp alone gives 0o700
    assert stat.S_IMODE((tmp_path / "res" / "summary.csv").stat().st_mode) == 0o644


# --------------------------------------------------------------------------- SIGKILL while saving
KILLER = """
import os, signal, sys
import sim
from sim.io import outputs
from sim.io import siblings as sibling_names

target, seed, kill_at = sys.argv[1], int(sys.argv[2]), sys.argv[3]
result = sim.run(sim.load_scenario({quick!r}, {{"workload.requests": 30, "seed": seed}}))
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if kill_at == "write":  # new files written into the temporary folder, not yet swapped in
    write = outputs.write_tables
    outputs.write_tables = lambda r, folder: (write(r, folder), die())
elif kill_at == "after-exchange":  # swapped in one step, previous folder not yet deleted
    exchange = outputs._exchange
    outputs._exchange = lambda a, b: (exchange(a, b), die())
elif kill_at == "between-renames":  # no exchange: old renamed aside, new not yet renamed in
    outputs._exchange = lambda a, b: False
    rename, calls = os.rename, []
    def rename_then_die(src, dst):
        calls.append(src)
        if len(calls) == 2:
            die()
        rename(src, dst)
    os.rename = rename_then_die
result.save(target, plots=False)
"""


def save_killed(target: Path, seed: int, kill_at: str) -> None:
    script = KILLER.format(quick=str(QUICK))
    done = subprocess.run([sys.executable, "-c", script, str(target), str(seed), kill_at], cwd=REPO, timeout=120)
    assert done.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_kill_while_writing_keeps_the_old_result(tmp_path: Path, refs: dict) -> None:
    target = tmp_path / "res"
    quick_result(1).save(target, plots=False)

    save_killed(target, 2, "write")

    assert folder_bytes(target) == refs[1]
    assert [s for s in siblings(target) if ".tmp-" in s]  # the kill left its temporary folder
    quick_result(2).save(target, plots=False)
    assert folder_bytes(target) == refs[2]
    assert siblings(target) == []


@pytest.mark.slow
@pytest.mark.skipif(outputs._renameat2() is None, reason="no renameat2 on this platform")
def test_kill_after_the_exchange_keeps_the_new_result(tmp_path: Path, refs: dict) -> None:
    target = tmp_path / "res"
    quick_result(1).save(target, plots=False)

    save_killed(target, 2, "after-exchange")

    assert folder_bytes(target) == refs[2]
    assert siblings(target)  # the previous folder, under its temporary name
    quick_result(2).save(target, plots=False)
    assert siblings(target) == []


@pytest.mark.slow
def test_kill_between_fallback_renames_recovers_the_old_result(tmp_path: Path, refs: dict) -> None:
    target = tmp_path / "res"
    quick_result(1).save(target, plots=False)

    save_killed(target, 2, "between-renames")

    assert not target.exists()
    stranded = [tmp_path / s for s in siblings(target) if ".old-" in s]
    assert len(stranded) == 1 and folder_bytes(stranded[0]) == refs[1]
    save_killed(target, 2, "write")  # the next save restores the old result before anything else
    assert folder_bytes(target) == refs[1]
    quick_result(2).save(target, plots=False)
    assert folder_bytes(target) == refs[2]
    assert siblings(target) == []


def test_only_leftovers_of_dead_writers_on_this_host_are_removed(tmp_path: Path, refs: dict) -> None:
    target = tmp_path / "res"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    names = {
        "dead": f".res.tmp-{int(dead.stdout)}@{sibling_names.HOST}-abcd1234",
        "alive": f".res.tmp-{os.getppid()}@{sibling_names.HOST}-abcd1234",
        "other host": f".res.tmp-{int(dead.stdout)}@00000000-abcd1234",
        "not ours": ".res.tmp-notes",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.csv").write_text("partial")

    quick_result(1).save(target, plots=False)

    assert folder_bytes(target) == refs[1]
    assert siblings(target) == sorted(names[k] for k in ("alive", "other host", "not ours"))


# --------------------------------------------------------------------------- progress bar
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_silent_when_stderr_is_redirected(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    script = (
        "import sys, sim.progress; sim.progress.DELAY_S = 0.0; from sim.cli import main; "
        f"sys.exit(main(['run', {str(QUICK)!r}, '--out', {str(tmp_path / 'res')!r}, "
        "'--set', 'workload.requests=30', '--no-plots']))"
    )
    with log.open("w") as err:
        subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                       stderr=err, timeout=120)
    assert log.read_bytes() == b""
    assert RunProgress(file=io.StringIO(), delay_s=0)("static", 10) is None


class FakeClock:
    """A clock that moves only when the test sets it: frames do not depend on the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_on_a_terminal_honours_delay_and_throttles_frames() -> None:
    clock = FakeClock()
    quiet = FakeTerminal()
    bar = RunProgress(file=quiet, delay_s=60, clock=clock)("static", 1000)
    for done in range(1000):
        clock.now = done * 0.05  # 50 s of calls, all before the delay is up
        bar(float(done), done)
    bar.close()
    assert quiet.getvalue() == ""

    clock.now = 0.0
    shown = FakeTerminal()
    bar = RunProgress(file=shown, delay_s=0, clock=clock)("vllm-v0", 50_000, index=2, count=3)
    for done in range(50_000):
        clock.now = done * 1e-4  # 5 s of calls, one every 0.1 ms
        bar(float(done), done)
    bar.close()
    assert "vllm-v0 2/3" in shown.getvalue() and "left" in shown.getvalue()
    assert 1 <= shown.getvalue().count("\r") < 100  # tqdm's mininterval, not one frame per call


def test_factories_get_policy_position_when_they_accept_it() -> None:
    scenario = sim.load_scenario(QUICK, {"workload.requests": 30})
    seen: list[tuple] = []

    def positional(policy: str, total: int, *, index: int, count: int) -> None:
        seen.append((policy, total, index, count))

    sim.run(scenario, policies=["static", "vllm-v0"], progress=positional)
    sim.run(scenario, policies=["vllm-v0"], progress=lambda policy, total: seen.append((policy, total)))

    assert seen == [("static", 30, 1, 2), ("vllm-v0", 30, 2, 2), ("vllm-v0", 30)]
