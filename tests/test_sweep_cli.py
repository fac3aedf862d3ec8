"""``python -m sim sweep`` / ``capacity`` end to end: outputs, errors, Ctrl-C, --resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.io.scenario import load_scenario
from sim.sweeps import sweep

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "name": "cli_sweep",
    "seed": 4,
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 150,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 256},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 96},
    },
    "policies": [
        {"name": "static", "kind": "static", "max_batch_size": 8},
        {"name": "continuous", "kind": "continuous", "max_batch_size": 16},
    ],
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.mark.slow
def test_sweep_writes_csv_markdown_and_plots(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "sweep",
            str(scenario_file),
            "--param",
            "workload.arrival.rate=2,8",
            "--param",
            "policies[continuous].max_batch_size=4,16",
            "--seeds",
            "2",
            "--workers",
            "2",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 2 * 2 * 2 * 2 and set(table["seed"]) == {0, 1}
    assert table.groupby(["point", "seed"]).size().eq(2).all()
    markdown = (out / "sweep.md").read_text()
    assert "`workload.arrival.rate` = 2, 8" in markdown and "TTFT p99 (ms)" in markdown
    assert markdown.count("\n| ") == 1 + 1 + 2 * 2 * 2  # header, rule, one row per point x policy
    for name in ("latency_vs_load_ttft_p99_s.png", "latency_vs_load_e2e_mean_s.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == ""  # --quiet


def test_default_seed_is_the_scenarios(scenario_file: Path, tmp_path: Path) -> None:
    assert (
        main(
            [
                "sweep",
                str(scenario_file),
                "--param",
                "workload.requests=40",
                "--workers",
                "1",
                "--out",
                str(tmp_path / "o"),
                "--quiet",
                "--no-plots",
            ]
        )
        == 0
    )
    assert pd.read_csv(tmp_path / "o" / "sweep.csv")["seed"].unique().tolist() == [TINY["seed"]]


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("workload.arrival.rate", "PATH=V1,V2"),
        ("workload.arival.rate=1,2", "arival"),
        ("workload.arrival.rate=1,-2", "point 1"),
        ("policies[contnuous].max_batch_size=8", "contnuous"),
        ("seed=1,2", "--seeds"),
    ],
)
def test_bad_params_fail_fast_with_exit_2(
    scenario_file: Path,
    tmp_path: Path,
    param: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "never"
    assert main(["sweep", str(scenario_file), "--param", param, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error
    assert not out.exists()  # nothing ran, nothing written


def test_failed_points_are_listed_and_exit_1(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 5 KV blocks of 16 tokens cannot hold a 256 + 96 token request: an error when resolving
    code = main(
        [
            "sweep",
            str(scenario_file),
            "--param",
            "memory.kv_blocks=5,2000",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "o"),
            "--no-plots",
        ]
    )
    assert code == 1
    captured = capsys.readouterr()
    assert "failed: point 0 (memory.kv_blocks=5)" in captured.err and "UserError" in captured.err
    table = pd.read_csv(tmp_path / "o" / "sweep.csv").fillna({"error": ""})
    assert (table[table["memory.kv_blocks"] == 5]["error"] != "").all()
    assert (table[table["memory.kv_blocks"] == 2000]["error"] == "").all()
    assert "1 failed run(s)" in (tmp_path / "o" / "sweep.md").read_text()


@pytest.mark.slow
def test_ctrl_c_then_resume_completes_the_sweep(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rates = ",".join(str(r) for r in range(1, 13))
    command = [
        sys.executable,
        "-m",
        "sim",
        "sweep",
        str(scenario_file),
        "--param",
        f"workload.arrival.rate={rates}",
        "--seeds",
        "2",
        "--workers",
        "2",
        "--out",
        str(out),
        "--no-plots",
        "--quiet",
    ]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    csv_path = out / "sweep.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if csv_path.exists() and csv_path.read_text().count("\n") >= 5:  # header + 2 points
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    partial = pd.read_csv(csv_path)
    finished = partial.groupby(["point", "seed"]).size()
    assert (
        finished.eq(2).all() and 2 <= len(finished) < 12 * 2
    )  # whole points only, and some left to do
    resumed = subprocess.run(
        [*command, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    expected = sweep(
        load_scenario(scenario_file), {"workload.arrival.rate": list(range(1, 13))}, 2, workers=2
    )
    on_disk = sweep(
        load_scenario(scenario_file),
        {"workload.arrival.rate": list(range(1, 13))},
        2,
        out=out,
        resume=True,
    )  # every point is done: this only reads sweep.csv back
    pd.testing.assert_frame_equal(on_disk, expected, check_exact=True)


@pytest.mark.slow
def test_capacity_prints_and_writes_the_table(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cap"
    code = main(
        [
            "capacity",
            str(scenario_file),
            "--slo",
            "ttft_p99_s=0.5",
            "--slo",
            "tpot_p99_s=0.03",
            "--workers",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "tolerance 2.0%" in printed and "static" in printed and "continuous" in printed
    report = pd.read_csv(out / "capacity.csv")
    assert report["policy"].tolist() == ["static", "continuous"] and (report["rate_rps"] > 0).all()
    assert "relative tolerance of 2.0%" in (out / "capacity.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--slo", "ttft=1"], "ttft"),
        (["--slo", "ttft_p99_s"], "BOUND=SECONDS"),
        (["--slo", "ttft_p99_s=fast"], "not a number"),
        (
            ["--slo", "ttft_p99_s=1", "--set", "workload.arrival={kind: burst}"],
            "workload.arrival.kind",
        ),
        (
            ["--slo", "ttft_p99_s=1", "--backend", "ray", "--address", "auto", "--seeds", "x"],
            "--seeds",
        ),
        (["--slo", "ttft_p99_s=1", "--param", "workload.arrival.rate=1,2"], "varies it itself"),
        (["--slo", "ttft_p99_s=1", "--param", "pipeline_parallel=0,2"], "pipeline_parallel"),
        (["--slo", "ttft_p99_s=1", "--param", "pipeline_parallel=1,2", "--split-gpus", "4"], "--split-gpus"),
    ],
)
def test_bad_capacity_options_exit_2(
    scenario_file: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["capacity", str(scenario_file), *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_ray_is_a_clear_user_error(scenario_file: Path, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['ray'] = None; from sim.cli import main; "
        f"sys.exit(main(['sweep', {str(scenario_file)!r}, '--param', 'workload.requests=20', "
        f"'--backend', 'ray', '--out', {str(tmp_path / 'o')!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2 and 'pip install ".[ray]"' in done.stderr


@pytest.mark.parametrize("command", ["sweep", "capacity"])
@pytest.mark.parametrize("where", ["file", "under_file"])
def test_out_that_cannot_be_a_folder_exits_2_before_anything_runs(
    scenario_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    where: str,
) -> None:
    import sim.runner

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a simulation ran although --out is unusable")

    monkeypatch.setattr(sim.runner, "run", must_not_run)
    existing = tmp_path / "notes.txt"
    existing.write_text("keep me\n")
    before = existing.stat()
    out = existing if where == "file" else existing / "sub"
    extra = ["--param", "workload.requests=20,40"] if command == "sweep" else ["--slo", "ttft_p99_s=1"]
    code = main([command, str(scenario_file), *extra, "--workers", "1", "--out", str(out)])
    assert code == 2
    error = capsys.readouterr().err
    # A long path is cut in its middle (the error line stays bounded): its last name always shows.
    assert error.count("\n") == 1 and error.startswith("error: ") and f"{out.name}'" in error
    assert existing.read_text() == "keep me\n" and existing.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "tiny.yaml"]  # nothing new


def test_sigterm_in_process_exits_143_and_keeps_the_file(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sim.runner

    real_run = sim.runner.run
    calls: list[int] = []

    def terminated_on_third_point(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in the main thread
        return real_run(*args, **kwargs)

    monkeypatch.setattr(sim.runner, "run", terminated_on_third_point)
    previous = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "o"
    argv = ["sweep", str(scenario_file), "--param", "workload.requests=20,21,22,23", "--workers", "1"]
    assert main([*argv, "--out", str(out), "--quiet", "--no-plots"]) == 143
    assert signal.getsignal(signal.SIGTERM) is previous  # the CLI puts the handler back
    assert "terminated:" in capsys.readouterr().err
    assert pd.read_csv(out / "sweep.csv")["workload.requests"].tolist() == [20, 20, 21, 21]
