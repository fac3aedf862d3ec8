"""Validation against real vLLM bursts: benchmark_serving's metrics, parsing, the replay, the report.

Tests marked ``needs_shared`` read ``../shared/validation/vllm-0.6.0-burst`` next to the
repository and skip with a reason where it is absent; the others build tiny validation
folders of their own. What the shared folder holds (its runs, their N) is read from its own
files, never written here: the folder may gain runs. The other shapes (load stages,
per-request traces) and folder detection: ``tests/test_validation_shapes.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config import FrontendConfig
from sim.presets import VLLM_06_CPU
from sim.resolve import resolve
from sim.validation import load_validation_set, replay_scenario
from sim.validation.metrics import (
    benchmark_metrics,
    client_frame,
    median_e2e_ms,
    median_tpot_ms,
    median_ttft_ms,
)
from sim.validation.report import DOCS_BLOCKS, DOCS_FILE, REPO_ROOT, refresh_docs, report_validation
from sim.vllm_defaults import V0_FRONTEND

SHARED_SET = REPO_ROOT.parent / "shared" / "validation" / "vllm-0.6.0-burst"
HAVE_SHARED = (SHARED_SET / "summary.csv").is_file()


def needs_shared(test: Callable[..., None]) -> Callable[..., None]:
    """Marks ``needs_shared`` and skips, saying why, where the real runs are absent."""
    skip = pytest.mark.skipif(
        not HAVE_SHARED, reason=f"real vLLM runs not found at {SHARED_SET} (../shared next to the repo)"
    )
    return pytest.mark.needs_shared(skip(test))


SHARED_RUNS = load_validation_set(SHARED_SET) if HAVE_SHARED else []


# --------------------------------------------------------------------------- metrics
def _client_rows() -> pd.DataFrame:
    """Five successful requests and a failed one; the expected figures are worked out below."""
    return pd.DataFrame({
        "output_len": [0, 1, 11, 21, 3, 100],
        "ttft_s": [0.0, 0.4, 1.0, 2.0, 3.0, 0.1],
        "e2e_s": [0.5, 0.4, 2.0, 6.0, 4.0, 0.2],
        "completed": [True, True, True, True, True, False],
    })  # fmt: skip


def test_ttft_median_excludes_empty_outputs() -> None:
    # With text: 0.4, 1.0, 2.0, 3.0 -> 1.5 s (with the empty answer's 0 it would be 1.0 s).
    assert median_ttft_ms(_client_rows()) == pytest.approx(1500.0)


def test_tpot_excludes_outputs_of_at_most_one_token() -> None:
    # (2-1)/10 = 0.1, (6-2)/20 = 0.2, (4-3)/2 = 0.5 -> 0.2 s; output_len 0 and 1 (and the failure) excluded.
    assert median_tpot_ms(_client_rows()) == pytest.approx(200.0)


def test_e2e_duration_and_throughput() -> None:
    frame = _client_rows()
    # E2E over every success, the empty answer included: 0.5, 0.4, 2, 6, 4 -> 2 s.
    assert median_e2e_ms(frame) == pytest.approx(2000.0)
    figures = benchmark_metrics(frame)
    assert figures["duration_s"] == pytest.approx(6.0)  # last end, all sent at t = 0
    assert figures["output_tps"] == pytest.approx((0 + 1 + 11 + 21 + 3) / 6.0)  # failures count 0 tokens


def test_client_frame_orders_by_request_and_zeroes_empty_ttft() -> None:
    sim_requests = pd.DataFrame({
        "request_id": [2, 0, 1], "ttft_s": [0.3, 0.1, 0.2], "e2e_s": [3.0, 1.0, 2.0],
        "status": pd.Categorical(["completed", "completed", "timed_out"]),
    })  # fmt: skip
    frame = client_frame(sim_requests, np.array([5, 0, 7]))
    assert frame["ttft_s"].tolist() == [0.1, 0.0, 0.3]
    assert frame["e2e_s"].tolist() == [1.0, 2.0, 3.0]
    assert frame["completed"].tolist() == [True, False, True]


# --------------------------------------------------------------------------- parsing and the CLI
SUMMARY_HEADER = (
    "config,gpu,num_gpus,tensor_parallel,model_id,max_model_len,num_prompts,duration,completed,"
    "total_output_tokens,output_throughput,median_ttft_ms_nonzero,median_tpot_ms,median_latency_ms,"
    "requests_file,source_repo,source_path,source_commit"
)


def _tiny_set(folder: Path, *, model: str = "meta-llama/Meta-Llama-3-8B-Instruct", duration: str = "2.0") -> Path:
    """A three-request validation folder in the real format (one empty answer)."""
    folder.mkdir(parents=True)
    (folder / "run__N3.csv").write_text(
        "request_idx,input_len,output_len,ttft_s,e2e_s,status\n"
        "0,100,30,0.5,,completed\n1,200,0,0,,empty_output\n2,50,12,0.6,,completed\n"
    )
    (folder / "summary.csv").write_text(
        SUMMARY_HEADER + "\n"
        f"run,A100-80GB-SXM,1,1,{model},2000,3,{duration},3,42,21.0,550,15.0,900,run__N3.csv,o/r,p.json,abc1234\n"
    )
    return folder


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_corrupt_summary_is_one_error_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    folder = _tiny_set(tmp_path / "set", duration="fast")
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out)]) == 2
    err = _one_error_line(capsys)
    assert "summary.csv, line 2, column 'duration'" in err and "'fast'" in err
    assert not out.exists()


def test_unknown_model_and_missing_folder_are_errors(tmp_path: Path, capsys) -> None:
    folder = _tiny_set(tmp_path / "set", model="acme/Giant-1T")
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out)]) == 2
    assert "'acme/Giant-1T' has no batchsim model" in _one_error_line(capsys)
    assert main(["validate-real", str(tmp_path / "absent"), "--out", str(out)]) == 2
    assert "not found" in _one_error_line(capsys)
    assert not out.exists()


def test_request_file_must_match_the_summary(tmp_path: Path, capsys) -> None:
    folder = _tiny_set(tmp_path / "set")
    text = (folder / "summary.csv").read_text().replace(",2000,3,", ",2000,4,")
    (folder / "summary.csv").write_text(text)
    assert main(["validate-real", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "3 requests, but summary.csv says num_prompts = 4" in _one_error_line(capsys)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# (file to edit, text replaced, replacement, fragments of the single error line)
CORRUPT_SET = {
    "missing request column": ("run__N3.csv", "ttft_s,", "ttft,", ["run__N3.csv", "no column 'ttft_s'"]),
    "non-numeric length": (
        "run__N3.csv",
        "0,100,30",
        "0,lots,30",
        ["run__N3.csv, line 2, column 'input_len'", "'lots'"],
    ),
    "negative ttft": ("run__N3.csv", "0.6,,completed", "-0.6,,completed", ["line 4, column 'ttft_s'", "'-0.6'"]),
    "fractional count": ("summary.csv", ",2000,3,", ",2000,3.5,", ["line 2, column 'num_prompts'", "'3.5'"]),
    "output total disagrees": (
        "summary.csv",
        ",3,42,",
        ",3,41,",
        ["output_len sums to 42", "total_output_tokens = 41"],
    ),
    "request file absent": ("summary.csv", ",run__N3.csv,", ",gone.csv,", ["column 'requests_file'", "'gone.csv'"]),
    "requests out of order": ("run__N3.csv", "\n1,200,", "\n5,200,", ["line 3, column 'request_idx'"]),
}


@pytest.mark.parametrize("case", CORRUPT_SET, ids=list(CORRUPT_SET))
def test_each_corrupt_file_is_one_error_line_naming_it(tmp_path: Path, capsys, case: str) -> None:
    name, old, new, fragments = CORRUPT_SET[case]
    folder = _tiny_set(tmp_path / "set")
    _edit(folder / name, old, new)
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out), "--quiet"]) == 2
    err = _one_error_line(capsys)
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists()


def test_any_request_file_name_replays(tmp_path: Path, capsys) -> None:
    """A file name is not a scenario name: 'run 1.csv' (a space) replays, under its own name in the table."""
    folder = _tiny_set(tmp_path / "set")
    (folder / "run__N3.csv").rename(folder / "run 1.csv")
    _edit(folder / "summary.csv", ",run__N3.csv,", ",run 1.csv,")
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    assert set(pd.read_csv(out / "set.csv")["run"]) == {"run 1"}


@settings(max_examples=60)
@given(st.text(max_size=300) | st.sampled_from(["run 1", "../up", ".hidden", "a/b:c?", "ü", ""]))
def test_replay_names_are_valid_scenario_names(stem: str) -> None:
    from sim.config import Scenario
    from sim.validation.cases import replay_name

    name = replay_name(stem)
    fixed = {"kind": "fixed", "value": 8}
    arrival = {"kind": "poisson", "rate": 1.0}
    workload = {"requests": 1, "arrival": arrival, "prompt_tokens": fixed, "output_tokens": fixed}
    assert Scenario(name=name, workload=workload, policies=[{"name": "p", "kind": "paged"}]).name == name
    if re.fullmatch(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}", stem):
        assert name == stem  # a name that is already valid is kept


def test_tiny_set_replays_and_writes_both_tables(tmp_path: Path, capsys) -> None:
    folder = _tiny_set(tmp_path / "set")
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "set.csv")
    assert list(table.columns) == [
        "run", "gpu", "model", "n", "cost_model", "metric", "unit", "measured", "simulated", "error_pct",
        "shape", "load_frac", "saturated", "preset",
    ]  # fmt: skip
    assert table["metric"].tolist() == ["ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tps", "duration_s"]
    assert table["measured"].tolist() == [550, 15.0, 900, 21.0, 2.0]
    assert np.allclose(
        table["error_pct"], 100 * (table["simulated"] - table["measured"]) / table["measured"], rtol=1e-4
    )
    assert set(table["shape"]) == {"burst"} and set(table["preset"]) == {"vllm-0.6"}
    # A burst of 3 on a batch of 1024 is far from saturating it.
    assert (table["load_frac"] < 0.9).all() and not table["saturated"].any()
    assert "| A100-80GB-SXM | Meta-Llama-3-8B-Instruct | 3 |" in (out / "set.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_server_columns_in_the_summary_override_the_folder_defaults(tmp_path: Path) -> None:
    folder = _tiny_set(tmp_path / "set")
    text = (folder / "summary.csv").read_text().splitlines()
    (folder / "summary.csv").write_text(f"{text[0]},max_num_seqs,engine_version\n{text[1]},64,0.6.3\n")
    run = load_validation_set(folder)[0]
    with replay_scenario(run) as scenario:
        policy = scenario.policies[0]
    assert policy.max_batch_size == 64 and policy.preset == "vllm-0.6"
    assert policy.num_scheduler_steps == 10  # not in the file: the folder's documented default


# --------------------------------------------------------------------------- the replay of the real runs
@pytest.mark.parametrize("run", SHARED_RUNS, ids=[r.name for r in SHARED_RUNS])
@needs_shared
def test_replay_has_the_runs_requests_and_the_server_flags(run) -> None:
    with replay_scenario(run) as scenario:
        stream = resolve(scenario).stream
    lengths = run.requests
    assert len(stream) == run.num_requests == len(lengths)
    assert np.array_equal(stream.prompt_tokens, lengths["input_len"])
    assert np.array_equal(stream.output_tokens, np.maximum(lengths["output_len"], 1))  # empty answer -> 1 token
    assert not np.any(stream.arrival_s)  # a burst: all sent at t = 0
    policy = scenario.policies[0]
    assert len(scenario.policies) == 1 and policy.kind == "paged" and policy.preset == "vllm-0.6"
    assert (policy.num_scheduler_steps, policy.max_batch_size, policy.max_num_batched_tokens) == (10, 1024, 2048)
    assert policy.gpu_memory_utilization == 0.95
    assert policy.engine_cpu.model_dump() == VLLM_06_CPU  # the preset's fitted CPU model
    assert scenario.frontend is None  # the server is the preset's: vLLM V0's API front end
    assert policy.frontend == FrontendConfig(**V0_FRONTEND)
    assert scenario.memory.block_size == 16 and scenario.memory.gpu_memory_utilization == 0.95
    assert scenario.max_model_len == run.summary["max_model_len"]


@needs_shared
def test_ttft_definition_reproduces_benchmark_serving_on_the_measured_requests() -> None:
    for run in SHARED_RUNS:
        frame = run.requests.assign(e2e_s=np.nan, completed=True)
        assert median_ttft_ms(frame) == pytest.approx(run.summary["median_ttft_ms_nonzero"], abs=0.02)


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """``python -m sim report``'s validation step, run once into a temporary results folder."""
    from sim.studies.regenerate import regenerate_results

    root = tmp_path_factory.mktemp("report")
    (root / "scenarios").mkdir()
    messages: list[str] = []
    regenerate_results(root / "scenarios", root / "results", plots=False, log=messages.append, studies=["validation"])
    return root / "results", messages


@needs_shared
def test_report_writes_a_table_for_every_validation_folder(reported) -> None:
    results, messages = reported
    for folder in sorted(p for p in SHARED_SET.parent.iterdir() if p.is_dir()):
        for suffix in ("md", "csv"):
            assert (results / "validation" / f"{folder.name}.{suffix}").is_file()
        assert any(f"{folder.name}.md" in m for m in messages)
    table = pd.read_csv(results / "validation" / "vllm-0.6.0-burst.csv")
    assert sorted(table["n"].unique()) == sorted({run.num_requests for run in SHARED_RUNS})
    assert len(table) == 5 * len(SHARED_RUNS)


def test_report_says_it_skipped_without_the_real_runs(tmp_path: Path) -> None:
    messages: list[str] = []
    report_validation(tmp_path / "results", log=messages.append, data_dir=tmp_path / "absent")
    assert messages and messages[0].startswith("skipped validation") and str(tmp_path / "absent") in messages[0]
    assert not (tmp_path / "results").exists()


# The accuracy of the fitted model (front end, CPU time, cost model) on the bursts, against issue 26's
# targets: no run's TTFT off by more than 25%, and a median |error| over all runs of at most 5% on TTFT,
# TPOT, E2E and tokens/s (scripts/fit_serving.py fitted the serving terms on both folders jointly).
@needs_shared
def test_fitted_model_keeps_every_burst_within_the_targets(reported) -> None:
    table = pd.read_csv(reported[0] / "validation" / "vllm-0.6.0-burst.csv")
    assert set(table["run"]) == {run.name for run in SHARED_RUNS}
    ttft = table[table["metric"] == "ttft_p50_ms"]
    assert (ttft["error_pct"].abs() <= 25.0).all(), ttft[["run", "error_pct"]].to_string()
    medians = table.assign(abs_error=table["error_pct"].abs()).groupby("metric")["abs_error"].median()
    assert (medians[["ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tps"]] <= 5.0).all(), medians.to_string()


@needs_shared
def test_fitted_model_keeps_unsaturated_v1_stages_within_ten_percent(reported) -> None:
    """vLLM 0.11 load stages below 0.9 of capacity: median |error| <= 10% on TTFT, TPOT and E2E (issue 26)."""
    table = pd.read_csv(reported[0] / "validation" / "vllm-0.11-h100.csv")
    stages = table[(table["shape"] == "stages") & ~table["saturated"].astype(bool)]
    assert stages["run"].nunique() >= 3
    medians = stages.assign(abs_error=stages["error_pct"].abs()).groupby("metric")["abs_error"].median()
    assert (medians[["ttft_mean_ms", "tpot_derived_ms", "e2e_mean_ms"]] <= 10.0).all(), medians.to_string()


@pytest.mark.parametrize("block", DOCS_BLOCKS)
def test_docs_tables_are_the_committed_results_tables(block: str) -> None:
    results_md = REPO_ROOT / "results" / "validation" / f"{DOCS_BLOCKS[block]}.md"
    assert refresh_docs(results_md, DOCS_FILE, block=block, check=True), "run: python -m sim.validation.docs"
