"""validate-real on every shape of real data: load stages, per-request traces, folder detection, servers.

Tiny folders of each shape are built here (the columns of ``../shared/validation/vllm-0.11-h100``);
tests marked ``needs_shared`` read that folder and skip with a reason where it is absent. What it
holds (its stages, its runs) is read from its own files.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from sim.config import FrontendConfig, Scenario
from sim.errors import UserError
from sim.validation.cases import Case
from sim.validation.folder import load_cases
from sim.validation.report import REPO_ROOT
from sim.validation.server import ENGINE_PRESETS, ServerFlags, policy_entry, preset_for
from sim.validation.spans import TraceCase
from sim.validation.stages import MEASURED, StageCase
from sim.vllm_defaults import V1_FRONTEND

SHARED_V1 = REPO_ROOT.parent / "shared" / "validation" / "vllm-0.11-h100"
HAVE_SHARED = (SHARED_V1 / "inference-perf-stages.csv").is_file()


def needs_shared(test: Callable[..., None]) -> Callable[..., None]:
    """Marks ``needs_shared`` and skips, saying why, where the real runs are absent."""
    skip = pytest.mark.skipif(not HAVE_SHARED, reason=f"real vLLM 0.11 runs not found at {SHARED_V1}")
    return pytest.mark.needs_shared(skip(test))


SERVER = {
    "engine_version": "0.11.0", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "gpu": "H100-80GB (GKE nvidia-h100-80gb)", "num_gpus": 1, "tp": 1, "max_model_len": 512, "max_num_seqs": 128,
    "max_num_batched_tokens": "not set (unknown; see README)", "gpu_memory_utilization": 0.9,
    "prefix_caching": "off", "chunked_prefill": "off (--no-enable-chunked-prefill)",
}  # fmt: skip


def _stage(stage: int, rate: float, sent: int, *, client_bound: bool = False) -> dict:
    measured = {column: 100.0 + stage for column, _ in MEASURED.values()}
    return {
        "stage": stage, **SERVER, "requested_rate": rate * (3 if client_bound else 1), "achieved_rate": rate,
        "stage_duration_s": sent / rate, "requests_sent": sent, "completed": sent, "failed": 0,
        "saturated_client_bound": client_bound, "client_max_outstanding": 4, "ignore_eos": True,
        "num_system_prompts": 2, "system_prompt_len": 128, "prompt_len_mean": 204.1, "output_len_cfg": 64,
        **measured, "source_repo": "o/r", "source_path": "p.json", "source_commit": "abc1234",
    }  # fmt: skip


def _stage_file(folder: Path) -> Path:
    """Two stages (one client-bound) and the 'all' row summing them."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [_stage(0, 2.0, 10), _stage(1, 40.0, 12, client_bound=True)]
    total = {**{k: "" for k in rows[0]}, "stage": "all", "requests_sent": 22, "completed": 22, "failed": 0}
    path = folder / "stages.csv"
    pd.DataFrame([*rows, total]).to_csv(path, index=False)
    return path


def _trace_file(folder: Path, run: str = "tiny") -> Path:
    """Six requests of one run, with the server's flags as columns."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 6
    frame = pd.DataFrame({
        "request_idx": range(n), "run": run, "input_len": [100, 800, 50, 300, 1200, 64],
        "output_len": [20, 5, 40, 1, 30, 12], "server_arrival_s": [0.0, 0.5, 0.9, 2.0, 2.1, 4.0],
        "server_ttft_s": 0.05, "server_e2e_s": 0.5, "server_queue_s": 0.001,
    })  # fmt: skip
    frame["server_prompt_tokens"], frame["server_completion_tokens"] = frame["input_len"], frame["output_len"]
    for key, value in {**SERVER, "model_id": "meta-llama/Llama-2-7b-hf", "max_model_len": 4096}.items():
        frame[key] = value
    path = folder / "requests.csv"
    frame.to_csv(path, index=False)
    return path


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _scenario(case: Case, folder: Path) -> Scenario:
    return Scenario(**case.scenario_dict(folder))


# --------------------------------------------------------------------------- load stages
def test_stage_rows_replay_at_their_rate_or_as_the_clients_closed_loop(tmp_path: Path) -> None:
    cases = load_cases(_stage_file(tmp_path / "set").parent)
    assert [type(c) for c in cases] == [StageCase, StageCase] and [c.n for c in cases] == [10, 12]
    steady, bound = (_scenario(c, tmp_path) for c in cases)
    assert steady.workload.arrival.kind == "constant" and steady.workload.arrival.rate == 2.0
    assert bound.workload.arrival.kind == "closed_loop" and bound.workload.arrival.clients == 4
    for scenario, case in zip((steady, bound), cases, strict=True):
        workload = scenario.workload
        assert workload.requests == case.n
        # 128-token system prompt (one of num_system_prompts) + the question: 204 tokens in all.
        assert workload.shared_prefix.tokens == 128 and workload.shared_prefix.variants == 2
        assert workload.shared_prefix.tokens + workload.prompt_tokens.value == 204
        assert workload.output_tokens.value == 64
        policy = scenario.policies[0]
        assert scenario.frontend is None and policy.frontend == FrontendConfig(**V1_FRONTEND)  # vLLM V1's server
        assert policy.frontend.startup_ms == 0.0  # a warm server
        assert policy.preset == "vllm-0.11" and policy.max_batch_size == 128 and policy.prefix_caching is False
        assert scenario.max_model_len == 512 and scenario.gpu == "h100-sxm" and scenario.model == "llama-3.1-8b"
    assert cases[1].requested_rps == 120.0 and cases[0].requested_rps is None


def test_stage_folder_writes_every_stage_and_marks_saturation(tmp_path: Path, capsys) -> None:
    folder = _stage_file(tmp_path / "set").parent
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    table = pd.read_csv(out / "set.csv")
    assert set(table["shape"]) == {"stages"} and table["run"].nunique() == 2
    for _, rows in table.groupby("run"):
        assert rows["metric"].tolist() == list(MEASURED)
        stage = int(rows["run"].iloc[0].rsplit(" ", 1)[1])
        assert (rows["measured"] == 100.0 + stage).all()  # the file's figures, unchanged
    load = table.groupby("run")["load_frac"].first()
    assert load["stages:stage 0"] < 0.1  # 2 req/s on an H100
    # The client-bound stage asked for 120 req/s; its load is that over the policy's capacity.
    assert load["stages:stage 1"] > 0 and table.set_index("run").loc["stages:stage 1", "saturated"].all() == (
        load["stages:stage 1"] >= 0.9
    )
    assert "## Constant-rate load stages" in (out / "set.md").read_text()


def _edit_csv(path: Path, row: int, column: str, value: object) -> None:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.loc[row, column] = str(value)
    frame.to_csv(path, index=False)


BROKEN_STAGES = {
    "missing column": (None, "ttft_mean_ms", ["no column 'ttft_mean_ms'"]),
    "non-numeric cell": (0, ("achieved_rate", "fast"), ["line 2, column 'achieved_rate'", "'fast'"]),
    "sent != completed + failed": (1, ("completed", 11), ["line 3, column 'completed'", "requests_sent = 12"]),
    "sums disagree with 'all'": (2, ("requests_sent", 23), ["line 4, column 'requests_sent'", "sum to 22"]),
    "not a switch": (0, ("saturated_client_bound", "maybe"), ["column 'saturated_client_bound'", "'maybe'"]),
    "bad server flag": (0, ("max_num_seqs", "lots"), ["column 'max_num_seqs'", "'lots'", "whole number"]),
    "unknown engine": (0, ("engine_version", "0.3.1"), ["no batchsim preset for vLLM 0.3", "0.11"]),
}


@pytest.mark.parametrize("case", BROKEN_STAGES, ids=list(BROKEN_STAGES))
def test_each_broken_stage_file_is_one_error_line(tmp_path: Path, capsys, case: str) -> None:
    row, edit, fragments = BROKEN_STAGES[case]
    path = _stage_file(tmp_path / "set")
    if row is None:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=[edit])
        frame.to_csv(path, index=False)
    else:
        _edit_csv(path, row, *edit)
    out = tmp_path / "out"
    assert main(["validate-real", str(path.parent), "--out", str(out), "--quiet"]) == 2
    err = _one_error_line(capsys)
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists()


# --------------------------------------------------------------------------- per-request traces
def test_trace_replays_its_arrivals_into_the_engine(tmp_path: Path) -> None:
    path = _trace_file(tmp_path / "set")
    (case,) = load_cases(path.parent)
    assert isinstance(case, TraceCase) and case.n == 6
    scenario = _scenario(case, tmp_path)
    assert scenario.frontend is None and scenario.policies[0].frontend is None  # the spans start at the engine
    from sim.resolve import resolve

    stream = resolve(scenario).stream
    frame = pd.read_csv(path)
    assert np.allclose(stream.arrival_s, frame["server_arrival_s"])
    assert np.array_equal(stream.prompt_tokens, frame["input_len"])
    assert np.array_equal(stream.output_tokens, frame["output_len"])
    policy = scenario.policies[0]
    assert policy.preset == "vllm-0.11" and scenario.max_model_len == 4096 and scenario.model == "llama-2-7b"


def test_trace_report_compares_in_distribution_and_per_request(tmp_path: Path, capsys) -> None:
    folder = _trace_file(tmp_path / "set").parent
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    table = pd.read_csv(out / "set.csv").set_index("metric")
    for span, real_ms in (("ttft", 50.0), ("e2e", 500.0), ("queue", 1.0)):
        assert table.loc[f"{span}_p50_ms", "measured"] == pytest.approx(real_ms)
    per_request = table[table.index.str.contains("_req_")]
    assert len(per_request) == 8 and (per_request["measured"] == 0).all() and per_request["error_pct"].isna().all()
    # The signed median lies within the absolute median's reach.
    assert abs(table.loc["ttft_req_err_p50", "simulated"]) <= table.loc["ttft_req_abs_err_p90", "simulated"]


BROKEN_TRACES = {
    "missing column": ("drop", "server_queue_s", ["no column 'server_queue_s'"]),
    "non-numeric cell": ((1, "server_ttft_s", "soon"), None, ["line 3, column 'server_ttft_s'", "'soon'"]),
    "count disagrees": ((2, "server_prompt_tokens", 51), None, ["line 4", "51 disagrees with input_len = 50"]),
    "arrivals backwards": ((3, "server_arrival_s", 0.1), None, ["line 5, column 'server_arrival_s'", "sort"]),
    "ttft after e2e": ((0, "server_ttft_s", 0.9), None, ["line 2, column 'server_e2e_s'"]),
    "zero-token prompt": ((0, "input_len", 0), None, ["line 2, column 'input_len'"]),
}


@pytest.mark.parametrize("case", BROKEN_TRACES, ids=list(BROKEN_TRACES))
def test_each_broken_trace_is_one_error_line(tmp_path: Path, capsys, case: str) -> None:
    edit, dropped, fragments = BROKEN_TRACES[case]
    path = _trace_file(tmp_path / "set")
    if edit == "drop":
        pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=[dropped]).to_csv(path, index=False)
    else:
        _edit_csv(path, *edit)
    out = tmp_path / "out"
    assert main(["validate-real", str(path.parent), "--out", str(out), "--quiet"]) == 2
    err = _one_error_line(capsys)
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists()


def test_a_trace_run_without_server_flags_is_an_error(tmp_path: Path, capsys) -> None:
    path = _trace_file(tmp_path / "set", run="anonymous")
    pd.read_csv(path).drop(columns=list(SERVER)).to_csv(path, index=False)
    assert main(["validate-real", str(path.parent), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "run 'anonymous' has no server flags" in _one_error_line(capsys)


# --------------------------------------------------------------------------- folders
def test_a_folder_holding_two_shapes_reports_both(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "set"
    _stage_file(folder), _trace_file(folder)
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    assert set(pd.read_csv(out / "set.csv")["shape"]) == {"stages", "trace"}


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({}, "no data in a known shape"),
        ({"README.md": "# nothing here\n"}, "no data in a known shape"),
        ({"notes.csv": "a,b\n1,2\n"}, "notes.csv: not a validation file of a known shape"),
    ],
    ids=["empty", "only a readme", "an unknown csv"],
)
def test_a_folder_in_no_known_shape_is_one_error_line(tmp_path: Path, capsys, files: dict, fragment: str) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    out = tmp_path / "out"
    assert main(["validate-real", str(folder), "--out", str(out)]) == 2
    err = _one_error_line(capsys)
    assert fragment in err and "expected summary.csv" in err
    assert not out.exists()


def test_a_stray_csv_beside_known_data_is_an_error(tmp_path: Path, capsys) -> None:
    _stage_file(tmp_path / "set")
    (tmp_path / "set" / "extra.csv").write_text("x\n1\n")
    assert main(["validate-real", str(tmp_path / "set"), "--out", str(tmp_path / "out")]) == 2
    assert "extra.csv: not a validation file" in _one_error_line(capsys)


# --------------------------------------------------------------------------- servers -> presets
@pytest.mark.parametrize("version", ["0.6.0", "0.6.3", "v0.6.1", "0.11.0", "0.11.2"])
def test_every_engine_version_maps_through_the_one_table(version: str) -> None:
    assert preset_for(version) == ENGINE_PRESETS[".".join(version.lstrip("v").split(".")[:2])]


def test_an_engine_version_without_a_preset_is_refused() -> None:
    with pytest.raises(UserError, match="no batchsim preset for vLLM 0.4"):
        preset_for("0.4.2")


FLAGS = {
    "max_num_seqs": 77, "max_num_batched_tokens": 3000, "gpu_memory_utilization": 0.85, "prefix_caching": True,
}  # fmt: skip


@pytest.mark.parametrize(
    ("version", "chunked", "budget_field"),
    [("0.6.0", False, "max_num_batched_tokens"), ("0.11.0", True, "chunk_size")],
)
def test_recorded_flags_become_explicit_policy_fields(version: str, chunked: bool, budget_field: str) -> None:
    flags = ServerFlags(version, "meta-llama/Meta-Llama-3-8B-Instruct", "A100-80GB-SXM", 2048,
                        chunked_prefill=chunked, **FLAGS)  # fmt: skip
    entry, notes = policy_entry(flags, "p", "run")
    assert notes == ()
    fixed = {"kind": "fixed", "value": 8}
    workload = {"arrival": {"kind": "burst"}, "requests": 1, "prompt_tokens": fixed, "output_tokens": fixed}
    scenario = Scenario(name="s", model="llama-3-8b", gpu="a100-80gb", max_model_len=2048, workload=workload,
                        policies=[entry])  # fmt: skip
    policy = scenario.policies[0]
    assert policy.preset == preset_for(version)
    assert (policy.max_batch_size, getattr(policy, budget_field)) == (77, 3000)
    assert policy.gpu_memory_utilization == 0.85 and policy.prefix_caching is True


def test_chunked_prefill_on_for_an_engine_that_never_chunks_is_refused() -> None:
    flags = ServerFlags("0.6.0", "meta-llama/Meta-Llama-3-8B-Instruct", "A100-80GB-SXM", 2048, chunked_prefill=True)
    with pytest.raises(UserError, match="never chunks"):
        policy_entry(flags, "p", "run")


# --------------------------------------------------------------------------- the shared folder
@needs_shared
def test_shared_v1_folder_holds_every_stage_and_trace_run() -> None:
    stages = pd.read_csv(SHARED_V1 / "inference-perf-stages.csv")
    stages = stages[stages["stage"].astype(str) != "all"]
    runs = pd.read_csv(SHARED_V1 / "guidellm-llama-2-7b-requests.csv")["run"].unique()
    cases = load_cases(SHARED_V1)
    assert sorted(c.shape for c in cases) == sorted(["stages"] * len(stages) + ["trace"] * len(runs))
    by_stage = {c.name.rsplit(" ", 1)[1]: c for c in cases if c.shape == "stages"}
    with tempfile.TemporaryDirectory() as folder:
        for _, row in stages.iterrows():
            case = by_stage[str(row["stage"])]
            arrival = _scenario(case, Path(folder)).workload.arrival
            if str(row["saturated_client_bound"]) == "True":
                assert arrival.kind == "closed_loop" and arrival.clients == row["client_max_outstanding"]
            else:
                assert arrival.kind == "constant" and arrival.rate == pytest.approx(row["achieved_rate"])
            assert case.n == row["requests_sent"]
    trace = next(c for c in cases if c.shape == "trace")
    assert trace.flags.kv_cache_tokens == 119_008 and trace.flags.max_num_seqs == 256  # README section 2
    assert not math.isnan(trace.requests["server_e2e_s"].sum())


def test_the_engine_takes_a_request_in_when_the_pass_in_flight_ends() -> None:
    """vLLM's engine loop reads new requests between steps: one arriving mid-pass is queued at that pass's end,
    one arriving while the engine idles (before the first pass, in a gap, at a pass's very end) at once, and so
    is one arriving as a pass starts (an idle engine starts its pass for it)."""
    from sim.validation.spans import engine_intake_s

    passes = pd.DataFrame({"start_s": [2.0, 1.0, 5.0], "duration_s": [1.0, 0.5, 2.0]})  # unsorted on purpose
    arrivals = pd.Series([0.5, 1.2, 1.5, 2.0, 2.9, 3.0, 4.0, 6.0, 7.5])
    expected = [0.5, 1.5, 1.5, 2.0, 3.0, 3.0, 4.0, 7.0, 7.5]
    assert engine_intake_s(arrivals, passes).tolist() == expected
